//! `kforge profile`: Nsight Compute over a compiled problem's forward (`ncu … python3 -m
//! kforge.inspect.profile`, the embedded package), or a CSV ncu wrote, read into per-kernel
//! speed-of-light rows with the strategy analyst's tier; a table, and the JSON report.

use anyhow::{bail, Context, Result};
use clap::Args;
use kforge_agents::analyst::Tier;
use kforge_agents::KernelProfile;
use kforge_ncu::{KernelRow, Profile};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Args)]
pub struct ProfileArgs {
    /// A KernelBench-format problem (class Model, get_inputs(), get_init_inputs()), or with
    /// --from-csv a CSV that ncu wrote (its raw page or its default details page).
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

const MODES: [&str; 4] = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"];

fn check(a: &ProfileArgs) -> Result<()> {
    if !MODES.contains(&a.mode.as_str()) {
        bail!("--mode must be one of {}, got {:?}", MODES.join(", "), a.mode);
    }
    if !crate::verify::SIZES.contains(&a.size.as_str()) {
        bail!("--size must be one of {}, got {:?}", crate::verify::SIZES.join(", "), a.size);
    }
    if a.forwards == 0 {
        bail!("--forwards must be at least 1");
    }
    if !a.source.is_file() {
        bail!("{}: no such file", a.source.display());
    }
    Ok(())
}

/// ncu's command line, then the profiled program's.
fn argv(a: &ProfileArgs, csv: &Path) -> Result<Vec<String>> {
    let src = std::fs::canonicalize(&a.source).with_context(|| format!("resolving {}", a.source.display()))?;
    let mut v = vec![a.ncu.clone()];
    v.extend(kforge_ncu::args(csv));
    v.extend([a.python.clone(), "-m".into(), "kforge.inspect.profile".into(), src.display().to_string()]);
    v.extend(["--mode".to_string(), a.mode.clone(), "--size".into(), a.size.clone()]);
    v.extend(["--forwards".to_string(), a.forwards.to_string()]);
    Ok(v)
}

/// How the profiled program ended: `Ok` for status 0; status 2 is its own reported failure.
fn judge_exit(a: &ProfileArgs, code: Option<i32>, how: &str, csv: &Path) -> Result<()> {
    match code {
        Some(0) => Ok(()),
        Some(2) => bail!("profile of {} failed (reason above)", a.source.display()),
        _ => {
            // ncu's own messages are in its log (the program's output went to ours).
            let log = std::fs::read_to_string(csv).unwrap_or_default();
            let said = match kforge_ncu::parse(&log) {
                Err(e @ kforge_ncu::NcuError::NoTable { .. }) => format!(": {e}"),
                _ => String::new(),
            };
            bail!("{} under {} ended with {how}{said}", a.source.display(), a.ncu)
        }
    }
}

fn run_local(a: &ProfileArgs, csv: &Path) -> Result<()> {
    let argv = argv(a, csv)?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    let _package = crate::output::embedded_python(&mut cmd)?;
    if let Some(d) = &a.device {
        cmd.env("CUDA_VISIBLE_DEVICES", d);
    }
    eprintln!("kforge profile: compiling {} (mode {}) and profiling it under {}…", a.source.display(), a.mode, a.ncu);
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("{} not found: Nsight Compute's ncu is needed (--ncu PATH or $KFORGE_NCU)", a.ncu)
        }
        Err(e) => return Err(e).with_context(|| format!("starting {}", a.ncu)),
    };
    judge_exit(a, status.code(), &status.to_string(), csv)
}

fn run_job(a: &ProfileArgs, socket: &Path, csv: &Path) -> Result<()> {
    let device = a.device.clone().unwrap_or_else(|| "auto".into());
    eprintln!("kforge profile: profiling {} (mode {}) as a daemon job on device {device}…", a.source.display(), a.mode);
    let label = format!("profile:{}:{}:{}", a.source.display(), a.size, a.mode);
    let peak = crate::job::gpu_memory_bytes(a.gpu_memory)?;
    let (exit, _) = crate::job::run_as_job(socket, argv(a, csv)?, &device, &label, None, peak).context("--daemon")?;
    let how = format!("status {}{}", exit.shell_code(), exit.reason.map(|r| format!(" ({r})")).unwrap_or_default());
    judge_exit(a, exit.code, &how, csv)
}

/// The profile of `a.source`: read from the CSV, or ncu run (locally or as a daemon job).
fn profile_of(socket: &Path, a: &ProfileArgs) -> Result<Profile> {
    check(a)?;
    if a.from_csv {
        let text = std::fs::read_to_string(&a.source).with_context(|| format!("reading {}", a.source.display()))?;
        let launches = kforge_ncu::parse(&text).with_context(|| format!("{}", a.source.display()))?;
        let kernels = kforge_ncu::kernels(&launches);
        return Ok(Profile { source: a.source.display().to_string(), mode: None, size: None, forwards: None, kernels });
    }
    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    let csv = a.csv_out.clone().unwrap_or_else(|| tmp.path().join("ncu.csv"));
    std::fs::remove_file(&csv).ok(); // ncu appends to a log file
    if a.daemon {
        run_job(a, socket, &csv)?;
    } else {
        run_local(a, &csv)?;
    }
    let text = std::fs::read_to_string(&csv).with_context(|| format!("reading ncu's log {}", csv.display()))?;
    let launches = kforge_ncu::parse(&text).with_context(|| format!("profile of {}", a.source.display()))?;
    Ok(Profile {
        source: a.source.display().to_string(),
        mode: Some(a.mode.clone()),
        size: Some(a.size.clone()),
        forwards: Some(a.forwards),
        kernels: kforge_ncu::kernels(&launches),
    })
}

fn tier(k: &KernelRow) -> Tier {
    match (k.sol_memory_pct, k.sol_compute_pct) {
        (Some(m), Some(c)) => {
            Tier::of(&KernelProfile { name: String::new(), sol_memory_pct: m, sol_compute_pct: c, occupancy_pct: None })
        }
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

/// The table: a row per kernel, most time first, then the total.
pub(crate) fn table(p: &Profile) -> String {
    let mut rows: Vec<&KernelRow> = p.kernels.iter().collect();
    rows.sort_by(|a, b| b.time_ns.total_cmp(&a.time_ns));
    let total: f64 = rows.iter().map(|k| k.time_ns).sum();
    let mut out = format!(
        "{:<60}  {:>8}  {:>10}  {:>6}  {:>5}  {:>5}  {:>5}  tier\n",
        "kernel", "launches", "time us", "share", "mem%", "sm%", "occ%"
    );
    for k in rows {
        let share = if total > 0.0 { format!("{:.1}%", 100.0 * k.time_ns / total) } else { "-".into() };
        out.push_str(&format!(
            "{:<60}  {:>8}  {:>10.1}  {:>6}  {:>5}  {:>5}  {:>5}  {}\n",
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
    out.push_str(&format!("{} kernels, {:.1} us in all\n", p.kernels.len(), total / 1e3));
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
