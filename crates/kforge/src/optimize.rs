//! `kforge optimize`: run the agents on a problem (`kforge_optimize::search`'s steps: the
//! agents' variants measured by `python3 -m kforge.optimize.dispatch`, the winner's standalone
//! result file written by `python3 -m kforge.optimize.result`, verified with `kforge verify`
//! under the policy written beside it; on a GPU the config agent's own search and result file,
//! `python3 -m kforge.optimize.config`, verified the same way) and decide
//! (`kforge_optimize::decide`, `decide_config`, `across`): the faster verified winner of the two
//! families, or the baseline kept. Each Python step runs from the embedded package, or as a daemon
//! job with `--daemon`. A directory is a campaign: every problem in it, one output folder each,
//! up to `--jobs` at once, a summary per level. Every step, candidate and decision goes into
//! the journal (`OUT/journal.db`); `--resume` skips what it holds; budgets stop new work; the
//! output folder is a git repository with a commit per verified improvement.

use anyhow::{bail, Context, Result};
use clap::Args;
use kforge_optimize::budget::{Admission, Budget, Spending, StepOf};
use kforge_optimize::decisions::{Answer, CarriedStep, Decisions, Entry};
use kforge_optimize::journal::{content_hash, verified_name, verified_of, Journal, Measured, StepDone, CARRIED_STEPS};
use kforge_optimize::redecide::Redecide;
use kforge_optimize::search::{measure_args, Step};
use kforge_optimize::{
    across, campaign_table, check_agents, decide, decide_config, parse_agents, result_from, summarize, Agent, Baseline,
    BeamOutcome, ConfigMeasurement, ConfigReport, Decision, DispatchMeasurement, ProblemOutcome, Question, Report,
    ResultFrom, Spent, Tried, Verified, CONFIG_NEEDS_A_GPU, CONFIG_VARIANT, STEPS_VERSION,
};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod llm;
mod summary;

#[derive(Args)]
pub struct OptimizeArgs {
    /// A KernelBench-format problem (class Model, get_inputs(), get_init_inputs()), or a directory
    /// of them (a campaign: every *.py below it, a summary per subfolder such as level1).
    problem: PathBuf,
    /// What to beat: torch.compile in max-autotune or default mode.
    #[arg(long, value_enum, default_value = "max-autotune")]
    baseline: crate::values::BaselineArg,
    /// Agents to run, comma-separated (known: dispatch — eager or a torch.compile mode per problem,
    /// and per graph for a forward of several graphs (graph breaks); inductor — the baseline's
    /// mode with one of Inductor's knobs changed, each measured;
    /// rewrite — the forward rewritten by the FX rewrite rules, eager and in the baseline's mode;
    /// config — the baseline's Triton kernels' launch configurations searched and pinned, in its
    /// own step, a GPU only: skipped on the CPU, and `--agents config` alone there is refused).
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
    /// Output directory (a git repository, one commit per verified improvement): the agent's
    /// measurement, the result file (model_new.py), its verify policy (policy.toml), the verdict,
    /// the report, and the journal of every run (journal.db).
    #[arg(long, default_value = "kforge-optimize")]
    out: PathBuf,
    /// Also write the report as JSON to this file (`-`: standard output).
    #[arg(long)]
    json: Option<String>,
    /// Also write the report as one self-contained HTML page with plots (inline SVG, nothing
    /// fetched): a problem's variants against the noise band, or a campaign's results per problem
    /// and level and which agent won what.
    #[arg(long)]
    html: Option<PathBuf>,
    /// Run each step as a job of the kforge daemon (--socket): its timing inside regions on a shared GPU.
    #[arg(long)]
    daemon: bool,
    /// Python interpreter with torch (and Triton).
    #[arg(long, default_value = "python3")]
    python: String,
    /// Skip what the journal in the output directory holds: a problem with a decision for the same
    /// question (problem, size, device, baseline, agents, rounds), a step finished with the same
    /// input; an interrupted run continues where it stopped.
    #[arg(long)]
    resume: bool,
    /// A compact JSON file of the decided problems' reports, kept outside the output folder, so
    /// that a campaign outlives its machine: each decision is added as it is made, and with
    /// --resume a problem the file holds a decision for under the same question is taken from
    /// it (its report restored into the output folder) even where the folder and its journal are
    /// gone — a batch job with a time limit on node-local scratch, a GPU lent call by call.
    /// Created when missing; one file may hold several campaigns (entries match by question).
    #[arg(long, value_name = "FILE")]
    decisions: Option<PathBuf>,
    /// With --resume: decide these problems again (comma-separated patterns over their paths, or
    /// any tail of a path after a `/`; `*` any run, `?` one character: `level3/002*`). At its
    /// first step, a problem's entry leaves the --decisions file, and neither its decision nor
    /// its steps of earlier runs in the journal are taken from then on. A later --resume, with
    /// or without the flag, continues the redecision until it decides.
    #[arg(long, value_name = "GLOB", value_delimiter = ',', requires = "resume")]
    redecide: Vec<String>,
    /// Run nothing: the campaign's summary (the table, --json, --html) from the --decisions file
    /// alone, for the problems of the directory the file holds a decision for under the same
    /// question (give the campaign's own flags and directory path) — no daemon, torch or GPU
    /// needed, e.g. on a laptop while the campaign goes on elsewhere.
    #[arg(long, requires = "decisions")]
    summarize: bool,
    /// With --summarize: the machine whose decisions to read (as the file names it, e.g. "NVIDIA
    /// H100 80GB HBM3, torch 2.11.0+cu130"), when the file holds several.
    #[arg(long, value_name = "NAME", requires = "summarize")]
    machine: Option<String>,
    /// Start no new problem or step once the steps spent this many device seconds (region time
    /// with --daemon, else the device steps' wall seconds).
    #[arg(long, allow_negative_numbers = true)]
    budget_gpu_s: Option<f64>,
    /// Start no new problem or step once this many seconds have passed since the run started, nor
    /// a step that the remainder cannot hold: each kind is expected to take the upper quartile
    /// of its steps in the problem's folder (the journal's earlier runs' with --resume; one a
    /// killed run left unfinished counted at what it had run), never less than what the
    /// problem's own such step had run. A measure step
    /// that no run of this budget holds starts bounded at a run's start (it prepares what it
    /// can, then times that); the config agent's step is then skipped.
    #[arg(long, allow_negative_numbers = true)]
    budget_wall_s: Option<f64>,
    /// Problems of a campaign in flight at once (with --daemon they share the GPU through its
    /// regions; without it their timings run side by side).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    jobs: i64,
    /// Processes that compile a measure step's variants ahead of it, each problem's own, into
    /// Inductor's caches (the step then loads each compile instead of making it; what is timed is
    /// unchanged). Default: on a GPU, what the cores hold beside --jobs (cores / jobs - 1, at
    /// most 3, fewer where the GPU's free memory would not hold them); on the CPU none. 0: none.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    compile_workers: Option<i64>,
    /// The beam's width: after the first measurement, the N inductor knobs that helped most are
    /// combined (every subset of two or more) and timed again beside the first round's best, in
    /// one measurement against the same baseline (2 to 4; 0: no second round). Needs the
    /// inductor agent.
    #[arg(long, default_value_t = 0)]
    beam_width: u32,
    /// With --daemon: the GPU memory each step's job declares it needs at most (GiB): the
    /// measurement, the config agent and each verification (the result step uses no GPU). The
    /// daemon then admits by it instead of its default for unknown jobs (a quarter of the GPU),
    /// so more problems run at once; a job that still runs out of memory beside others is retried
    /// alone, never counted as the candidate's failure.
    #[arg(long, value_name = "GIB", requires = "daemon")]
    gpu_memory: Option<f64>,
    /// Seconds a Python step (a measurement, the config agent's search, a result file) may run
    /// before it is killed: the problem then fails naming the step and the limit, and a campaign
    /// goes on with the others. Verifications have `kforge verify`'s own time limit.
    #[arg(long, default_value_t = 3600, value_name = "S")]
    step_limit_s: u64,
    #[command(flatten)]
    llm: llm::LlmArgs,
}

/// What every problem of a run shares, checked once.
struct Plan {
    agents: Vec<Agent>,
    baseline: Baseline,
    gpu: bool,
    budget: Budget,
    jobs: usize,
    /// Compile workers per measure step (`--compile-workers`).
    compile_workers: usize,
    beam_width: u32,
    /// The llm agent's endpoint, loop and budget (with `--agents …,llm`).
    llm: Option<llm::LlmPlan>,
    /// The machine as `--python` sees `--device` (`machine_of`), or why it could not tell: it goes
    /// into each report, each step's input hash and the decisions file, so that nothing timed on
    /// one GPU is taken on another.
    machine: std::result::Result<String, String>,
}

impl Plan {
    /// The device as step input hashes name it: `--device` and, where known, the machine.
    fn device_key(&self, device: &str) -> String {
        match &self.machine {
            Ok(m) => format!("{device}@{m}"),
            Err(_) => device.to_string(),
        }
    }
}

pub fn optimize(socket: &Path, a: OptimizeArgs) -> Result<i32> {
    if a.summarize {
        return summary::summarize(&a);
    }
    let started = Instant::now(); // the wall budget counts from here: probing the machine is the run's time too
    let plan = plan(&a)?;
    let redecide = Redecide::new(&a.redecide)?;
    let problems = if a.problem.is_dir() {
        problem_files(&a.problem)?
    } else {
        let source = std::fs::read_to_string(&a.problem).with_context(|| format!("reading {}", a.problem.display()))?;
        kforge_verify::problem_interface(&source).map_err(|why| kforge_optimize::OptimizeError::NotAProblem {
            path: a.problem.display().to_string(),
            why,
        })?;
        vec![(PathBuf::from(a.problem.file_name().unwrap_or_default()), a.problem.clone())]
    };
    let paths: Vec<String> = problems.iter().map(|(_, p)| p.display().to_string()).collect();
    if let Some(p) = redecide.unmatched(&paths) {
        bail!("--redecide {p}: matches none of the problems of {}", a.problem.display());
    }
    let decisions = match &a.decisions {
        Some(path) => Some(DecisionsFile::open(path, plan.machine.clone().map_err(anyhow::Error::msg)?)?),
        None => None,
    };
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let journal_path = a.out.join("journal.db");
    let journal =
        Journal::open(&journal_path, &question(&a, &plan, &a.problem), plan.budget, plan.jobs as u32, a.resume)
            .with_context(|| format!("opening the journal {}", journal_path.display()))?;
    let chat = match &plan.llm {
        Some(l) => Some(l.client(&journal_path, journal.run(), journal.run_before()?, a.resume)?),
        None => None,
    };
    if let Some(d) = decisions.as_ref().filter(|_| a.resume) {
        // A problem decided again from this run on runs its steps again, carried or not.
        let questions = problems.iter().map(|(_, p)| question(&a, &plan, p)).filter(|q| !redecide.matches(&q.problem));
        let carried = carry_steps_in(&journal, &a.out, d, questions)?;
        if carried > 0 {
            eprintln!(
                "kforge optimize: {carried} finished step(s) taken from the decisions file {} (this journal had not run them)",
                d.path.display()
            );
        }
    }
    let spending = spending(plan.budget, started, &journal, &redecide)?;
    if let Some(d) = decisions.as_ref().filter(|_| a.resume) {
        carry_floors_in(&spending, d, problems.iter().map(|(_, p)| question(&a, &plan, p)));
    }
    let run = Run {
        chat,
        decisions,
        redecide,
        socket,
        workspace: Workspace::open(&a.out),
        in_flight: InFlight::default(),
        spending,
        total: problems.len(),
        a: &a,
        plan: &plan,
        journal,
    };
    // The run's heartbeat, so that a run killed mid-step still tells how long its steps had run
    // (`Journal::floor_seconds`); it stops with the run.
    let (stop, ticks) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let journal = &run.journal;
        scope.spawn(move || heartbeat(journal, &ticks));
        let ran = if a.problem.is_dir() { run.campaign(&problems) } else { run.single(&problems[0].1) };
        drop(stop);
        // Every problem's floors as the run ends (one held back has no step end to write them).
        if let Err(e) = run.save_undecided(problems.iter().map(|(_, p)| question(&a, &plan, p))) {
            eprintln!(
                "kforge optimize: warning: the decisions file's step floors and carried steps were not written: {e}"
            );
        }
        ran
    })
}

/// How often a run journals that it is alive.
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(5);

/// The run's heartbeat: `Journal::alive` every `HEARTBEAT` until `ticks`' sender is dropped. A
/// failed write is not the run's failure: its floors are then only less precise.
fn heartbeat(journal: &Journal, ticks: &std::sync::mpsc::Receiver<()>) {
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = ticks.recv_timeout(HEARTBEAT) {
        let _ = journal.alive();
    }
}

/// The run's spending, each kind of step expected to take what the journal's finished ones
/// took (earlier runs' with `--resume`), so that a wall budget starts no step it cannot hold.
fn spending(budget: Budget, started: Instant, journal: &Journal, redecide: &Redecide) -> Result<Spending> {
    let spending = Spending::since(budget, started);
    for (problem, step, seconds) in journal.step_seconds().context("reading the journal's step durations")? {
        spending.observe(StepOf { step: &step, group: &step_group(&problem), problem: &problem }, seconds);
    }
    for u in journal
        .floor_seconds(|p| redecide.matches(p))
        .context("reading the journal's floors (killed and bounded steps)")?
    {
        let of = StepOf { step: &u.step, group: &step_group(&u.problem), problem: &u.problem };
        if u.killed {
            spending.observe_unfinished(of, u.seconds);
        } else {
            spending.observe_bounded(of, u.seconds);
        }
    }
    Ok(spending)
}

impl Run<'_> {
    /// With `--decisions`, these questions' step floors and finished steps as the run knows
    /// them, into the file; the first write that failed, why (the caller warns: a step's result
    /// does not depend on it).
    fn save_undecided(&self, questions: impl Iterator<Item = Question>) -> std::result::Result<(), String> {
        let Some(d) = &self.decisions else { return Ok(()) };
        questions.into_iter().try_for_each(|q| {
            let steps = self.carried_steps(&d.machine, &q).map_err(|e| format!("{e:#}"))?;
            d.save_undecided(&q, &self.spending.floors_of(&q.problem), steps)
        })
    }

    /// `q`'s finished steps the decisions file carries (`Journal::carried_steps`), each with its
    /// output file's text, from the kept copy (`kept_root`) where the file changed since (a rerun
    /// killed after it wrote); one whose file is gone, changed with no kept copy, not UTF-8 or
    /// over `CARRIED_TEXT_MAX` is left out.
    fn carried_steps(&self, machine: &str, q: &Question) -> Result<Vec<CarriedStep>> {
        let rows = self.journal.carried_steps(&q.problem).context("reading the journal's finished steps")?;
        let carried = rows.into_iter().filter_map(|s| {
            let (output, output_hash) = (s.output?, s.output_hash?);
            let text = output_text(&self.a.out, &output, &output_hash)?;
            (text.len() <= CARRIED_TEXT_MAX).then(|| CarriedStep {
                machine: machine.into(),
                question: q.clone(),
                step: s.step,
                input_hash: s.input_hash,
                output,
                output_hash,
                text,
                seconds: s.seconds.unwrap_or(0.0),
                gpu_seconds: s.gpu_seconds,
                gpu_seconds_kind: s.gpu_seconds_kind,
                outcome: s.outcome,
            })
        });
        Ok(carried.collect())
    }
}

/// Whether `text`, a step's output file at `output`, still hashes to what the step wrote: the
/// name it was hashed under is the output's trailing parts (`verdict.json`, `config/verdict.json`).
fn unchanged(output: &str, text: &str, output_hash: &str) -> bool {
    let parts: Vec<&str> = output.split('/').collect();
    (1..=parts.len())
        .any(|k| hash_of(&[&parts[parts.len() - k..].join("/")], &[text.as_bytes().to_vec()]) == output_hash)
}

/// The largest output file a decisions file carries (`CarriedStep::text`): a measurement is a
/// few KiB; a file of this size would make the committed file large.
const CARRIED_TEXT_MAX: usize = 256 << 10;

/// The decisions file's finished steps of these questions on this machine (`CarriedStep`), into
/// the journal with their output files, where the journal has no finished step of that input:
/// a fresh journal (a state pack lost with its machine, a node's scratch) takes them as its own
/// instead of running them again. A step whose file is here with other content is left to the
/// journal's own state; one the journal has finished with the same output, but whose file has
/// changed since, is kept (`keep_carried`) for a reuse to take back. Returns how many were taken.
fn carry_steps_in(
    journal: &Journal,
    out: &Path,
    d: &DecisionsFile,
    questions: impl Iterator<Item = Question>,
) -> Result<usize> {
    let mut taken = 0;
    for q in questions {
        for c in d.read.steps_of(&d.machine, &q) {
            let Some(step) = CARRIED_STEPS.into_iter().find(|s| s.name() == c.step) else { continue };
            let inside = Path::new(&c.output).components().all(|p| matches!(p, std::path::Component::Normal(_)));
            if !inside {
                continue;
            }
            if let Some(row) = journal.finished(step, &c.input_hash)? {
                if let Err(e) = keep_carried(out, &row, c) {
                    eprintln!("kforge optimize: warning: a carried step's output was not kept: {e:#}");
                }
                continue;
            }
            let path = out.join(&c.output);
            match std::fs::read_to_string(&path) {
                Ok(here) if here != c.text => continue,
                Ok(_) => {}
                Err(_) => {
                    if let Some(parent) = path.parent() {
                        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
                    }
                    std::fs::write(&path, &c.text).with_context(|| format!("writing {}", path.display()))?;
                }
            }
            let end = kforge_store::StepEnd {
                seconds: c.seconds,
                gpu_seconds: c.gpu_seconds,
                gpu_seconds_kind: c.gpu_seconds_kind.clone(),
                output: Some(c.output.clone()),
                output_hash: Some(c.output_hash.clone()),
                outcome: c.outcome.clone(),
                ..kforge_store::StepEnd::default()
            };
            journal.carried_in(&q.problem, &c.step, &c.input_hash, &end).context("journaling a carried step")?;
            taken += 1;
        }
    }
    Ok(taken)
}

/// `c`, a carried step the journal has finished as `row` with the same output, into the kept
/// store (`kept_root`) when its file here no longer holds that output and no kept copy does: in
/// session 32 a rerun in full of level3/004's bounded measure step rewrote its `dispatch.json`
/// and was killed before it finished, and the journal's bounded result (what the next call was
/// to take) no longer matched its file.
fn keep_carried(out: &Path, row: &kforge_store::StepRow, c: &CarriedStep) -> Result<()> {
    if row.output_hash.as_deref() != Some(c.output_hash.as_str()) || !unchanged(&c.output, &c.text, &c.output_hash) {
        return Ok(());
    }
    if output_text(out, &c.output, &c.output_hash).is_some() {
        return Ok(());
    }
    write_creating(&kept_root(out, &c.output_hash).join(&c.output), c.text.as_bytes())
}

/// Where a finished step's output files are kept, by their content hash, when a step of the same
/// input runs again over them (`ProblemRun::keep_standing`) or a decisions file carries them
/// (`keep_carried`): under the journal's folder `out`, each file at its journaled path. A reuse
/// takes them back from there (`ProblemRun::take`) when the files themselves were rewritten by a
/// run that never finished.
fn kept_root(out: &Path, output_hash: &str) -> PathBuf {
    out.join(".kept").join(output_hash)
}

/// A finished step's output file's text (`output`, relative to the journal's folder `out`) that
/// still hashes to `output_hash`: the file itself, else its kept copy (`kept_root`).
fn output_text(out: &Path, output: &str, output_hash: &str) -> Option<String> {
    [out.to_path_buf(), kept_root(out, output_hash)]
        .iter()
        .filter_map(|root| std::fs::read_to_string(root.join(output)).ok())
        .find(|text| unchanged(output, text, output_hash))
}

/// Write `bytes` to `path`, creating its folder.
fn write_creating(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// The decisions file's step floors of these questions on this machine, each its problem's step
/// floor (`Spending::observe_bounded`): what a journal of another machine knew of steps that ran
/// bounded or were killed there.
fn carry_floors_in(spending: &Spending, d: &DecisionsFile, questions: impl Iterator<Item = Question>) {
    for q in questions {
        for (step, seconds) in d.read.floors_of(&d.machine, &q) {
            spending
                .observe_bounded(StepOf { step: &step, group: &step_group(&q.problem), problem: &q.problem }, seconds);
        }
    }
}

/// The group whose steps estimate a problem's (`Spending::expected_s`): its folder, a
/// campaign's level (a level-3 model's steps take what level 3's take, not level 1's).
fn step_group(problem: &str) -> String {
    let folder = Path::new(problem).parent().map(|p| p.display().to_string()).unwrap_or_default();
    if folder.is_empty() {
        ".".into()
    } else {
        folder
    }
}

fn plan(a: &OptimizeArgs) -> Result<Plan> {
    plan_on(a, || machine_of(&a.python, &a.device).map_err(|e| format!("{e:#}")))
}

/// The plan, the machine given by `machine` (asked only once the flags are valid).
fn plan_on(a: &OptimizeArgs, machine: impl FnOnce() -> std::result::Result<String, String>) -> Result<Plan> {
    let agents = parse_agents(&a.agents)?;
    if a.rounds < 2 {
        bail!("--rounds must be at least 2 (an interval needs two rounds), got {}", a.rounds);
    }
    if !crate::verify::SIZES.contains(&a.size.as_str()) {
        bail!("--size must be one of {}, got {:?}", crate::verify::SIZES.join(", "), a.size);
    }
    if !(1..=256).contains(&a.jobs) {
        bail!("--jobs must be between 1 and 256 (problems in flight at once), got {}", a.jobs);
    }
    let max = kforge_optimize::search::MAX_COMPILE_WORKERS;
    if let Some(n) = a.compile_workers.filter(|n| !(0..=max as i64).contains(n)) {
        bail!("--compile-workers must be between 0 and {max} (processes per measure step), got {n}");
    }
    let budget = Budget::new(a.budget_gpu_s, a.budget_wall_s)?;
    if a.beam_width == 1 || a.beam_width as usize > kforge_optimize::beam::MAX_WIDTH {
        bail!(
            "--beam-width must be 0 (no second round) or 2 to {} (knobs combined), got {}",
            kforge_optimize::beam::MAX_WIDTH,
            a.beam_width
        );
    }
    crate::job::gpu_memory_bytes(a.gpu_memory)?;
    if a.step_limit_s == 0 {
        bail!("--step-limit-s must be a positive number of seconds, got 0");
    }
    if a.beam_width >= 2 && !agents.contains(&Agent::Inductor) {
        bail!("--beam-width combines the inductor agent's knobs: add inductor to --agents");
    }
    let machine = machine();
    let gpu = match a.device.as_str() {
        "cpu" => false,
        "auto" => machine.as_ref().is_ok_and(|m| !m.starts_with("cpu, ")),
        d if d.parse::<u32>().is_ok() => true,
        d => bail!("--device must be auto, cpu or a GPU index, got {d:?}"),
    };
    check_agents(&agents, gpu)?;
    let llm = if agents.contains(&Agent::Llm) && !a.summarize {
        // (--summarize runs no step: no endpoint to resolve)
        Some(llm::LlmPlan::new(&a.llm)?)
    } else {
        if let Some(flag) = a.llm.given() {
            bail!("{flag} is for the llm agent: add llm to --agents");
        }
        None
    };
    Ok(Plan {
        agents,
        baseline: a.baseline.into(),
        gpu,
        budget,
        jobs: a.jobs as usize,
        compile_workers: match a.compile_workers {
            Some(n) => n as usize,
            None => kforge_optimize::search::compile_workers_for(cores(), a.jobs as usize, gpu),
        },
        beam_width: a.beam_width,
        llm,
        machine,
    })
}

/// This machine's cores, as the compile workers' default counts them.
fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// A measure step's input hash: the steps' version, the problem's source, size, device,
/// baseline, rounds and every agent's variants (`flags`).
fn measure_hash(a: &OptimizeArgs, plan: &Plan, source: &[u8], flags: &[(&str, String)]) -> String {
    let (rounds, steps, device) = (a.rounds.to_string(), STEPS_VERSION.to_string(), plan.device_key(&a.device));
    let mut parts: Vec<&[u8]> = vec![steps.as_bytes(), source, a.size.as_bytes(), device.as_bytes()];
    parts.extend([plan.baseline.mode().as_bytes(), rounds.as_bytes()]);
    for (flag, v) in flags {
        parts.extend([flag.as_bytes(), v.as_bytes()]);
    }
    content_hash(&parts)
}

fn question(a: &OptimizeArgs, plan: &Plan, problem: &Path) -> Question {
    Question {
        problem: problem.display().to_string(),
        size: a.size.clone(),
        device: a.device.clone(),
        baseline: plan.baseline,
        agents: plan.agents.clone(),
        rounds: a.rounds,
        beam_width: plan.beam_width,
        steps: STEPS_VERSION,
    }
}

/// How one problem's run ended.
enum Outcome {
    /// Decided now, or taken from an earlier run (`resumed`).
    Decided { report: Box<Report>, resumed: bool },
    /// A budget was spent before it (or one of its steps) started.
    NotReached,
}

/// One invocation: its journal, budget and workspace, shared by the problems in flight.
struct Run<'a> {
    socket: &'a Path,
    a: &'a OptimizeArgs,
    plan: &'a Plan,
    journal: Journal,
    spending: Spending,
    workspace: Option<Workspace>,
    in_flight: InFlight,
    total: usize,
    /// The llm agent's client (its replay cache in the journal's file).
    chat: Option<llm::LlmClient>,
    /// `--decisions`: the decided problems' reports, read at the start, written at each decision.
    decisions: Option<DecisionsFile>,
    /// `--redecide`: problems decided again.
    redecide: Redecide,
}

/// The decisions file as read at the start, its path and this machine, shared by the problems
/// in flight.
struct DecisionsFile {
    path: PathBuf,
    read: Decisions,
    /// The GPU's name (or `cpu`) and torch's version: entries of another machine are not taken.
    machine: String,
}

/// Result files a decided problem's folder holds (`Entry::result_hash`).
const RESULT_FILES: [&str; 2] = ["model_new.py", "policy.toml"];

impl DecisionsFile {
    /// What the file, as read at the start, holds for `q` on this machine and `problem`'s source.
    fn answer(&self, problem: &Path, q: &Question) -> Result<Answer<'_>> {
        let source = std::fs::read(problem).with_context(|| format!("reading {}", problem.display()))?;
        Ok(self.read.answer(q, &self.machine, &content_hash(&[&source])))
    }

    /// The file at `path` (created, empty, when missing: a path that cannot be written is named
    /// before anything runs) on `machine`.
    fn open(path: &Path, machine: String) -> Result<DecisionsFile> {
        let read = Decisions::update(path, |_| false)?;
        Ok(DecisionsFile { path: path.to_path_buf(), read, machine })
    }

    /// This machine's entry of `question` removed (it is being decided again: no later run may
    /// take it; the file's other campaigns keep theirs); whether there was one.
    fn forget(&self, question: &Question) -> std::result::Result<bool, String> {
        let mut gone = 0;
        Decisions::update(&self.path, |d| {
            gone = d.forget(&self.machine, question);
            gone > 0
        })
        .map(|_| gone > 0)
        .map_err(|e| e.to_string())
    }

    /// `question`'s step floors and carried steps on this machine made `floors` and `steps`
    /// (`Decisions::set_floors`, `Decisions::set_steps`), in one write.
    fn save_undecided(
        &self,
        question: &Question,
        floors: &BTreeMap<String, f64>,
        steps: Vec<CarriedStep>,
    ) -> std::result::Result<(), String> {
        Decisions::update(&self.path, |d| {
            let floors = d.set_floors(&self.machine, question, floors);
            d.set_steps(&self.machine, question, steps) || floors
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    /// `report` added with this machine, its problem's source hash (as the run read it) and its
    /// result files' hash, over the entry of its question and machine.
    fn record(&self, report: &Report, source_hash: String, out: &Path) -> std::result::Result<(), String> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let (result_hash, result_files) = result_of(out);
        let entry = Entry {
            decided_unix_s: now,
            machine: self.machine.clone(),
            source_hash,
            result_hash,
            result_files,
            report: report.clone(),
        };
        Decisions::update(&self.path, |d| d.record(entry)).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// The result files in `out`, read once: their hash (none when one is missing) and their texts by
/// name (none unless every one is UTF-8 text: not a result a restore could write back as decided).
/// One read for both, so the text carried is the content hashed (a sibling may rewrite them).
fn result_of(out: &Path) -> (Option<String>, BTreeMap<String, String>) {
    let Ok(contents) = RESULT_FILES.iter().map(|n| std::fs::read(out.join(n))).collect::<std::io::Result<Vec<_>>>()
    else {
        return (None, BTreeMap::new());
    };
    let texts: Option<BTreeMap<String, String>> = RESULT_FILES
        .iter()
        .zip(&contents)
        .map(|(n, c)| String::from_utf8(c.clone()).ok().map(|t| (n.to_string(), t)))
        .collect();
    (Some(hash_of(&RESULT_FILES, &contents)), texts.unwrap_or_default())
}

/// `entry`'s result files written into `out`, where it carries all of them and they hash to its
/// `result_hash` (what was decided); whether they were.
fn write_result_files(entry: &Entry, out: &Path) -> Result<bool> {
    let contents: Option<Vec<Vec<u8>>> =
        RESULT_FILES.iter().map(|n| entry.result_files.get(*n).map(|t| t.as_bytes().to_vec())).collect();
    let Some(contents) = contents.filter(|c| Some(hash_of(&RESULT_FILES, c)) == entry.result_hash) else {
        return Ok(false);
    };
    for (name, content) in RESULT_FILES.iter().zip(&contents) {
        let path = out.join(name);
        std::fs::write(&path, content).with_context(|| format!("writing {} (the decided result)", path.display()))?;
    }
    Ok(true)
}

/// A campaign's summary made public: `campaign.json` in the output folder (`in_out`), `--json`,
/// `--html` (each decided problem's own page linked as `pages` says) and the table last, then
/// `tail`'s lines. `extra`'s fields (the run's budget and id) join the JSON.
fn publish(
    a: &OptimizeArgs,
    baseline: Baseline,
    outcomes: &[ProblemOutcome],
    extra: serde_json::Value,
    pages: &BTreeMap<String, String>,
    tail: &str,
    in_out: bool,
) -> Result<()> {
    let summary = summarize(outcomes);
    let goals = kforge_optimize::goals::check(outcomes, &summary, baseline);
    let mut body = serde_json::json!({"problems": outcomes, "summary": summary, "goals": goals});
    if let (Some(b), serde_json::Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
    let body = serde_json::to_string_pretty(&body)?;
    if in_out {
        let path = a.out.join("campaign.json");
        std::fs::write(&path, &body).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(dest) = &a.json {
        crate::output::write_out(dest, &body)?;
    }
    if let Some(path) = &a.html {
        let title = format!("kforge optimize: {} against torch.compile {}", a.problem.display(), baseline.mode());
        let page = kforge_optimize::html::campaign_html(&title, outcomes, &summary, &goals, pages);
        std::fs::write(path, page).with_context(|| format!("writing the HTML report {}", path.display()))?;
    }
    let table = format!("{}{}\n{tail}", campaign_table(outcomes, &summary), kforge_optimize::goals::lines(&goals));
    crate::output::print_table(a.json.as_deref(), &table);
    Ok(())
}

/// The machine as `python` sees `device`: the GPU's name (the first GPU for `auto`) or `cpu`, and
/// torch's version.
fn machine_of(python: &str, device: &str) -> Result<String> {
    let probe = "import sys, torch\n\
        d = sys.argv[1]\n\
        gpu = d != 'cpu' and torch.cuda.is_available()\n\
        name = torch.cuda.get_device_name(0 if d == 'auto' else int(d)) if gpu else 'cpu'\n\
        print(f'{name}, torch {torch.__version__}')";
    let o = Command::new(python)
        .args(["-c", probe, device])
        .output()
        .with_context(|| format!("running {python} to tell which machine this is"))?;
    let text = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if !o.status.success() || text.is_empty() {
        bail!(
            "--decisions needs the machine: {python} could not tell which it is ({}): {}",
            o.status,
            last_lines(&String::from_utf8_lossy(&o.stderr))
        );
    }
    Ok(text)
}

/// One lock per step input in flight, so that problems running at once with identical inputs
/// run the step once: the second waits for the first and reuses its output.
#[derive(Default)]
struct InFlight(Mutex<HashMap<String, Arc<Mutex<()>>>>);

impl InFlight {
    fn lock_for(&self, step: Step, input_hash: &str) -> Arc<Mutex<()>> {
        let key = format!("{}:{input_hash}", step.name());
        self.0.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default().clone()
    }
}

impl Run<'_> {
    /// One problem: its report and table. Exit status 3 when a budget stopped it (`--resume`
    /// continues it).
    fn single(&self, problem: &Path) -> Result<i32> {
        let gpu_s = Cell::new(0.0);
        let outcome = self.problem(1, problem, &self.a.out, &gpu_s);
        self.journal.finish(matches!(outcome, Ok(Outcome::NotReached)).then_some("budget"))?;
        match outcome? {
            Outcome::Decided { report, .. } => {
                let body = serde_json::to_string_pretty(&report).context("serializing the report")?;
                if let Some(dest) = &self.a.json {
                    crate::output::write_out(dest, &body)?;
                }
                if let Some(path) = &self.a.html {
                    Self::write_problem_page(&report, problem, path)?;
                }
                crate::output::print_table(self.a.json.as_deref(), &report.table());
                Ok(0)
            }
            Outcome::NotReached => {
                eprint!("kforge optimize: {}: not reached: {}", problem.display(), self.spending.status().line());
                Ok(3)
            }
        }
    }

    /// In a campaign with `--html`, each decided problem's own page, `report.html` in its output
    /// folder (the campaign's page is the file `--html` names).
    fn problem_page(&self, o: Outcome, problem: &Path, out: &Path) -> Result<Outcome> {
        if let (Some(_), Outcome::Decided { report, .. }) = (&self.a.html, &o) {
            Self::write_problem_page(report, problem, &out.join("report.html"))?;
        }
        Ok(o)
    }

    /// With `--html`, each problem's own page that exists, by problem, as the campaign's page
    /// links it: relative to the page's folder when below it, else absolute.
    fn problem_pages(&self, outcomes: &[ProblemOutcome], problems: &[(PathBuf, PathBuf)]) -> BTreeMap<String, String> {
        let Some(html) = &self.a.html else { return BTreeMap::new() };
        let from = std::path::absolute(html).ok().and_then(|p| p.parent().map(Path::to_path_buf));
        let decided: Vec<&str> = outcomes.iter().filter(|o| o.decision.is_some()).map(|o| o.problem.as_str()).collect();
        problems
            .iter()
            .filter(|(rel, _)| decided.contains(&rel.display().to_string().as_str()))
            .filter_map(|(rel, _)| {
                let own = std::path::absolute(self.a.out.join(rel.with_extension("")).join("report.html")).ok()?;
                own.is_file().then_some(())?;
                let link = from.as_ref().and_then(|f| own.strip_prefix(f).ok()).unwrap_or(&own);
                Some((rel.display().to_string(), link.display().to_string()))
            })
            .collect()
    }

    /// A problem's page at `path`: its report, and what its result file changes against the
    /// problem's source (both read here; a result file that cannot be read leaves the diff out).
    fn write_problem_page(report: &Report, problem: &Path, path: &Path) -> Result<()> {
        let source = std::fs::read_to_string(problem).with_context(|| format!("reading {}", problem.display()))?;
        let result = std::fs::read_to_string(&report.result).ok();
        let name = Path::new(&report.result).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let change = result.as_deref().map(|r| kforge_optimize::html::Change {
            problem: &source,
            result_name: &name,
            result: r,
        });
        let page = kforge_optimize::html::problem_html(report, change.as_ref());
        std::fs::write(path, page).with_context(|| format!("writing the HTML report {}", path.display()))
    }

    /// A note when more problems are in flight than the daemon admits jobs at once
    /// (`admission_note`). Without an answer from the daemon, none (its own error comes later).
    fn note_admission(&self, in_flight: usize) {
        let Ok(mut c) = kforge_client::Client::connect(self.socket) else { return };
        let Ok(kforge_proto::Reply::Status(status)) = c.request(&kforge_proto::Request::Status) else { return };
        let declared = crate::job::gpu_memory_bytes(self.a.gpu_memory).ok().flatten();
        let rooms: Vec<DeviceRoom> = status.devices.iter().map(DeviceRoom::of).collect();
        if let Some(note) = admission_note(&rooms, &self.a.device, in_flight, declared) {
            eprintln!("kforge optimize: note: {note}");
        }
    }

    /// Every problem below the directory, each in its own output folder, up to `--jobs` at
    /// once; a problem that fails is recorded as failed and the campaign goes on; those a budget
    /// kept from starting are `not-reached: budget`. Exit status 2 when any failed.
    fn campaign(&self, problems: &[(PathBuf, PathBuf)]) -> Result<i32> {
        if problems.is_empty() {
            bail!(
                "{}: no problem file (*.py defining class Model, get_inputs(), get_init_inputs()) below it",
                self.a.problem.display()
            );
        }
        if self.a.daemon && self.plan.jobs.min(problems.len()) > 1 {
            self.note_admission(self.plan.jobs.min(problems.len()));
        }
        let next = AtomicUsize::new(0);
        let order = self.start_order(problems)?;
        let done: Mutex<Vec<Option<ProblemOutcome>>> = Mutex::new(vec![None; problems.len()]);
        std::thread::scope(|s| {
            for _ in 0..self.plan.jobs.min(problems.len()) {
                s.spawn(|| {
                    while let Some(&i) = order.get(next.fetch_add(1, Ordering::SeqCst)) {
                        let Some((rel, path)) = problems.get(i) else { break };
                        let o = self.outcome(i + 1, rel, path);
                        done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(o);
                    }
                });
            }
        });
        let outcomes: Vec<ProblemOutcome> =
            done.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().flatten().collect();
        let not_reached = outcomes.iter().filter(|o| o.not_reached.is_some()).count();
        self.journal.finish((not_reached > 0).then_some("budget"))?;
        let budget = self.spending.status();
        let mut tail = budget.line();
        if not_reached > 0 {
            let holding = if budget.held_back > 0 { ", given a wall budget that holds their steps" } else { "" };
            tail += &format!("{not_reached} problem(s) not reached (budget): --resume continues them{holding}\n");
        }
        let pages = self.problem_pages(&outcomes, problems);
        let extra = serde_json::json!({"budget": budget, "run": self.journal.run()});
        publish(self.a, self.plan.baseline, &outcomes, extra, &pages, &tail, true)?;
        Ok(if outcomes.iter().any(|o| o.decision.is_none() && o.not_reached.is_none()) { 2 } else { 0 })
    }

    /// The order a campaign's problems start in (indices into `problems`; each keeps its number
    /// in the progress lines and its place in the summary): with `--resume`, first the measured
    /// problems whose beam or config step starts only at a run's start (bounded: its own floor,
    /// a killed or bounded earlier run's, is over the wall budget; reached later it would be
    /// held back again); then the other measured problems, a beam, result or verify step from a
    /// decision: a wall budget decides them before it is spent on long measure steps that may not
    /// finish in it (in session 23's call 6, three level-3 measure steps took three of four slots
    /// at the start, four problems one verify step from a decision waited, and the call decided
    /// none); then the problems whose measure step is still to run (none finished, or
    /// `--redecide` names them), the longest expected first (`Spending::expected_s`: a killed
    /// one's own floor, else its folder's quartile), so that the long ones start while the
    /// budget's rest can hold them and the short ones fill the end (in session 13's call 7, five
    /// measure steps were held back at 198 s of 490 while three of four slots then idled). Last,
    /// the problems whose measure step already ran a whole wall budget without finishing (its own
    /// floor is over the budget: it starts only at a run's start, bounded, and cannot be expected
    /// to finish there): they take a slot only when fewer problems that can finish are left than
    /// slots. In sessions 20 and 21 such a problem (level1/019, whose max-autotune compile
    /// outlived every device call) started first in every call and held a slot to the budget's
    /// end each time. Otherwise, and among equals, in order.
    fn start_order(&self, problems: &[(PathBuf, PathBuf)]) -> Result<Vec<usize>> {
        let mut order: Vec<usize> = (0..problems.len()).collect();
        if !self.a.resume {
            return Ok(order);
        }
        let measured = self.journal.measured().context("reading the journal's measure steps")?;
        let config = self.plan.agents.contains(&Agent::Config);
        let flags = measure_args(&self.plan.agents, self.plan.gpu);
        let key = |i: usize| -> Result<(u8, f64)> {
            let (problem, path) = (question(self.a, self.plan, &problems[i].1).problem, &problems[i].1);
            let source = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let hash = measure_hash(self.a, self.plan, &source, &flags);
            let group = step_group(&problem);
            let of = StepOf { step: Step::Measure.name(), group: &group, problem: &problem };
            if self.is_measured(measured.get(&hash), of)? && !self.redecide.matches(&problem) {
                let only_first = |step: Step| {
                    let of = StepOf { step: step.name(), group: &group, problem: &problem };
                    self.spending.starts_only_at_a_runs_start(of)
                };
                let first = only_first(Step::Beam) || (config && only_first(Step::Config));
                return Ok((if first { 0 } else { 1 }, 0.0));
            }
            let expected = self.spending.expected_s(of).map_or(0.0, |e| e.seconds);
            Ok((if self.spending.starts_only_at_a_runs_start(of) { 3 } else { 2 }, -expected))
        };
        let keys: Vec<(u8, f64)> = order.iter().map(|&i| key(i)).collect::<Result<_>>()?;
        order.sort_by(|&a, &b| keys[a].0.cmp(&keys[b].0).then(keys[a].1.total_cmp(&keys[b].1)));
        let others_first = order.iter().any(|&j| matches!(keys[j].0, 1 | 2));
        for &i in order.iter().filter(|&&i| keys[i].0 == 3 && others_first) {
            let (seconds, budget) = (-keys[i].1, self.a.budget_wall_s.unwrap_or_default());
            let why = format!(
                "starts after the problems that can finish: its measure step ran a whole --budget-wall-s of \
                 {budget:.0} without finishing (at least {seconds:.0} s here)"
            );
            self.progress(i + 1, &problems[i].1, &why);
        }
        Ok(order)
    }

    /// Whether a problem counts as measured for the start order: a measure step ran in full (or
    /// was taken), or its bounded one will be taken (`stopgap`). In session 23's call 7,
    /// level3/004, measured bounded only, started among the problems whose measure step outlived
    /// a budget, though a verify step was all it had left.
    fn is_measured(&self, m: Option<&Measured>, of: StepOf<'_>) -> Result<bool> {
        match m {
            Some(m) if m.in_full => Ok(true),
            // Any run's verify counts: a redecided problem is never counted measured (the caller).
            Some(Measured { bounded: Some(bounded), .. }) => Ok(self.stopgap(of, bounded, 0)?.is_some()),
            _ => Ok(false),
        }
    }

    /// Why a finished step's result (`latest`: bounded, or an older full one) stands for `of`'s
    /// step in this run: this run cannot hold the step in full; or running it in full was tried
    /// since and came to nothing (failed, or killed with its run after its work began); or the
    /// problem went on from a bounded result (its verify step finished since, in run `since` or
    /// later: a redecision's window).
    /// `None`: run it in full. A bounded result is a stopgap, but in session 23
    /// level3/004's bounded measure step (the rewrite left out) was run again in full, failed
    /// after 430 s with torch's CUDA graph trees assertion, and took its beam and result steps
    /// with it.
    ///
    /// A bounded measure or beam step's floor understates the step: it prepared only some of its
    /// variants. Its length in full is judged by that share (`full_length`); in session 28
    /// level3/010's bounded measure step ran 348.8 s with 2 of its 10 variants prepared, so a
    /// 420 s budget, which its floor fits, would have spent a call running it again.
    fn stopgap(&self, of: StepOf<'_>, latest: &kforge_store::StepRow, since: u64) -> Result<Option<Stopgap>> {
        if !self.spending.fits_in_full(of) {
            return Ok(Some(Stopgap::NoRoom));
        }
        if let Some(full) = self.full_length(latest).filter(|f| !self.spending.holds_s(f.seconds)) {
            return Ok(Some(Stopgap::TooLong(full)));
        }
        if let Some(tried) = self.journal.tried_in_full_since(latest)? {
            return Ok(Some(Stopgap::FullFailed(Box::new(tried))));
        }
        let went_on =
            if is_bounded(latest.outcome.as_deref()) { self.journal.verified_after(latest, since)? } else { None };
        Ok(went_on.map(|verified| Stopgap::MovedOn(Box::new(verified))))
    }

    /// What a bounded step (`latest`) would take in full, judged by the share of its variants it
    /// prepared: its seconds × all ÷ prepared. `None` for a step that ran in full, or whose output
    /// is not a measurement with variants left out.
    fn full_length(&self, latest: &kforge_store::StepRow) -> Option<FullLength> {
        if !is_bounded(latest.outcome.as_deref()) {
            return None;
        }
        let text = std::fs::read_to_string(self.a.out.join(latest.output.as_deref()?)).ok()?;
        full_length_of(&text, latest.seconds?)
    }

    /// One problem of a campaign, whatever happened to it.
    fn outcome(&self, index: usize, rel: &Path, path: &Path) -> ProblemOutcome {
        let t0 = Instant::now();
        let gpu_s = Cell::new(0.0);
        let out = self.a.out.join(rel.with_extension(""));
        let (report, error, not_reached, resumed) =
            match self.problem(index, path, &out, &gpu_s).and_then(|o| self.problem_page(o, path, &out)) {
                Ok(Outcome::Decided { report, resumed }) => (Some(report), None, None, resumed),
                Ok(Outcome::NotReached) => (None, None, Some("budget".to_string()), false),
                Err(e) => {
                    self.progress(index, path, &format!("failed: {e:#}"));
                    (None, Some(format!("{e:#}")), None, false)
                }
            };
        let this_run = Spent { seconds: t0.elapsed().as_secs_f64(), gpu_seconds: gpu_s.get() };
        ProblemOutcome { error, not_reached, resumed, ..outcome_of(rel, report.as_deref(), this_run) }
    }

    /// One problem in `out`: taken from the journal with `--resume` (or from the decisions file),
    /// else its steps in turn. With `--decisions`, a decision made here goes into the file (one
    /// taken from the journal went in when it was made, if the file was in use then).
    fn problem(&self, index: usize, problem: &Path, out: &Path, gpu_s: &Cell<f64>) -> Result<Outcome> {
        let q = question(self.a, self.plan, problem);
        let (since, starts_redecision) = self.redecided_since(index, problem, &q)?;
        if let Some(report) = self.resumed(index, problem, &q, out, since)? {
            match (&report.machine, &self.plan.machine) {
                (Some(then), Ok(now)) if then != now => self.progress(
                    index,
                    problem,
                    &format!("its report was decided on {then}, this run is on {now}: run again"),
                ),
                _ => {
                    self.progress(index, problem, "resumed: its decision is in the journal");
                    let report = self.confirmed_from_decisions(problem, &q, report)?;
                    self.result_files_from_decisions(index, problem, &q, &report, out)?;
                    return Ok(Outcome::Decided { report: Box::new(report), resumed: true });
                }
            }
        }
        // Decided again since a run of this journal: its own decision, above, is the only one taken.
        let restored = if since.is_none() { self.restored_from_decisions(index, problem, &q, out)? } else { None };
        if let Some(report) = restored {
            let from = self.decisions.as_ref().map(|d| d.path.display().to_string()).unwrap_or_default();
            self.progress(index, problem, &format!("resumed: its decision is in the decisions file {from}"));
            return Ok(Outcome::Decided { report: Box::new(report), resumed: true });
        }
        if self.spending.spent().is_some() {
            self.progress(index, problem, "not reached: budget");
            return Ok(Outcome::NotReached);
        }
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let source = std::fs::read(problem).with_context(|| format!("reading {}", problem.display()))?;
        let source_hash = content_hash(&[&source]);
        let (started, earlier) = (Instant::now(), Cell::new(Spent::default()));
        let (until, group) = (Cell::new(None), step_group(&q.problem));
        let p = ProblemRun {
            run: self,
            index,
            problem,
            out,
            source,
            question: q,
            group,
            since,
            unmarked: Cell::new(starts_redecision),
            gpu_s,
            started,
            earlier,
            until,
            deadline: Cell::new(None),
            step_id: Cell::new(None),
            began: Cell::new(None),
            withdrawn: Cell::new(None),
        };
        let outcome = p.steps()?;
        if let (Some(d), Outcome::Decided { report, .. }) = (&self.decisions, &outcome) {
            // A file that cannot be written is a warning: the decision is in the report and journal.
            if let Err(why) = d.record(report, source_hash, out) {
                self.progress(index, problem, &format!("warning: its decision is not in the decisions file: {why}"));
            }
        }
        Ok(outcome)
    }

    /// A journal's report without gate 4's speedup (`Report::confirmed`: decided before reports
    /// recorded it) takes it from the decisions file's entry of the same decision, where one was
    /// filled in afterwards (`scripts/analysis/backfill_confirmed.py`): the run's summary then
    /// counts what `--summarize` counts.
    fn confirmed_from_decisions(&self, problem: &Path, q: &Question, mut report: Report) -> Result<Report> {
        let Some(d) = self.decisions.as_ref().filter(|_| report.confirmed.is_none()) else { return Ok(report) };
        if let Answer::Taken(e) = d.answer(problem, q)? {
            if e.report.decision == report.decision {
                report.confirmed = e.report.confirmed;
            }
        }
        Ok(report)
    }

    /// A journal's decision whose folder lost a result file (a state pack from before result
    /// files were packed, or a file removed) gets them back from the decisions file's entry of the
    /// same decision on this machine for this source, where it carries them as decided
    /// (`Entry::result_files`): a re-verification then finds the result it names. Said when done.
    fn result_files_from_decisions(
        &self,
        index: usize,
        problem: &Path,
        q: &Question,
        report: &Report,
        out: &Path,
    ) -> Result<()> {
        if RESULT_FILES.iter().all(|n| out.join(n).exists()) {
            return Ok(());
        }
        let Some(d) = self.decisions.as_ref() else { return Ok(()) };
        let Answer::Taken(e) = d.answer(problem, q)? else { return Ok(()) };
        if e.report.decision == report.decision && write_result_files(e, out)? {
            let from = d.path.display();
            self.progress(index, problem, &format!("its result files were missing here: written from {from}"));
        }
        Ok(())
    }

    /// With `--resume --decisions`, the file's report for this question, decided on this machine
    /// for this source, restored as the problem's `out/report.json` and journaled as its decision
    /// (so that the folder resumes without the file too). Its result files are kept where the
    /// folder still holds the ones it names (`Entry::result_hash`); other result files there are
    /// another decision's and are removed, and the entry's own (`Entry::result_files`) are
    /// written in their place. An entry that does not hold here is said and decided again.
    fn restored_from_decisions(
        &self,
        index: usize,
        problem: &Path,
        q: &Question,
        out: &Path,
    ) -> Result<Option<Report>> {
        let Some(d) = self.decisions.as_ref().filter(|_| self.a.resume) else { return Ok(None) };
        let entry = match d.answer(problem, q)? {
            Answer::Nothing => return Ok(None),
            Answer::Stale(why) => {
                self.progress(
                    index,
                    problem,
                    &format!("the decisions file's entry does not hold here ({why}): run again"),
                );
                return Ok(None);
            }
            Answer::Taken(e) => e,
        };
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let mut report = entry.report.clone();
        report.source_hash = Some(entry.source_hash.clone());
        let here = files_hash(out, &RESULT_FILES).ok();
        if here.is_none() || here != entry.result_hash {
            // Not the result it names (or half of one): another decision's files; the report that
            // named them is replaced below, as any run asked another question replaces it.
            for stale in RESULT_FILES.map(|n| out.join(n)).iter().filter(|p| p.exists()) {
                std::fs::remove_file(stale)
                    .with_context(|| format!("removing {} (another decision's)", stale.display()))?;
            }
            if !write_result_files(entry, out)? && entry.result_hash.is_some() {
                let why = if entry.result_files.is_empty() {
                    "its result files are not in the decisions file (decided before it carried them, or not text)"
                } else {
                    "the decisions file's result files do not hash as decided (edited since?)"
                };
                self.progress(index, problem, &format!("{why}: the report alone is restored"));
            }
        }
        (report.result, report.policy) = (journaled(out, RESULT_FILES[0]), journaled(out, RESULT_FILES[1]));
        let path = out.join("report.json");
        let body = serde_json::to_string_pretty(&report).context("serializing the report")?;
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
        self.journal.decided(q, &report.decision, Path::new(&journaled(out, "report.json")))?;
        Ok(Some(report))
    }

    /// With `--resume`, the problem's report (`out/report.json`) when it answers the same
    /// question for the same source (the file unchanged since; a report from before
    /// `Report::source_hash` is taken) and the journal holds a decision for it (or the report
    /// is from before the journal: a journal without any decision of this problem).
    fn resumed(
        &self,
        index: usize,
        problem: &Path,
        q: &Question,
        out: &Path,
        since: Option<u64>,
    ) -> Result<Option<Report>> {
        if !self.a.resume {
            return Ok(None);
        }
        if let Some(s) = since {
            // Decided again from run `s` on: only a decision of that run or a later one counts.
            if self.journal.decision_for(q)?.is_none_or(|d| d.run < s) {
                return Ok(None);
            }
        }
        let Ok(text) = std::fs::read_to_string(out.join("report.json")) else { return Ok(None) };
        let Some(report) = serde_json::from_str::<Report>(&text).ok().filter(|r| r.question == *q) else {
            return Ok(None);
        };
        if report.llm.as_ref().is_some_and(|l| l.cut_short()) {
            return Ok(None); // its llm search was cut short: continued, not taken
        }
        if let Some(decided_for) = &report.source_hash {
            let source = std::fs::read(problem).with_context(|| format!("reading {}", problem.display()))?;
            if *decided_for != content_hash(&[&source]) {
                self.progress(index, problem, "its source changed since its decision: decided again");
                return Ok(None);
            }
        }
        let journaled = self.journal.decision_for(q)?.is_some();
        Ok((journaled || !self.journal.decided_any(&q.problem)?).then_some(report))
    }

    /// The run from which `problem` is decided again, if one is, and whether this run starts that
    /// redecision (to be journaled when its first step starts, so that a run that starts nothing
    /// leaves the journal as it was). `--redecide` naming it starts one, unless an earlier run's
    /// redecision of it is still undecided: that one goes on (the flag given twice is harmless).
    /// Without the flag, the journal's latest redecision.
    fn redecided_since(&self, index: usize, problem: &Path, q: &Question) -> Result<(Option<u64>, bool)> {
        let marked = if self.a.resume { self.journal.redecided_since(&q.problem)? } else { None };
        if !self.redecide.matches(&problem.display().to_string()) {
            return Ok((marked, false));
        }
        if let Some(m) = marked {
            if self.journal.decision_for(q)?.is_none_or(|d| d.run < m) {
                self.progress(index, problem, &format!("decided again (--redecide): run {m}'s redecision goes on"));
                return Ok((Some(m), false));
            }
        }
        self.progress(index, problem, "decided again (--redecide): earlier runs' decision and steps are not taken");
        Ok((Some(self.journal.run()), true))
    }

    /// `kforge verify PROBLEM FILE --policy POLICY --json VERDICT` (this binary) with the run's
    /// size, device and interpreter: without gate 4 on the CPU, as a daemon job with `--daemon`,
    /// its job then declaring `declared` bytes of GPU memory when given.
    fn verify_command(
        &self,
        problem: &Path,
        (file, policy, verdict): (&Path, &Path, &Path),
        declared: Option<u64>,
    ) -> Result<Command> {
        let (a, gpu) = (self.a, self.plan.gpu);
        let mut cmd = Command::new(crate::output::this_binary()?);
        cmd.arg("--socket").arg(self.socket).arg("verify").arg(problem).arg(file);
        cmd.arg("--policy").arg(policy).args(["--size", &a.size, "--python", &a.python]);
        cmd.arg("--json").arg(verdict).args(["--device", if gpu { a.device.as_str() } else { "cpu" }]);
        if !gpu {
            cmd.arg("--no-performance");
        }
        if a.daemon {
            cmd.arg("--daemon");
        }
        if let (true, Some(bytes)) = (a.daemon, declared) {
            // Exact: a division by a power of two, printed so that it parses back to the same bytes.
            cmd.arg("--gpu-memory").arg(format!("{}", bytes as f64 / (1u64 << 30) as f64));
        }
        Ok(cmd)
    }

    /// With `--daemon`, the region time of the verify jobs of `problem` queued since `since_ns`
    /// (the label `kforge verify` gives them: `verify:PROBLEM:SIZE`).
    fn verify_region_s(&self, problem: &Path, since_ns: i64) -> Option<f64> {
        if !self.a.daemon {
            return None;
        }
        let label = format!("verify:{}:{}", problem.display(), self.a.size);
        self.known_region_s(crate::job::region_seconds(self.socket, &label, None, Some(since_ns)), &label)
    }

    /// A region time the daemon gave, or none (the step's GPU time is then its wall time, and
    /// its progress line says "wall") with a warning that says why.
    fn known_region_s(&self, asked: Result<f64>, what: &str) -> Option<f64> {
        asked
            .map_err(|e| {
                eprintln!("kforge optimize: warning: no region time for {what} ({e:#}): its wall time is counted")
            })
            .ok()
    }

    /// A progress line: the problem, what happened, the time and budget left.
    fn progress(&self, index: usize, problem: &Path, what: &str) {
        let shown =
            if self.a.problem.is_dir() { problem.strip_prefix(&self.a.problem).unwrap_or(problem) } else { problem };
        eprintln!(
            "kforge optimize: [{index}/{}] {}: {what} ({})",
            self.total,
            shown.display(),
            self.spending.progress()
        );
    }
}

/// What a device of the daemon holds for admission (`admission_note`): its name, whether it is
/// a GPU, its total memory (None: no sample) and its `max_concurrent`.
struct DeviceRoom {
    name: String,
    gpu: bool,
    total_bytes: Option<u64>,
    max_concurrent: usize,
}

impl DeviceRoom {
    fn of(d: &kforge_proto::DeviceStatus) -> DeviceRoom {
        let total_bytes = d.memory.as_ref().map(|m| m.total_bytes);
        DeviceRoom { name: d.name.clone(), gpu: d.kind == "gpu", total_bytes, max_concurrent: d.max_concurrent }
    }
}

/// Why `in_flight` problems' jobs will wait in the daemon's queue, if they will: the devices
/// they may use (`device`: `auto` is every GPU) admit fewer of them at once, each expected to
/// peak at the `declared` bytes (`--gpu-memory`) or at the daemon's default for unknown jobs, and
/// no more than a device's `max_concurrent`. None when they fit, or a device has no memory sample.
fn admission_note(rooms: &[DeviceRoom], device: &str, in_flight: usize, declared: Option<u64>) -> Option<String> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut fit = 0;
    let mut each = Vec::new();
    for d in rooms.iter().filter(|d| if device == "auto" { d.gpu } else { d.name == device }) {
        let total = d.total_bytes?;
        let peak = declared.unwrap_or(total / kforge_proto::DEFAULT_GPU_MEMORY_SHARE).max(1);
        let n = usize::try_from(total / peak).unwrap_or(usize::MAX).min(d.max_concurrent);
        fit += n;
        each.push(format!("{n} on {} ({:.1} of {:.1} GiB each)", d.name, gib(peak), gib(total)));
    }
    if fit == 0 || in_flight <= fit {
        return None;
    }
    let whose = match declared {
        Some(_) => "as --gpu-memory declares",
        None => "the daemon's default for jobs it has not seen, unless earlier runs taught it less; --gpu-memory GIB declares it",
    };
    Some(format!(
        "{in_flight} problems in flight, but the daemon admits about {fit} of their jobs at once ({}: peaks {whose}): \
         the others wait in its queue, and fewer --jobs would start no more than fit",
        each.join(", ")
    ))
}

/// Run `cmd`, its stderr kept: its exit status, or `None` when it ran past `limit` and was
/// killed. It stays in this process's group, so a Ctrl-C reaches it too (Inductor's compile
/// workers leave when their parent is gone).
fn run_within(mut cmd: Command, limit: Duration) -> Result<(Option<std::process::ExitStatus>, String)> {
    use std::io::Read;
    let mut child = cmd.stderr(Stdio::piped()).spawn()?;
    let mut pipe = child.stderr.take().context("the step's stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // A killed step's children may hold its stderr open a while: its text is waited for briefly.
    let wait = if status.is_some() { Duration::from_secs(3600) } else { Duration::from_secs(5) };
    let err = String::from_utf8_lossy(&rx.recv_timeout(wait).unwrap_or_default()).into_owned();
    Ok((status, err))
}

/// The content hash of files in `dir` (their names and contents, in order).
fn files_hash(dir: &Path, names: &[&str]) -> Result<String> {
    let mut contents = Vec::new();
    for n in names {
        let path = dir.join(n);
        contents.push(std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?);
    }
    Ok(hash_of(names, &contents))
}

/// The hash of named contents: each name, then its bytes.
fn hash_of(names: &[&str], contents: &[Vec<u8>]) -> String {
    let parts: Vec<&[u8]> = names.iter().zip(contents).flat_map(|(n, c)| [n.as_bytes(), c.as_slice()]).collect();
    content_hash(&parts)
}

/// What a step's work reports: its device seconds when known better than its wall seconds, and
/// its one-word answer (verify: the outcome).
#[derive(Default)]
struct Work {
    region_s: Option<f64>,
    /// Device seconds known better than the step's wall seconds but not as region time (the llm
    /// step without the daemon: its verifications' wall seconds, not the model's latency).
    device_wall_s: Option<f64>,
    outcome: Option<String>,
    /// Its device seconds were charged to the run's budget as they were spent (not again at its end).
    charged: bool,
}

/// The start of a finished step's outcome when its work is not complete (a budget or a failing
/// provider cut it short): it is journaled, but never stands for a later run's step.
const INCOMPLETE: &str = "incomplete";

/// What a problem's steps found so far.
#[derive(Default)]
struct Found {
    measurement: Option<DispatchMeasurement>,
    beam: Option<BeamOutcome>,
    /// The beam step's input hash (its candidates are journaled under it).
    beam_hash: Option<String>,
    verified: Option<Verified>,
    /// The config agent's measurement, its result's verdict, or why its step did not run or
    /// failed.
    config: Option<ConfigMeasurement>,
    config_verified: Option<Verified>,
    config_skipped: Option<String>,
    config_error: Option<String>,
    /// The LLM family's report, or why its step failed.
    llm: Option<kforge_optimize::llm::LlmReport>,
    llm_error: Option<String>,
    /// The dispatch family's result files verified in turn, and the runner-up's measurement and
    /// file when the measured winner was rejected (`kforge_optimize::RUNNER_UPS`).
    tried: Vec<Tried>,
    runner_up: Option<(DispatchMeasurement, String)>,
}

/// The config step's `--beat`: a speedup as its input hash spells it (four decimals).
fn beat_arg(beat: f64) -> String {
    format!("{beat:.4}")
}

impl Found {
    /// The speedup the dispatch family's verified result has (1.0 when it has none): the config
    /// agent searches only when its Amdahl ceiling exceeds it (a family wins `across` only by a
    /// larger speedup).
    fn dispatch_speedup(&self, gpu: bool) -> f64 {
        let Some((m, _)) = self.decisive() else { return 1.0 };
        match kforge_optimize::decide(m, self.verified, gpu) {
            Decision::Improved { speedup, .. } => speedup.max(1.0),
            Decision::Fallback { .. } => 1.0,
        }
    }

    /// The measurement the result and the decision come from: a runner-up's after a rejected
    /// winner, else the beam's second round when it ran, else the first; and its file.
    fn decisive(&self) -> Option<(&DispatchMeasurement, &str)> {
        if let Some((m, file)) = &self.runner_up {
            return Some((m, file.as_str()));
        }
        match self.beam.as_ref().and_then(|b| b.measurement.as_ref()) {
            Some(m) => Some((m, "beam.json")),
            None => self.measurement.as_ref().map(|m| (m, "dispatch.json")),
        }
    }
}

/// The config step's outputs (below the problem's folder): its measurement and result file.
const CONFIG_OUTPUTS: [&str; 3] = ["config/config.json", "config/model_new.py", "config/policy.toml"];

/// Whether a step's output says its deadlines cut it: variants left out (`not_prepared`), rounds
/// not timed (`rounds_cut`), kernels not tuned (`not_tuned`). An output it cannot read says
/// nothing (the step's own reading of it names the problem).
fn deadlines_cut(output: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(output) else { return false };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { return false };
    let listed = |k: &str| v[k].as_array().is_some_and(|a| !a.is_empty());
    listed("not_prepared") || listed("not_tuned") || !v["rounds_cut"].is_null()
}

/// A step's deadlines (Unix seconds), when it started bounded or under a wall budget's safety
/// net: its bounded part's (`--prepare-until`, `--tune-until`) and its end's (`--until`).
#[derive(Debug, Clone, Copy)]
struct Deadline {
    part: f64,
    end: f64,
}

/// Why a bounded result stands for a step (`Run::stopgap`).
enum Stopgap {
    /// The run's wall budget cannot hold the step in full.
    NoRoom,
    /// Nor what the step would take in full, judged by the variants it prepared.
    TooLong(FullLength),
    /// Running it in full was tried since and came to nothing: that attempt.
    FullFailed(Box<kforge_store::StepRow>),
    /// The problem went on from it: its verify step (this row) finished since.
    MovedOn(Box<kforge_store::StepRow>),
}

/// Whether a step's one-word answer says it ran bounded (`journal::BOUNDED`).
fn is_bounded(outcome: Option<&str>) -> bool {
    outcome == Some(kforge_optimize::journal::BOUNDED)
}

/// A bounded measurement's length in full, extrapolated (`full_length_of`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct FullLength {
    seconds: f64,
    prepared: usize,
    variants: usize,
}

/// What a bounded measurement (a measure or beam step's output `text`, which ran `seconds`)
/// would take in full: `seconds` × its variants ÷ those it prepared (tried, whether they
/// compiled or not; the baseline among them). `None` when it left none out, prepared none, or
/// is not such a measurement.
fn full_length_of(text: &str, seconds: f64) -> Option<FullLength> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let left_out = v["not_prepared"].as_array()?.len();
    let prepared =
        v["prepared"].as_object()?.values().filter(|p| p.get("not_prepared").is_none_or(|n| n.is_null())).count();
    if left_out == 0 || prepared == 0 {
        return None;
    }
    let variants = prepared + left_out;
    Some(FullLength { seconds: seconds * variants as f64 / prepared as f64, prepared, variants })
}

/// One problem's run: its steps, each journaled.
struct ProblemRun<'a> {
    run: &'a Run<'a>,
    index: usize,
    problem: &'a Path,
    out: &'a Path,
    source: Vec<u8>,
    question: Question,
    /// Its steps' group for the spending's estimates (`step_group`).
    group: String,
    /// Decided again (`--redecide`) from this run on: no step of a run before it is taken.
    since: Option<u64>,
    /// This run starts that redecision and has not journaled it yet (at its first step).
    unmarked: Cell<bool>,
    gpu_s: &'a Cell<f64>,
    /// When its steps began, and what the steps it took from earlier runs had cost there: with
    /// this run's, what deciding it cost (`Report::spent`).
    started: Instant,
    earlier: Cell<Spent>,
    /// When the step about to run must stop its bounded part (a measure step preparing variants,
    /// a config step tuning) and end, when the budget started it bounded
    /// (`Admission::Bounded`); set by `step` before its work.
    until: Cell<Option<Deadline>>,
    /// The deadlines the step about to run was given: `until`'s, or the safety net's of a step
    /// admitted in full under a wall budget (`Spending::safety_net`); set by `bounded_work`.
    deadline: Cell<Option<Deadline>>,
    /// The journal's id of the step running now, and which step (set by `step` before its work).
    step_id: Cell<Option<(u64, Step, Instant)>>,
    /// When the running step's work began (its daemon job started), if it has.
    began: Cell<Option<Instant>>,
    /// Why the running step was withdrawn when its job started late (`still_runs`).
    withdrawn: Cell<Option<String>>,
}

/// Clears a problem's running-step state (`step_id`, `began`, `withdrawn`) when `step` returns:
/// a job run after the step (the baseline's result file) is no step's.
struct StepEnds<'a, 'b>(&'a ProblemRun<'b>);

impl Drop for StepEnds<'_, '_> {
    fn drop(&mut self) {
        self.0.step_id.set(None);
        self.0.began.set(None);
        self.0.withdrawn.set(None);
    }
}

impl ProblemRun<'_> {
    /// The running step's work begins now (its daemon job started, or it needs none): journaled
    /// so that a step that waited in the daemon's queue is not counted as having run. A failed
    /// write is not the step's failure (the budget's estimates are then only less precise).
    /// Outside a step (a job `decide` runs after the last one) it does nothing.
    fn work_began(&self) {
        let Some((id, step, t0)) = self.step_id.get() else { return };
        if self.began.get().is_none() {
            self.began.set(Some(Instant::now()));
            let waited = t0.elapsed().as_secs_f64();
            if waited >= 1.0 {
                self.progress(&format!("{}: its job started after {waited:.1} s in the daemon's queue", step.name()));
            }
        }
        let _ = self.run.journal.work_began(id);
    }

    /// The daemon started the running step's job now: whether it should still run. A step the
    /// budget admitted whose job waited in the daemon's queue until the wall budget's remainder
    /// can no longer hold it is withdrawn (`Spending::no_longer_fits`; `step` journals it and the
    /// problem is not reached): run, it would be killed at the end with its work lost. A step
    /// started bounded runs whenever it starts (its deadline holds), and so does a job outside
    /// a step.
    fn still_runs(&self) -> bool {
        self.work_began();
        let (None, Some((_, step, _))) = (self.until.get(), self.step_id.get()) else { return true };
        let Some(why) = self.run.spending.no_longer_fits(self.step_of(step)) else { return true };
        self.withdrawn.set(Some(why));
        false
    }

    /// Journal that this run decides the problem again, before its first step (`--redecide`), and
    /// take its entry out of the decisions file.
    fn mark_redecision(&self) -> Result<()> {
        if !self.unmarked.replace(false) {
            return Ok(());
        }
        self.run.journal.redecide(&self.question.problem).context("journaling the redecision")?;
        if let Some(d) = &self.run.decisions {
            match d.forget(&self.question) {
                Ok(true) => self.progress(&format!("its entry left the decisions file {}", d.path.display())),
                Ok(false) => {}
                Err(why) => self.progress(&format!("warning: its entry is still in the decisions file: {why}")),
            }
        }
        Ok(())
    }

    /// `step` of this problem, as the spending's estimates know it.
    fn step_of(&self, step: Step) -> StepOf<'_> {
        StepOf { step: step.name(), group: &self.group, problem: &self.question.problem }
    }

    /// The steps of `kforge_optimize::search` in order, then the decision; `NotReached` when a
    /// budget was spent before a step.
    fn steps(&self) -> Result<Outcome> {
        let plan = self.run.plan;
        let flags = measure_args(&plan.agents, plan.gpu);
        let measure_hash = self.measure_hash(&flags);
        let mut found = Found::default();
        for step in kforge_optimize::search::steps(&plan.agents, plan.beam_width) {
            if !self.take_step(step, &flags, &measure_hash, &mut found)? {
                return Ok(Outcome::NotReached);
            }
        }
        self.decide(found, &measure_hash)
    }

    /// The config step's input hash: the steps' version, the problem's source, size, device,
    /// baseline, rounds and the speedup it has to beat (`--beat`).
    fn config_hash(&self, beat: f64) -> String {
        let (a, plan) = (self.run.a, self.run.plan);
        let (rounds, steps, beat) = (a.rounds.to_string(), STEPS_VERSION.to_string(), beat_arg(beat));
        let device = plan.device_key(&a.device);
        content_hash(&[
            steps.as_bytes(),
            CONFIG_VARIANT.as_bytes(),
            &self.source,
            a.size.as_bytes(),
            device.as_bytes(),
            plan.baseline.mode().as_bytes(),
            rounds.as_bytes(),
            beat.as_bytes(),
        ])
    }

    /// The measure step's input hash (`measure_hash`) of this problem.
    fn measure_hash(&self, flags: &[(&str, String)]) -> String {
        measure_hash(self.run.a, self.run.plan, &self.source, flags)
    }

    /// One step, what it found kept in `found`; false when a budget kept it from starting.
    fn take_step(&self, step: Step, flags: &[(&str, String)], measure_hash: &str, found: &mut Found) -> Result<bool> {
        match step {
            Step::Measure if !kforge_optimize::search::dispatch_family(&self.run.plan.agents) => {
                // No agent of the dispatch family: nothing to time, the baseline stands for it.
                let m = DispatchMeasurement::baseline_only(self.run.plan.baseline);
                let write = || -> Result<Work> {
                    let path = self.out.join("dispatch.json");
                    std::fs::write(&path, serde_json::to_string_pretty(&m)?)
                        .with_context(|| format!("writing {}", path.display()))?;
                    Ok(Work::default())
                };
                let Some(_) = self.step(step, measure_hash, &["dispatch.json"], write)? else {
                    return Ok(false);
                };
                found.measurement = Some(m);
            }
            Step::Measure => {
                let measure = || self.measure(flags, "dispatch.json");
                let Some(_) = self.step(step, measure_hash, &["dispatch.json"], measure)? else {
                    return Ok(false);
                };
                let m = self.read_measurement("dispatch.json")?;
                if !m.not_prepared.is_empty() {
                    self.progress(&format!(
                        "measure: left out by its deadline: {} (not prepared, not timed)",
                        m.not_prepared.join(", ")
                    ));
                }
                if let Some(cut) = &m.rounds_cut {
                    self.progress(&format!("measure: {cut}"));
                }
                found.measurement = Some(m);
            }
            Step::Beam => return self.beam(measure_hash, found),
            Step::Result => {
                let (_, file) = found.decisive().context("the result step before the measure step")?;
                if !self.result_step(file)? {
                    return Ok(false);
                }
            }
            Step::Verify => return self.verify_in_turn(found),
            Step::Config => {
                if !self.run.plan.gpu {
                    self.progress(&format!("config: skipped: {}", &CONFIG_NEEDS_A_GPU["config: ".len()..]));
                    found.config_skipped = Some(CONFIG_NEEDS_A_GPU.into());
                    return Ok(true);
                }
                let beat = found.dispatch_speedup(self.run.plan.gpu);
                let share = found.measurement.as_ref().and_then(|m| m.baseline_profile.as_ref()?.triton_share);
                let cannot_win = share.and_then(|s| kforge_optimize::config_cannot_win(s, beat));
                // An optional agent no run of this budget holds is skipped, not held back forever
                // (unless it starts bounded, `--tune-until`: at a run's start; reached later in a
                // run, the admission holds it back for the next run's start).
                if let Some(why) =
                    cannot_win.or_else(|| self.run.spending.never_fits(self.step_of(step), step.bounds_itself()))
                {
                    self.progress(&format!("config: skipped: {why}"));
                    found.config_skipped = Some(format!("config: {why}"));
                    return Ok(true);
                }
                // A failed config step is its family's fallback (journaled as failed; --resume runs
                // it again), not the problem's failure: the dispatch family's result stands.
                match self.config_step(beat) {
                    Ok(None) => return Ok(false),
                    Ok(Some(m)) => found.config = Some(m),
                    Err(e) => {
                        self.progress(&format!("config: failed: {e:#}"));
                        found.config_error = Some(format!("{e:#}"));
                    }
                }
            }
            Step::Llm => {
                let (Some(plan), Some(chat)) = (&self.run.plan.llm, &self.run.chat) else {
                    bail!("the llm step without the llm agent's settings");
                };
                // A failed llm step is its family's fallback, like the config step's.
                match self.llm_step(plan, chat) {
                    Ok(None) => return Ok(false),
                    Ok(Some(r)) => found.llm = Some(r),
                    Err(e) => {
                        self.progress(&format!("llm: failed: {e:#}"));
                        found.llm_error = Some(format!("{e:#}"));
                    }
                }
            }
            Step::ConfigVerify => {
                if !found.config.as_ref().is_some_and(ConfigMeasurement::won) {
                    return Ok(true); // skipped, or config did not win: nothing to verify
                }
                let Some(answer) = self.verify_step(step, "config")? else { return Ok(false) };
                found.config_verified = Some(answer);
            }
        }
        Ok(true)
    }

    /// The beam's second round (`kforge_optimize::beam`): the knobs that helped, combined, timed
    /// beside the first round's best; or why the search stops after the first round.
    fn beam(&self, measure_hash: &str, found: &mut Found) -> Result<bool> {
        let first = found.measurement.as_ref().context("the beam step before the measure step")?;
        let round = if first.winner.ends_with("~rewrite") {
            Err(format!(
                "beam: stopped after round 1: its winner {} is a rewrite, knobs are combined on the baseline's mode",
                first.winner
            ))
        } else {
            kforge_optimize::beam::second_round(first, self.run.plan.beam_width as usize)
        };
        let round = match round {
            Ok(r) => r,
            Err(why) => {
                self.progress(&why);
                found.beam = Some(BeamOutcome { measurement: None, stopped: Some(why) });
                return Ok(true);
            }
        };
        let flags =
            [("--modes", round.modes.join(",")), ("--knobs", round.knobs.join(",")), ("--rewrite", String::new())];
        let hash = content_hash(&[measure_hash.as_bytes(), b"beam", self.measure_hash(&flags).as_bytes()]);
        let Some(_) = self.step(Step::Beam, &hash, &["beam.json"], || self.measure(&flags, "beam.json"))? else {
            return Ok(false);
        };
        let second = self.read_measurement("beam.json")?;
        found.beam_hash = Some(hash);
        let stopped =
            (!kforge_optimize::beam::improved(&second)).then(|| kforge_optimize::beam::stopped(first, &second));
        found.beam = Some(BeamOutcome { measurement: Some(second), stopped });
        Ok(true)
    }

    /// The result step: `model_new.py` and `policy.toml` written for the winner `file` names;
    /// false when a budget kept it from starting.
    fn result_step(&self, file: &str) -> Result<bool> {
        let hash = content_hash(&[&self.source, files_hash(self.out, &[file])?.as_bytes()]);
        let write = || self.write_result(file).map(|_| Work::default());
        Ok(self.step(Step::Result, &hash, &["model_new.py", "policy.toml"], write)?.is_some())
    }

    /// The verify step: the winner's result file; when the cascade rejects it, the next fastest
    /// variant beyond noise (`kforge_optimize::runner_up`, at most `RUNNER_UPS` of them) gets its
    /// own result file and verification, so a variant that measured faster than it runs
    /// standalone does not hide an honest runner-up. False when a budget stopped it.
    fn verify_in_turn(&self, found: &mut Found) -> Result<bool> {
        let (m, file) = found.decisive().map(|(m, f)| (m.clone(), f.to_string())).context("no measure step")?;
        if m.fallback {
            return Ok(true); // nothing won: nothing to verify
        }
        let gpu = self.run.plan.gpu;
        let mut variant = m.winner.clone();
        loop {
            let Some(answer) = self.verify_step(Step::Verify, "")? else { return Ok(false) };
            found.verified = Some(answer);
            found.tried.push(Tried { variant: variant.clone(), verified: answer });
            let Some(next) = kforge_optimize::next_to_verify(&m, &found.tried, gpu) else { return Ok(true) };
            let tried: Vec<String> = found.tried.iter().map(|t| t.variant.clone()).collect();
            self.progress(&format!(
                "verify: {variant} was {}; its runner-up {next} ({:.3}x) next",
                verified_name(answer),
                m.modes[&next].speedup
            ));
            let name = format!("runner-up-{}.json", found.tried.len());
            self.write_runner_up(&file, &next, &tried, &name)?;
            found.runner_up = Some((kforge_optimize::with_winner(&m, &next), name.clone()));
            if !self.result_step(&name)? {
                return Ok(false);
            }
            variant = next;
        }
    }

    /// `name`: the measurement in `file` with `next` as its winner (the variants `tried` before
    /// it recorded), for the result step.
    fn write_runner_up(&self, file: &str, next: &str, tried: &[String], name: &str) -> Result<()> {
        self.write_with_winner(file, name, next, false, Some(tried))
    }

    /// `to`: the measurement in `from` with `winner` as its winner (`measured_winner` keeps the
    /// one it measured), `fallback` set, and the variants rejected before it when given. One
    /// writer for a runner-up's and a kept baseline's measurement.
    fn write_with_winner(
        &self,
        from: &str,
        to: &str,
        winner: &str,
        fallback: bool,
        rejected: Option<&[String]>,
    ) -> Result<()> {
        let path = self.out.join(from);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        v["measured_winner"] = v["winner"].clone();
        v["winner"] = serde_json::json!(winner);
        v["fallback"] = serde_json::json!(fallback);
        if let Some(r) = rejected {
            v["rejected_before"] = serde_json::json!(r);
        }
        let to = self.out.join(to);
        std::fs::write(&to, serde_json::to_string_pretty(&v)?).with_context(|| format!("writing {}", to.display()))
    }

    fn read_measurement(&self, file: &str) -> Result<DispatchMeasurement> {
        let path = self.out.join(file);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(DispatchMeasurement::parse(&text)?)
    }

    /// The config step and its measurement; `None` when a budget kept it from starting.
    fn config_step(&self, beat: f64) -> Result<Option<ConfigMeasurement>> {
        if self.step(Step::Config, &self.config_hash(beat), &CONFIG_OUTPUTS, || self.config(beat))?.is_none() {
            return Ok(None);
        }
        let path = self.out.join(CONFIG_OUTPUTS[0]);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let m = ConfigMeasurement::parse(&text)?;
        if !m.not_tuned.is_empty() {
            self.progress(&format!("config: left out by its deadline: {} (not tuned)", m.not_tuned.join(", ")));
        }
        if let Some(cut) = &m.rounds_cut {
            self.progress(&format!("config: {cut}"));
        }
        Ok(Some(m))
    }

    /// A verify step of the result file in `dir` (below the problem's folder; `""`: the folder
    /// itself): its outcome, `None` when a budget kept it from starting.
    fn verify_step(&self, step: Step, dir: &str) -> Result<Option<Verified>> {
        let a = self.run.a;
        let folder = self.out.join(dir);
        let inputs = files_hash(&folder, &["model_new.py", "policy.toml"])?;
        let device = self.run.plan.device_key(&a.device);
        let hash = content_hash(&[&self.source, inputs.as_bytes(), a.size.as_bytes(), device.as_bytes()]);
        let verdict = Path::new(dir).join("verdict.json");
        let verdict = verdict.to_str().context("a verdict path")?;
        let Some(answer) = self.step(step, &hash, &[verdict], || self.verify(&folder))? else {
            return Ok(None);
        };
        let name = answer.unwrap_or_default();
        Ok(Some(verified_of(&name).with_context(|| format!("a verify outcome {name:?}"))?))
    }

    /// What deciding the problem cost so far: this run's wall and device seconds of it, and
    /// those of the steps taken from earlier runs.
    fn spent(&self) -> Spent {
        let earlier = self.earlier.get();
        Spent {
            seconds: self.started.elapsed().as_secs_f64() + earlier.seconds,
            gpu_seconds: self.gpu_s.get() + earlier.gpu_seconds,
        }
    }

    /// The journaled step that stands for this one, if any: one that ran in full while this run
    /// can hold the step in full, else the latest finished one where its stopgap rule
    /// (`Run::stopgap`) lets a bounded result stand.
    fn finished_step(&self, step: Step, input_hash: &str) -> Result<Option<kforge_store::StepRow>> {
        let (journal, of) = (&self.run.journal, self.step_of(step));
        if self.run.spending.fits_in_full(of) {
            if let Some(full) = journal.finished_in_full(step, input_hash)? {
                return Ok(Some(full));
            }
        }
        let Some(latest) = journal.finished(step, input_hash)? else { return Ok(None) };
        let Some(why) = self.run.stopgap(of, &latest, self.since.unwrap_or(0))? else { return Ok(None) };
        if let Stopgap::MovedOn(verified) = &why {
            self.progress(&format!(
                "{}: takes its bounded result (step {} of run {}): the problem went on from it (its verify step, \
                 step {} of run {}, finished since)",
                step.name(),
                latest.id,
                latest.run,
                verified.id,
                verified.run,
            ));
        }
        if let Stopgap::TooLong(full) = why {
            self.progress(&format!(
                "{}: takes its bounded result (step {} of run {}): in full it would take about {:.0} s ({} of {} \
                 variants prepared in {:.0} s), more than this run's wall budget holds",
                step.name(),
                latest.id,
                latest.run,
                full.seconds,
                full.prepared,
                full.variants,
                latest.seconds.unwrap_or(0.0),
            ));
        }
        if let Stopgap::FullFailed(tried) = why {
            let error =
                tried.error.as_deref().map_or(String::new(), |e| format!(": {}", kforge_llm::wire::excerpt(e, 200)));
            let ended = if tried.status == "running" { "with its run (killed)" } else { tried.status.as_str() };
            self.progress(&format!(
                "{}: takes its bounded result (step {} of run {}): running it in full again, step {} of run {}, \
                 ended {ended}{error}",
                step.name(),
                latest.id,
                latest.run,
                tried.id,
                tried.run,
            ));
        }
        Ok(Some(latest))
    }

    /// Run a step unless a finished one with the same input hash stands for it (its outputs
    /// taken, copied when they are another problem's); `None` when a budget is spent. Returns
    /// its one-word answer.
    fn step(
        &self,
        step: Step,
        input_hash: &str,
        outputs: &[&str],
        work: impl FnOnce() -> Result<Work>,
    ) -> Result<Option<Option<String>>> {
        let journal = &self.run.journal;
        // A step with the same input in flight in another problem: wait for it, then take its output.
        let same = self.run.in_flight.lock_for(step, input_hash);
        let _one = same.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(outcome) = self.reuse_finished(step, input_hash, outputs)? {
            return Ok(Some(outcome));
        }
        if !self.admit(step) {
            return Ok(None);
        }
        self.mark_redecision()?;
        if let Err(e) = self.keep_standing(step, input_hash, outputs) {
            self.progress(&format!(
                "warning: the finished {} step's output was not kept before it runs again: {e:#}",
                step.name()
            ));
        }
        let id = journal.started(&self.question.problem, step, input_hash)?;
        self.progress(&format!("{}…", step.name()));
        let t0 = Instant::now();
        self.step_id.set(Some((id, step, t0)));
        self.began.set(None);
        let _ends = StepEnds(self); // the step's state goes with it, however it returns
        if !self.run.a.daemon || step == Step::Llm {
            self.work_began(); // no daemon job of its own to wait for
        }
        let done = work().and_then(|w| {
            let seconds = t0.elapsed().as_secs_f64();
            let gpu_seconds = match (w.region_s, w.device_wall_s) {
                (Some(s), _) => Some((s, "region")),
                (None, Some(s)) => Some((s, "wall")),
                (None, None) => step.uses_device().then_some((seconds, "wall")),
            };
            let output_hash = files_hash(self.out, outputs)?;
            let output = self.journaled_step_output(outputs[0]);
            Ok((StepDone { seconds, gpu_seconds, output, output_hash, outcome: w.outcome }, w.charged))
        });
        if let Some(why) = self.withdrawn.take() {
            let waited = self.began.get().map_or(0.0, |b| b.duration_since(t0).as_secs_f64());
            journal.withdrawn(id, t0.elapsed().as_secs_f64(), &why)?;
            self.progress(&format!(
                "not reached: budget (its {} step's job started only after {waited:.1} s in the daemon's queue: {why}; withdrawn)",
                step.name()
            ));
            return Ok(None);
        }
        match done {
            Ok((d, charged)) => self.record_done(id, step, d, charged).map(Some),
            Err(e) => {
                journal.failed(id, t0.elapsed().as_secs_f64(), &format!("{e:#}"), self.deadline.get().is_some())?;
                if self.deadline.get().is_some() {
                    let ran = self.began.get().map_or(0.0, |b| b.elapsed().as_secs_f64());
                    self.run.spending.observe_bounded(self.step_of(step), ran);
                    self.save_undecided();
                }
                Err(e)
            }
        }
    }

    /// A finished, complete step with this input (of this run, or of one `--resume` may take)
    /// whose output files can be taken: journaled as reused, its cost counted where it was
    /// spent, and its outcome returned. `None`: the step is to run.
    fn reuse_finished(&self, step: Step, input_hash: &str, outputs: &[&str]) -> Result<Option<Option<String>>> {
        let journal = &self.run.journal;
        let complete = |f: &kforge_store::StepRow| !f.outcome.as_deref().is_some_and(|o| o.starts_with(INCOMPLETE));
        let taken = |f: &kforge_store::StepRow| self.since.is_none_or(|s| f.run >= s);
        let Some(from) = self.finished_step(step, input_hash)?.filter(complete).filter(taken) else {
            return Ok(None);
        };
        if !self.take(&from.output, &from.output_hash, outputs)? {
            return Ok(None);
        }
        self.mark_redecision()?;
        let id = journal.started(&self.question.problem, step, input_hash)?;
        journal.reused(id, &from, &self.journaled_step_output(outputs[0]))?;
        // Another problem's step (an identical input) is that problem's cost, counted there.
        if from.run != journal.run() && from.problem == self.question.problem {
            let mut e = self.earlier.get();
            e.seconds += from.seconds.unwrap_or(0.0);
            e.gpu_seconds += from.gpu_seconds.unwrap_or(0.0);
            self.earlier.set(e);
        }
        self.progress(&format!("{}: reused (step {} of run {})", step.name(), from.id, from.run));
        Ok(Some(from.outcome))
    }

    /// Whether the run's budget lets the step start: in full, or bounded (its deadline set,
    /// the progress line saying why); `false` when it is refused (the line says why).
    fn admit(&self, step: Step) -> bool {
        self.until.set(None);
        self.deadline.set(None);
        match self.run.spending.admit(self.step_of(step), step.bounds_itself()) {
            Admission::Start => true,
            Admission::Bounded { seconds, end_seconds, why } => {
                self.progress(&format!("{}: bounded: {why}", step.name()));
                let now = unix_now_s();
                self.until.set(Some(Deadline { part: now + seconds, end: now + end_seconds }));
                true
            }
            Admission::Refused(why) => {
                self.progress(&format!("not reached: budget (before its {} step: {why})", step.name()));
                false
            }
        }
    }

    /// A step that ran to its end: journaled, its time taught to the budget (the time its job
    /// waited in the daemon's queue is not what its kind takes; nor is a bounded step's time
    /// what its kind takes in full), its GPU seconds charged unless the work charged them.
    fn record_done(&self, id: u64, step: Step, d: StepDone, charged: bool) -> Result<Option<String>> {
        self.run.journal.done(id, &d)?;
        let ran = self.began.get().map_or(d.seconds, |b| b.elapsed().as_secs_f64().min(d.seconds));
        if !is_bounded(d.outcome.as_deref()) {
            self.run.spending.observe(self.step_of(step), ran);
        } else {
            self.run.spending.observe_bounded(self.step_of(step), ran);
        }
        self.save_undecided();
        let gpu = d.gpu_seconds.map(|g| g.0).unwrap_or(0.0);
        if !charged {
            self.run.spending.charge(gpu);
        }
        self.gpu_s.set(self.gpu_s.get() + gpu);
        let kind = d.gpu_seconds.map(|g| format!(", gpu {:.1} s {}", g.0, g.1)).unwrap_or_default();
        let waited = d.seconds - ran;
        let queued =
            if waited >= 1.0 { format!(" ({waited:.1} s of it in the daemon's queue)") } else { String::new() };
        self.progress(&format!("{} done in {:.1} s{queued}{kind}", step.name(), d.seconds));
        Ok(d.outcome)
    }

    /// With `--decisions`, the problem's step floors and finished steps as the run knows them
    /// now, into the file, for a fresh journal on the next machine (a failed write is said, not
    /// the step's failure).
    fn save_undecided(&self) {
        if let Err(e) = self.run.save_undecided(std::iter::once(self.question.clone())) {
            self.progress(&format!(
                "warning: the decisions file's step floors and carried steps were not written: {e}"
            ));
        }
    }

    /// Whether the files a finished step wrote (beside `output`) still hold what it wrote; they
    /// are copied here when they were another folder's.
    fn take(&self, output: &Option<String>, hash: &Option<String>, names: &[&str]) -> Result<bool> {
        let (Some(output), Some(hash)) = (output, hash) else { return Ok(false) };
        // The folder the names are relative to: the output (the first name) without its parts,
        // where the journal's folder is now (it may have moved since the step ran); else the
        // kept copy, where a rerun that never finished rewrote the files.
        let root = &self.run.a.out;
        let Some((dir, contents)) = step_output_in(root, output, names, hash)
            .or_else(|| step_output_in(&kept_root(root, hash), output, names, hash))
        else {
            return Ok(false);
        };
        // Another folder's (a file is never copied onto itself).
        if dir != absolute_or_as_is(self.out) {
            for (n, bytes) in names.iter().zip(&contents) {
                write_creating(&self.out.join(n), bytes)
                    .with_context(|| format!("copying {} into {}", dir.join(n).display(), self.out.display()))?;
            }
        }
        Ok(true)
    }

    /// Before a step runs again over the files of a finished step of the same input (a bounded
    /// result run in full, a redecision): those files copied into the kept store (`kept_root`),
    /// so that a rerun killed after it rewrote them does not take the finished result with it.
    /// The latest finished step is looked at, and the latest that ran in full (an older full
    /// result may be what the files hold); a failure to keep is a warning, not the step's.
    fn keep_standing(&self, step: Step, input_hash: &str, outputs: &[&str]) -> Result<()> {
        let journal = &self.run.journal;
        let rows = [journal.finished(step, input_hash)?, journal.finished_in_full(step, input_hash)?];
        let root = &self.run.a.out;
        let standing = rows.iter().flatten().find_map(|row| {
            let (output, hash) = (row.output.as_deref()?, row.output_hash.as_deref()?);
            step_output_in(root, output, outputs, hash).map(|(dir, contents)| (dir, contents, hash))
        });
        let Some((dir, contents, hash)) = standing else { return Ok(()) };
        if dir != absolute_or_as_is(self.out) {
            return Ok(()); // another problem's (an identical input): not what this run rewrites
        }
        let within = relative_to_journal(root, &dir);
        if Path::new(&within).is_absolute() {
            return Ok(()); // outside the journal's folder: no kept store for it
        }
        let kept = kept_root(root, hash).join(within);
        outputs.iter().zip(&contents).try_for_each(|(n, bytes)| write_creating(&kept.join(n), bytes))
    }

    fn progress(&self, what: &str) {
        self.run.progress(self.index, self.problem, what)
    }

    /// A step's output file as the journal names it: relative to the journal's folder, so that
    /// a run resumed from another working directory, or after the folder moved (a campaign's
    /// state unpacked on another machine), finds it.
    fn journaled_step_output(&self, name: &str) -> String {
        relative_to_journal(&self.run.a.out, &self.out.join(name))
    }

    /// The decision across the families (the dispatch family's measurement and verdict, the
    /// config agent's when it ran), the result file made the winner's; the report, the
    /// journal's candidates and decision, and a workspace commit for an improvement.
    fn decide(&self, found: Found, measure_hash: &str) -> Result<Outcome> {
        let gpu = self.run.plan.gpu;
        // The dispatch family's decisive measurement: the beam's second round when it ran.
        let (decisive, file) = found.decisive().map(|(m, f)| (m.clone(), f.to_string())).context("no measure step")?;
        let beam_hash = found.beam_hash.clone();
        let measurement = found.measurement.context("no measure step")?;
        let verified = found.verified;
        let dispatch = decide(&decisive, verified, gpu);
        let config = self.run.plan.agents.contains(&Agent::Config).then(|| ConfigReport {
            skipped: found.config_skipped.clone(),
            error: found.config_error.clone(),
            decision: found.config.as_ref().map(|c| decide_config(c, found.config_verified, gpu)),
            verified: found.config_verified,
            result: found.config.as_ref().map(|_| self.out.join(CONFIG_OUTPUTS[1]).display().to_string()),
            measurement: found.config,
        });
        // The config family's decision, or why it has none (skipped, failed: said in a fallback).
        let config_family = config.as_ref().and_then(ConfigReport::family_decision);
        let llm_family = match (&found.llm, &found.llm_error) {
            (Some(r), _) => r.decision.clone(),
            (None, Some(e)) => Some(Decision::Fallback { reason: format!("llm: failed: {e}") }),
            (None, None) => None,
        };
        let families: Vec<Decision> =
            std::iter::once(dispatch.clone()).chain(config_family).chain(llm_family).collect();
        let decision = across(&families);
        self.place_result(&decisive, &file, &dispatch, &decision, found.llm.as_ref())?;
        let (result, policy) = (self.out.join("model_new.py"), self.out.join("policy.toml"));
        let confirmed = self.confirmed(&decision);
        let report = Report {
            question: self.question.clone(),
            measurement,
            verified,
            decision,
            result: result.display().to_string(),
            policy: policy.display().to_string(),
            beam: found.beam,
            config,
            llm: found.llm,
            tried: found.tried,
            spent: Some(self.spent()),
            machine: self.run.plan.machine.clone().ok(),
            source_hash: Some(content_hash(&[&self.source])),
            confirmed,
        };
        let body = serde_json::to_string_pretty(&report).context("serializing the report")?;
        let report_path = self.out.join("report.json");
        std::fs::write(&report_path, &body).with_context(|| format!("writing {}", report_path.display()))?;
        self.journal_candidates(&report, measure_hash, beam_hash.as_deref())?;
        let journal = &self.run.journal;
        journal.decided(&self.question, &report.decision, Path::new(&journaled(self.out, "report.json")))?;
        let what = match &report.decision {
            Decision::Improved { agent, mode, speedup, .. } => {
                let message = format!("optimize {}: {mode} ({}) {speedup:.3}x", self.problem.display(), agent.name());
                if let Some(w) = &self.run.workspace {
                    w.commit(&[&result, &policy, &report_path], &message);
                }
                let v = match agent {
                    Agent::Config => report.config.as_ref().and_then(|c| c.verified),
                    Agent::Llm => Some(Verified::Accepted),
                    _ => verified,
                };
                format!(
                    "decided: {mode} ({}) {speedup:.3}x, {}",
                    agent.name(),
                    v.map(verified_name).unwrap_or_default()
                )
            }
            Decision::Fallback { .. } => "decided: the baseline kept".to_string(),
        };
        self.progress(&what);
        Ok(Outcome::Decided { report: Box::new(report), resumed: false })
    }

    /// Gate 4's speedup of the winner's shipped result file, read from its family's verdict
    /// (`Verdict::speedup`); `None` for the baseline kept, an llm winner (its verdicts are the
    /// llm step's) or a verdict without one (no GPU, gate 4 not run).
    fn confirmed(&self, decision: &Decision) -> Option<f64> {
        let found = confirmed_in(self.out, decision);
        if let Err(why) = &found {
            self.progress(&format!("warning: no confirmed speedup: {why}"));
        }
        found.ok().flatten()
    }

    /// `model_new.py` and `policy.toml` made the decision's (`kforge_optimize::result_from`).
    fn place_result(
        &self,
        m: &DispatchMeasurement,
        file: &str,
        dispatch: &Decision,
        decision: &Decision,
        llm: Option<&kforge_optimize::llm::LlmReport>,
    ) -> Result<()> {
        match result_from(m, dispatch, decision) {
            ResultFrom::Llm => {
                // Its own llm/model_new.py, or (a step taken from an identical problem's folder)
                // the one its report names.
                let own = self.out.join(kforge_optimize::llm::LLM_OUTPUTS[1]);
                let named = llm.and_then(|l| l.result.as_deref()).map(PathBuf::from);
                let from =
                    Some(own).filter(|p| p.is_file()).or(named).context("the llm family won without a result file")?;
                let to = self.out.join("model_new.py");
                std::fs::copy(&from, &to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
                let (from, to) = (self.out.join(kforge_optimize::llm::LLM_OUTPUTS[2]), self.out.join("policy.toml"));
                std::fs::copy(&from, &to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
                Ok(())
            }
            ResultFrom::Config => {
                for (from, to) in CONFIG_OUTPUTS[1..].iter().zip(["model_new.py", "policy.toml"]) {
                    let (from, to) = (self.out.join(from), self.out.join(to));
                    std::fs::copy(&from, &to)
                        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
                }
                Ok(())
            }
            ResultFrom::Baseline => self.keep_baseline(m, file), // the result file becomes the baseline's
            ResultFrom::AsWritten => Ok(()),
        }
    }

    /// Every measured candidate into the journal: the dispatch family's and config's, each with
    /// its verdict when it was verified.
    fn journal_candidates(&self, report: &Report, measure_hash: &str, beam_hash: Option<&str>) -> Result<()> {
        let (journal, problem) = (&self.run.journal, &self.question.problem);
        let mut verified: Vec<(&str, Verified)> =
            report.tried.iter().map(|t| (t.variant.as_str(), t.verified)).collect();
        if verified.is_empty() {
            verified.extend(report.verified.map(|v| (report.decisive().winner.as_str(), v)));
        }
        let round2 = report.beam.as_ref().and_then(|b| b.measurement.as_ref());
        let first: &[(&str, Verified)] = if round2.is_none() { &verified } else { &[] };
        journal.candidates(problem, &report.measurement.modes, measure_hash, first)?;
        if let Some(g) = &report.measurement.graphs {
            // The per-graph search's plans, each once (the one it ended with is in `modes`).
            let hash = content_hash(&[measure_hash.as_bytes(), b"graphs"]);
            journal.candidates(problem, &g.plans_timed(&report.measurement), &hash, &verified)?;
        }
        if let (Some(m), Some(hash)) = (round2, beam_hash) {
            journal.candidates(problem, &m.modes, hash, &verified)?; // the beam's second round
        }
        if let Some(c) = report.config.as_ref().and_then(|c| c.measurement.as_ref()) {
            let verdict: Vec<(&str, Verified)> =
                report.config.as_ref().and_then(|c| c.verified).map(|v| (CONFIG_VARIANT, v)).into_iter().collect();
            journal.candidates(problem, &c.modes, &self.config_hash(c.beat.unwrap_or(1.0)), &verdict)?;
        }
        Ok(())
    }

    /// The agents' measurement, run here or as a daemon job (its region time then counted).
    fn measure(&self, flags: &[(&str, String)], file: &str) -> Result<Work> {
        let (a, plan) = (self.run.a, self.run.plan);
        let out = self.out.join(file);
        let device = if plan.gpu { "cuda" } else { "cpu" };
        let mut args: Vec<String> = ["-m", "kforge.optimize.dispatch"].map(String::from).to_vec();
        args.push(self.problem.display().to_string());
        args.extend(["--out".into(), out.display().to_string(), "--device".into(), device.into()]);
        args.extend(["--size".into(), a.size.clone(), "--baseline".into(), plan.baseline.mode().into()]);
        args.extend(["--rounds".into(), a.rounds.to_string()]);
        for (flag, variants) in flags {
            args.extend([flag.to_string(), variants.clone()]);
        }
        // Not among the flags the step's input hash is made of: workers change how fast the
        // variants compile, not what is measured.
        if plan.compile_workers > 0 {
            args.extend(["--compile-workers".into(), plan.compile_workers.to_string()]);
        }
        self.bounded_work(args, ("--prepare-until", Some("--until")), "dispatch", &out)
    }

    /// The config agent's search and result file (`config/`), run here or as a daemon job.
    fn config(&self, beat: f64) -> Result<Work> {
        let (a, plan) = (self.run.a, self.run.plan);
        let dir = self.out.join("config");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut args: Vec<String> = ["-m", "kforge.optimize.config"].map(String::from).to_vec();
        args.push(self.problem.display().to_string());
        args.extend(["--out".into(), self.out.join(CONFIG_OUTPUTS[0]).display().to_string()]);
        args.extend(["--device".into(), "cuda".into(), "--size".into(), a.size.clone()]);
        args.extend(["--baseline".into(), plan.baseline.mode().into(), "--rounds".into(), a.rounds.to_string()]);
        args.extend(["--result-dir".into(), dir.display().to_string(), "--beat".into(), beat_arg(beat)]);
        let output = self.out.join(CONFIG_OUTPUTS[0]);
        self.bounded_work(args, ("--tune-until", Some("--until")), "config", &output)
    }

    /// A Python step that bounds itself: given deadlines (`until`, set when the budget admitted
    /// it bounded; else the safety net's under a wall budget) it gets `PART_FLAG UNIX_S` for its
    /// bounded part and, where it takes one, `END_FLAG UNIX_S` for its end. It is journaled
    /// `bounded` when it started bounded, or when the safety net cut it (its `output` says what
    /// it left out): then its seconds are not what a step of its kind takes in full.
    fn bounded_work(
        &self,
        mut args: Vec<String>,
        flags: (&str, Option<&str>),
        step: &str,
        output: &Path,
    ) -> Result<Work> {
        let net = || {
            let (part, end) = self.run.spending.safety_net()?;
            let now = unix_now_s();
            Some(Deadline { part: now + part, end: now + end })
        };
        let Some(deadline) = self.until.get().or_else(net) else { return self.python_work(args, step) };
        self.deadline.set(Some(deadline));
        args.extend([flags.0.into(), format!("{:.3}", deadline.part)]);
        if let Some(end) = flags.1 {
            args.extend([end.into(), format!("{:.3}", deadline.end)]);
        }
        let work = self.python_work(args, step)?;
        let bounded = self.until.get().is_some() || deadlines_cut(output);
        Ok(Work { outcome: bounded.then(|| kforge_optimize::journal::BOUNDED.into()), ..work })
    }

    /// A Python step's work: with the daemon, its job's region time.
    fn python_work(&self, args: Vec<String>, step: &str) -> Result<Work> {
        let job = self.python_step(args, step)?;
        let region_s = job.and_then(|(label, id)| {
            self.run.known_region_s(crate::job::region_seconds(self.run.socket, &label, Some(id), None), &label)
        });
        Ok(Work { region_s, ..Work::default() })
    }

    /// `model_new.py` and `policy.toml` for the winner named in `measurement` (a file in `out`).
    fn write_result(&self, measurement: &str) -> Result<()> {
        let args = vec![
            "-m".into(),
            "kforge.optimize.result".into(),
            self.problem.display().to_string(),
            self.out.join(measurement).display().to_string(),
            "--out".into(),
            self.out.display().to_string(),
        ];
        self.python_step(args, "result").map(|_| ()) // host only: a daemon job on its cpu device
    }

    /// The result file rewritten for the baseline (its winner did not pass verification), from
    /// `fallback.json`: the measurement naming the baseline as its winner (`dispatch.json` stays
    /// as measured).
    fn keep_baseline(&self, m: &DispatchMeasurement, file: &str) -> Result<()> {
        self.write_with_winner(file, "fallback.json", &m.baseline, true, None)?;
        self.write_result("fallback.json")
    }

    /// `kforge verify PROBLEM DIR/model_new.py --policy DIR/policy.toml` (this binary): its
    /// outcome, written to `DIR/verdict.json`.
    fn verify(&self, dir: &Path) -> Result<Work> {
        let verdict = dir.join("verdict.json");
        let (file, policy) = (dir.join("model_new.py"), dir.join("policy.toml"));
        let files = (file.as_path(), policy.as_path(), verdict.as_path());
        let mut cmd = self.run.verify_command(self.problem, files, self.declared_memory("verify")?)?;
        if let (true, Some(ms)) = (self.run.a.daemon, self.expected_ms()) {
            cmd.arg("--expected-s").arg(format!("{:.3}", ms as f64 / 1e3));
        }
        std::fs::remove_file(&verdict).ok(); // an earlier run's verdict is not this one's
        let since_ns = now_ns();
        let (log, shown) = self.step_log("verify")?;
        cmd.stdout(log.try_clone().with_context(|| format!("opening {shown}"))?).stderr(Stdio::piped());
        let mut child = cmd.spawn().context("running kforge verify")?;
        // Its stderr's reader is gone once this returns: a child still writing ends, and is waited for.
        let copied = self.copy_watching_for_start(&mut child, &log);
        let status = child.wait().context("waiting for kforge verify")?;
        copied.with_context(|| format!("copying kforge verify's stderr into {shown}"))?;
        let text = std::fs::read_to_string(&verdict).with_context(|| {
            format!("kforge verify wrote no verdict ({status}, its output: {shown}); reading {}", verdict.display())
        })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", verdict.display()))?;
        let outcome: Verified = serde_json::from_value(v["outcome"].clone())
            .with_context(|| format!("the outcome in {}", verdict.display()))?;
        if let Some(peak) = v["limits"]["gpu_memory_peak_bytes"].as_u64() {
            self.record_memory("verify", peak)?;
        }
        let region_s = self.run.verify_region_s(self.problem, since_ns);
        Ok(Work { region_s, outcome: Some(verified_name(outcome)), ..Work::default() })
    }

    /// Copy a `kforge verify` child's stderr into its step's log line by line until the child
    /// closes it. Its `started_line` (the daemon started its job) marks the step's work begun,
    /// or withdraws the step (`still_runs`): the child is killed, and with its connection gone
    /// the daemon cancels its job.
    fn copy_watching_for_start(&self, child: &mut std::process::Child, mut log: &std::fs::File) -> Result<()> {
        use std::io::{BufRead, Write};
        let from = child.stderr.take().context("kforge verify's stderr")?;
        let mut lines = std::io::BufReader::new(from);
        let mut line = Vec::new();
        while lines.read_until(b'\n', &mut line)? > 0 {
            if crate::job::is_started_line(String::from_utf8_lossy(&line).trim_end()) && !self.still_runs() {
                child.kill().context("withdrawing kforge verify")?;
            }
            log.write_all(&line)?;
            line.clear();
        }
        Ok(())
    }

    /// How long the running step's job is expected to take, for the daemon's backfill
    /// (`SubmitSpec::expected_ms`): what its kind of step takes here (`Spending::expected_s`, the
    /// upper quartile of those that finished, at least its problem's own floor); `None` before
    /// one finished. At least 1 ms: the daemon refuses an expected length of 0.
    fn expected_ms(&self) -> Option<u64> {
        let (_, step, _) = self.step_id.get()?;
        let e = self.run.spending.expected_s(self.step_of(step))?;
        Some(expected_ms_of(e.seconds))
    }

    /// Run `python3 ARGS` here (the embedded package on its PYTHONPATH) or as a daemon job (its
    /// label and id returned); its failure says the step, the exit status and the last lines it
    /// wrote.
    fn python_step(&self, args: Vec<String>, step: &str) -> Result<Option<(String, u64)>> {
        let a = self.run.a;
        if a.daemon {
            let mut argv = vec![a.python.clone()];
            argv.extend(args);
            // The result step writes text (its rewrite made again on the meta device): the host's.
            let host_only = step == "result";
            let device = if host_only {
                "cpu"
            } else if a.device == "auto" {
                "auto"
            } else {
                a.device.as_str()
            };
            let gpu_memory_bytes = if host_only { None } else { self.declared_memory(step)? };
            let label = format!("optimize:{step}:{}", self.problem.display());
            let timeout_s = Some(a.step_limit_s);
            let req = crate::job::JobRequest {
                argv,
                device,
                label: &label,
                timeout_s,
                gpu_memory_bytes,
                warm: false,
                own_process: false,
                expected_ms: self.expected_ms(),
            };
            let (mut log, shown) = self.step_log(step)?;
            let mut err_log = log.try_clone().with_context(|| format!("opening {shown}"))?;
            let still_runs = &mut |_| self.still_runs();
            let (exit, err, id) = crate::job::run_job_to(self.run.socket, req, &mut log, &mut err_log, still_runs)?;
            let Some(exit) = exit else { bail!("the {step} step was withdrawn when its job started") };
            if let (Some(peak), false) = (exit.gpu_memory_peak_bytes, host_only) {
                self.record_memory(step, peak)?;
            }
            if exit.code != Some(0) {
                let why = exit.reason.as_deref().map(|r| format!(" ({r}; --step-limit-s {})", a.step_limit_s));
                let (code, why) = (exit.code, why.unwrap_or_default());
                bail!("the {step} step ended with {code:?}{why}: {} (all of it: {shown})", last_lines(&err));
            }
            return Ok(Some((label, id)));
        }
        let mut cmd = Command::new(&a.python);
        cmd.args(&args);
        let _package = crate::output::embedded_python(&mut cmd)?;
        let (log, shown) = self.step_log(step)?;
        cmd.stdout(log.try_clone().with_context(|| format!("opening {shown}"))?);
        let (status, err) = run_within(cmd, Duration::from_secs(a.step_limit_s))
            .with_context(|| format!("running {} for the {step} step", a.python))?;
        std::io::Write::write_all(&mut &log, err.as_bytes()).with_context(|| format!("writing {shown}"))?;
        match status {
            None => bail!(
                "the {step} step passed its limit of {} s (--step-limit-s) and was killed: {} (all of it: {shown})",
                a.step_limit_s,
                last_lines(&err)
            ),
            Some(st) if !st.success() => {
                bail!("the {step} step ended with {st}: {} (all of it: {shown})", last_lines(&err))
            }
            Some(_) => Ok(None),
        }
    }

    /// The peak GPU memory a daemon job of this problem's `step` declares: `--gpu-memory`, else
    /// what an earlier job of the same problem and step used (the journal's, with a margin), so
    /// that a fresh daemon — a resumed campaign on a new machine — admits it by that rather than
    /// by its default share; else none (the daemon's learned peak or default).
    fn declared_memory(&self, step: &str) -> Result<Option<u64>> {
        if let Some(declared) = crate::job::gpu_memory_bytes(self.run.a.gpu_memory)? {
            return Ok(Some(declared));
        }
        let (problem, key) = (self.question.problem.as_str(), self.memory_key(step));
        self.run.journal.step_memory(problem, &key).context("reading a step's GPU memory from the journal")
    }

    /// Journal that a daemon job of this problem's `step` used `peak` bytes of GPU memory.
    fn record_memory(&self, step: &str, peak: u64) -> Result<()> {
        let (problem, key) = (self.question.problem.as_str(), self.memory_key(step));
        self.run.journal.record_step_memory(problem, &key, peak).context("journaling a step's GPU memory")
    }

    /// What a step's GPU memory is journaled under beside the problem: the step and the size
    /// preset (one journal may hold runs of both; a large run's peak is not a default one's).
    fn memory_key(&self, step: &str) -> String {
        format!("{step}:{}", self.run.a.size)
    }

    /// The log a step's process writes into (its stdout and stderr: Inductor's autotuning
    /// tables, `kforge verify`'s table), `logs/PROCESS.log` in the problem's folder (`dispatch`
    /// for the measure and beam steps, `verify` for every verification), appended to under a line
    /// naming the run; and how to name it. The terminal keeps the progress lines. Without the
    /// daemon, a step's stderr follows its stdout there (not interleaved).
    fn step_log(&self, step: &str) -> Result<(std::fs::File, String)> {
        use std::io::Write;
        let dir = self.out.join("logs");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{step}.log"));
        let shown = path.display().to_string();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {shown}"))?;
        let at = unix_now_s() as u64;
        writeln!(f, "== {step}, run {} of the journal, at {at} (Unix seconds)", self.run.journal.run())
            .with_context(|| format!("writing {shown}"))?;
        Ok((f, shown))
    }
}

/// The output directory as a git repository: one commit per verified improvement. Without git
/// (or when `git init` fails) the run goes on without commits, after one warning.
struct Workspace {
    git: String,
    dir: PathBuf,
    /// One commit at a time (problems in flight commit from their threads).
    lock: Mutex<()>,
}

impl Workspace {
    fn open(dir: &Path) -> Option<Workspace> {
        Workspace::open_with("git", dir)
    }

    /// With `git` the program to run.
    fn open_with(git: &str, dir: &Path) -> Option<Workspace> {
        let warn = |why: String| {
            eprintln!(
                "kforge optimize: warning: {why}; {} is not a git workspace (no commit per improvement)",
                dir.display()
            );
            None
        };
        match Command::new(git).arg("--version").output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => return warn(format!("git --version ended with {}", o.status)),
            Err(e) => return warn(format!("git is not runnable ({e})")),
        }
        if !dir.join(".git").exists() {
            match Command::new(git).args(["init", "-q"]).arg(dir).output() {
                Ok(o) if o.status.success() => {}
                Ok(o) => {
                    return warn(format!(
                        "git init ended with {}: {}",
                        o.status,
                        last_lines(&String::from_utf8_lossy(&o.stderr))
                    ))
                }
                Err(e) => return warn(format!("git init did not run ({e})")),
            }
        }
        let ignore = dir.join(".gitignore");
        if !ignore.exists() && std::fs::write(&ignore, "journal.db*\n").is_err() {
            return warn(format!("cannot write {}", ignore.display()));
        }
        Some(Workspace { git: git.into(), dir: dir.to_path_buf(), lock: Mutex::new(()) })
    }

    /// Commit `files` (paths below the workspace) with `message`; a failure is a warning (the
    /// result files and the journal hold the result either way).
    fn commit(&self, files: &[&Path], message: &str) {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = self.try_commit(files, message) {
            eprintln!("kforge optimize: warning: no commit in {}: {e:#}", self.dir.display());
        }
    }

    fn try_commit(&self, files: &[&Path], message: &str) -> Result<()> {
        let rel: Vec<&Path> = files.iter().map(|f| f.strip_prefix(&self.dir).unwrap_or(f)).collect();
        self.git(
            &[&["add", "--"][..], &rel.iter().map(|p| p.to_str().unwrap_or_default()).collect::<Vec<_>>()].concat(),
        )?;
        let named = self.git(&["config", "user.email"]).is_ok();
        let who: &[&str] = if named { &[] } else { &["-c", "user.name=kforge", "-c", "user.email=kforge@localhost"] };
        self.git(&[who, &["commit", "-q", "-m", message]].concat())
    }

    fn git(&self, args: &[&str]) -> Result<()> {
        let o = Command::new(&self.git).arg("-C").arg(&self.dir).args(args).output().context("running git")?;
        if !o.status.success() {
            bail!(
                "git {} ended with {}: {}",
                args.join(" "),
                o.status,
                last_lines(&String::from_utf8_lossy(&o.stderr))
            );
        }
        Ok(())
    }
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

/// Gate 4's speedup in the verdict of `decision`'s family below the problem's folder `out`
/// (`ProblemRun::confirmed`); `Ok(None)` where there is none to read, an error for a verdict
/// that cannot be read.
fn confirmed_in(out: &Path, decision: &Decision) -> Result<Option<f64>> {
    let verdict = match decision {
        Decision::Improved { agent: Agent::Config, .. } => out.join("config/verdict.json"),
        Decision::Improved { agent: Agent::Llm, .. } | Decision::Fallback { .. } => return Ok(None),
        Decision::Improved { .. } => out.join("verdict.json"),
    };
    if !verdict.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&verdict).with_context(|| format!("reading {}", verdict.display()))?;
    let v: kforge_verify::verdict::Verdict =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", verdict.display()))?;
    Ok(v.speedup())
}

/// A campaign's line for the problem at `rel`: its report's decision, cost (`Report::spent`),
/// Triton share and confirmed speedup, or none of them with `unspent` as its cost (what this run
/// spent on a problem it did not decide); neither failed, not reached nor resumed.
fn outcome_of(rel: &Path, report: Option<&Report>, unspent: Spent) -> ProblemOutcome {
    let spent = report.and_then(|r| r.spent).unwrap_or(unspent);
    ProblemOutcome {
        problem: rel.display().to_string(),
        level: level_of(rel),
        decision: report.map(|r| r.decision.clone()),
        error: None,
        not_reached: None,
        seconds: spent.seconds,
        gpu_seconds: spent.gpu_seconds,
        resumed: false,
        triton_share: report.and_then(Report::triton_share),
        confirmed: report.and_then(|r| r.confirmed),
        roofline_ceiling: report.and_then(Report::roofline_ceiling),
        not_prepared: report.map(|r| r.measurement.not_prepared.len()).unwrap_or(0),
    }
}

/// The group a campaign's problem is summarised in: its first folder below the campaign
/// (`level1`), else `.`.
fn level_of(rel: &Path) -> String {
    rel.parent().and_then(|p| p.iter().next()).map(|c| c.to_string_lossy().into_owned()).unwrap_or(".".into())
}

fn unix_now_s() -> f64 {
    now_ns() as f64 / 1e9
}

fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// `--device auto`: whether torch sees a GPU here.
/// A file of a problem's folder `out` as reports and the journal name it: absolute, so that a
/// run resumed from another working directory finds it.
fn journaled(out: &Path, name: &str) -> String {
    let path = out.join(name);
    std::path::absolute(&path).unwrap_or(path).display().to_string()
}

/// `path` relative to the journal's folder `root` when it lies inside it, else absolute.
fn relative_to_journal(root: &Path, path: &Path) -> String {
    let path = absolute_or_as_is(path);
    path.strip_prefix(absolute_or_as_is(root)).map_or_else(|_| path.display().to_string(), |r| r.display().to_string())
}

/// `p` made absolute against the working directory (as it is when that cannot be read).
fn absolute_or_as_is(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Where a finished step's output files are now, read once, when their bytes hash to what the
/// step wrote: `output` (the first of `names`) as journaled, relative to the journal's folder
/// `root`, or absolute. An absolute one (a row from before outputs were journaled relative)
/// whose folder has moved is looked for under `root` by its trailing parts; the hash makes a
/// wrong match impossible.
fn step_output_in(root: &Path, output: &str, names: &[&str], hash: &str) -> Option<(PathBuf, Vec<Vec<u8>>)> {
    let depth = names.first().map(|n| Path::new(n).components().count()).unwrap_or(1);
    let output = Path::new(output);
    let root = absolute_or_as_is(root);
    let dir = if output.is_absolute() { output.to_path_buf() } else { root.join(output) };
    let dir = dir.ancestors().nth(depth)?.to_path_buf();
    let parts: Vec<_> = dir.components().collect();
    let moved = (1..=parts.len()).map(|i| root.join(parts[i..].iter().collect::<PathBuf>()));
    std::iter::once(dir.clone()).chain(moved).filter(|d| d.is_dir()).find_map(|d| {
        let contents = names.iter().map(|n| std::fs::read(d.join(n))).collect::<Result<Vec<_>, _>>().ok()?;
        (hash_of(names, &contents) == hash).then_some((d, contents))
    })
}

/// An expected length in seconds as the daemon takes it: whole milliseconds, at least 1 (a step
/// that finished within a clock tick reads 0 s; an expected length of 0 is refused).
fn expected_ms_of(seconds: f64) -> u64 {
    ((seconds * 1e3).ceil() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_measurements_length_in_full_is_its_seconds_over_the_share_it_prepared() {
        // Session 28's level3/010: the baseline and eager prepared, eight variants left out.
        let left: Vec<String> = (0..7).map(|i| format!("mode-{i}")).chain(["the rewrite".into()]).collect();
        let mut prepared = serde_json::json!({
            "max-autotune": {"ok": true, "first_call_s": 51.4},
            "eager": {"ok": true, "first_call_s": 0.03},
            "default": {"ok": false, "not_prepared": "the step's deadline came first"},
        });
        let text = |prepared: &serde_json::Value, left: &[String]| {
            serde_json::json!({"prepared": prepared, "not_prepared": left, "modes": {}}).to_string()
        };
        let full = full_length_of(&text(&prepared, &left), 348.8).unwrap();
        assert_eq!((full.prepared, full.variants), (2, 10));
        assert!((full.seconds - 1744.0).abs() < 1e-9, "{full:?}");
        // A variant that was tried and failed to compile counts as prepared (its time was spent).
        prepared["broken"] = serde_json::json!({"ok": false, "error": "no valid triton configs"});
        assert_eq!(full_length_of(&text(&prepared, &left), 300.0).map(|f| f.prepared), Some(3));
        assert_eq!(full_length_of(&text(&prepared, &[]), 300.0), None, "none left out: it ran in full");
        assert_eq!(full_length_of(&text(&serde_json::json!({}), &left), 300.0), None, "none prepared");
        assert_eq!(full_length_of("{\"not_tuned\": []}", 300.0), None, "not a measurement of variants");
    }

    #[test]
    fn an_expected_length_is_whole_milliseconds_and_never_zero() {
        assert_eq!(expected_ms_of(0.0), 1, "a step within a clock tick: the daemon refuses 0");
        assert_eq!(expected_ms_of(0.0004), 1);
        assert_eq!(expected_ms_of(2.0001), 2001);
        assert_eq!(expected_ms_of(420.0), 420_000);
    }

    #[test]
    fn more_problems_in_flight_than_the_daemon_admits_get_a_note() {
        const G: u64 = 1 << 30;
        let room = |name: &str, gpu, total: Option<u64>, max_concurrent| DeviceRoom {
            name: name.into(),
            gpu,
            total_bytes: total,
            max_concurrent,
        };
        let h100 = [room("cpu", false, None, 4), room("0", true, Some(80 * G), 8)];
        let note = admission_note(&h100, "auto", 8, None).unwrap();
        assert!(note.starts_with("8 problems in flight, but the daemon admits about 4 of their jobs at once (4 on 0 (20.0 of 80.0 GiB each): peaks the daemon's default"), "{note}");
        assert_eq!(admission_note(&h100, "auto", 4, None), None, "4 fit");
        assert_eq!(admission_note(&h100, "0", 8, Some(9 * G)), None, "8 of 9 GiB fit");
        let declared = admission_note(&h100, "0", 8, Some(30 * G)).unwrap();
        assert!(
            declared.contains("about 2 of their jobs") && declared.contains("as --gpu-memory declares"),
            "{declared}"
        );
        let slots = [room("0", true, Some(80 * G), 2)];
        assert!(admission_note(&slots, "auto", 3, Some(G)).unwrap().contains("about 2 of"), "max_concurrent caps it");
        let two = [room("0", true, Some(80 * G), 8), room("1", true, Some(80 * G), 8)];
        assert_eq!(admission_note(&two, "auto", 8, None), None, "4 on each of two GPUs");
        assert_eq!(admission_note(&h100, "cpu", 8, None), None, "no memory sample: nothing to say");
    }

    /// A step output journaled under one folder is found after the folder moved: a relative row
    /// under the journal's new folder, an absolute row (from before outputs were journaled
    /// relative) by its trailing parts; a file changed since is not taken.
    #[test]
    fn a_step_output_is_found_after_its_journals_folder_moved() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("a/state/out"), dir.path().join("b/state/out"));
        let problem = old.join("level3/lstm");
        std::fs::create_dir_all(&problem).unwrap();
        std::fs::write(problem.join("dispatch.json"), "{}").unwrap();
        let hash = hash_of(&["dispatch.json"], &[b"{}".to_vec()]);
        let relative = relative_to_journal(&old, &problem.join("dispatch.json"));
        assert_eq!(relative, "level3/lstm/dispatch.json");
        let absolute = journaled(&problem, "dispatch.json");
        let found = |root: &Path, output: &str| step_output_in(root, output, &["dispatch.json"], &hash).map(|f| f.0);
        assert_eq!(found(&old, &relative), Some(problem.clone()));
        std::fs::create_dir_all(dir.path().join("b/state")).unwrap();
        std::fs::rename(&old, &new).unwrap();
        let moved = new.join("level3/lstm");
        assert_eq!(found(&new, &relative), Some(moved.clone()), "relative, under the moved folder");
        assert_eq!(found(&new, &absolute), Some(moved.clone()), "absolute, by its trailing parts");
        std::fs::write(moved.join("dispatch.json"), "{\"changed\": 1}").unwrap();
        assert_eq!(found(&new, &relative), None, "its bytes changed since the step wrote them");
        assert_eq!(found(&new, &absolute), None);
        // A single problem's outputs lie in the folder itself.
        let (single, elsewhere) = (dir.path().join("c/out"), dir.path().join("d/out"));
        std::fs::create_dir_all(&single).unwrap();
        std::fs::write(single.join("dispatch.json"), "{}").unwrap();
        let absolute = journaled(&single, "dispatch.json");
        std::fs::create_dir_all(dir.path().join("d")).unwrap();
        std::fs::rename(&single, &elsewhere).unwrap();
        assert_eq!(found(&elsewhere, &absolute), Some(elsewhere.clone()), "the folder itself");
    }

    #[test]
    fn the_confirmed_speedup_is_gate_4s_in_the_winning_familys_verdict() {
        use kforge_verify::verdict::{compose, CheckResult, RunnerResult};
        let dir = tempfile::tempdir().unwrap();
        let check = |gate: &str, name: &str, evidence| CheckResult {
            gate: gate.into(),
            name: name.into(),
            ok: Some(true),
            evidence,
        };
        let ran = |speedup: f64| RunnerResult {
            checks: ["dry-run", "correctness", "model", "exploits", "dispatch"]
                .into_iter()
                .map(|g| check(g, "x", serde_json::json!({})))
                .chain([check("performance", "speedup", serde_json::json!({"speedup": speedup}))])
                .collect(),
            ..Default::default()
        };
        let write = |dir: &Path, speedup: f64| {
            std::fs::create_dir_all(dir).unwrap();
            let v = compose("p", "c", &[], Some(&ran(speedup)), None, serde_json::json!({}));
            std::fs::write(dir.join("verdict.json"), serde_json::to_string(&v).unwrap()).unwrap();
        };
        let won = |agent| Decision::Improved { agent, mode: "m".into(), speedup: 2.0, ci95: [1.9, 2.1] };
        assert_eq!(confirmed_in(dir.path(), &won(Agent::Dispatch)).unwrap(), None, "no verdict: nothing confirmed");
        write(dir.path(), 1.5);
        write(&dir.path().join("config"), 1.2);
        assert_eq!(confirmed_in(dir.path(), &won(Agent::Dispatch)).unwrap(), Some(1.5));
        assert_eq!(
            confirmed_in(dir.path(), &won(Agent::Inductor)).unwrap(),
            Some(1.5),
            "the dispatch family's verdict"
        );
        assert_eq!(confirmed_in(dir.path(), &won(Agent::Config)).unwrap(), Some(1.2), "the config family's own");
        assert_eq!(confirmed_in(dir.path(), &won(Agent::Llm)).unwrap(), None);
        assert_eq!(confirmed_in(dir.path(), &Decision::Fallback { reason: "r".into() }).unwrap(), None);
        std::fs::write(dir.path().join("verdict.json"), "{").unwrap();
        let e = confirmed_in(dir.path(), &won(Agent::Dispatch)).unwrap_err();
        assert!(format!("{e:#}").starts_with("parsing "), "a broken verdict is said: {e:#}");
    }

    fn log(dir: &Path) -> String {
        let o = Command::new("git").arg("-C").arg(dir).args(["log", "--format=%s"]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    #[test]
    fn the_workspace_commits_each_improvement_and_only_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let w = Workspace::open(dir.path()).expect("git is installed here");
        assert!(dir.path().join(".git").is_dir());
        let p = dir.path().join("level1/a");
        std::fs::create_dir_all(&p).unwrap();
        for f in ["model_new.py", "policy.toml", "report.json", "dispatch.json"] {
            std::fs::write(p.join(f), f).unwrap();
        }
        let files = ["model_new.py", "policy.toml", "report.json"].map(|f| p.join(f));
        w.commit(
            &files.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
            "optimize level1/a.py: eager (dispatch) 1.500x",
        );
        assert_eq!(log(dir.path()), "optimize level1/a.py: eager (dispatch) 1.500x\n");
        let o =
            Command::new("git").arg("-C").arg(dir.path()).args(["show", "--name-only", "--format="]).output().unwrap();
        let names = String::from_utf8_lossy(&o.stdout).into_owned();
        let names: Vec<&str> = names.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(names, ["level1/a/model_new.py", "level1/a/policy.toml", "level1/a/report.json"]);
        // Opened again: the same repository, the next commit on top.
        let again = Workspace::open(dir.path()).unwrap();
        std::fs::write(p.join("model_new.py"), "better").unwrap();
        again.commit(&[&p.join("model_new.py")], "optimize level1/a.py: default (dispatch) 2.000x");
        assert_eq!(log(dir.path()).lines().count(), 2);
    }

    #[test]
    fn without_git_there_is_no_workspace() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Workspace::open_with("/no/such/git", dir.path()).is_none());
        assert!(!dir.path().join(".git").exists());
    }
}
