//! `kforge`: the command-line front of the kforge libraries. Thin: argument parsing, printing,
//! exit codes. Everything else lives in the library crates.

mod inspect;
mod job;
mod verify;
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use kforge_client::{resolve_socket, Client};
use kforge_proto::{Policy, Reply, Request, SubmitSpec};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "kforge",
    version,
    about = "Benchmark GPU kernels concurrently on shared GPUs; only timed regions are exclusive."
)]
struct Cli {
    /// Daemon socket (else $KFORGE_SOCKET, else $XDG_RUNTIME_DIR/kforge/kforge.sock or /tmp/kforge-<uid>/kforge.sock).
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the node daemon: manages devices, runs submitted commands, grants exclusive regions.
    Daemon(DaemonArgs),
    /// Submit a benchmark command and stream its output; exits with the command's exit code.
    Run(RunArgs),
    /// Show devices, freeze and isolation mechanisms, jobs, region queues and holders.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Without RUN files: dump what the daemon's store recorded (jobs, regions, measurements) as
    /// JSON. With run manifests (`*.run.json` from `kforge workload truth|run`): the evaluation
    /// report — throughput, inflation per duration bucket, ranking fidelity, region statistics.
    Report {
        /// Run manifests; exactly one must be the ground truth.
        runs: Vec<PathBuf>,
        /// Only jobs with this label (store dump).
        #[arg(long)]
        label: Option<String>,
        /// Write JSON to this file (`-` or no value: standard output).
        #[arg(long, num_args = 0..=1, default_missing_value = "-")]
        json: Option<String>,
        /// Write a self-contained HTML page with plots (evaluation report).
        #[arg(long)]
        html: Option<PathBuf>,
        /// Percent: the resolved ranking counts only candidate pairs whose ground truths differ by
        /// at least this much (closer pairs are within what the idle GPU repeats to).
        #[arg(long, value_name = "PCT", default_value_t = kforge_eval::report::DEFAULT_MIN_GAP * 100.0)]
        min_gap: f64,
    },
    /// Inventory a problem compiled with torch.compile: its Triton kernels and vendor-library
    /// calls in launch order, GPU time per entry, which are replaceable, per-kernel replay and a
    /// re-stitch round trip. Runs the capture on a GPU (Python, torch, Triton), or reads a saved one.
    Inspect(inspect::InspectArgs),
    /// Verify a candidate (a ModelNew file) against a problem through the gate cascade: static,
    /// dry run, multi-seed correctness, model level (fp64 rule), exploit checks, performance.
    /// Exit 0 accepted (or passed without the performance gate), 1 rejected, 2 could not run.
    Verify(verify::VerifyArgs),
    /// Agent-like benchmark workloads: generate, time in isolation, run under a policy.
    Workload {
        #[command(subcommand)]
        cmd: WorkloadCmd,
    },
    /// Cancel a queued or running job (kills its process tree).
    Cancel {
        /// Job id (from `kforge status`).
        job: u64,
    },
    /// Stop the daemon: running jobs are killed, queued jobs fail.
    Shutdown,
    /// The main demo: a private daemon, a generated workload of short CPU benchmark commands under
    /// the none, command and region policies, plus ground truth; prints a table. No GPU needed.
    Demo(kforge_demo::DemoArgs),
    /// Benchmark the runtime itself: uncontended region round trip and contended hand-over.
    BenchRuntime(kforge_demo::BenchArgs),
    /// Internal: the guardian process a daemon starts (kills its jobs if it dies).
    #[command(name = "__guardian", hide = true)]
    Guardian {
        #[arg(long)]
        ledger: PathBuf,
    },
    /// Debugging and test helpers.
    #[command(hide = true)]
    Debug {
        #[command(subcommand)]
        cmd: DebugCmd,
    },
}

#[derive(Subcommand)]
enum WorkloadCmd {
    /// Generate a workload (JSON Lines) and its candidate script next to it.
    Gen {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// gpu: Triton candidates of six operators; cpu: stdlib-Python candidates (runs anywhere).
        #[arg(long, value_enum, default_value = "gpu")]
        profile: kforge_eval::workload::Profile,
        /// Least commands per duration bucket (<0.1, 0.1-1, 1-10, >10 ms, by estimate).
        #[arg(long, default_value_t = 50)]
        per_bucket: usize,
        /// Python used to list the gpu candidate space (no GPU needed).
        #[arg(long, default_value = "python3")]
        python: String,
    },
    /// Time every command alone, one at a time (the ground truth), its timed part in a region
    /// (settled GPU, clocks recorded); writes truth.run.json.
    Truth {
        /// The workload (JSON Lines from `kforge workload gen`).
        workload: PathBuf,
        /// Run the commands in a warm worker (same timing protocol, no interpreter start-up).
        #[arg(long)]
        warm: bool,
        /// Manifest name (default truth, or truth-warm; -OFFSET added when --offset or --limit
        /// is given). Name a second GPU's truth apart, e.g. truth-gpu1.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        common: WorkloadCommon,
    },
    /// Run the workload concurrently under a policy; writes NAME.run.json.
    Run {
        /// The workload (JSON Lines from `kforge workload gen`).
        workload: PathBuf,
        /// Isolation policy of every command.
        #[arg(long, value_parser = ["region", "command", "none"])]
        policy: String,
        /// Ablation step under the region policy (each adds one mechanism).
        #[arg(long, value_enum, default_value = "isolate")]
        ablation: kforge_eval::runner::Ablation,
        /// Same as --ablation warm.
        #[arg(long)]
        warm: bool,
        /// Commands in flight.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Run name (default: policy, plus ablation under region).
        #[arg(long)]
        name: Option<String>,
        /// With --device all: send each command to the least busy GPU, not to the GPU of its
        /// candidate group (more even load; candidate pairs split over two GPUs are not ranked).
        #[arg(long)]
        no_gpu_groups: bool,
        #[command(flatten)]
        common: WorkloadCommon,
    },
}

#[derive(clap::Args)]
struct WorkloadCommon {
    /// auto (the first GPU, else cpu), cpu, a GPU index, or all (runs only: every GPU, --concurrency
    /// commands in flight on each, each candidate group on one GPU, picked by load when its first
    /// command starts — for scaling runs; see --no-gpu-groups).
    #[arg(long, default_value = "auto")]
    device: String,
    /// Store of all runs (default: kforge-eval.db beside the workload).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Cores reserved for measuring threads in the isolate and warm steps.
    #[arg(long, default_value_t = 1)]
    reserve_cores: usize,
    /// Skip the first N commands (split a long run over several calls).
    #[arg(long, default_value_t = 0)]
    offset: usize,
    /// Run only N commands (after --offset).
    #[arg(long)]
    limit: Option<usize>,
    /// Time limit per command, seconds.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Longest wait, before each region, for the GPU's power-cap throttling to clear (0: no
    /// settle step). Default: the ablation step's (1500 from freeze on, 0 before).
    #[arg(long, value_name = "MS")]
    settle_timeout_ms: Option<u64>,
}

#[derive(Subcommand)]
enum DebugCmd {
    /// A process that submits fake work honouring a gate segment (as the CUDA shim will).
    Submitter {
        #[arg(long, env = "KFORGE_GATE")]
        gate: PathBuf,
        #[arg(long)]
        log: PathBuf,
        /// Submissions to make (0 = until killed).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// How long each fake submission stays in flight, in microseconds.
        #[arg(long, default_value_t = 2000)]
        in_flight_us: u64,
    },
}

#[derive(clap::Args)]
struct DaemonArgs {
    /// SQLite store (`:memory:` keeps nothing).
    #[arg(long)]
    db: Option<PathBuf>,
    /// GPUs to manage: all, none, or indices such as 0,2.
    #[arg(long, default_value = "all")]
    gpus: String,
    /// Default isolation policy for jobs that do not choose one.
    #[arg(long, default_value = "region", value_parser = ["region", "command", "none"])]
    policy: String,
    /// Which sibling jobs a region freezes.
    #[arg(long, default_value = "device", value_parser = ["none", "device", "node"])]
    freeze: String,
    /// Freeze mechanism; auto picks cgroup2, then cgroup1, then signals.
    #[arg(long, default_value = "auto", value_parser = ["auto", "cgroup2", "cgroup1", "signals"])]
    freeze_mechanism: String,
    /// Cores kept for region holders' measuring threads (jobs run on the others).
    #[arg(long, default_value_t = 0)]
    reserve_cores: usize,
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
    /// Run every Python command in a warm worker when its command line allows (as `run --warm`).
    #[arg(long)]
    warm_python: bool,
    /// Default time limit of a job in seconds (`run --timeout` overrides).
    #[arg(long)]
    job_timeout_s: Option<f64>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// auto, cpu, or a GPU index.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Isolation policy (default: the daemon's).
    #[arg(long, value_parser = ["region", "command", "none"])]
    policy: Option<String>,
    /// Label stored with the job (to group a run in reports).
    #[arg(long)]
    label: Option<String>,
    /// Run the Python command in a warm worker (preloaded torch/triton, live CUDA context).
    #[arg(long)]
    warm: bool,
    /// Kill the job after this many seconds.
    #[arg(long)]
    timeout: Option<f64>,
    /// Run on the same GPU as the other jobs of this group (e.g. one operator's candidates, so
    /// that they are compared on one GPU): with --device auto, on the group's GPU — where its
    /// first job went, or where a job of it was last sent with --device N.
    #[arg(long, value_name = "NAME")]
    gpu_group: Option<String>,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn main() {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("kforge: {e:#}");
            std::process::exit(2);
        }
    }
}

fn real_main(cli: Cli) -> Result<i32> {
    let socket = resolve_socket(cli.socket.as_deref());
    match cli.cmd {
        Cmd::Daemon(a) => daemon(socket, a),
        Cmd::Run(a) => run(socket, a),
        Cmd::Status { json } => status(socket, json),
        Cmd::Report { runs, label, json, html, min_gap } => report(socket, runs, label, json, html, min_gap),
        Cmd::Workload { cmd } => workload(cmd),
        Cmd::Inspect(a) => inspect::inspect(a, socket),
        Cmd::Verify(a) => verify::verify(a, socket),
        Cmd::Cancel { job } => {
            Client::connect(&socket)?.request(&Request::Cancel { job })?;
            println!("job {job} cancelled");
            Ok(0)
        }
        Cmd::Shutdown => {
            Client::connect(&socket)?.request(&Request::Shutdown)?;
            Ok(0)
        }
        Cmd::Demo(a) => kforge_demo::demo(&std::env::current_exe().context("locating the kforge binary")?, a),
        Cmd::BenchRuntime(a) => {
            kforge_demo::bench_runtime(&std::env::current_exe().context("locating the kforge binary")?, a)
        }
        Cmd::Guardian { ledger } => {
            kforge_daemon::guardian::run_guardian(&ledger)
                .with_context(|| format!("guardian for {}", ledger.display()))?;
            Ok(0)
        }
        Cmd::Debug { cmd: DebugCmd::Submitter { gate, log, count, in_flight_us } } => {
            kforge_gate::run_test_submitter(&gate, &log, count, Duration::from_micros(in_flight_us))
                .with_context(|| format!("test submitter on {}", gate.display()))?;
            Ok(0)
        }
    }
}

/// Put the embedded Python package first on `cmd`'s PYTHONPATH; the returned directory holds it
/// and must outlive the command.
pub(crate) fn embedded_python(cmd: &mut std::process::Command) -> Result<tempfile::TempDir> {
    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    kforge_python::write_package(tmp.path()).context("writing the embedded Python package")?;
    let pp = std::env::var_os("PYTHONPATH").map(|p| format!("{}:{}", tmp.path().display(), p.to_string_lossy()));
    cmd.env("PYTHONPATH", pp.unwrap_or_else(|| tmp.path().display().to_string()));
    Ok(tmp)
}

pub(crate) fn write_out(dest: &str, body: &str) -> Result<()> {
    if dest == "-" {
        println!("{body}");
        Ok(())
    } else {
        std::fs::write(dest, body).with_context(|| format!("writing {dest}"))
    }
}

fn report(
    socket: PathBuf,
    runs: Vec<PathBuf>,
    label: Option<String>,
    json: Option<String>,
    html: Option<PathBuf>,
    min_gap: f64,
) -> Result<i32> {
    if runs.is_empty() {
        if html.is_some() {
            bail!("--html needs run manifests (`kforge report truth.run.json region.run.json … --html out.html`)");
        }
        let mut c = Client::connect(&socket)?;
        match c.request(&Request::Report { label })? {
            Reply::Report { report } => {
                write_out(json.as_deref().unwrap_or("-"), &serde_json::to_string_pretty(&report)?)?
            }
            other => bail!("unexpected reply {other:?}"),
        }
        return Ok(0);
    }
    if !(min_gap.is_finite() && min_gap >= 0.0) {
        bail!("--min-gap is a percentage >= 0 (2 for 2 %), not {min_gap}");
    }
    let manifests = runs.iter().map(|p| kforge_eval::runner::RunManifest::load(p)).collect::<Result<Vec<_>>>()?;
    let r = kforge_eval::report::compute_with(
        &manifests,
        &kforge_eval::report::ReportOptions { min_gap: min_gap / 100.0 },
    )?;
    if let Some(dest) = &json {
        write_out(dest, &serde_json::to_string_pretty(&r)?)?;
    }
    if let Some(p) = &html {
        std::fs::write(p, kforge_eval::html::render(&r)).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("kforge report: wrote {}", p.display());
    }
    if json.as_deref() != Some("-") {
        print!("{}", kforge_eval::report::table(&r));
    }
    Ok(0)
}

fn workload(cmd: WorkloadCmd) -> Result<i32> {
    use kforge_eval::runner::{Ablation, RunOptions};
    use kforge_eval::workload::{self, Profile};
    let exe = std::env::current_exe().context("locating the kforge binary")?;
    let options = |w: &PathBuf, c: &WorkloadCommon, policy, ablation, concurrency, name: String, truth| -> RunOptions {
        let db = c.db.clone().unwrap_or_else(|| {
            w.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new(".")).join("kforge-eval.db")
        });
        RunOptions {
            kforge: exe.clone(),
            workload: w.clone(),
            policy,
            ablation,
            concurrency,
            device: c.device.clone(),
            name,
            truth,
            db,
            reserve_cores: c.reserve_cores,
            offset: c.offset,
            limit: c.limit,
            timeout: Duration::from_secs(c.timeout_s),
            settle_timeout_ms: c.settle_timeout_ms,
            gpu_groups: false,
        }
    };
    match cmd {
        WorkloadCmd::Gen { out, seed, profile, per_bucket, python } => {
            let list = match profile {
                Profile::Cpu => None,
                Profile::Gpu => {
                    let dir = tempfile::tempdir().context("creating a temporary directory")?;
                    let script = dir.path().join("eval_gpu.py");
                    std::fs::write(&script, workload::EVAL_GPU_PY)
                        .with_context(|| format!("writing {}", script.display()))?;
                    let o = std::process::Command::new(&python)
                        .arg(&script)
                        .arg("--list")
                        .output()
                        .with_context(|| format!("running {python}"))?;
                    if !o.status.success() {
                        bail!("{python} eval_gpu.py --list failed: {}", String::from_utf8_lossy(&o.stderr));
                    }
                    Some(serde_json::from_slice(&o.stdout).context("reading the gpu candidate list")?)
                }
            };
            let cmds = workload::generate(profile, seed, per_bucket, list.as_ref())?;
            workload::write(&out, &cmds)?;
            let mut counts = [0usize; 4];
            for c in &cmds {
                counts[kforge_eval::report::bucket_of(c.est_ms)] += 1;
            }
            println!("{} commands written to {} (seed {seed}); by estimated duration:", cmds.len(), out.display());
            for (b, n) in kforge_eval::report::BUCKETS.iter().zip(counts) {
                println!("  {b:<9} {n}");
            }
            Ok(0)
        }
        WorkloadCmd::Truth { workload, warm, name, common } => {
            let ablation = if warm { Ablation::Warm } else { Ablation::Isolate };
            // A warm truth is named apart from a cold one: one state may hold both (to compare them).
            let base = name.as_deref().unwrap_or(if warm { "truth-warm" } else { "truth" });
            let name = if common.offset > 0 || common.limit.is_some() {
                format!("{base}-{}", common.offset)
            } else {
                base.into()
            };
            let (m, path) =
                kforge_eval::runner::run(&options(&workload, &common, Policy::Command, ablation, 1, name, true))?;
            println!(
                "ground truth: {} commands in {:.1} s, {} failed; manifest {}",
                m.commands,
                m.wall_s,
                m.failed.len(),
                path.display()
            );
            Ok(if m.failed.is_empty() { 0 } else { 1 })
        }
        WorkloadCmd::Run { workload, policy, ablation, warm, concurrency, name, no_gpu_groups, common } => {
            let policy = Policy::parse(&policy).expect("clap checked");
            let ablation = if warm { Ablation::Warm } else { ablation };
            let name = name.unwrap_or_else(|| {
                if policy == Policy::Region {
                    format!("region-{}", ablation.as_str())
                } else {
                    policy.as_str().to_string()
                }
            });
            let o = RunOptions {
                gpu_groups: !no_gpu_groups,
                ..options(&workload, &common, policy, ablation, concurrency, name, false)
            };
            let (m, path) = kforge_eval::runner::run(&o)?;
            println!(
                "{}: {} commands in {:.1} s ({:.1}/min), {} failed; manifest {}",
                m.name,
                m.commands,
                m.wall_s,
                m.commands as f64 / m.wall_s * 60.0,
                m.failed.len(),
                path.display()
            );
            Ok(if m.failed.is_empty() { 0 } else { 1 })
        }
    }
}

fn daemon(socket: PathBuf, a: DaemonArgs) -> Result<i32> {
    let mut cfg = kforge_daemon::Config::new(socket);
    if let Some(db) = a.db {
        cfg.db = db;
    }
    cfg.gpus = kforge_daemon::GpuSelection::parse(&a.gpus)?;
    cfg.default_policy = Policy::parse(&a.policy).expect("clap checked");
    cfg.freeze_scope = kforge_daemon::FreezeScope::parse(&a.freeze).expect("clap checked");
    cfg.freeze_mechanism = match a.freeze_mechanism.as_str() {
        "auto" => None,
        m => Some(kforge_freeze::MechanismKind::parse(m).expect("clap checked")),
    };
    cfg.reserve_cores = a.reserve_cores;
    if a.max_concurrent == Some(0) {
        bail!("--max-concurrent must be at least 1");
    }
    cfg.max_concurrent = a.max_concurrent;
    if a.lease_ms == 0 {
        bail!("--lease-ms must be positive");
    }
    cfg.lease = Duration::from_millis(a.lease_ms);
    cfg.drain_timeout = Duration::from_millis(a.drain_timeout_ms);
    cfg.settle_timeout = Duration::from_millis(a.settle_timeout_ms);
    if !(0.0..=1.0).contains(&a.settle_power_fraction) {
        bail!("--settle-power-fraction must lie in [0, 1], got {}", a.settle_power_fraction);
    }
    cfg.settle_power_fraction = a.settle_power_fraction;
    cfg.drain = !a.no_drain;
    cfg.warm_workers = a.warm_workers;
    cfg.worker_python = a.worker_python;
    cfg.worker_preload = a.worker_preload;
    if a.worker_max_jobs == 0 {
        bail!("--worker-max-jobs must be at least 1");
    }
    cfg.worker_max_jobs = a.worker_max_jobs;
    cfg.worker_max_rss_mb = a.worker_max_rss_mb;
    cfg.warm_python = a.warm_python;
    cfg.job_timeout = match a.job_timeout_s {
        Some(t) if !(t > 0.0 && t.is_finite()) => bail!("--job-timeout-s must be a positive number of seconds"),
        Some(t) => Some(Duration::from_secs_f64(t)),
        None => None,
    };
    cfg.shim = if a.no_shim {
        None
    } else {
        match a.shim {
            Some(p) if p.is_file() => {
                Some(p.canonicalize().with_context(|| format!("resolving --shim {}", p.display()))?)
            }
            Some(p) => bail!("--shim {}: no such file", p.display()),
            None => {
                let beside =
                    std::env::current_exe().context("locating the kforge binary")?.with_file_name("libkforge_shim.so");
                beside.is_file().then_some(beside)
            }
        }
    };
    // SIGINT/SIGTERM are taken by a thread that asks the daemon to stop cleanly.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let exe = std::env::current_exe().context("locating the kforge binary for the guardian")?;
    let handle = kforge_daemon::server::start(cfg.clone(), Some(vec![exe.into_os_string(), "__guardian".into()]))
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
    let stopper = handle.shutdown_sender();
    std::thread::spawn(move || {
        let mut sig: libc::c_int = 0;
        // SAFETY: set is initialized; sigwait writes the signal number.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
            let _ = stopper.send(kforge_daemon::state::Event::Shutdown);
        }
    });
    handle.wait().context("daemon stopped with an error")?;
    eprintln!("kforge daemon: stopped");
    Ok(0)
}

fn run(socket: PathBuf, a: RunArgs) -> Result<i32> {
    let c = Client::connect(&socket)?;
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let spec = SubmitSpec {
        argv: a.command,
        cwd: cwd.display().to_string(),
        env: std::env::vars().collect(),
        device: a.device,
        policy: a.policy.as_deref().and_then(Policy::parse),
        label: a.label,
        warm: a.warm,
        timeout_ms: match a.timeout {
            Some(t) if !(t > 0.0 && t.is_finite()) => bail!("--timeout must be a positive number of seconds"),
            Some(t) => Some((t * 1e3).ceil() as u64),
            None => None,
        },
        gpu_group: a.gpu_group,
    };
    let grouped = spec.gpu_group.is_some();
    let job = c.submit(spec)?;
    if grouped && job.gpu_group.is_none() {
        eprintln!("kforge run: warning: the daemon ignored --gpu-group (a daemon older than GPU groups)");
    }
    let exit = job.stream_output(&mut std::io::stdout().lock(), &mut std::io::stderr())?;
    if let Some(r) = &exit.reason {
        eprintln!("kforge: job ended: {r}");
    }
    Ok(exit.shell_code())
}

fn status(socket: PathBuf, json: bool) -> Result<i32> {
    let mut c = Client::connect(&socket)?;
    let Reply::Status(s) = c.request(&Request::Status)? else { bail!("unexpected reply to status") };
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(0);
    }
    println!("daemon pid {}  protocol {}  socket {}", s.daemon_pid, s.protocol, s.socket);
    println!("store      {}", s.db);
    println!("policy     {} (default)", s.default_policy.as_str());
    println!("freeze     {} (scope {})", s.freeze_mechanism, s.freeze_scope);
    println!("isolation  {}", s.isolation);
    println!("gate shim  {}", s.gate_shim.as_deref().unwrap_or("none (GPU work of other jobs is not held or drained)"));
    println!();
    println!(
        "{:<6} {:<5} {:>4} {:>7} {:>6}  {:<24} REGION QUEUE",
        "DEVICE", "KIND", "MAX", "RUNNING", "QUEUED", "REGION HOLDER"
    );
    for d in &s.devices {
        let holder = d
            .region_holder
            .as_ref()
            .map(|r| {
                format!(
                    "#{} {} (job {}) {:.0} ms",
                    r.region,
                    r.name,
                    r.job.map(|j| j.to_string()).unwrap_or("-".into()),
                    r.since_ms
                )
            })
            .unwrap_or("-".into());
        let queue: Vec<String> = d.region_queue.iter().map(|r| format!("#{}", r.region)).collect();
        println!(
            "{:<6} {:<5} {:>4} {:>7} {:>6}  {:<24} {}",
            d.name,
            d.kind,
            d.max_concurrent,
            d.running.len(),
            d.queued.len(),
            holder,
            if queue.is_empty() { "-".into() } else { queue.join(" ") }
        );
        println!("       {}", d.description);
        if d.gpu_groups > 0 {
            println!("       GPU groups bound here: {}", d.gpu_groups);
        }
        let p = &d.pool;
        if p.size > 0 || !p.recycled.is_empty() {
            let recycled: Vec<String> = p.recycled.iter().map(|(k, v)| format!("{v}× {k}")).collect();
            println!(
                "       warm pool: size {}, warm {}, busy {}, starting {}, jobs served {}, recycled {}{}",
                p.size,
                p.warm,
                p.busy,
                p.starting,
                p.jobs_served,
                if recycled.is_empty() { "0".into() } else { recycled.join(", ") },
                p.disabled.as_ref().map(|d| format!(" — DISABLED: {d}")).unwrap_or_default()
            );
        }
    }
    if !s.jobs.is_empty() {
        println!();
        println!("{:>6} {:<6} {:<8} {:<8} {:>8} {:<6} COMMAND", "JOB", "DEVICE", "POLICY", "STATE", "PID", "FROZEN");
        for j in &s.jobs {
            println!(
                "{:>6} {:<6} {:<8} {:<8} {:>8} {:<6} {}",
                j.job,
                j.device,
                j.policy.as_str(),
                j.state,
                j.pid.map(|p| p.to_string()).unwrap_or("-".into()),
                if j.frozen { "yes" } else { "no" },
                j.argv.join(" ")
            );
        }
    }
    Ok(0)
}
