//! `kforge inspect`: run the capture (`python3 -m kforge.inspect.capture`, the embedded package) or read a
//! saved capture, then print the inventory table and write the JSON report.

use anyhow::{bail, Context, Result};
use clap::Args;
use kforge_inductor::inspect::{report, table, Capture};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Args)]
pub struct InspectArgs {
    /// A KernelBench-format problem (class Model, get_inputs(), get_init_inputs()), a standalone
    /// Triton kernel file (kernel_function(*inputs), get_inputs()), or with --from-capture a
    /// capture JSON saved earlier (--capture-out).
    source: PathBuf,
    /// torch.compile mode: default, reduce-overhead (CUDA graphs), max-autotune,
    /// max-autotune-no-cudagraphs.
    #[arg(long, default_value = "default")]
    mode: String,
    /// SOURCE is a saved capture: build the report from it (no GPU, no Python needed).
    #[arg(long)]
    from_capture: bool,
    /// Profiled runs of the compiled model.
    #[arg(long, default_value_t = 5)]
    iterations: u32,
    /// Skip the re-stitch round trip (a second compile).
    #[arg(long)]
    no_restitch: bool,
    /// A problem's size preset: default (its constants as written) or large (its LARGE dict, see
    /// problems/README.md).
    #[arg(long, default_value = "default")]
    size: String,
    /// GPU index to capture on (sets CUDA_VISIBLE_DEVICES; default: what the environment says).
    #[arg(long)]
    device: Option<String>,
    /// Python interpreter with torch and Triton.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Also keep the raw capture here (reusable with --from-capture).
    #[arg(long)]
    capture_out: Option<PathBuf>,
    /// Write the JSON report to this file (`-`: standard output).
    #[arg(long)]
    json: Option<String>,
    /// Run the capture as a job of the kforge daemon (--socket): on a shared GPU its work is held
    /// at the gate during other jobs' regions, and its profile and timings run inside regions.
    #[arg(long)]
    daemon: bool,
    /// With --daemon: the capture job's peak GPU memory, GiB, for the daemon's admission.
    /// Without it the daemon uses what earlier captures of the same problem, size and mode used
    /// (the job's label is `inspect:PROBLEM:SIZE:MODE`), else its default for unknown jobs.
    #[arg(long, value_name = "GIB", requires = "daemon")]
    gpu_memory: Option<f64>,
}

const MODES: [&str; 4] = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"];

/// `--mode` is a torch.compile mode and `--size` a size preset (`kforge inspect`, `kforge profile`).
pub(crate) fn check_mode_and_size(mode: &str, size: &str) -> Result<()> {
    if !MODES.contains(&mode) {
        bail!("--mode must be one of {}, got {mode:?}", MODES.join(", "));
    }
    if !crate::verify::SIZES.contains(&size) {
        bail!("--size must be one of {}, got {size:?}", crate::verify::SIZES.join(", "));
    }
    Ok(())
}

pub(crate) fn read_capture(path: &Path) -> Result<Capture> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading capture {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a kforge capture", path.display()))
}

fn capture_args(a: &InspectArgs, out: &Path) -> Result<Vec<String>> {
    let src = std::fs::canonicalize(&a.source).with_context(|| format!("resolving {}", a.source.display()))?;
    let mut v = vec![
        "-m".to_string(),
        "kforge.inspect.capture".into(),
        src.display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    v.extend(["--mode".to_string(), a.mode.clone(), "--iterations".into(), a.iterations.to_string()]);
    if a.no_restitch {
        v.push("--no-restitch".into());
    }
    v.extend(["--size".to_string(), a.size.clone()]);
    Ok(v)
}

fn run_capture_job(a: &InspectArgs, socket: &Path, out: &Path) -> Result<()> {
    let mut argv = vec![a.python.clone()];
    argv.extend(capture_args(a, out)?);
    let device = a.device.clone().unwrap_or_else(|| "auto".into());
    eprintln!("kforge inspect: capturing {} (mode {}) as a daemon job on device {device}…", a.source.display(), a.mode);
    let label = format!("inspect:{}:{}:{}", a.source.display(), a.size, a.mode);
    let peak = crate::job::gpu_memory_bytes(a.gpu_memory)?;
    let req = crate::job::JobRequest {
        argv,
        device: &device,
        label: &label,
        timeout_s: None,
        gpu_memory_bytes: peak,
        warm: false,
        own_process: false,
        expected_ms: None,
    };
    let (exit, _, _) = crate::job::run_job(socket, req, &mut std::io::stdout()).context("--daemon")?;
    match exit.code {
        Some(0) => Ok(()),
        Some(2) => bail!("capture of {} failed (reason above)", a.source.display()),
        _ => bail!(
            "capture of {} ended with status {}{}",
            a.source.display(),
            exit.shell_code(),
            exit.reason.map(|r| format!(" ({r})")).unwrap_or_default()
        ),
    }
}

fn run_capture(a: &InspectArgs, out: &Path) -> Result<()> {
    if !a.source.is_file() {
        bail!("{}: no such file", a.source.display());
    }
    let mut cmd = Command::new(&a.python);
    let _package = crate::output::embedded_python(&mut cmd)?;
    cmd.args(capture_args(a, out)?);
    if let Some(d) = &a.device {
        cmd.env("CUDA_VISIBLE_DEVICES", d);
    }
    eprintln!(
        "kforge inspect: compiling {} (mode {}) and profiling {} runs…",
        a.source.display(),
        a.mode,
        a.iterations
    );
    let status = cmd.status().with_context(|| format!("starting {}", a.python))?;
    match status.code() {
        Some(0) => Ok(()),
        // The capture printed the reason (file and cause) on stderr already.
        Some(2) => bail!("capture of {} failed (reason above)", a.source.display()),
        _ => bail!("capture of {} ended with {status}", a.source.display()),
    }
}

pub fn inspect(socket: &Path, a: InspectArgs) -> Result<i32> {
    check_mode_and_size(&a.mode, &a.size)?;
    if a.iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    let cap = if a.from_capture {
        read_capture(&a.source)?
    } else {
        let tmp = tempfile::tempdir().context("creating a temporary directory")?;
        let out = a.capture_out.clone().unwrap_or_else(|| tmp.path().join("capture.json"));
        if a.daemon {
            if !a.source.is_file() {
                bail!("{}: no such file", a.source.display());
            }
            run_capture_job(&a, socket, &out)?;
        } else {
            run_capture(&a, &out)?;
        }
        read_capture(&out)?
    };
    let r = report(&cap).with_context(|| format!("inventory of {}", cap.source))?;
    if let Some(j) = &a.json {
        crate::output::write_out(j, &serde_json::to_string_pretty(&r).context("serializing the report")?)?;
    }
    crate::output::print_table(a.json.as_deref(), &table(&r));
    Ok(0)
}
