//! `kforge daemon`: its flags, mapped onto `kforge_daemon::DaemonFlags` (checked there), then the
//! daemon run in this process until SIGINT, SIGTERM or `kforge shutdown`.

use crate::values::{FreezeScopeArg, MechanismArg, PolicyArg};
use anyhow::{Context, Result};
use kforge_daemon::config::{DaemonFlags, ShimChoice};
use kforge_daemon::signals::ShutdownSignals;
use kforge_daemon::Config;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DaemonArgs {
    /// SQLite store (`:memory:` keeps nothing).
    #[arg(long)]
    db: Option<PathBuf>,
    /// GPUs to manage: all, none, or indices such as 0,2.
    #[arg(long, default_value = "all")]
    gpus: String,
    /// Default isolation policy for jobs that do not choose one.
    #[arg(long, value_enum, default_value = "region")]
    policy: PolicyArg,
    /// Which sibling jobs a region freezes.
    #[arg(long, value_enum, default_value = "device")]
    freeze: FreezeScopeArg,
    /// Freeze mechanism; auto picks cgroup2, then cgroup1, then signals.
    #[arg(long, value_enum, default_value = "auto")]
    freeze_mechanism: MechanismArg,
    /// Physical cores kept for region holders' measuring threads: one cpu of each, its SMT
    /// siblings (from /sys topology) kept idle, so no job thread shares a measuring thread's core
    /// (shared after all where that would leave no cpu for jobs; `kforge status` says which);
    /// jobs run on the other cpus.
    #[arg(long, default_value_t = 0)]
    reserve_cores: usize,
    /// The cpus of region holders' measuring threads, chosen instead of the lowest-numbered ones
    /// that --reserve-cores takes: a cpu list such as `8,9` or `8-9`, one cpu per physical core,
    /// their SMT siblings kept idle. For a cpu away from the one that takes the interrupts (often
    /// cpu 0; the store's `region_host` rows show each region's irq and steal time), or near the GPU.
    #[arg(long, value_name = "LIST")]
    region_cpus: Option<String>,
    /// Concurrent commands per device (default: cpu 2 per job core, GPU 4).
    #[arg(long)]
    max_concurrent: Option<usize>,
    /// Default region lease in milliseconds; a region held longer is revoked.
    #[arg(long, default_value_t = 60_000)]
    lease_ms: u64,
    /// Longest wait for managed processes to drain their GPU work, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    drain_timeout_ms: u64,
    /// Close the gate but do not wait for managed processes to drain (ablation studies only).
    #[arg(long)]
    no_drain: bool,
    /// Longest wait, entering a region on a GPU, for power-cap or thermal clock throttling left
    /// by other jobs' load to clear, in milliseconds (0: do not wait).
    #[arg(long, default_value_t = 1_500)]
    settle_timeout_ms: u64,
    /// Settle also waits until the GPU's (1 s averaged) power draw is at most this fraction of
    /// its enforced power limit: right after other jobs' heavy load the power-cap controller
    /// still counts their draw and clocks a power-bound kernel down (0: do not wait for power).
    #[arg(long, default_value_t = 0.5)]
    settle_power_fraction: f64,
    /// The gate shim preloaded into GPU jobs (default: libkforge_shim.so next to this binary).
    #[arg(long)]
    shim: Option<PathBuf>,
    /// Run GPU jobs without the gate shim (debugging: their work is then neither held nor drained).
    #[arg(long)]
    no_shim: bool,
    /// Warm workers per device (default: a GPU's concurrency limit; 0 on the cpu device).
    #[arg(long)]
    warm_workers: Option<usize>,
    /// Interpreter of the warm workers.
    #[arg(long, default_value = "python3")]
    worker_python: String,
    /// Modules warm workers import at start, comma-separated (`auto`: torch and triton when importable).
    #[arg(long, default_value = "auto")]
    worker_preload: String,
    /// Recycle a warm worker after this many jobs.
    #[arg(long, default_value_t = 100)]
    worker_max_jobs: u32,
    /// Recycle a warm worker whose resident memory exceeds this many MiB (0: no ceiling).
    #[arg(long, default_value_t = 0)]
    worker_max_rss_mb: u64,
    /// Warm workers fork a child for each job instead of running it in-process: each job is
    /// then as isolated as a fresh process (for `kforge verify --daemon --warm`), the imports
    /// still saved; the workers create no CUDA context (each job does).
    #[arg(long)]
    worker_fork: bool,
    /// Run every Python command in a warm worker when its command line allows (as `run --warm`).
    #[arg(long)]
    warm_python: bool,
    /// Default time limit of a job in seconds (`run --timeout` overrides).
    #[arg(long)]
    job_timeout_s: Option<f64>,
    /// Test hook: read device memory (free/total, per-pid use) from this JSON file, re-read at
    /// every sample, instead of NVML (docs/protocol.md, "GPU memory admission").
    #[arg(long, hide = true, value_name = "FILE")]
    debug_gpu_memory: Option<PathBuf>,
}

impl DaemonArgs {
    fn flags(self, binary: PathBuf) -> DaemonFlags {
        let shim = match (self.no_shim, self.shim) {
            (true, _) => ShimChoice::Off,
            (false, Some(p)) => ShimChoice::File(p),
            (false, None) => ShimChoice::BesideBinary(binary),
        };
        DaemonFlags {
            db: self.db,
            gpus: self.gpus,
            default_policy: self.policy.into(),
            freeze_scope: self.freeze.into(),
            freeze_mechanism: self.freeze_mechanism.forced(),
            reserve_cores: self.reserve_cores,
            region_cpus: self.region_cpus,
            max_concurrent: self.max_concurrent,
            lease_ms: self.lease_ms,
            drain_timeout_ms: self.drain_timeout_ms,
            no_drain: self.no_drain,
            settle_timeout_ms: self.settle_timeout_ms,
            settle_power_fraction: self.settle_power_fraction,
            shim,
            warm_workers: self.warm_workers,
            worker_python: self.worker_python,
            worker_preload: self.worker_preload,
            worker_max_jobs: self.worker_max_jobs,
            worker_max_rss_mb: self.worker_max_rss_mb,
            worker_fork: self.worker_fork,
            warm_python: self.warm_python,
            job_timeout_s: self.job_timeout_s,
            debug_gpu_memory: self.debug_gpu_memory,
        }
    }
}

pub fn daemon(socket: PathBuf, a: DaemonArgs) -> Result<i32> {
    let exe = crate::output::this_binary()?;
    let cfg = Config::from_flags(socket, a.flags(exe.clone()))?;
    let signals = ShutdownSignals::block();
    let guardian = vec![exe.into_os_string(), "__guardian".into()];
    let handle = kforge_daemon::server::start(cfg.clone(), Some(guardian))
        .with_context(|| format!("starting the daemon on {}", cfg.socket.display()))?;
    eprintln!(
        "kforge daemon: listening on {} (pid {}, store {}, freezing with {})",
        handle.socket.display(),
        std::process::id(),
        cfg.db.display(),
        handle.freeze_mechanism
    );
    match &cfg.shim {
        Some(s) => eprintln!("kforge daemon: GPU jobs preload the gate shim {}", s.display()),
        None => eprintln!(
            "kforge daemon: no gate shim: GPU submissions of other jobs are not held or drained during regions"
        ),
    }
    signals.stop_daemon_on_receipt(&handle);
    handle.wait().context("daemon stopped with an error")?;
    eprintln!("kforge daemon: stopped");
    Ok(0)
}
