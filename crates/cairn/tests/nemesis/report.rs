//! The nemesis's totals over a run: the tables it prints (RELIABILITY.md takes them) and
//! the assertions that fail the run.

use super::*;

#[derive(Debug, Default)]
pub(super) struct Totals {
    pub(super) scenarios: u64,
    pub(super) faults: BTreeMap<String, u64>,
    pub(super) appends: u64,
    pub(super) append_errors: u64,
    pub(super) bytes_verified: u64,
    pub(super) reads: u64,
    pub(super) read_errors: u64,
    pub(super) losses: u64,
    pub(super) corrupt_reads: u64,
    pub(super) unacked_reads: u64,
    pub(super) misplaced: u64,
    pub(super) under_replicated: u64,
    pub(super) s3_puts: u64,
    pub(super) s3_deletes: u64,
    pub(super) s3_gets: u64,
    pub(super) s3_errors: u64,
    pub(super) s3_bad_gets: u64,
    pub(super) s3_losses: u64,
    /// Chunks of the `then:ec` files found converted at the end of their scenario.
    pub(super) converted: u64,
    /// Chunks of files in the split partition (`PARTITIONED`), allocated by it.
    pub(super) partition_chunks: u64,
    pub(super) nbd_writes: u64,
    pub(super) nbd_errors: u64,
    /// Blocks read back and checked against the model.
    pub(super) nbd_blocks_checked: u64,
    /// Blocks that read something the model does not allow.
    pub(super) nbd_bad_blocks: u64,
    /// Scenarios whose volume could not be read back within a minute of their end.
    pub(super) nbd_unreadable: u64,
    /// Metadata consistency checks run (one per scenario, every partition) and the
    /// problems they found.
    pub(super) metadata_checks: u64,
    pub(super) metadata_problems: u64,
    /// Partitions whose three masters' copies were compared at one log entry
    /// (`cairn admin digests`), those whose masters never stood at one entry together, and
    /// those whose copies differed.
    pub(super) copies_compared: u64,
    pub(super) copies_uncompared: u64,
    pub(super) copies_diverged: u64,
    /// Populated directories moved into a partition under the faults, moves not finished
    /// within a minute of the faults' end, and moves that lost rows.
    pub(super) moves: u64,
    /// Of those, directories hashed over partitions.
    pub(super) hashed: u64,
    pub(super) moves_unfinished: u64,
    pub(super) moves_lost_rows: u64,
    /// Renames across partitions answered, failed, and files they lost (txn.rs).
    pub(super) renames: u64,
    pub(super) rename_errors: u64,
    pub(super) renames_lost: u64,
    /// The file service's writer (mount.rs): calls made, failed, fsyncs and closes answered,
    /// names read and checked, and reads the model does not allow.
    pub(super) fs_ops: u64,
    pub(super) fs_errors: u64,
    pub(super) fs_synced: u64,
    /// Renames by hard link (the file writer's).
    pub(super) fs_linked: u64,
    pub(super) fs_checked: u64,
    pub(super) fs_bad: u64,
}

/// Prints the run's tables and fails it on anything lost, wrong or left undone, or on a run
/// that exercised nothing (a canary).
pub(super) fn report(t: &Totals, seed: u64, scenarios: u64, elapsed: Duration) {
    let faults: u64 = t.faults.values().sum();
    println!();
    println!(
        "nemesis: seed {seed}, {scenarios} scenarios in {:.0?}",
        elapsed
    );
    println!(
        "| scenarios | faults injected | appends acked | bytes verified | reads checked | append errors | read errors | losses | corrupt reads | unacked reads | chunks short of copies |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {faults} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        t.scenarios,
        t.appends,
        t.bytes_verified,
        t.reads,
        t.append_errors,
        t.read_errors,
        t.losses,
        t.corrupt_reads,
        t.unacked_reads,
        t.under_replicated
    );
    println!(
        "| S3 PUTs acked | S3 DELETEs acked | S3 GETs checked | S3 errors | bad S3 GETs | S3 keys lost |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {} | {} |",
        t.s3_puts, t.s3_deletes, t.s3_gets, t.s3_errors, t.s3_bad_gets, t.s3_losses
    );
    println!("| NBD writes acked | NBD errors | NBD blocks checked | NBD bad blocks |");
    println!("|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} |",
        t.nbd_writes, t.nbd_errors, t.nbd_blocks_checked, t.nbd_bad_blocks
    );
    println!(
        "| file calls | file errors | fsyncs and closes answered | names checked | bad reads | renames by link |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {} | {} |",
        t.fs_ops, t.fs_errors, t.fs_synced, t.fs_checked, t.fs_bad, t.fs_linked
    );
    println!("faults by kind: {:?}", t.faults);
    println!("chunks converted to compressed groups: {}", t.converted);
    println!(
        "chunks in partition 1 ({PARTITIONED}): {}",
        t.partition_chunks
    );
    println!(
        "subtrees moved into partitions: {} (of them hashed over {HASH_SHARDS}: {}; not finished {}, rows lost {})",
        t.moves, t.hashed, t.moves_unfinished, t.moves_lost_rows
    );
    println!(
        "renames across partitions: {} (errors {}, files lost {})",
        t.renames, t.rename_errors, t.renames_lost
    );
    println!(
        "metadata checks: {} (problems {})",
        t.metadata_checks, t.metadata_problems
    );
    println!(
        "masters' copies compared: {} (diverged {}, not at one entry together {})",
        t.copies_compared, t.copies_diverged, t.copies_uncompared
    );
    // Canary: a run that acknowledged and verified nothing proves nothing; one that converted
    // nothing did not test conversion.
    assert!(
        t.appends > 0
            && t.bytes_verified > 0
            && t.reads > 0
            && t.s3_puts > 0
            && t.s3_gets > 0
            && t.nbd_writes > 0
            && t.nbd_blocks_checked > 0
            && t.fs_ops > 0
            && t.fs_synced > 0
            && t.fs_checked > 0,
        "{t:?}"
    );
    assert_eq!(
        t.fs_bad, 0,
        "files read other than fsync, close or the masters left them: {t:?}"
    );
    assert!(t.converted > 0, "no chunk was converted: {t:?}");
    assert!(
        t.scenarios <= MOVE_AT || t.moves > 0,
        "no subtree was moved: {t:?}"
    );
    assert_eq!(t.moves_unfinished, 0, "moves not finished: {t:?}");
    assert_eq!(t.moves_lost_rows, 0, "moves lost rows: {t:?}");
    assert!(t.renames > 0, "no rename across partitions: {t:?}");
    assert_eq!(
        t.renames_lost, 0,
        "renames across partitions lost files: {t:?}"
    );
    assert!(
        t.partition_chunks > 0,
        "no chunk was written in a partition: {t:?}"
    );
    assert_eq!(t.s3_losses, 0, "S3 keys not as acknowledged: {t:?}");
    assert_eq!(
        t.s3_bad_gets, 0,
        "S3 GETs returned wrong or stale objects: {t:?}"
    );
    assert_eq!(t.losses, 0, "acknowledged bytes lost: {t:?}");
    assert_eq!(
        t.nbd_bad_blocks, 0,
        "NBD blocks read other than flushed or written since: {t:?}"
    );
    assert_eq!(
        t.nbd_unreadable, 0,
        "the volume was not served again within a minute: {t:?}"
    );
    assert_eq!(t.corrupt_reads, 0, "readers saw wrong bytes: {t:?}");
    assert_eq!(
        t.unacked_reads, 0,
        "readers saw unacknowledged bytes: {t:?}"
    );
    assert_eq!(
        t.misplaced, 0,
        "appends acknowledged at the wrong offset: {t:?}"
    );
    assert_eq!(t.under_replicated, 0, "chunks left short of copies: {t:?}");
    assert!(t.metadata_checks > 0, "no metadata check ran: {t:?}");
    assert_eq!(
        t.metadata_problems, 0,
        "the metadata consistency check found problems: {t:?}"
    );
    assert!(
        t.copies_compared > 0,
        "no masters' copies were compared: {t:?}"
    );
    assert_eq!(
        t.copies_diverged, 0,
        "masters' copies of a partition differ at one entry: {t:?}"
    );
}
