//! `kforge optimize`: run the agents on a problem (today: the dispatch agent,
//! `python3 -m kforge.optimize.dispatch`), write the winner's standalone result file
//! (`python3 -m kforge.optimize.result`), verify it with `kforge verify` under the policy written
//! beside it, and decide (`kforge_optimize::decide`): the verified winner, or the baseline kept.
//! Each Python step runs from the embedded package, or as a daemon job with `--daemon`.

use anyhow::{bail, Context, Result};
use clap::Args;
use kforge_optimize::{
    decide, dispatch_modes, parse_agents, Baseline, Decision, DispatchMeasurement, Report, Verified,
};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Args)]
pub struct OptimizeArgs {
    /// A KernelBench-format problem (class Model, get_inputs(), get_init_inputs()).
    problem: PathBuf,
    /// What to beat: torch.compile in max-autotune or default mode.
    #[arg(long, value_enum, default_value = "max-autotune")]
    baseline: crate::values::BaselineArg,
    /// Agents to run, comma-separated (known: dispatch — eager or a torch.compile mode per problem).
    #[arg(long, default_value = "dispatch")]
    agents: String,
    /// Where it runs: auto (a GPU if torch sees one), cpu (Inductor's CPU backend), or a GPU index.
    #[arg(long, default_value = "auto")]
    device: String,
    /// The problem's size preset: default or large (its LARGE dict, see problems/README.md).
    #[arg(long, default_value = "default")]
    size: String,
    /// Interleaved timing rounds of the dispatch agent (at least 2).
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Output directory: the agent's measurement, the result file (model_new.py), its verify
    /// policy (policy.toml), the verdict and the report.
    #[arg(long, default_value = "kforge-optimize")]
    out: PathBuf,
    /// Also write the report as JSON to this file (`-`: standard output).
    #[arg(long)]
    json: Option<String>,
    /// Run each step as a job of the kforge daemon (--socket): its timing inside regions on a shared GPU.
    #[arg(long)]
    daemon: bool,
    /// Python interpreter with torch (and Triton).
    #[arg(long, default_value = "python3")]
    python: String,
}

pub fn optimize(socket: &Path, a: OptimizeArgs) -> Result<i32> {
    let agents = parse_agents(&a.agents)?;
    if a.rounds < 2 {
        bail!("--rounds must be at least 2 (an interval needs two rounds), got {}", a.rounds);
    }
    if !crate::verify::SIZES.contains(&a.size.as_str()) {
        bail!("--size must be one of {}, got {:?}", crate::verify::SIZES.join(", "), a.size);
    }
    let gpu = match a.device.as_str() {
        "cpu" => false,
        "auto" => torch_sees_a_gpu(&a.python),
        d if d.parse::<u32>().is_ok() => true,
        d => bail!("--device must be auto, cpu or a GPU index, got {d:?}"),
    };
    let source = std::fs::read_to_string(&a.problem).with_context(|| format!("reading {}", a.problem.display()))?;
    kforge_verify::problem_interface(&source)
        .map_err(|why| kforge_optimize::OptimizeError::NotAProblem { path: a.problem.display().to_string(), why })?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let baseline: Baseline = a.baseline.into();
    let measurement = run_dispatch(socket, &a, baseline, gpu)?;
    write_result(socket, &a)?;
    let (result, policy) = (a.out.join("model_new.py"), a.out.join("policy.toml"));
    let verified = if measurement.fallback { None } else { Some(verify_result(socket, &a, &result, &policy, gpu)?) };
    let decision = decide(&measurement, verified, gpu);
    if measurement.winner != measurement.baseline && matches!(decision, Decision::Fallback { .. }) {
        keep_baseline(socket, &a, &measurement)?; // the result file becomes the baseline's
    }
    let report = Report {
        problem: a.problem.display().to_string(),
        size: a.size.clone(),
        device: a.device.clone(),
        baseline,
        agents,
        measurement,
        verified,
        decision,
        result: result.display().to_string(),
        policy: policy.display().to_string(),
    };
    let body = serde_json::to_string_pretty(&report).context("serializing the report")?;
    std::fs::write(a.out.join("report.json"), &body)
        .with_context(|| format!("writing {}", a.out.join("report.json").display()))?;
    if let Some(dest) = &a.json {
        crate::output::write_out(dest, &body)?;
    }
    print!("{}", report.table());
    Ok(0)
}

/// The dispatch agent's measurement, run here or as a daemon job; read back from its JSON.
fn run_dispatch(socket: &Path, a: &OptimizeArgs, baseline: Baseline, gpu: bool) -> Result<DispatchMeasurement> {
    let out = a.out.join("dispatch.json");
    let device = if gpu { "cuda".to_string() } else { "cpu".to_string() };
    let modes = dispatch_modes(gpu).join(",");
    let args: Vec<String> = vec![
        "-m".into(),
        "kforge.optimize.dispatch".into(),
        a.problem.display().to_string(),
        "--out".into(),
        out.display().to_string(),
        "--device".into(),
        device,
        "--size".into(),
        a.size.clone(),
        "--modes".into(),
        modes,
        "--baseline".into(),
        baseline.mode().into(),
        "--rounds".into(),
        a.rounds.to_string(),
    ];
    eprintln!("kforge optimize: dispatch agent on {} ({} rounds)…", a.problem.display(), a.rounds);
    python_step(socket, a, args, "dispatch")?;
    let text = std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    Ok(DispatchMeasurement::parse(&text)?)
}

/// `model_new.py` and `policy.toml` for the measured winner.
fn write_result(socket: &Path, a: &OptimizeArgs) -> Result<()> {
    let args = vec![
        "-m".into(),
        "kforge.optimize.result".into(),
        a.problem.display().to_string(),
        a.out.join("dispatch.json").display().to_string(),
        "--out".into(),
        a.out.display().to_string(),
    ];
    python_step(socket, a, args, "result")
}

/// The result file rewritten for the baseline (its winner did not pass verification).
fn keep_baseline(socket: &Path, a: &OptimizeArgs, m: &DispatchMeasurement) -> Result<()> {
    let path = a.out.join("dispatch.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    v["measured_winner"] = serde_json::json!(m.winner);
    v["winner"] = serde_json::json!(m.baseline);
    v["fallback"] = serde_json::json!(true);
    std::fs::write(&path, serde_json::to_string_pretty(&v)?).with_context(|| format!("writing {}", path.display()))?;
    write_result(socket, a)
}

/// `kforge verify PROBLEM model_new.py --policy policy.toml` (this binary), its outcome.
fn verify_result(socket: &Path, a: &OptimizeArgs, result: &Path, policy: &Path, gpu: bool) -> Result<Verified> {
    let verdict = a.out.join("verdict.json");
    let mut cmd = Command::new(crate::output::this_binary()?);
    cmd.arg("--socket").arg(socket).arg("verify").arg(&a.problem).arg(result).arg("--policy").arg(policy);
    cmd.args(["--size", &a.size, "--json"]).arg(&verdict).args(["--python", &a.python]);
    cmd.args(["--device", if gpu { a.device.as_str() } else { "cpu" }]);
    if !gpu {
        cmd.arg("--no-performance");
    }
    if a.daemon {
        cmd.arg("--daemon");
    }
    eprintln!("kforge optimize: verifying {}…", result.display());
    let status = cmd.status().context("running kforge verify")?;
    let text = std::fs::read_to_string(&verdict)
        .with_context(|| format!("kforge verify wrote no verdict ({status}); reading {}", verdict.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", verdict.display()))?;
    serde_json::from_value(v["outcome"].clone()).with_context(|| format!("the outcome in {}", verdict.display()))
}

/// Run `python3 ARGS` here (the embedded package on its PYTHONPATH) or as a daemon job; its
/// failure says the step, the exit status and the last lines it wrote.
fn python_step(socket: &Path, a: &OptimizeArgs, args: Vec<String>, step: &str) -> Result<()> {
    if a.daemon {
        let mut argv = vec![a.python.clone()];
        argv.extend(args);
        let device = if a.device == "auto" { "auto" } else { a.device.as_str() };
        let (exit, err) = crate::job::run_as_job(
            socket,
            argv,
            device,
            &format!("optimize:{step}:{}", a.problem.display()),
            None,
            None,
        )?;
        if exit.code != Some(0) {
            bail!("the {step} step ended with {:?}: {}", exit.code, last_lines(&err));
        }
        return Ok(());
    }
    let mut cmd = Command::new(&a.python);
    cmd.args(&args);
    let _package = crate::output::embedded_python(&mut cmd)?;
    let o = cmd.output().with_context(|| format!("running {} for the {step} step", a.python))?;
    std::io::Write::write_all(&mut std::io::stderr(), &o.stderr).ok();
    if !o.status.success() {
        bail!("the {step} step ended with {}: {}", o.status, last_lines(&String::from_utf8_lossy(&o.stderr)));
    }
    Ok(())
}

fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// `--device auto`: whether torch sees a GPU here.
fn torch_sees_a_gpu(python: &str) -> bool {
    Command::new(python)
        .args(["-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}
