//! The nemesis's fault plans: which faults a scenario injects, where and when, from its seed.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Kind {
    KillChunkserver,
    KillMaster,
    /// SIGSTOP then SIGCONT: a master that stops answering with its connections open and its
    /// memory kept (a leader paused past the election timeout leads a later term again).
    PauseMaster,
    Slow,
    Errors,
    Frozen,
    DiskFull,
    KillService,
}

impl Kind {
    pub(super) fn kills(self) -> bool {
        matches!(
            self,
            Kind::KillChunkserver | Kind::KillMaster | Kind::PauseMaster | Kind::KillService
        )
    }
}

#[derive(Debug, Clone)]
pub(super) struct Fault {
    pub(super) kind: Kind,
    /// Chunkserver or master index.
    pub(super) target: usize,
    pub(super) start: Duration,
    pub(super) end: Duration,
    pub(super) spec: FaultSpec,
}

/// The faults of scenario `seed`: one to three, at most one process killed at a time, each on
/// its own chunkserver.
pub(super) fn plan(seed: u64) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = rng.random_range(1..=3);
    let mut servers: Vec<usize> = (0..4).collect();
    let mut faults: Vec<Fault> = Vec::new();
    let mut killed = false;
    // CAIRN_NEMESIS_MASTER_FAULTS=1: every scenario's first fault kills or pauses a master (to
    // chase failures of master failover faster; other plans than the default seed's).
    let masters_first = std::env::var("CAIRN_NEMESIS_MASTER_FAULTS").is_ok_and(|v| v == "1");
    for i in 0..n {
        let draw = match masters_first && i == 0 {
            true => 1,
            false => rng.random_range(0..7),
        };
        let kind = match draw {
            0 if !killed => Kind::KillChunkserver,
            1 if !killed => match rng.random_bool(0.5) {
                true => Kind::KillMaster,
                false => Kind::PauseMaster,
            },
            6 if !killed => Kind::KillService,
            0..=2 | 6 => Kind::Slow,
            3 => Kind::Errors,
            4 => Kind::Frozen,
            _ => Kind::DiskFull,
        };
        killed |= kind.kills();
        let target = if matches!(kind, Kind::KillMaster | Kind::PauseMaster) {
            rng.random_range(0..3)
        } else if kind == Kind::KillService {
            0
        } else {
            servers.remove(rng.random_range(0..servers.len()))
        };
        let start = Duration::from_millis(rng.random_range(200..1500));
        let end = start + Duration::from_millis(rng.random_range(300..1500));
        let spec = match kind {
            Kind::Slow => FaultSpec {
                delay_ms: rng.random_range(5..60),
                jitter_ms: rng.random_range(0..20),
                ..FaultSpec::default()
            },
            Kind::Errors => FaultSpec {
                error_ppm: rng.random_range(10_000..200_000),
                ..FaultSpec::default()
            },
            Kind::Frozen => FaultSpec {
                stall: true,
                ..FaultSpec::default()
            },
            Kind::DiskFull => FaultSpec {
                disk_full: true,
                ..FaultSpec::default()
            },
            Kind::KillChunkserver | Kind::KillMaster | Kind::PauseMaster | Kind::KillService => {
                FaultSpec::default()
            }
        };
        faults.push(Fault {
            kind,
            target,
            start,
            end,
            spec,
        });
    }
    faults
}
