//! `cairn`: run and operate a Cairn storage cluster.
//!
//! `up` runs a local cluster; `master` and `chunkserver` run one process each; `fs` and
//! `status` use a running cluster; `bench` measures against the hardware's floor.

mod admin;
mod bench;
mod chunkserver;
mod cluster;
mod fs;
mod master;
mod metrics;
mod s3;
// get_opt and delete serve the nemesis test, which includes the file.
#[allow(dead_code)]
mod s3client;
mod tls;
mod up;
mod volume;

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
    /// Run a local cluster: masters and chunkservers as supervised processes.
    Up(up::UpArgs),
    /// Run one master of the Raft group.
    Master(master::MasterArgs),
    /// Run one chunkserver: serve this machine's disks on the data plane.
    Chunkserver(chunkserver::ChunkserverArgs),
    /// Files: put, get, cat, append, ls, stat, rm, seal, mkdir, mv.
    Fs(fs::FsArgs),
    /// The cluster: masters, chunkservers, totals.
    Status(fs::StatusArgs),
    /// Operators: change the master group, drain chunkservers.
    Admin(admin::AdminArgs),
    /// The object service: run an S3 gateway, manage its users.
    S3(s3::S3Args),
    /// Users of the cluster (the S3 gateway's users too): create.
    #[command(subcommand)]
    User(s3::UserCommand),
    /// TLS certificates for the control plane: make a cluster CA and a server certificate.
    #[command(subcommand)]
    Tls(tls::TlsCommand),
    /// Block volumes: create, list, info, resize, delete.
    #[command(subcommand)]
    Volume(volume::VolumeCommand),
    /// Serve volumes over NBD (qemu, nbdcopy, fio's nbd engine).
    Nbd(volume::NbdArgs),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CAIRN_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let r = match Cli::parse().command {
        Command::Bench(b) => bench::run(b),
        Command::Chunkserver(a) => chunkserver::run(a),
        Command::Up(a) => up::run(a),
        Command::Master(a) => master::run(a),
        Command::Fs(a) => fs::run(a),
        Command::Status(a) => fs::status(a),
        Command::Admin(a) => admin::run(a),
        Command::S3(a) => s3::run(a),
        Command::User(c) => s3::user(c),
        Command::Tls(c) => tls::run(c),
        Command::Volume(c) => volume::run(c),
        Command::Nbd(a) => volume::nbd(a),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
