//! The llm step of `kforge optimize` (`--agents …,llm`): the LLM agents' search
//! (`kforge_agents::search`) over an OpenAI-compatible endpoint (`kforge_llm::client::Client`),
//! every candidate saved the moment it arrives (`llm/candidates/ID.py`), judged by `kforge
//! verify` under the family's policy (`llm/policy.toml`: the problem's own policy, gate 4 against
//! the run's baseline), journaled with its verdict; the best accepted candidate becomes
//! `llm/model_new.py`. Every request and reply goes into the replay cache in the journal's file:
//! `--replay RUN` answers from it (no endpoint, zero tokens), `--resume` replays what the killed
//! run had already received and reuses the verdicts it had journaled.

use super::{content_hash, now_ns, ProblemRun, Work};
use anyhow::{bail, Context, Result};
use clap::Args;
use kforge_agents::{
    BaselineInfo, Candidate, Inventory, Judge, Judgement, KernelInfo, KernelKind, KernelProfile, LoopConfig, Observer,
    ProblemContext, SearchOutcome, Stop, Verdict,
};
use kforge_llm::budget::{Limits, Meter};
use kforge_llm::client::Client;
use kforge_llm::config::ProviderConfig;
use kforge_llm::replay::{Cache, Mode};
use kforge_llm::Params;
use kforge_optimize::llm::{LlmCandidate, LlmReport, LlmUsage, LLM_OUTPUTS};
use kforge_store::LlmCandidateRow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Args)]
pub struct LlmArgs {
    /// The LLM agents' endpoint: an OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1)
    /// or an endpoint's name in --llm-config (else KFORGE_LLM_URL).
    #[arg(long, value_name = "URL|NAME")]
    llm: Option<String>,
    /// The model the endpoint serves (else KFORGE_LLM_MODEL).
    #[arg(long)]
    model: Option<String>,
    /// Endpoints, keys (by environment variable) and per-model prices and kinds, TOML (else
    /// KFORGE_LLM_CONFIG). Keys come from the environment: KFORGE_LLM_KEY, OPENAI_API_KEY, or
    /// the variable an endpoint's key_env names.
    #[arg(long, value_name = "FILE")]
    llm_config: Option<PathBuf>,
    /// Answer every LLM request from run RUN's recorded replies in the output directory's journal
    /// (no endpoint is called, zero tokens): the search repeats that run.
    #[arg(long, value_name = "RUN")]
    replay: Option<i64>,
    /// Iterations of the LLM search (plan, write, judge, summarize).
    #[arg(long, default_value_t = 5)]
    llm_iterations: u32,
    /// Chains of the beam: the best candidates carried into the next iteration.
    #[arg(long, default_value_t = 4)]
    llm_chains: u32,
    /// Plans the planner writes per chain and iteration (one minimal change each).
    #[arg(long, default_value_t = 4)]
    llm_plans: u32,
    /// Attempts of an executor per plan, the compiler's or the verifier's error fed back.
    #[arg(long, default_value_t = 4)]
    llm_retries: u32,
    /// Executors in flight at once (their candidates are judged concurrently).
    #[arg(long, default_value_t = 4)]
    llm_executors: u32,
    /// Stop after this many iterations without an improvement (0: never).
    #[arg(long, default_value_t = 2)]
    llm_patience: u32,
    /// Tokens all LLM calls of the run may use.
    #[arg(long)]
    llm_max_tokens: Option<u64>,
    /// Dollars all LLM calls of the run may cost (from the model's prices in --llm-config).
    #[arg(long)]
    llm_max_usd: Option<f64>,
    /// Tokens the LLM calls of one problem may use.
    #[arg(long)]
    llm_problem_max_tokens: Option<u64>,
    /// Dollars the LLM calls of one problem may cost.
    #[arg(long)]
    llm_problem_max_usd: Option<f64>,
    /// Sampling temperature (left out for reasoning models).
    #[arg(long)]
    llm_temperature: Option<f64>,
    /// The seed sent with each request (dropped, once, by a server that rejects it).
    #[arg(long)]
    llm_seed: Option<u64>,
    /// The longest reply, tokens.
    #[arg(long, default_value_t = 8192)]
    llm_max_reply_tokens: u64,
    /// No summarizer calls: experience items are written from the verdicts alone.
    #[arg(long)]
    llm_no_summarizer: bool,
    /// A capture of the baseline (`kforge inspect PROBLEM --capture-out FILE`): its kernels in
    /// launch order, their time shares and sources go to the planner and to the synthesis step.
    /// Without it the llm step inspects the baseline itself on a GPU (on the CPU: no inventory).
    #[arg(long, value_name = "FILE")]
    llm_capture: Option<PathBuf>,
    /// No profile step: without it, on a GPU, the llm step runs `kforge profile` (Nsight Compute
    /// over the baseline's kernels) for the strategy analyst's tiers; without a profile they are
    /// "unknown".
    #[arg(long)]
    llm_no_profile: bool,
    /// Nsight Compute's ncu for the profile step.
    #[arg(long, env = "KFORGE_NCU", default_value = "ncu")]
    ncu: String,
    /// The profile step's time limit, seconds (ncu replays every kernel launch of a forward).
    #[arg(long, default_value_t = 1200)]
    llm_profile_timeout_s: u64,
}

impl LlmArgs {
    /// The first llm flag given (of those without a default), if any.
    pub fn given(&self) -> Option<&'static str> {
        let given = [
            ("--llm", self.llm.is_some()),
            ("--model", self.model.is_some()),
            ("--llm-config", self.llm_config.is_some()),
            ("--replay", self.replay.is_some()),
            ("--llm-capture", self.llm_capture.is_some()),
            ("--llm-max-tokens", self.llm_max_tokens.is_some()),
            ("--llm-max-usd", self.llm_max_usd.is_some()),
            ("--llm-problem-max-tokens", self.llm_problem_max_tokens.is_some()),
            ("--llm-problem-max-usd", self.llm_problem_max_usd.is_some()),
            ("--llm-temperature", self.llm_temperature.is_some()),
            ("--llm-seed", self.llm_seed.is_some()),
            ("--llm-no-summarizer", self.llm_no_summarizer),
            ("--llm-no-profile", self.llm_no_profile),
        ];
        given.iter().find(|(_, g)| *g).map(|(f, _)| *f)
    }
}

/// The run's LLM client and its replay cache (read back for each problem's usage).
pub struct LlmClient {
    pub chat: Client,
    cache: Arc<Cache>,
}

impl LlmClient {
    /// What `problem`'s calls in this run cost, from the replay cache's rows.
    fn usage(&self, problem: &str) -> Result<LlmUsage> {
        let rows = self.cache.calls(self.cache.run()).context("reading the replay cache")?;
        let mut u = LlmUsage::default();
        for r in rows.iter().filter(|r| r.problem == problem) {
            u.calls += 1;
            u.replayed += u64::from(r.replayed);
            u.retries += u64::from(r.attempts.saturating_sub(1));
            u.tokens += r.prompt_tokens + r.completion_tokens;
            u.usd += r.usd;
        }
        Ok(u)
    }
}

/// What the llm step of every problem shares: the endpoint, the loop's settings, the budget.
pub struct LlmPlan {
    provider: ProviderConfig,
    limits: Limits,
    config: LoopConfig,
    replay: Option<i64>,
    capture: Option<PathBuf>,
    /// ncu for the profile step; `None`: no profile step.
    ncu: Option<String>,
    profile_timeout_s: u64,
}

impl LlmPlan {
    /// The llm agent's settings, checked before anything runs.
    pub fn new(a: &LlmArgs) -> Result<LlmPlan> {
        for (flag, v) in [
            ("--llm-iterations", a.llm_iterations),
            ("--llm-chains", a.llm_chains),
            ("--llm-plans", a.llm_plans),
            ("--llm-retries", a.llm_retries),
            ("--llm-executors", a.llm_executors),
        ] {
            if v == 0 {
                bail!("{flag} must be at least 1");
            }
        }
        let positive = |v: Option<f64>| v.is_none_or(|v| v > 0.0);
        if !positive(a.llm_max_usd) || !positive(a.llm_problem_max_usd) {
            bail!("--llm-max-usd and --llm-problem-max-usd must be positive numbers of dollars");
        }
        for (flag, v) in [
            ("--llm-max-tokens", a.llm_max_tokens),
            ("--llm-problem-max-tokens", a.llm_problem_max_tokens),
            ("--llm-max-reply-tokens", Some(a.llm_max_reply_tokens)),
        ] {
            if v == Some(0) {
                bail!("{flag} must be at least 1 token");
            }
        }
        let env = |k: &str| std::env::var(k).ok();
        // A replay needs no endpoint (it never calls one): without --llm its URL is a label.
        let url = a.llm.as_deref().or(a.replay.map(|_| "http://replay.invalid/v1"));
        let mut provider = ProviderConfig::resolve(url, a.model.as_deref(), a.llm_config.as_deref(), &env)
            .context("the llm agent's endpoint")?;
        if let (Some(run), None) = (a.replay, &a.llm) {
            provider.url = format!("the replay of run {run}");
        }
        let limits = Limits {
            run_tokens: a.llm_max_tokens,
            run_usd: a.llm_max_usd,
            problem_tokens: a.llm_problem_max_tokens,
            problem_usd: a.llm_problem_max_usd,
        };
        let params =
            Params { temperature: a.llm_temperature, max_tokens: Some(a.llm_max_reply_tokens), seed: a.llm_seed };
        let config = LoopConfig {
            model: provider.model.clone(),
            params,
            iterations: a.llm_iterations,
            chains: a.llm_chains as usize,
            plans: a.llm_plans as usize,
            retries: a.llm_retries,
            executors: a.llm_executors as usize,
            patience: a.llm_patience,
            summarize: !a.llm_no_summarizer,
            ..LoopConfig::default()
        };
        config.check().context("the llm agent's settings")?;
        if let Some(c) = a.llm_capture.as_ref().filter(|c| !c.is_file()) {
            bail!("--llm-capture {}: no such file", c.display());
        }
        if a.llm_profile_timeout_s == 0 {
            bail!("--llm-profile-timeout-s must be at least 1");
        }
        let ncu = (!a.llm_no_profile).then(|| a.ncu.clone());
        let (replay, capture, profile_timeout_s) = (a.replay, a.llm_capture.clone(), a.llm_profile_timeout_s);
        Ok(LlmPlan { provider, limits, config, replay, capture, ncu, profile_timeout_s })
    }

    /// The client of a run and its replay cache in the journal's file, in the mode the flags ask
    /// (`--replay RUN`; `--resume`: the previous run's replies first).
    pub fn client(&self, journal_path: &Path, run: u64, before: Option<u64>, resume: bool) -> Result<LlmClient> {
        let mode = match (self.replay, before.filter(|_| resume)) {
            (Some(from), _) => Mode::Replay { from },
            (None, Some(from)) => Mode::Resume { from: from as i64 },
            (None, None) => Mode::Record,
        };
        let cache = Arc::new(
            Cache::open(journal_path, run as i64, mode)
                .with_context(|| format!("opening the replay cache in {}", journal_path.display()))?,
        );
        if let Some(from) = self.replay {
            if cache.calls(from).context("reading the replay cache")?.is_empty() {
                bail!("--replay {from}: the journal {} holds no LLM call of run {from}", journal_path.display());
            }
        }
        let meter = Arc::new(Meter::new(self.limits));
        // A line per call being written every 10 s, not one per streamed chunk.
        let shown: Mutex<HashMap<(String, String), Instant>> = Mutex::new(HashMap::new());
        let progress = move |scope: &kforge_llm::Scope, p: &kforge_llm::Progress| {
            let mut shown = shown.lock().unwrap_or_else(|e| e.into_inner());
            let last = shown.entry((scope.problem.clone(), scope.role.clone())).or_insert_with(Instant::now);
            if last.elapsed().as_secs_f64() >= 10.0 {
                *last = Instant::now();
                let chars = p.content_chars + p.argument_chars;
                eprintln!(
                    "kforge optimize: {}: llm: {} writing: {chars} chars in {:.0} s",
                    scope.problem,
                    scope.role,
                    p.elapsed.as_secs_f64()
                );
            }
        };
        let chat = Client::builder(self.provider.clone(), meter, cache.clone()).progress(progress).build();
        Ok(LlmClient { chat, cache })
    }

    /// What decides the llm step's output besides the problem: the endpoint, the model, the
    /// loop's settings and the replayed run.
    fn key(&self) -> String {
        let (p, l) = (&self.provider, &self.limits);
        // Whether there is a profile step, not which ncu: the same profile either way.
        let (replay, capture, profiled) = (self.replay, &self.capture, self.ncu.is_some());
        format!("{}|{}|{:?}|{replay:?}|{capture:?}|{l:?}|{profiled}", p.url, p.model, self.config)
    }
}

impl ProblemRun<'_> {
    /// The llm step: its report, `None` when a budget kept it from starting.
    pub(super) fn llm_step(&self, plan: &LlmPlan, client: &LlmClient) -> Result<Option<LlmReport>> {
        let policy = self.llm_policy()?;
        let hash = content_hash(&[b"llm", &self.source, self.judge_hash(&policy).as_bytes(), plan.key().as_bytes()]);
        let search = || self.llm_search(plan, client, &policy);
        let outputs = [LLM_OUTPUTS[0], LLM_OUTPUTS[2]];
        if self.step(kforge_optimize::search::Step::Llm, &hash, &outputs, search)?.is_none() {
            return Ok(None);
        }
        let path = self.out.join(LLM_OUTPUTS[0]);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(Some(serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?))
    }

    /// What decides a candidate's verdict besides its source: the size, the device, the
    /// baseline and the verify policy.
    fn judge_hash(&self, policy: &str) -> String {
        let (a, plan) = (self.run.a, self.run.plan);
        let (gpu, device) = (if plan.gpu { "gpu" } else { "cpu" }, plan.device_key(&a.device));
        let parts: [&[u8]; 5] =
            [a.size.as_bytes(), device.as_bytes(), gpu.as_bytes(), plan.baseline.mode().as_bytes(), policy.as_bytes()];
        content_hash(&parts)
    }

    fn llm_search(&self, plan: &LlmPlan, client: &LlmClient, policy_text: &str) -> Result<Work> {
        let since_ns = now_ns();
        let dir = self.out.join("llm");
        std::fs::create_dir_all(dir.join("candidates")).with_context(|| format!("creating {}", dir.display()))?;
        let policy = dir.join("policy.toml");
        std::fs::write(&policy, policy_text).with_context(|| format!("writing {}", policy.display()))?;
        std::fs::remove_file(self.out.join(LLM_OUTPUTS[1])).ok(); // an earlier run's winner is not this one's
        let source = String::from_utf8_lossy(&self.source).into_owned();
        let report = self.llm_inventory(plan, &dir).unwrap_or_else(|e| {
            self.progress(&format!("llm: no inventory of the baseline: {e:#}"));
            None
        });
        let (inventory, time_ms) = match report.as_ref().map(inventory_of) {
            Some((inventory, ms)) => (Some(inventory), ms),
            None => (None, None),
        };
        let profile = self.llm_profile(plan, &dir, report.as_ref());
        let ctx = ProblemContext {
            problem: self.question.problem.clone(),
            source: source.clone(),
            baseline: BaselineInfo {
                source,
                label: format!("torch.compile in mode {}", self.run.plan.baseline.mode()),
                time_ms,
            },
            inventory,
            profile,
            device: self.llm_device(),
        };
        let here = Here {
            run: self.run,
            index: self.index,
            problem: self.problem,
            label: &self.question.problem,
            since: self.since,
        };
        let judge_hash = self.judge_hash(policy_text);
        let judge = VerifyJudge {
            here,
            dir: &dir,
            policy: &policy,
            judge_hash: &judge_hash,
            replayed: plan.replay.map(|r| r as u64),
            seconds: Mutex::new(0.0),
            // Without the daemon nothing keeps gate 4's timings apart on a GPU: one at a time.
            one_at_a_time: (self.run.plan.gpu && !self.run.a.daemon).then(|| Mutex::new(())),
        };
        let observer = Journaling { here, dir: &dir, judge_hash: &judge_hash, verdicts: AtomicU64::new(0) };
        let chat = WithinBudget { chat: &client.chat, spending: &self.run.spending };
        let outcome = kforge_agents::search(&ctx, &plan.config, &chat, &judge, &observer);
        let body = serde_json::to_string_pretty(&outcome).context("serializing the search's outcome")?;
        std::fs::write(dir.join("outcome.json"), body).with_context(|| format!("writing {}", dir.display()))?;
        let mut report = self.llm_report(plan, &outcome, &dir)?;
        let counted = std::mem::take(&mut report.usage);
        report.usage = LlmUsage {
            malformed: counted.malformed,
            executor_retries: counted.executor_retries,
            duplicates: counted.duplicates,
            meltdowns: counted.meltdowns,
            ..client.usage(&self.question.problem)?
        };
        let body = serde_json::to_string_pretty(&report).context("serializing the llm report")?;
        let path = self.out.join(LLM_OUTPUTS[0]);
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
        let seconds = *judge.seconds.lock().unwrap_or_else(|e| e.into_inner());
        // A search a budget or the provider cut short is not finished: --resume continues it.
        let word = if report.cut_short() { super::INCOMPLETE } else { "complete" };
        Ok(Work {
            region_s: self.run.verify_region_s(self.problem, since_ns),
            device_wall_s: Some(seconds),
            outcome: Some(format!("{word}: {}", report.stop)),
            charged: true,
        })
    }

    /// The baseline's kernels (and its GPU time per forward, ms): from `--llm-capture`, else on a
    /// GPU from `kforge inspect` of the baseline (`llm/inspect.json`); none on the CPU.
    fn llm_inventory(&self, plan: &LlmPlan, dir: &Path) -> Result<Option<kforge_inductor::inspect::InspectReport>> {
        let report = match &plan.capture {
            Some(path) => {
                let cap = crate::inspect::read_capture(path)?;
                kforge_inductor::inspect::report(&cap).with_context(|| format!("the capture {}", path.display()))?
            }
            None if self.run.plan.gpu => self.inspect_baseline(dir, plan)?,
            None => return Ok(None),
        };
        Ok(Some(report))
    }

    /// The profile step (on a GPU, unless `--llm-no-profile`): the baseline's kernels under
    /// Nsight Compute, as the analyst's rows named as the inventory names them. A failure (no
    /// ncu, no hardware counters) costs the tiers only.
    fn llm_profile(
        &self,
        plan: &LlmPlan,
        dir: &Path,
        report: Option<&kforge_inductor::inspect::InspectReport>,
    ) -> Option<Vec<KernelProfile>> {
        let ncu = plan.ncu.as_deref().filter(|_| self.run.plan.gpu)?;
        match self.profile_baseline(dir, plan, ncu) {
            Ok(p) => Some(profile_rows(&p, report)),
            Err(e) => {
                self.progress(&format!("llm: no profile of the baseline (tiers unknown): {e:#}"));
                None
            }
        }
    }

    /// `kforge profile PROBLEM --mode BASELINE --json llm/profile.json` (this binary; a daemon
    /// job with `--daemon`).
    fn profile_baseline(&self, dir: &Path, plan: &LlmPlan, ncu: &str) -> Result<kforge_ncu::Profile> {
        let a = self.run.a;
        let json = dir.join(format!("profile-{}-{}.json", self.run.plan.baseline.mode(), a.size));
        if !((a.resume || plan.replay.is_some()) && json.is_file()) {
            self.progress("llm: profiling the baseline's kernels (Nsight Compute, for the strategy analyst)");
            let mut cmd = Command::new(crate::output::this_binary()?);
            cmd.arg("--socket").arg(self.run.socket).arg("profile").arg(self.problem);
            cmd.args(["--mode", self.run.plan.baseline.mode(), "--size", &a.size, "--python", &a.python, "--ncu", ncu]);
            cmd.arg("--timeout-s").arg(plan.profile_timeout_s.to_string());
            cmd.arg("--json").arg(&json);
            if a.daemon {
                cmd.arg("--daemon");
            }
            let o = cmd.output().context("running kforge profile")?;
            if !o.status.success() {
                let err = String::from_utf8_lossy(&o.stderr);
                bail!("kforge profile ended with {}: {}", o.status, super::last_lines(&err));
            }
        }
        let text = std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))
    }

    /// `kforge inspect PROBLEM --mode BASELINE --no-restitch --json llm/inspect.json` (this
    /// binary; a daemon job with `--daemon`).
    fn inspect_baseline(&self, dir: &Path, plan: &LlmPlan) -> Result<kforge_inductor::inspect::InspectReport> {
        let a = self.run.a;
        let json = dir.join(format!("inspect-{}-{}.json", self.run.plan.baseline.mode(), a.size));
        // A resumed or replayed search sees the baseline as the first run did (its shares are in
        // the prompts, so the requests repeat).
        if (a.resume || plan.replay.is_some()) && json.is_file() {
            let text = std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
            return serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()));
        }
        self.progress("llm: inspecting the baseline (its kernels for the planner)");
        let mut cmd = Command::new(crate::output::this_binary()?);
        cmd.arg("--socket").arg(self.run.socket).arg("inspect").arg(self.problem);
        cmd.args(["--mode", self.run.plan.baseline.mode(), "--size", &a.size, "--python", &a.python, "--no-restitch"]);
        cmd.arg("--json").arg(&json);
        if a.daemon {
            cmd.arg("--daemon");
        }
        let o = cmd.output().context("running kforge inspect")?;
        if !o.status.success() {
            bail!("kforge inspect ended with {}: {}", o.status, super::last_lines(&String::from_utf8_lossy(&o.stderr)));
        }
        let text = std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))
    }

    /// The family's verify policy: the problem's own (`PROBLEM.toml` beside it), gate 4 against
    /// the run's baseline.
    fn llm_policy(&self) -> Result<String> {
        let own = self.problem.with_extension("toml");
        let mut text = format!("baseline_mode = \"{}\"\n", self.run.plan.baseline.mode());
        if own.is_file() {
            let body = std::fs::read_to_string(&own).with_context(|| format!("reading {}", own.display()))?;
            // The run's baseline, not the problem's: the families' speedups are against the same.
            for line in body.lines().filter(|l| !l.trim_start().starts_with("baseline_mode")) {
                text.push_str(line);
                text.push('\n');
            }
        }
        Ok(text)
    }

    fn llm_device(&self) -> String {
        if self.run.plan.gpu {
            "cuda (NVIDIA GPU)".into()
        } else {
            "cpu (Triton kernels run in Triton's interpreter)".into()
        }
    }

    /// The report of the family from the search's outcome; the best candidate's file copied to
    /// `llm/model_new.py`.
    fn llm_report(&self, plan: &LlmPlan, o: &SearchOutcome, dir: &Path) -> Result<LlmReport> {
        let candidates: Vec<LlmCandidate> = o.candidates.iter().map(|(c, j)| summary(c, j, dir)).collect();
        let result = match &o.best {
            Some(best) => {
                let from = dir.join("candidates").join(format!("{best}.py"));
                let to = self.out.join(LLM_OUTPUTS[1]);
                std::fs::copy(&from, &to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
                Some(std::path::absolute(&to).unwrap_or(to).display().to_string())
            }
            None => None,
        };
        let s = &o.stats;
        let (stop, error) = stop_words(&o.stop);
        let mut report = LlmReport {
            endpoint: plan.provider.url.clone(),
            model: plan.provider.model.clone(),
            replayed_from: plan.replay,
            iterations: s.iterations,
            stop,
            error,
            candidates,
            best: o.best.clone(),
            usage: LlmUsage {
                malformed: s.malformed,
                executor_retries: s.executor_retries,
                duplicates: s.duplicates,
                meltdowns: s.meltdowns,
                ..LlmUsage::default()
            },
            decision: None,
            result,
        };
        report.decision = Some(report.decide(self.run.plan.gpu));
        Ok(report)
    }
}

/// The agents' inventory from an inspect report: every launch in order (generated Triton kernels
/// with their source; vendor and aten calls), its share of the GPU time; and the GPU time per
/// forward, ms.
pub fn inventory_of(r: &kforge_inductor::inspect::InspectReport) -> (Inventory, Option<f64>) {
    let source = |name: &str| r.inventory.kernels.iter().find(|k| k.name == name).map(|k| k.source.clone());
    let kernels = r
        .attribution
        .launches
        .iter()
        .map(|l| {
            let kind = match l.kind.as_str() {
                "triton" => KernelKind::Generated,
                "extern" => KernelKind::Vendor,
                _ => KernelKind::Aten,
            };
            let source = if kind == KernelKind::Generated { source(&l.label) } else { None };
            let bandwidth_of_peak = if kind == KernelKind::Generated { r.bandwidth_of_peak(&l.label) } else { None };
            KernelInfo { name: l.label.clone(), kind, share: l.share, source, bandwidth_of_peak }
        })
        .collect();
    let ms = r.attribution.total_us / 1000.0;
    (Inventory { kernels }, (ms > 0.0).then_some(ms))
}

/// The analyst's rows of a profile: with an inventory, one row per inventory entry, named as
/// the inventory names it (a vendor call's row combines the GPU kernels attributed to the calls of
/// that name); without
/// one, ncu's rows as they are. Rows lacking a speed-of-light percentage are left out.
pub fn profile_rows(
    p: &kforge_ncu::Profile,
    report: Option<&kforge_inductor::inspect::InspectReport>,
) -> Vec<KernelProfile> {
    let rows: Vec<kforge_ncu::KernelRow> = match report {
        None => p.kernels.clone(),
        Some(r) => {
            let mut out: Vec<kforge_ncu::KernelRow> = Vec::new();
            let launches = &r.attribution.launches;
            for l in launches {
                if out.iter().any(|o| o.name == l.label) {
                    continue;
                }
                // The analyst finds a row by name: launches of one label (two `extern_kernels.mm`
                // calls) share theirs.
                let same = launches.iter().filter(|m| m.label == l.label);
                let mut names: Vec<&str> = same.flat_map(|m| m.gpu_kernels.iter().map(String::as_str)).collect();
                if names.is_empty() {
                    names.push(&l.label);
                }
                let mut of: Vec<&kforge_ncu::KernelRow> = Vec::new();
                for row in names.iter().flat_map(|n| kforge_ncu::rows_for(&p.kernels, n)) {
                    if !of.iter().any(|o| std::ptr::eq(*o, row)) {
                        of.push(row);
                    }
                }
                if !of.is_empty() {
                    out.push(kforge_ncu::combine(&l.label, &of));
                }
            }
            out
        }
    };
    let peak = p.peaks.as_ref().map(|pk| pk.copy_bytes_per_s);
    rows.into_iter()
        .filter_map(|k| {
            let dram_of_peak_pct = k.dram_bytes_per_s().zip(peak).map(|(rate, peak)| 100.0 * rate / peak);
            Some(KernelProfile {
                sol_memory_pct: k.sol_memory_pct?,
                sol_compute_pct: k.sol_compute_pct?,
                occupancy_pct: k.occupancy_pct,
                dram_of_peak_pct,
                name: k.name,
            })
        })
        .collect()
}

/// Why the search stopped, in words, and the provider's failure when that was why.
fn stop_words(stop: &Stop) -> (String, Option<String>) {
    match stop {
        Stop::Iterations => ("iterations".into(), None),
        Stop::NoImprovement { iterations } => (format!("no improvement in {iterations} iteration(s)"), None),
        Stop::Budget(why) => (format!("budget: {why}"), None),
        Stop::ProviderFailed(why) => ("provider failed".into(), Some(why.clone())),
    }
}

/// The run's client behind the run's own budget (`--budget-gpu-s`, `--budget-wall-s`): once it
/// is spent no call starts, and the search stops as for an LLM budget.
struct WithinBudget<'a> {
    chat: &'a Client,
    spending: &'a kforge_optimize::budget::Spending,
}

impl kforge_llm::Chat for WithinBudget<'_> {
    fn recorded_only(&self) -> bool {
        kforge_llm::Chat::recorded_only(self.chat)
    }

    fn chat(
        &self,
        request: &kforge_llm::Request,
        scope: &kforge_llm::Scope,
    ) -> Result<kforge_llm::Answer, kforge_llm::LlmError> {
        if let Some(what) = self.spending.spent() {
            let s = self.spending.status();
            let (limit, spent) = match what {
                "gpu" => (s.budget_gpu_s.unwrap_or(0.0), s.gpu_s),
                _ => (s.budget_wall_s.unwrap_or(0.0), s.wall_s),
            };
            return Err(kforge_llm::LlmError::Budget { what: format!("the run's {what} seconds"), limit, spent });
        }
        self.chat.chat(request, scope)
    }
}

/// A judged candidate as the report lists it.
fn summary(c: &Candidate, j: &Judgement, dir: &Path) -> LlmCandidate {
    let (verdict, gate, exploit, speedup) = verdict_columns(&j.verdict);
    let file = dir.join("candidates").join(format!("{}.verdict.json", c.id));
    let ci95 = speedup.and_then(|_| ci95_of(&file));
    LlmCandidate {
        id: c.id.clone(),
        strategy: c.strategy.clone(),
        verdict,
        gate,
        exploit,
        speedup,
        ci95,
        duplicate_of: c.duplicate_of.clone(),
        source: dir.join("candidates").join(format!("{}.py", c.id)).display().to_string(),
    }
}

/// Gate 4's 95 % interval in a verdict file.
fn ci95_of(file: &Path) -> Option<[f64; 2]> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()?;
    let mut checks = v["gates"].as_array()?.iter().flat_map(|g| g["checks"].as_array().into_iter().flatten());
    let speedup = checks.find(|c| c["gate"] == "performance" && c["name"] == "speedup")?;
    Some([speedup["evidence"]["ci95"][0].as_f64()?, speedup["evidence"]["ci95"][1].as_f64()?])
}

type Columns = (String, Option<String>, bool, Option<f64>);

/// A verdict as the journal's and the report's columns: its word, the rejecting gate, whether
/// an exploit check rejected it, the speedup and its interval.
fn verdict_columns(v: &Verdict) -> Columns {
    match v {
        Verdict::Accepted { speedup: Some(s) } => ("accepted".into(), None, false, Some(*s)),
        Verdict::Accepted { speedup: None } => ("passed-without-performance".into(), None, false, None),
        Verdict::Rejected { gate, exploit, .. } => ("rejected".into(), Some(gate.clone()), *exploit, None),
        Verdict::CouldNotRun { .. } => ("could-not-run".into(), None, false, None),
    }
}

/// What the judge and the observer need of the problem's run (shared by the executor threads).
#[derive(Clone, Copy)]
struct Here<'a> {
    run: &'a super::Run<'a>,
    index: usize,
    problem: &'a Path,
    /// The problem as the journal names it.
    label: &'a str,
    /// The run from which it is decided again (`--redecide`), if it is.
    since: Option<u64>,
}

impl Here<'_> {
    fn progress(&self, what: &str) {
        self.run.progress(self.index, self.problem, what)
    }
}

/// `kforge verify` as the search's judge: each candidate saved under `llm/candidates/` and
/// verified there, or its verdict taken from the journal when a resumed run had judged it.
struct VerifyJudge<'a> {
    here: Here<'a>,
    dir: &'a Path,
    policy: &'a Path,
    judge_hash: &'a str,
    /// `--replay RUN`: the replayed run's verdicts stand (its timings are what its prompts saw).
    replayed: Option<u64>,
    /// Wall seconds of the verifications (the step's device seconds).
    seconds: Mutex<f64>,
    one_at_a_time: Option<Mutex<()>>,
}

impl Judge for VerifyJudge<'_> {
    fn judge(&self, c: &Candidate) -> Judgement {
        let file = self.dir.join("candidates").join(format!("{}.py", c.id));
        if let Err(e) = std::fs::write(&file, &c.source) {
            return could_not_run(format!("saving the candidate {}: {e}", file.display()));
        }
        // Decided again (`--redecide`): a verdict of a run before the redecision is not taken.
        let taken = |row: &kforge_store::LlmCandidateRow| {
            self.replayed.is_some() || self.here.since.is_none_or(|s| row.run >= s)
        };
        match self.here.run.journal.judged_llm(self.here.label, &c.hash, self.judge_hash, self.replayed) {
            Ok(Some(row)) if taken(&row) => {
                self.here.progress(&format!(
                    "llm: {}: its verdict from the journal (run {}): {}",
                    c.id, row.run, row.verdict
                ));
                return judgement_of(&row);
            }
            Ok(_) => {}
            Err(e) => return could_not_run(format!("reading the journal: {e}")),
        }
        let _one = self.one_at_a_time.as_ref().map(|m| m.lock().unwrap_or_else(|e| e.into_inner()));
        let t0 = Instant::now();
        let judged = self.verify(&file).unwrap_or_else(|e| could_not_run(format!("{e:#}")));
        let seconds = t0.elapsed().as_secs_f64();
        *self.seconds.lock().unwrap_or_else(|e| e.into_inner()) += seconds;
        self.here.run.spending.charge(seconds); // the run's device budget, verification by verification
        judged
    }
}

impl VerifyJudge<'_> {
    /// `kforge verify PROBLEM FILE --policy llm/policy.toml --json FILE.verdict.json` (this
    /// binary), its verdict read back.
    fn verify(&self, file: &Path) -> Result<Judgement> {
        let verdict = file.with_extension("verdict.json");
        let declared = crate::job::gpu_memory_bytes(self.here.run.a.gpu_memory)?;
        let mut cmd = self.here.run.verify_command(self.here.problem, (file, self.policy, &verdict), declared)?;
        std::fs::remove_file(&verdict).ok(); // an earlier run's verdict is not this one's
        let o = cmd.output().context("running kforge verify")?;
        let text = std::fs::read_to_string(&verdict).with_context(|| {
            format!(
                "kforge verify wrote no verdict ({}): {}",
                o.status,
                super::last_lines(&String::from_utf8_lossy(&o.stderr))
            )
        })?;
        let v: kforge_verify::verdict::Verdict =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", verdict.display()))?;
        if Path::new(&v.candidate) != file {
            bail!("{} judges {}, not {}", verdict.display(), v.candidate, file.display());
        }
        Ok(judgement_from_verdict(&v))
    }
}

fn could_not_run(reason: String) -> Judgement {
    Judgement {
        feedback: format!("the harness could not run the candidate: {reason}"),
        verdict: Verdict::CouldNotRun { reason },
    }
}

/// The verdict's outcome as the search's, with what is fed back to the model: the rejecting
/// check and its evidence, or why it could not run (the traceback's last lines), bounded.
pub fn judgement_from_verdict(v: &kforge_verify::verdict::Verdict) -> Judgement {
    use kforge_verify::verdict::Outcome;
    let checks = || v.gates.iter().flat_map(|g| g.checks.iter());
    match v.outcome {
        Outcome::Accepted | Outcome::PassedWithoutPerformance => {
            let perf = checks().find(|c| c.gate == "performance" && c.name == "speedup");
            let speedup = perf.and_then(|c| c.evidence["speedup"].as_f64());
            let speedup = speedup.filter(|_| v.outcome == Outcome::Accepted);
            let feedback = match speedup {
                Some(s) => format!("accepted: {s:.3}x against the baseline"),
                None => "correct: every gate that ran passed (not timed)".into(),
            };
            Judgement { verdict: Verdict::Accepted { speedup }, feedback }
        }
        Outcome::Rejected => {
            let gate = v.rejected_by.clone().unwrap_or_else(|| "unknown".into());
            let evidence = checks()
                .find(|c| format!("{}:{}", c.gate, c.name) == gate)
                .map(|c| stable(&c.evidence).to_string())
                .unwrap_or_default();
            let exploit = is_exploit(&gate);
            let reason = bounded(&format!("{evidence} {}", cause_text(v)), 1500);
            let feedback = format!("rejected by the check {gate}: {reason}");
            Judgement { verdict: Verdict::Rejected { gate, reason, exploit }, feedback }
        }
        Outcome::CouldNotRun => {
            let reason = bounded(&format!("{} {}", v.error.clone().unwrap_or_default(), cause_text(v)), 1500);
            could_not_run(reason)
        }
    }
}

/// Evidence without what differs from run to run (seconds, times), so that what is fed back to
/// the model, and so the next request, repeats: a replay finds it in the cache.
fn stable(evidence: &serde_json::Value) -> serde_json::Value {
    let timing = |k: &str| k == "seconds" || k.contains("time") || ["_s", "_ms", "_ns"].iter().any(|e| k.ends_with(e));
    match evidence {
        serde_json::Value::Object(m) => m
            .iter()
            .filter(|(k, _)| !timing(k))
            .map(|(k, v)| (k.clone(), stable(v)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
        serde_json::Value::Array(a) => a.iter().map(stable).collect::<Vec<_>>().into(),
        v => v.clone(),
    }
}

/// Whether the rejecting check is one of the exploit defences (a cheat, not a mistake): the
/// exploit gate, torch compute where a kernel was asked for, or a static finding other than a
/// syntax error.
fn is_exploit(gate: &str) -> bool {
    let (g, check) = gate.split_once(':').unwrap_or((gate, ""));
    g == "exploits" || (g == "dispatch" && check == "torch-compute") || (g == "static" && check != "syntax")
}

fn cause_text(v: &kforge_verify::verdict::Verdict) -> String {
    let Some(c) = &v.cause else { return String::new() };
    let mut t = c.message.clone();
    if !c.traceback.is_empty() {
        t.push('\n');
        t.push_str(&c.traceback.join("\n"));
    }
    t
}

/// At most `n` characters of `text`, its end kept (where a traceback says what failed).
fn bounded(text: &str, n: usize) -> String {
    let text = text.trim();
    let count = text.chars().count();
    if count <= n {
        return text.to_string();
    }
    let tail: String = text.chars().skip(count - n).collect();
    format!("[… {} chars cut] {tail}", count - n)
}

/// A journaled verdict as the judge's (a resumed search).
fn judgement_of(row: &LlmCandidateRow) -> Judgement {
    let verdict = match row.verdict.as_str() {
        "accepted" | "passed-without-performance" => Verdict::Accepted { speedup: row.speedup },
        "rejected" => Verdict::Rejected {
            gate: row.gate.clone().unwrap_or_default(),
            reason: row.reason.clone().unwrap_or_default(),
            exploit: row.exploit,
        },
        _ => Verdict::CouldNotRun { reason: row.reason.clone().unwrap_or_default() },
    };
    Judgement { verdict, feedback: row.feedback.clone() }
}

/// The search's observer: progress lines, and every judged candidate journaled the moment its
/// verdict arrives (its source saved beside it).
struct Journaling<'a> {
    here: Here<'a>,
    dir: &'a Path,
    judge_hash: &'a str,
    /// Verdicts so far (judged, static rejections, duplicates).
    verdicts: AtomicU64,
}

impl Observer for Journaling<'_> {
    fn on_candidate(&self, c: &Candidate, j: &Judgement) {
        let source = self.dir.join("candidates").join(format!("{}.py", c.id));
        if let Err(e) = std::fs::write(&source, &c.source) {
            self.here.progress(&format!("llm: saving {} failed: {e}", source.display()));
        }
        let (verdict, gate, exploit, speedup) = verdict_columns(&j.verdict);
        let reason = match &j.verdict {
            Verdict::Rejected { reason, .. } | Verdict::CouldNotRun { reason } => Some(reason.clone()),
            Verdict::Accepted { .. } => None,
        };
        let row = LlmCandidateRow {
            id: 0,
            run: 0,
            problem: self.here.label.to_string(),
            candidate: c.id.clone(),
            iteration: c.iteration,
            chain: c.chain,
            plan: c.plan,
            attempt: c.attempt,
            strategy: c.strategy.clone(),
            content_hash: c.hash.clone(),
            source: std::path::absolute(&source).unwrap_or(source).display().to_string(),
            parent: c.parent.clone(),
            duplicate_of: c.duplicate_of.clone(),
            verdict: verdict.clone(),
            gate: gate.clone(),
            reason,
            exploit,
            speedup,
            feedback: j.feedback.clone(),
            judged_ns: now_ns(),
            judge_hash: self.judge_hash.to_string(),
        };
        if let Err(e) = self.here.run.journal.llm_candidate(&row) {
            self.here.progress(&format!("llm: journaling {} failed: {e}", c.id));
        }
        let n = self.verdicts.fetch_add(1, Ordering::SeqCst) + 1;
        let why = gate.map(|g| format!(" by {g}{}", if exploit { " (exploit)" } else { "" })).unwrap_or_default();
        self.here.progress(&format!("llm: candidate {} ({}) {verdict}{why} [{n} verdicts]", c.id, c.strategy));
    }

    fn progress(&self, text: &str) {
        self.here.progress(&format!("llm: {text}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An inspect report of the mlp/softmax wrapper fixture: launches extern_kernels.mm
    /// (sm90_xmma_gemm), triton_poi_fused_addmm_relu_0, extern_kernels.mm (nvjet_gemm),
    /// triton_per_fused__softmax_1.
    fn inspect_report() -> kforge_inductor::inspect::InspectReport {
        let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../kforge-inductor/tests/fixtures/mlp_softmax_t210.py");
        let it = serde_json::json!([
            {"name": "sm90_xmma_gemm", "dur_us": 100.0}, {"name": "triton_poi_fused_addmm_relu_0", "dur_us": 20.0},
            {"name": "nvjet_gemm", "dur_us": 70.0}, {"name": "triton_per_fused__softmax_1", "dur_us": 10.0}
        ]);
        let cap = serde_json::json!({
            "kforge_capture": 1, "source": "mlp.py", "kind": "problem", "mode": "default",
            "wrappers": [std::fs::read_to_string(fixture).unwrap()], "iterations": [it]
        });
        kforge_inductor::inspect::report(&serde_json::from_value(cap).unwrap()).unwrap()
    }

    fn row(name: &str, t: f64, m: f64, c: Option<f64>) -> kforge_ncu::KernelRow {
        kforge_ncu::KernelRow {
            name: name.into(),
            launches: 1,
            time_ns: t,
            sol_memory_pct: Some(m),
            sol_compute_pct: c,
            occupancy_pct: None,
            dram_bytes: Some(t * 3.0),
            flops: None,
            block: None,
            grid: None,
        }
    }

    #[test]
    fn profile_rows_take_the_inventorys_names() {
        let p = kforge_ncu::Profile {
            source: "mlp.py".into(),
            mode: None,
            size: None,
            forwards: Some(1),
            metrics: vec![],
            peaks: Some(kforge_ncu::Peaks { copy_bytes_per_s: 4e9 }),
            kernels: vec![
                row("void sm90_xmma_gemm(int)", 300.0, 40.0, Some(90.0)),
                row("triton_poi_fused_addmm_relu_0", 60.0, 85.0, Some(10.0)),
                row("nvjet_gemm", 100.0, 20.0, Some(70.0)),
                row("triton_per_fused__softmax_1", 30.0, 50.0, None),
                row("triton_unrelated_9", 5.0, 10.0, Some(10.0)),
            ],
        };
        let rows = profile_rows(&p, Some(&inspect_report()));
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        let want = ["extern_kernels.mm", "triton_poi_fused_addmm_relu_0", "extern_kernels.addmm"];
        assert_eq!(names, want, "the softmax kernel has no compute %: left out");
        assert_eq!((rows[0].sol_memory_pct, rows[0].sol_compute_pct), (40.0, 90.0), "void (int) aside");
        assert_eq!((rows[2].sol_memory_pct, rows[2].sol_compute_pct), (20.0, 70.0));
        let dram = rows[0].dram_of_peak_pct.unwrap();
        assert!((dram - 75.0).abs() < 1e-9, "3 bytes a ns against a 4 GB/s peak: {dram}");
        let raw = profile_rows(&p, None);
        assert_eq!(raw.len(), 4);
        assert_eq!(raw[0].name, "void sm90_xmma_gemm(int)");
    }

    #[test]
    fn the_agents_inventory_carries_each_generated_kernels_roofline() {
        let mut r = inspect_report();
        let (inv, ms) = inventory_of(&r);
        assert!(inv.kernels.iter().all(|k| k.bandwidth_of_peak.is_none()), "no roofline in the report: none");
        assert_eq!(ms, Some(0.2));
        r.roofline = Some(serde_json::json!({"peak_bytes_per_s": 2.9e12, "ceiling": 1.2, "kernels": {
            "triton_poi_fused_addmm_relu_0": {"of_peak": 0.93, "ceiling": 1.129},
            "triton_per_fused__softmax_1": {"of_peak": 0.2, "why": "its traffic (1.0 MB a launch) is within 4x the L2"}
        }}));
        let (inv, _) = inventory_of(&r);
        let f: Vec<(&str, Option<f64>)> = inv.kernels.iter().map(|k| (k.name.as_str(), k.bandwidth_of_peak)).collect();
        assert_eq!(
            f,
            [
                ("extern_kernels.mm", None),
                ("triton_poi_fused_addmm_relu_0", Some(0.93)),
                ("extern_kernels.addmm", None),
                ("triton_per_fused__softmax_1", None), // no ceiling: its estimate does not hold
            ]
        );
    }

    fn verdict(outcome: &str, rejected_by: Option<&str>, checks: serde_json::Value) -> kforge_verify::verdict::Verdict {
        serde_json::from_value(serde_json::json!({
            "problem": "p.py", "candidate": "c.py", "outcome": outcome, "rejected_by": rejected_by,
            "error": null, "gates": [{"gate": "any", "status": "failed", "checks": checks}],
            "limits": {}, "cause": null, "notes": []
        }))
        .unwrap()
    }

    #[test]
    fn a_rejection_feeds_back_its_check_without_timings_and_names_cheats() {
        let checks = serde_json::json!([{"gate": "correctness", "name": "seed-0", "ok": false,
            "evidence": {"max_abs_diff": 6.5, "seconds": 0.031, "per_round": [{"candidate_ms": 1.0, "why": "x"}]}}]);
        let j = judgement_from_verdict(&verdict("rejected", Some("correctness:seed-0"), checks));
        let Verdict::Rejected { gate, exploit, .. } = &j.verdict else { panic!("{j:?}") };
        assert_eq!((gate.as_str(), *exploit), ("correctness:seed-0", false));
        assert!(j.feedback.contains("max_abs_diff") && j.feedback.contains("\"why\":\"x\""), "{}", j.feedback);
        assert!(!j.feedback.contains("seconds") && !j.feedback.contains("candidate_ms"), "{}", j.feedback);
        for (gate, cheat) in [
            ("exploits:ghost-replay", true),
            ("dispatch:torch-compute", true),
            ("static:torch-compute", true),
            ("static:syntax", false),
            ("correctness:ragged-1", false),
            ("performance:speedup", false),
        ] {
            assert_eq!(is_exploit(gate), cheat, "{gate}");
        }
    }

    #[test]
    fn an_accepted_candidate_carries_gate_4s_speedup_and_an_untimed_one_none() {
        let perf = serde_json::json!([{"gate": "performance", "name": "speedup", "ok": true,
            "evidence": {"speedup": 1.31, "ci95": [1.2, 1.4]}}]);
        let j = judgement_from_verdict(&verdict("accepted", None, perf));
        assert_eq!(j.verdict, Verdict::Accepted { speedup: Some(1.31) });
        let j = judgement_from_verdict(&verdict("passed-without-performance", None, serde_json::json!([])));
        assert_eq!(j.verdict, Verdict::Accepted { speedup: None });
        assert_eq!(verdict_columns(&j.verdict).0, "passed-without-performance");
        let j = judgement_from_verdict(&verdict("could-not-run", None, serde_json::json!([])));
        assert!(matches!(j.verdict, Verdict::CouldNotRun { .. }) && j.feedback.contains("could not run"));
    }

    #[test]
    fn long_feedback_keeps_its_end() {
        let text = format!("{}the last line", "x".repeat(3000));
        let cut = bounded(&text, 100);
        assert!(cut.starts_with("[… 2913 chars cut]") && cut.ends_with("the last line"), "{cut}");
        assert_eq!(bounded("short", 100), "short");
    }
}
