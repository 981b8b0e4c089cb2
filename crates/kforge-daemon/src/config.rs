//! Daemon configuration (what `kforge daemon` flags set).

use crate::devices::GpuSelection;
use kforge_freeze::MechanismKind;
use kforge_proto::Policy;
use std::path::PathBuf;
use std::time::Duration;

/// Which sibling jobs a region freezes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezeScope {
    /// Nothing is frozen.
    None,
    /// Other jobs on the region's device.
    Device,
    /// Every other job on the node; regions are then granted one at a time node-wide.
    Node,
}

impl FreezeScope {
    pub fn parse(s: &str) -> Option<FreezeScope> {
        match s {
            "none" => Some(FreezeScope::None),
            "device" => Some(FreezeScope::Device),
            "node" => Some(FreezeScope::Node),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            FreezeScope::None => "none",
            FreezeScope::Device => "device",
            FreezeScope::Node => "node",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub socket: PathBuf,
    /// SQLite file; `:memory:` keeps nothing.
    pub db: PathBuf,
    pub gpus: GpuSelection,
    pub default_policy: Policy,
    pub freeze_scope: FreezeScope,
    /// Force a freeze mechanism; auto-detected when None.
    pub freeze_mechanism: Option<MechanismKind>,
    /// Cores kept for region holders' measuring threads.
    pub reserve_cores: usize,
    /// Concurrent commands per device; None = default (cpu: number of job cores, GPU: 4).
    pub max_concurrent: Option<usize>,
    pub lease: Duration,
    pub drain_timeout: Duration,
    /// Wait for managed processes to drain and acknowledge (`--no-drain` turns it off: ablation).
    pub drain: bool,
    pub freeze_timeout: Duration,
    /// Longest wait, when entering a region on a GPU, for power-cap or thermal throttling left
    /// by other jobs' load to clear (zero: do not wait).
    pub settle_timeout: Duration,
    /// Settle until the GPU draws at most this fraction of its power limit (0: ignore power).
    pub settle_power_fraction: f64,
    /// The gate shim (`libkforge_shim.so`) preloaded into every job on a GPU device; None runs
    /// GPU jobs without it (their submissions are then neither gated nor drained).
    pub shim: Option<PathBuf>,
    /// Warm workers per device; None = the default (GPU: its concurrency limit, cpu: 0).
    pub warm_workers: Option<usize>,
    /// Interpreter of warm workers.
    pub worker_python: String,
    /// Modules warm workers import at start (`auto`: torch and triton when importable).
    pub worker_preload: String,
    /// Recycle a worker after this many jobs.
    pub worker_max_jobs: u32,
    /// Recycle a worker whose resident memory exceeds this (MiB; 0 = no ceiling).
    pub worker_max_rss_mb: u64,
    /// Route every Python command to warm workers (where the command line allows).
    pub warm_python: bool,
    /// Default time limit of a job (None = none).
    pub job_timeout: Option<Duration>,
}

impl Config {
    /// Defaults for a socket path.
    pub fn new(socket: PathBuf) -> Config {
        Config {
            socket,
            db: default_db_path(),
            gpus: GpuSelection::All,
            default_policy: Policy::Region,
            freeze_scope: FreezeScope::Device,
            freeze_mechanism: None,
            reserve_cores: 0,
            max_concurrent: None,
            lease: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(2),
            drain: true,
            freeze_timeout: Duration::from_secs(2),
            settle_timeout: Duration::from_millis(1500),
            settle_power_fraction: 0.5,
            shim: None,
            warm_workers: None,
            worker_python: "python3".into(),
            worker_preload: "auto".into(),
            worker_max_jobs: 100,
            worker_max_rss_mb: 0,
            warm_python: false,
            job_timeout: None,
        }
    }

    /// Directory beside the socket holding this daemon's private state (python package, ledger).
    pub fn state_dir(&self) -> PathBuf {
        let mut s = self.socket.as_os_str().to_owned();
        s.push(".d");
        PathBuf::from(s)
    }
}

/// `$XDG_STATE_HOME/kforge/kforge.db`, else `~/.local/state/kforge/kforge.db`, else `/tmp`.
pub fn default_db_path() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(d).join("kforge/kforge.db");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".local/state/kforge/kforge.db");
    }
    PathBuf::from("/tmp/kforge.db")
}
