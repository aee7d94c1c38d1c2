//! Where a master's store spends its bytes: every table's rows, leaf and branch pages, stored,
//! metadata and fragmented bytes, from a stopped master's `master.redb` (or a partition's).
//!
//! `cargo run --release -p cairn-master --example store_stats -- DATA_DIR/master.redb
//! [--upgrade]` (the master must be stopped: redb opens a file in one process at a time).
//! `--upgrade` first rewrites records of older versions as a master's start does
//! (`cairn_master::kv::upgrade`) and says how many and how long it took.

use redb::{ReadableDatabase, ReadableTableMetadata, TableHandle};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: store_stats FILE.redb")?;
    let db = redb::Database::open(&path)?;
    if std::env::args().any(|a| a == "--upgrade") {
        let t = std::time::Instant::now();
        let rows = cairn_master::kv::upgrade(&db, cairn_master::state::TABLES)?;
        println!("upgraded {rows} rows in {:.2} s", t.elapsed().as_secs_f64());
    }
    let len = std::fs::metadata(&path)?.len();
    let w = db.begin_write()?;
    let s = w.stats()?;
    w.abort()?;
    let page = s.page_size() as u64;
    println!(
        "file {len} B; page {page} B; allocated {} pages = {} B; leaf {} branch {} pages; \
         stored {} B, metadata {} B, fragmented {} B",
        s.allocated_pages(),
        s.allocated_pages() * page,
        s.leaf_pages(),
        s.branch_pages(),
        s.stored_bytes(),
        s.metadata_bytes(),
        s.fragmented_bytes()
    );
    let r = db.begin_read()?;
    println!(
        "{:<20} {:>10} {:>10} {:>8} {:>14} {:>12} {:>12} {:>10}",
        "table", "rows", "leaf", "branch", "stored B", "metadata B", "fragmented B", "B/row"
    );
    for h in r.list_tables()? {
        let name = h.name().to_string();
        let t = r.open_untyped_table(h)?;
        let st = t.stats()?;
        let rows = t.len()?;
        let pages = (st.leaf_pages() + st.branch_pages()) * page;
        println!(
            "{:<20} {:>10} {:>10} {:>8} {:>14} {:>12} {:>12} {:>10.1}",
            name,
            rows,
            st.leaf_pages(),
            st.branch_pages(),
            st.stored_bytes(),
            st.metadata_bytes(),
            st.fragmented_bytes(),
            pages as f64 / rows.max(1) as f64
        );
    }
    Ok(())
}
