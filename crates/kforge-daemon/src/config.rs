//! Daemon configuration (what `kforge daemon` flags set): [`DaemonFlags`] as given on the command
//! line, checked and converted by [`Config::from_flags`].

use crate::devices::GpuSelection;
use crate::DaemonError;
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
    /// The region holders' cpus chosen by the user instead (`--region-cpus`).
    pub region_cpus: Option<Vec<u32>>,
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
    /// Warm workers run each job in a child forked for it (no CUDA context in the worker):
    /// jobs isolated from each other as fresh processes are, the imports still saved.
    pub worker_fork: bool,
    /// Route every Python command to warm workers (where the command line allows).
    pub warm_python: bool,
    /// Default time limit of a job (None = none).
    pub job_timeout: Option<Duration>,
    /// Test hook: read device memory from this JSON file instead of NVML
    /// (`crate::memory::MemorySource::File`).
    pub debug_gpu_memory: Option<PathBuf>,
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
            region_cpus: None,
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
            worker_fork: false,
            warm_python: false,
            job_timeout: None,
            debug_gpu_memory: None,
        }
    }

    /// Directory beside the socket holding this daemon's private state (python package, ledger).
    pub fn state_dir(&self) -> PathBuf {
        let mut s = self.socket.as_os_str().to_owned();
        s.push(".d");
        PathBuf::from(s)
    }
}

/// The flags of `kforge daemon`, in their units, before they are checked.
#[derive(Debug, Clone)]
pub struct DaemonFlags {
    /// SQLite store (None: [`default_db_path`]).
    pub db: Option<PathBuf>,
    /// GPUs to manage: `all`, `none`, or indices such as `0,2`.
    pub gpus: String,
    pub default_policy: Policy,
    pub freeze_scope: FreezeScope,
    /// None: auto-detect.
    pub freeze_mechanism: Option<MechanismKind>,
    pub reserve_cores: usize,
    /// `--region-cpus`: a cpu list (`8,9`, `8-9`).
    pub region_cpus: Option<String>,
    pub max_concurrent: Option<usize>,
    pub lease_ms: u64,
    pub drain_timeout_ms: u64,
    pub no_drain: bool,
    pub settle_timeout_ms: u64,
    pub settle_power_fraction: f64,
    pub shim: ShimChoice,
    pub warm_workers: Option<usize>,
    pub worker_python: String,
    pub worker_preload: String,
    pub worker_max_jobs: u32,
    pub worker_max_rss_mb: u64,
    pub worker_fork: bool,
    pub warm_python: bool,
    pub job_timeout_s: Option<f64>,
    /// Test hook (`--debug-gpu-memory FILE`): device memory from this file instead of NVML.
    pub debug_gpu_memory: Option<PathBuf>,
}

/// Where the gate shim comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShimChoice {
    /// No shim (`--no-shim`): GPU jobs' work is neither held nor drained.
    Off,
    /// This file (`--shim`); it must exist.
    File(PathBuf),
    /// `libkforge_shim.so` beside this binary, when there is one.
    BesideBinary(PathBuf),
}

impl ShimChoice {
    /// The shim file, resolved.
    fn resolve(self) -> Result<Option<PathBuf>, ConfigError> {
        match self {
            ShimChoice::Off => Ok(None),
            ShimChoice::File(p) if p.is_file() => {
                p.canonicalize().map(Some).map_err(|source| ConfigError::ResolvingShim { path: p, source })
            }
            ShimChoice::File(p) => Err(ConfigError::NoSuchShim(p)),
            ShimChoice::BesideBinary(binary) => {
                let beside = binary.with_file_name("libkforge_shim.so");
                Ok(beside.is_file().then_some(beside))
            }
        }
    }
}

/// `--region-cpus`' list: cpu numbers, at least one (whether this machine has them is checked
/// when the daemon starts, against the cpus it may use).
fn parse_region_cpus(list: &str) -> Result<Vec<u32>, ConfigError> {
    let cpus = kforge_cores::parse_cpu_list(list).map_err(|e| ConfigError::RegionCpus(e.to_string()))?;
    if cpus.is_empty() {
        return Err(ConfigError::RegionCpus("no cpu given".into()));
    }
    Ok(cpus)
}

/// A flag of `kforge daemon` out of its range.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} must be at least 1")]
    AtLeastOne(&'static str),
    #[error("--lease-ms must be positive")]
    LeaseNotPositive,
    #[error("--region-cpus: {0}")]
    RegionCpus(String),
    #[error("give --reserve-cores or --region-cpus, not both")]
    ReserveTwice,
    #[error("--settle-power-fraction must lie in [0, 1], got {0}")]
    PowerFraction(f64),
    #[error("--job-timeout-s must be a positive number of seconds")]
    JobTimeout,
    #[error("--shim {}: no such file", .0.display())]
    NoSuchShim(PathBuf),
    #[error("resolving --shim {}: {source}", path.display())]
    ResolvingShim { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Gpus(DaemonError),
}

impl Config {
    /// Check `flags` and turn them into the configuration of a daemon on `socket`.
    pub fn from_flags(socket: PathBuf, flags: DaemonFlags) -> Result<Config, ConfigError> {
        let f = flags;
        let gpus = GpuSelection::parse(&f.gpus).map_err(ConfigError::Gpus)?;
        if f.max_concurrent == Some(0) {
            return Err(ConfigError::AtLeastOne("--max-concurrent"));
        }
        if f.lease_ms == 0 {
            return Err(ConfigError::LeaseNotPositive);
        }
        let region_cpus = match f.region_cpus.as_deref() {
            None => None,
            Some(_) if f.reserve_cores > 0 => return Err(ConfigError::ReserveTwice),
            Some(list) => Some(parse_region_cpus(list)?),
        };
        if !(0.0..=1.0).contains(&f.settle_power_fraction) {
            return Err(ConfigError::PowerFraction(f.settle_power_fraction));
        }
        if f.worker_max_jobs == 0 {
            return Err(ConfigError::AtLeastOne("--worker-max-jobs"));
        }
        let job_timeout = job_timeout(f.job_timeout_s)?;
        let shim = f.shim.resolve()?;
        let defaults = Config::new(socket);
        Ok(Config {
            db: f.db.unwrap_or(defaults.db.clone()),
            gpus,
            default_policy: f.default_policy,
            freeze_scope: f.freeze_scope,
            freeze_mechanism: f.freeze_mechanism,
            reserve_cores: f.reserve_cores,
            region_cpus,
            max_concurrent: f.max_concurrent,
            lease: Duration::from_millis(f.lease_ms),
            drain_timeout: Duration::from_millis(f.drain_timeout_ms),
            drain: !f.no_drain,
            settle_timeout: Duration::from_millis(f.settle_timeout_ms),
            settle_power_fraction: f.settle_power_fraction,
            shim,
            warm_workers: f.warm_workers,
            worker_python: f.worker_python,
            worker_preload: f.worker_preload,
            worker_max_jobs: f.worker_max_jobs,
            worker_max_rss_mb: f.worker_max_rss_mb,
            worker_fork: f.worker_fork,
            warm_python: f.warm_python,
            job_timeout,
            debug_gpu_memory: f.debug_gpu_memory,
            ..defaults
        })
    }
}

fn job_timeout(seconds: Option<f64>) -> Result<Option<Duration>, ConfigError> {
    match seconds {
        Some(t) if !(t > 0.0 && t.is_finite()) => Err(ConfigError::JobTimeout),
        Some(t) => Ok(Some(Duration::from_secs_f64(t))),
        None => Ok(None),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags `kforge daemon` passes when none is given.
    fn flags() -> DaemonFlags {
        DaemonFlags {
            db: None,
            gpus: "all".into(),
            default_policy: Policy::Region,
            freeze_scope: FreezeScope::Device,
            freeze_mechanism: None,
            reserve_cores: 0,
            region_cpus: None,
            max_concurrent: None,
            lease_ms: 60_000,
            drain_timeout_ms: 2_000,
            no_drain: false,
            settle_timeout_ms: 1_500,
            settle_power_fraction: 0.5,
            shim: ShimChoice::Off,
            warm_workers: None,
            worker_python: "python3".into(),
            worker_preload: "auto".into(),
            worker_max_jobs: 100,
            worker_max_rss_mb: 0,
            worker_fork: false,
            warm_python: false,
            job_timeout_s: None,
            debug_gpu_memory: None,
        }
    }

    fn error_of(f: DaemonFlags) -> String {
        Config::from_flags("/tmp/s.sock".into(), f).unwrap_err().to_string()
    }

    #[test]
    fn default_flags_give_the_default_config_and_flags_convert_their_units() {
        let c = Config::from_flags("/tmp/s.sock".into(), flags()).unwrap();
        let d = Config::new("/tmp/s.sock".into());
        assert_eq!(
            (c.lease, c.drain_timeout, c.settle_timeout, c.drain, c.job_timeout, c.db),
            (d.lease, d.drain_timeout, d.settle_timeout, d.drain, d.job_timeout, d.db)
        );
        let c = Config::from_flags(
            "/tmp/s.sock".into(),
            DaemonFlags {
                db: Some(":memory:".into()),
                gpus: "0,2".into(),
                lease_ms: 250,
                no_drain: true,
                job_timeout_s: Some(1.5),
                ..flags()
            },
        )
        .unwrap();
        assert_eq!(c.db, PathBuf::from(":memory:"));
        assert!(matches!(c.gpus, GpuSelection::List(ref v) if v == &[0, 2]));
        assert_eq!(
            (c.lease, c.drain, c.job_timeout),
            (Duration::from_millis(250), false, Some(Duration::from_millis(1500)))
        );
    }

    #[test]
    fn each_flag_out_of_range_is_named() {
        assert_eq!(error_of(DaemonFlags { max_concurrent: Some(0), ..flags() }), "--max-concurrent must be at least 1");
        assert_eq!(error_of(DaemonFlags { lease_ms: 0, ..flags() }), "--lease-ms must be positive");
        assert_eq!(
            error_of(DaemonFlags { settle_power_fraction: 1.5, ..flags() }),
            "--settle-power-fraction must lie in [0, 1], got 1.5"
        );
        assert!(error_of(DaemonFlags { settle_power_fraction: f64::NAN, ..flags() }).contains("must lie in [0, 1]"));
        assert_eq!(error_of(DaemonFlags { worker_max_jobs: 0, ..flags() }), "--worker-max-jobs must be at least 1");
        for t in [0.0, -1.0, f64::INFINITY, f64::NAN] {
            assert_eq!(
                error_of(DaemonFlags { job_timeout_s: Some(t), ..flags() }),
                "--job-timeout-s must be a positive number of seconds"
            );
        }
        assert!(error_of(DaemonFlags { gpus: "0,x".into(), ..flags() }).contains("--gpus: \"x\" is not a GPU index"));
        let cpus = |list: &str| DaemonFlags { region_cpus: Some(list.into()), ..flags() };
        assert!(error_of(cpus("8,x")).starts_with("--region-cpus: bad cpu list"), "{}", error_of(cpus("8,x")));
        assert_eq!(error_of(cpus("")), "--region-cpus: no cpu given");
        assert_eq!(
            error_of(DaemonFlags { reserve_cores: 2, ..cpus("8") }),
            "give --reserve-cores or --region-cpus, not both"
        );
        let c = Config::from_flags("/tmp/s.sock".into(), cpus("9,8,10-11")).unwrap();
        assert_eq!(c.region_cpus, Some(vec![8, 9, 10, 11]));
    }

    #[test]
    fn the_shim_is_a_file_that_exists_or_the_one_beside_the_binary_or_none() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.so");
        assert_eq!(
            error_of(DaemonFlags { shim: ShimChoice::File(missing.clone()), ..flags() }),
            format!("--shim {}: no such file", missing.display())
        );
        let binary = dir.path().join("kforge");
        let beside = Config::from_flags(
            "/tmp/s.sock".into(),
            DaemonFlags { shim: ShimChoice::BesideBinary(binary.clone()), ..flags() },
        );
        assert_eq!(beside.unwrap().shim, None, "no shim beside the binary: none");
        let shim = dir.path().join("libkforge_shim.so");
        std::fs::write(&shim, b"").unwrap();
        let beside =
            Config::from_flags("/tmp/s.sock".into(), DaemonFlags { shim: ShimChoice::BesideBinary(binary), ..flags() });
        assert_eq!(beside.unwrap().shim, Some(shim.clone()));
        let explicit =
            Config::from_flags("/tmp/s.sock".into(), DaemonFlags { shim: ShimChoice::File(shim.clone()), ..flags() });
        assert_eq!(explicit.unwrap().shim, Some(shim.canonicalize().unwrap()));
        assert_eq!(Config::from_flags("/tmp/s.sock".into(), flags()).unwrap().shim, None);
    }
}
