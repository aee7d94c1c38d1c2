//! `cairn chunkserver`: one chunkserver process serving its disks on the data plane.

use cairn_chunkserver::{Chunkserver, DiskSet, DiskSetOptions, ServerOptions};
use cairn_chunkstore::{Durability, FormatOptions, OpenOptions};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ChunkserverArgs {
    /// Directory of this server's store files (disk0.cairn, disk1.cairn, …).
    #[arg(long, default_value = "./cairn-data/chunkserver")]
    data_dir: PathBuf,
    /// Store files (disks) to serve; missing ones are created and formatted.
    #[arg(long, default_value_t = 1)]
    disks: usize,
    /// Size of each store file created here (4k, 64m, 4g, …).
    #[arg(long, default_value = "1g", value_parser = crate::bench::parse_size)]
    disk_size: u64,
    /// Address for the data plane; port 0 picks a free port. The bound address is printed on
    /// stdout as `listening on ADDR`.
    #[arg(long, default_value = "127.0.0.1:7100")]
    listen: std::net::SocketAddr,
    /// sync (default): every acknowledged append is on the disk. none: benchmarks only.
    #[arg(long, default_value = "sync", value_parser = ["sync", "none"])]
    durability: String,
    /// Write zeros over new store files (slower to create, steadier first-pass appends).
    #[arg(long)]
    zero_fill: bool,
}

pub fn run(a: ChunkserverArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.disks >= 1, "--disks must be at least 1");
    let set = DiskSet::open(&DiskSetOptions {
        paths: (0..a.disks)
            .map(|i| a.data_dir.join(format!("disk{i}.cairn")))
            .collect(),
        create_bytes: a.disk_size,
        zero_fill: a.zero_fill,
        format: FormatOptions::default(),
        open: OpenOptions {
            durability: if a.durability == "sync" {
                Durability::Sync
            } else {
                Durability::None
            },
            ..OpenOptions::default()
        },
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("cairn-cs")
        .build()?;
    let cs = Chunkserver::new(set, ServerOptions::default());
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(a.listen).await?;
        println!("listening on {}", listener.local_addr()?);
        use std::io::Write;
        std::io::stdout().flush()?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        cs.clone()
            .serve(listener, async move {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            })
            .await;
        anyhow::Ok(())
    })?;
    // Let in-flight requests finish, then close every store (a final checkpoint each).
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    match std::sync::Arc::try_unwrap(cs) {
        Ok(cs) => cs.into_disks().close()?,
        Err(_) => tracing::warn!("connections still open at shutdown; stores dropped"),
    }
    Ok(())
}
