//! `cairn`: run and operate a Cairn storage cluster.
//!
//! Today it carries the chunk store's benchmarks and `chunkserver`; the other cluster
//! commands (`up`, `master`, `fs`, `status`) arrive with the masters.

mod bench;
mod chunkserver;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Cairn: an append-only distributed storage system"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks that print their numbers next to the hardware's in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Run one chunkserver: serve this machine's disks on the data plane.
    Chunkserver(chunkserver::ChunkserverArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CAIRN_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Bench(b) => bench::run(b),
        Command::Chunkserver(a) => chunkserver::run(a),
    }
}
