//! `cairn`: run and operate a Cairn storage cluster.
//!
//! `up` runs a local cluster; `master` and `chunkserver` run one process each; `fs` and
//! `status` use a running cluster; `bench` measures against the hardware's floor.

mod admin;
mod append;
mod bench;
mod chunkserver;
mod cluster;
mod fs;
mod limits;
mod local;
mod master;
mod metrics;
mod mount;
mod s3;
// get_opt and delete serve the nemesis test, which includes the file.
#[allow(dead_code)]
mod s3client;
mod status;
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
    /// Stop the local cluster `cairn up` runs on a data directory.
    Down(up::DownArgs),
    /// Run one master of the Raft group.
    Master(master::MasterArgs),
    /// Run one chunkserver: serve this machine's disks on the data plane.
    Chunkserver(chunkserver::ChunkserverArgs),
    /// Files: put, get, cat, append, ls, stat, rm, seal, mkdir, mv, chmod, chown, du, df.
    Fs(fs::FsArgs),
    /// The cluster: masters, chunkservers, totals.
    Status(status::StatusArgs),
    /// Operators: change the master group, drain chunkservers.
    Admin(admin::AdminArgs),
    /// The object service: run an S3 gateway, manage its users.
    S3(s3::S3Args),
    /// Users of the cluster (the S3 gateway's users too): create, list, delete, rotate keys.
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
    /// Mount the cluster's file system at a local directory (FUSE).
    Mount(mount::MountArgs),
}

fn main() -> std::process::ExitCode {
    // Colours only for a person at a terminal: never in a log file or a pipe.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CAIRN_LOG")
                // rustls warns of every libnbd client that sends an IP address as SNI.
                .unwrap_or_else(|_| "warn,rustls=error".into()),
        )
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
    local::quiet_broken_pipe();
    // `--json` anywhere on the line: errors are JSON too.
    let json = std::env::args().skip(1).any(|a| a == "--json");
    let cli = Cli::parse();
    // What servers write (logs, the Raft log, stores, secrets) is for their user only; the
    // CLI's downloads keep the user's umask.
    if matches!(
        cli.command,
        Command::Up(_)
            | Command::Master(_)
            | Command::Chunkserver(_)
            | Command::S3(_)
            | Command::Nbd(_)
    ) {
        cairn_rpc::private::restrict_umask();
    }
    let r = match cli.command {
        Command::Bench(b) => bench::run(b),
        Command::Chunkserver(a) => chunkserver::run(a),
        Command::Up(a) => up::run(a),
        Command::Master(a) => master::run(a),
        Command::Fs(a) => fs::run(a),
        Command::Status(a) => status::run(a),
        Command::Down(a) => up::down(a),
        Command::Admin(a) => admin::run(a),
        Command::S3(a) => s3::run(a),
        Command::User(c) => s3::user(c),
        Command::Tls(c) => tls::run(c),
        Command::Volume(c) => volume::run(c),
        Command::Nbd(a) => volume::nbd(a),
        Command::Mount(a) => mount::run(a),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if json => {
            eprintln!("{}", serde_json::json!({"error": format!("{e:#}")}));
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// clap's own checks of the whole command tree (no two arguments of one name, …).
    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// Every command, option and argument says what it is in `--help`.
    #[test]
    fn every_command_option_and_argument_has_a_help_line() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", cmd.get_name());
            if cmd.get_about().is_none() && !path.ends_with(" help") {
                missing.push(format!("{path} (the command)"));
            }
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "", &mut missing);
        assert!(missing.is_empty(), "without help:\n{}", missing.join("\n"));
    }
}
