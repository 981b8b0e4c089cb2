//! `kforge profile`: Nsight Compute over a compiled problem's forward (`ncu … python3 -m
//! kforge.inspect.profile`, the embedded package), or a CSV ncu wrote, read into per-kernel
//! speed-of-light rows with the strategy analyst's tier; a table, and the JSON report.

use anyhow::{bail, Context, Result};
use clap::Args;
use kforge_agents::analyst::Tier;
use kforge_ncu::{KernelRow, Profile};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

#[derive(Args)]
pub struct ProfileArgs {
    /// A KernelBench-format problem (class Model, get_inputs(), get_init_inputs()), a standalone
    /// Triton kernel file (kernel_function(*inputs), get_inputs(); --mode and --size do not
    /// apply), or with --from-csv a CSV that ncu wrote (its raw page or its default details page).
    source: PathBuf,
    /// torch.compile mode: default, reduce-overhead (CUDA graphs), max-autotune,
    /// max-autotune-no-cudagraphs.
    #[arg(long, default_value = "default")]
    mode: String,
    /// A problem's size preset: default or large (its LARGE dict, see problems/README.md).
    #[arg(long, default_value = "default")]
    size: String,
    /// Forwards inside the profiled range (after three warm-up forwards); ncu replays every
    /// kernel launch of each, so a forward of many kernels takes a while.
    #[arg(long, default_value_t = 1)]
    forwards: u32,
    /// How ncu treats the caches between a kernel's replays: all (flushed before each: cold-cache
    /// numbers, ncu's default) or none (as the previous replay left them).
    #[arg(long, default_value = "all")]
    cache_control: String,
    /// Kill ncu and the program after this many seconds (default: no limit). ncu replays every
    /// launch, so a forward of many kernels takes minutes.
    #[arg(long, value_name = "S")]
    timeout_s: Option<u64>,
    /// SOURCE is a CSV ncu wrote: read it (no GPU, no ncu needed).
    #[arg(long)]
    from_csv: bool,
    /// Nsight Compute's command-line profiler.
    #[arg(long, env = "KFORGE_NCU", default_value = "ncu")]
    ncu: String,
    /// GPU index to profile on (sets CUDA_VISIBLE_DEVICES; default: what the environment says).
    #[arg(long)]
    device: Option<String>,
    /// Python interpreter with torch and Triton.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Also keep ncu's CSV here (reusable with --from-csv).
    #[arg(long)]
    csv_out: Option<PathBuf>,
    /// Write the JSON report to this file (`-`: standard output).
    #[arg(long)]
    json: Option<String>,
    /// Run ncu as a job of the kforge daemon (--socket): the profiled forwards are a region, so
    /// no other job's kernels run while ncu replays them.
    #[arg(long)]
    daemon: bool,
    /// With --daemon: the job's peak GPU memory, GiB, for the daemon's admission (default: what
    /// earlier profiles of the same problem, size and mode used, else the daemon's default).
    #[arg(long, value_name = "GIB", requires = "daemon")]
    gpu_memory: Option<f64>,
}

fn check(a: &ProfileArgs) -> Result<()> {
    crate::inspect::check_mode_and_size(&a.mode, &a.size)?;
    if a.forwards == 0 {
        bail!("--forwards must be at least 1");
    }
    if kforge_ncu::CacheControl::from_name(&a.cache_control).is_none() {
        bail!("--cache-control must be all or none, got {:?}", a.cache_control);
    }
    if a.timeout_s == Some(0) {
        bail!("--timeout-s must be at least 1");
    }
    if !a.source.is_file() {
        bail!("{}: no such file", a.source.display());
    }
    Ok(())
}

/// One run of ncu: where its CSV and the program's measured peaks go, the metrics asked for and
/// the time it may take.
struct Attempt<'a> {
    csv: &'a Path,
    peaks: &'a Path,
    metrics: &'a [&'static str],
    timeout_s: Option<u64>,
}

/// ncu's command line, then the profiled program's.
fn argv(a: &ProfileArgs, at: &Attempt) -> Result<Vec<String>> {
    let src = std::fs::canonicalize(&a.source).with_context(|| format!("resolving {}", a.source.display()))?;
    let mut v = vec![a.ncu.clone()];
    let cache = kforge_ncu::CacheControl::from_name(&a.cache_control).unwrap_or(kforge_ncu::CacheControl::All);
    v.extend(kforge_ncu::args(at.csv, cache, at.metrics));
    v.extend([a.python.clone(), "-m".into(), "kforge.inspect.profile".into(), src.display().to_string()]);
    v.extend(["--mode".to_string(), a.mode.clone(), "--size".into(), a.size.clone()]);
    v.extend(["--forwards".to_string(), a.forwards.to_string()]);
    v.extend(["--peaks-out".to_string(), at.peaks.display().to_string()]);
    Ok(v)
}

/// How ncu ended, judged with what it wrote: the table when there is one (a program that
/// crashed at teardown, after the range, still profiled it: a warning says how it ended);
/// status 2 without one is the program's own reported failure; otherwise ncu's messages.
fn judge(a: &ProfileArgs, code: Option<i32>, how: &str, csv: &Path) -> Result<Vec<kforge_ncu::Launch>> {
    let log = std::fs::read_to_string(csv).unwrap_or_default();
    let parsed = kforge_ncu::parse(&log);
    match (code, parsed) {
        (Some(0), parsed) => parsed.with_context(|| format!("profile of {}", a.source.display())),
        (_, Ok(launches)) if !launches.is_empty() => {
            eprintln!(
                "kforge profile: warning: {} under {} ended with {how}; its table is read",
                a.source.display(),
                a.ncu
            );
            Ok(launches)
        }
        (Some(2), _) => bail!("profile of {} failed (reason above)", a.source.display()),
        (_, Err(e @ kforge_ncu::NcuError::NoTable { .. })) => {
            Err(anyhow::Error::new(e).context(format!("{} under {} ended with {how}", a.source.display(), a.ncu)))
        }
        _ => bail!("{} under {} ended with {how}", a.source.display(), a.ncu),
    }
}

/// Wait for `child` (the leader of its own process group); past `limit`, kill the group.
/// `Ok(None)`: killed for the limit.
fn wait_within(child: &mut std::process::Child, limit: Option<u64>) -> Result<Option<std::process::ExitStatus>> {
    let Some(limit) = limit else {
        return child.wait().map(Some).context("waiting for ncu");
    };
    let pid = child.id() as i32;
    let (done, ended) = mpsc::channel::<()>();
    let watcher = std::thread::spawn(move || {
        let timed_out = ended.recv_timeout(Duration::from_secs(limit)) == Err(RecvTimeoutError::Timeout);
        if timed_out {
            // SAFETY: signalling the process group ncu leads (set up in run_local).
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        timed_out
    });
    let status = child.wait().context("waiting for ncu");
    let _ = done.send(());
    let timed_out = watcher.join().unwrap_or(false);
    Ok((!timed_out).then_some(status?))
}

fn run_local(a: &ProfileArgs, at: &Attempt) -> Result<Vec<kforge_ncu::Launch>> {
    let argv = argv(a, at)?;
    let mut cmd = Command::new(&argv[0]);
    // The program's standard output goes to ours for errors: ours stays the JSON's (--json -).
    cmd.args(&argv[1..]).stdout(Stdio::from(std::io::stderr()));
    let _package = crate::output::embedded_python(&mut cmd)?;
    if let Some(d) = &a.device {
        cmd.env("CUDA_VISIBLE_DEVICES", d);
    }
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setpgid(0, 0);
            // ncu and the program die with kforge (a Ctrl-C no longer reaches their group).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
            Ok(())
        });
    }
    eprintln!("kforge profile: profiling {} (mode {}) under {}…", a.source.display(), a.mode, a.ncu);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("{} not found: Nsight Compute's ncu is needed (--ncu PATH or $KFORGE_NCU)", a.ncu)
        }
        Err(e) => return Err(e).with_context(|| format!("starting {}", a.ncu)),
    };
    match wait_within(&mut child, at.timeout_s)? {
        Some(status) => judge(a, status.code(), &status.to_string(), at.csv),
        None => {
            bail!("{} under {} ran past --timeout-s {}: killed", a.source.display(), a.ncu, at.timeout_s.unwrap_or(0))
        }
    }
}

fn run_job(a: &ProfileArgs, socket: &Path, at: &Attempt) -> Result<Vec<kforge_ncu::Launch>> {
    let device = a.device.clone().unwrap_or_else(|| "auto".into());
    eprintln!("kforge profile: profiling {} (mode {}) as a daemon job on device {device}…", a.source.display(), a.mode);
    let label = format!("profile:{}:{}:{}", a.source.display(), a.size, a.mode);
    let peak = crate::job::gpu_memory_bytes(a.gpu_memory)?;
    let mut out = std::io::stderr(); // the program's output: ours stays the JSON's (--json -)
    let req = crate::job::JobRequest {
        argv: argv(a, at)?,
        device: &device,
        label: &label,
        timeout_s: at.timeout_s,
        gpu_memory_bytes: peak,
        warm: false,
        own_process: false,
        expected_ms: None,
    };
    let (exit, _, _) = crate::job::run_job(socket, req, &mut out).context("--daemon")?;
    let how = format!("status {}{}", exit.shell_code(), exit.reason.map(|r| format!(" ({r})")).unwrap_or_default());
    judge(a, exit.code, &how, at.csv)
}

/// The profile of `a.source`: read from the CSV, or ncu run (locally or as a daemon job).
fn profile_of(socket: &Path, a: &ProfileArgs) -> Result<Profile> {
    check(a)?;
    if a.from_csv {
        let text = std::fs::read_to_string(&a.source).with_context(|| format!("reading {}", a.source.display()))?;
        let launches = kforge_ncu::parse(&text).with_context(|| format!("{}", a.source.display()))?;
        let kernels = kforge_ncu::kernels(&launches);
        let source = a.source.display().to_string();
        let (metrics, peaks) = (Vec::new(), None);
        return Ok(Profile { source, mode: None, size: None, forwards: None, metrics, peaks, kernels });
    }
    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    let csv = a.csv_out.clone().unwrap_or_else(|| tmp.path().join("ncu.csv"));
    let peaks = tmp.path().join("peaks.json");
    let extended = kforge_ncu::extended_metrics();
    let t0 = std::time::Instant::now();
    let first = Attempt { csv: &csv, peaks: &peaks, metrics: &extended, timeout_s: a.timeout_s };
    let (launches, metrics) = match attempt(socket, a, &first) {
        Err(e) if refused_a_metric(&e) => {
            eprintln!("kforge profile: ncu refused the DRAM or FLOP counters ({e:#}); profiling with the base metrics");
            // Within the one --timeout-s: what the first attempt left.
            let left = a.timeout_s.map(|s| s.saturating_sub(t0.elapsed().as_secs()).max(1));
            let base = &kforge_ncu::METRICS[..];
            let second = Attempt { csv: &csv, peaks: &peaks, metrics: base, timeout_s: left };
            (attempt(socket, a, &second)?, base.to_vec())
        }
        other => (other?, extended),
    };
    Ok(Profile {
        source: a.source.display().to_string(),
        mode: Some(a.mode.clone()),
        size: Some(a.size.clone()),
        forwards: Some(a.forwards),
        metrics: metrics.iter().map(|m| m.to_string()).collect(),
        peaks: read_peaks(&peaks),
        kernels: kforge_ncu::kernels(&launches),
    })
}

fn attempt(socket: &Path, a: &ProfileArgs, at: &Attempt) -> Result<Vec<kforge_ncu::Launch>> {
    // An earlier run's table and peak are not this one's.
    std::fs::remove_file(at.csv).ok();
    std::fs::remove_file(at.peaks).ok();
    if a.daemon {
        run_job(a, socket, at)
    } else {
        run_local(a, at)
    }
}

/// Whether ncu's failure is that it does not know one of the extra counters (`Failed to find
/// metric`, the name perhaps as a regular expression): then the base metrics may still work. A
/// refused base metric, or any other failure, is not retried.
fn refused_a_metric(e: &anyhow::Error) -> bool {
    let extra = |m: &str| kforge_ncu::extra_metric_named(m);
    e.chain().any(|c| {
        matches!(c.downcast_ref::<kforge_ncu::NcuError>(), Some(kforge_ncu::NcuError::NoTable { messages })
            if messages.iter().any(|m| m.to_lowercase().contains("failed to find metric") && extra(m)))
    })
}

/// The peaks the program measured, if it wrote them.
fn read_peaks(path: &Path) -> Option<kforge_ncu::Peaks> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

fn tier(k: &KernelRow) -> Tier {
    match (k.sol_memory_pct, k.sol_compute_pct) {
        (Some(m), Some(c)) => Tier::from_percentages(m, c),
        _ => Tier::Unknown,
    }
}

fn pct(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into())
}

fn short(name: &str) -> String {
    let key = kforge_ncu::name_key(name);
    if key.chars().count() <= 60 {
        return key.to_string();
    }
    format!("{}…", key.chars().take(59).collect::<String>())
}

/// Achieved DRAM GB/s and, with a measured copy peak, its percentage of it.
fn dram(k: &KernelRow, peaks: Option<&kforge_ncu::Peaks>) -> (String, String) {
    let Some(rate) = k.dram_bytes_per_s() else { return ("-".into(), "-".into()) };
    let of_peak = peaks.map(|p| format!("{:.0}", 100.0 * rate / p.copy_bytes_per_s)).unwrap_or_else(|| "-".into());
    (format!("{:.0}", rate / 1e9), of_peak)
}

/// The table: a row per kernel, most time first, then the total and the measured peak.
pub(crate) fn table(p: &Profile) -> String {
    let mut rows: Vec<&KernelRow> = p.kernels.iter().collect();
    rows.sort_by(|a, b| b.time_ns.total_cmp(&a.time_ns));
    let total: f64 = rows.iter().map(|k| k.time_ns).sum();
    let mut out = format!(
        "{:<60}  {:>8}  {:>10}  {:>6}  {:>5}  {:>5}  {:>5}  {:>6}  {:>5}  {:>7}  tier\n",
        "kernel", "launches", "time us", "share", "mem%", "sm%", "occ%", "GB/s", "copy%", "GFLOP/s"
    );
    for k in rows {
        let share = if total > 0.0 { format!("{:.1}%", 100.0 * k.time_ns / total) } else { "-".into() };
        let (rate, of_peak) = dram(k, p.peaks.as_ref());
        let gflops = k.flops_per_s().map(|f| format!("{:.0}", f / 1e9)).unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:<60}  {:>8}  {:>10.1}  {:>6}  {:>5}  {:>5}  {:>5}  {rate:>6}  {of_peak:>5}  {gflops:>7}  {}\n",
            short(&k.name),
            k.launches,
            k.time_ns / 1e3,
            share,
            pct(k.sol_memory_pct),
            pct(k.sol_compute_pct),
            pct(k.occupancy_pct),
            tier(k).name()
        ));
    }
    out.push_str(&format!("{} kernels, {:.1} us in all", p.kernels.len(), total / 1e3));
    match &p.peaks {
        Some(pk) => out.push_str(&format!("; copy peak {:.0} GB/s (measured)\n", pk.copy_bytes_per_s / 1e9)),
        None => out.push('\n'),
    }
    out
}

pub fn profile(socket: &Path, a: ProfileArgs) -> Result<i32> {
    let p = profile_of(socket, &a)?;
    if let Some(j) = &a.json {
        crate::output::write_out(j, &serde_json::to_string_pretty(&p).context("serializing the profile")?)?;
    }
    crate::output::print_table(a.json.as_deref(), &table(&p));
    Ok(0)
}
