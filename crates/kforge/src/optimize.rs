//! `kforge optimize`: run the agents on a problem (today: the dispatch agent,
//! `python3 -m kforge.optimize.dispatch`), write the winner's standalone result file
//! (`python3 -m kforge.optimize.result`), verify it with `kforge verify` under the policy written
//! beside it, and decide (`kforge_optimize::decide`): the verified winner, or the baseline kept.
//! Each Python step runs from the embedded package, or as a daemon job with `--daemon`. A
//! directory is a campaign: every problem in it, one output folder each, a summary per level;
//! `--resume` takes a problem's earlier report when it answers the same question.

use anyhow::{bail, Context, Result};
use clap::Args;
use kforge_optimize::{
    campaign_table, decide, dispatch_modes, inductor_knobs, parse_agents, summarize, Agent, Baseline, Decision,
    DispatchMeasurement, ProblemOutcome, Question, Report, Verified,
};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Args)]
pub struct OptimizeArgs {
    /// A KernelBench-format problem (class Model, get_inputs(), get_init_inputs()), or a directory
    /// of them (a campaign: every *.py below it, a summary per subfolder such as level1).
    problem: PathBuf,
    /// What to beat: torch.compile in max-autotune or default mode.
    #[arg(long, value_enum, default_value = "max-autotune")]
    baseline: crate::values::BaselineArg,
    /// Agents to run, comma-separated (known: dispatch — eager or a torch.compile mode per problem;
    /// inductor — the baseline's mode with one of Inductor's knobs changed, each measured;
    /// rewrite — the forward rewritten by the FX rewrite rules, eager and in the baseline's mode).
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
    /// Take a problem's earlier report in the output directory instead of running it again, when
    /// it answers the same question (problem, size, device, baseline, agents, rounds).
    #[arg(long)]
    resume: bool,
}

/// What every problem of a run shares, checked once.
struct Plan {
    agents: Vec<Agent>,
    baseline: Baseline,
    gpu: bool,
}

pub fn optimize(socket: &Path, a: OptimizeArgs) -> Result<i32> {
    let plan = plan(&a)?;
    if a.problem.is_dir() {
        return campaign(socket, &a, &plan);
    }
    let source = std::fs::read_to_string(&a.problem).with_context(|| format!("reading {}", a.problem.display()))?;
    kforge_verify::problem_interface(&source)
        .map_err(|why| kforge_optimize::OptimizeError::NotAProblem { path: a.problem.display().to_string(), why })?;
    let report = match resumed(&a, &plan, &a.problem, &a.out) {
        Some(r) => r,
        None => optimize_one(socket, &a, &plan, &a.problem, &a.out)?,
    };
    let body = serde_json::to_string_pretty(&report).context("serializing the report")?;
    if let Some(dest) = &a.json {
        crate::output::write_out(dest, &body)?;
    }
    print!("{}", report.table());
    Ok(0)
}

fn plan(a: &OptimizeArgs) -> Result<Plan> {
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
    Ok(Plan { agents, baseline: a.baseline.into(), gpu })
}

fn question(a: &OptimizeArgs, plan: &Plan, problem: &Path) -> Question {
    Question {
        problem: problem.display().to_string(),
        size: a.size.clone(),
        device: a.device.clone(),
        baseline: plan.baseline,
        agents: plan.agents.clone(),
        rounds: a.rounds,
    }
}

/// With `--resume`, the report already in `out` if it answers the same question.
fn resumed(a: &OptimizeArgs, plan: &Plan, problem: &Path, out: &Path) -> Option<Report> {
    if !a.resume {
        return None;
    }
    let text = std::fs::read_to_string(out.join("report.json")).ok()?;
    let r: Report = serde_json::from_str(&text).ok()?;
    (r.question == question(a, plan, problem)).then(|| {
        eprintln!("kforge optimize: {}: resumed from {}", problem.display(), out.join("report.json").display());
        r
    })
}

/// Every problem below the directory, each in its own output folder; a problem that fails is
/// recorded as failed and the campaign goes on. Exit status 2 when any failed.
fn campaign(socket: &Path, a: &OptimizeArgs, plan: &Plan) -> Result<i32> {
    let problems = problem_files(&a.problem)?;
    if problems.is_empty() {
        bail!(
            "{}: no problem file (*.py defining class Model, get_inputs(), get_init_inputs()) below it",
            a.problem.display()
        );
    }
    let mut outcomes = Vec::new();
    for (i, (rel, path)) in problems.iter().enumerate() {
        eprintln!("kforge optimize: [{}/{}] {}", i + 1, problems.len(), rel.display());
        let out = a.out.join(rel.with_extension(""));
        let level =
            rel.parent().and_then(|p| p.iter().next()).map(|c| c.to_string_lossy().into_owned()).unwrap_or(".".into());
        let t0 = std::time::Instant::now();
        let (decision, error, resumed_now) = match resumed(a, plan, path, &out) {
            Some(r) => (Some(r.decision), None, true),
            None => match optimize_one(socket, a, plan, path, &out) {
                Ok(r) => (Some(r.decision), None, false),
                Err(e) => (None, Some(format!("{e:#}")), false),
            },
        };
        let seconds = t0.elapsed().as_secs_f64();
        outcomes.push(ProblemOutcome {
            problem: rel.display().to_string(),
            level,
            decision,
            error,
            seconds,
            resumed: resumed_now,
        });
    }
    let summary = summarize(&outcomes);
    let body = serde_json::to_string_pretty(&serde_json::json!({"problems": outcomes, "summary": summary}))?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    std::fs::write(a.out.join("campaign.json"), &body)
        .with_context(|| format!("writing {}", a.out.join("campaign.json").display()))?;
    if let Some(dest) = &a.json {
        crate::output::write_out(dest, &body)?;
    }
    print!("{}", campaign_table(&outcomes, &summary));
    Ok(if outcomes.iter().any(|o| o.decision.is_none()) { 2 } else { 0 })
}

/// The problem files below `dir` (relative path, path), sorted: `*.py` defining the problem
/// interface (other Python files — helpers, candidates — are not problems).
fn problem_files(dir: &Path) -> Result<Vec<(PathBuf, PathBuf)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry.with_context(|| format!("reading {}", d.display()))?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "py")
                && std::fs::read_to_string(&path).is_ok_and(|s| kforge_verify::problem_interface(&s).is_ok())
            {
                let rel = path.strip_prefix(dir).unwrap_or(&path).to_path_buf();
                out.push((rel, path));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// One problem: the agent, the result file, its verification, the decision; `out/report.json`.
fn optimize_one(socket: &Path, a: &OptimizeArgs, plan: &Plan, problem: &Path, out: &Path) -> Result<Report> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let step = Step { socket, plan, a, problem, out };
    let measurement = step.run_dispatch(plan.baseline, plan.gpu)?;
    step.write_result()?;
    let (result, policy) = (out.join("model_new.py"), out.join("policy.toml"));
    let verified = if measurement.fallback { None } else { Some(step.verify_result(&result, &policy, plan.gpu)?) };
    let decision = decide(&measurement, verified, plan.gpu);
    if measurement.winner != measurement.baseline && matches!(decision, Decision::Fallback { .. }) {
        step.keep_baseline(&measurement)?; // the result file becomes the baseline's
    }
    let report = Report {
        question: question(a, plan, problem),
        measurement,
        verified,
        decision,
        result: result.display().to_string(),
        policy: policy.display().to_string(),
    };
    let body = serde_json::to_string_pretty(&report).context("serializing the report")?;
    std::fs::write(out.join("report.json"), &body)
        .with_context(|| format!("writing {}", out.join("report.json").display()))?;
    Ok(report)
}

/// The steps of one problem's run.
struct Step<'a> {
    socket: &'a Path,
    plan: &'a Plan,
    a: &'a OptimizeArgs,
    problem: &'a Path,
    out: &'a Path,
}

impl Step<'_> {
    /// The dispatch agent's measurement, run here or as a daemon job; read back from its JSON.
    fn run_dispatch(&self, baseline: Baseline, gpu: bool) -> Result<DispatchMeasurement> {
        let a = self.a;
        let out = self.out.join("dispatch.json");
        let device = if gpu { "cuda".to_string() } else { "cpu".to_string() };
        // The dispatch agent's modes, the inductor agent's knobs: one measurement, one baseline.
        let agents = &self.plan.agents;
        let modes = if agents.contains(&Agent::Dispatch) { dispatch_modes(gpu).join(",") } else { String::new() };
        let knobs = if agents.contains(&Agent::Inductor) { inductor_knobs(gpu).join(",") } else { String::new() };
        let mut args: Vec<String> = vec![
            "-m".into(),
            "kforge.optimize.dispatch".into(),
            self.problem.display().to_string(),
            "--out".into(),
            out.display().to_string(),
            "--device".into(),
            device,
            "--size".into(),
            a.size.clone(),
            "--modes".into(),
            modes,
            "--knobs".into(),
            knobs,
            "--baseline".into(),
            baseline.mode().into(),
            "--rounds".into(),
            a.rounds.to_string(),
        ];
        if agents.contains(&Agent::Rewrite) {
            args.push("--rewrite".into()); // the rewrite agent's variants MODE~rewrite, in the same rounds
        }
        eprintln!("kforge optimize: dispatch agent on {} ({} rounds)…", self.problem.display(), a.rounds);
        self.python_step(args, "dispatch")?;
        let text = std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
        Ok(DispatchMeasurement::parse(&text)?)
    }

    /// `model_new.py` and `policy.toml` for the measured winner.
    fn write_result(&self) -> Result<()> {
        let args = vec![
            "-m".into(),
            "kforge.optimize.result".into(),
            self.problem.display().to_string(),
            self.out.join("dispatch.json").display().to_string(),
            "--out".into(),
            self.out.display().to_string(),
        ];
        self.python_step(args, "result")
    }

    /// The result file rewritten for the baseline (its winner did not pass verification).
    fn keep_baseline(&self, m: &DispatchMeasurement) -> Result<()> {
        let path = self.out.join("dispatch.json");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        v["measured_winner"] = serde_json::json!(m.winner);
        v["winner"] = serde_json::json!(m.baseline);
        v["fallback"] = serde_json::json!(true);
        std::fs::write(&path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", path.display()))?;
        self.write_result()
    }

    /// `kforge verify PROBLEM model_new.py --policy policy.toml` (this binary), its outcome.
    fn verify_result(&self, result: &Path, policy: &Path, gpu: bool) -> Result<Verified> {
        let a = self.a;
        let verdict = self.out.join("verdict.json");
        let mut cmd = Command::new(crate::output::this_binary()?);
        cmd.arg("--socket").arg(self.socket).arg("verify").arg(self.problem).arg(result).arg("--policy").arg(policy);
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
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", verdict.display()))?;
        serde_json::from_value(v["outcome"].clone()).with_context(|| format!("the outcome in {}", verdict.display()))
    }

    /// Run `python3 ARGS` here (the embedded package on its PYTHONPATH) or as a daemon job; its
    /// failure says the step, the exit status and the last lines it wrote.
    fn python_step(&self, args: Vec<String>, step: &str) -> Result<()> {
        let a = self.a;
        if a.daemon {
            let mut argv = vec![a.python.clone()];
            argv.extend(args);
            let device = if a.device == "auto" { "auto" } else { a.device.as_str() };
            let label = format!("optimize:{step}:{}", self.problem.display());
            let (exit, err) = crate::job::run_as_job(self.socket, argv, device, &label, None, None)?;
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
