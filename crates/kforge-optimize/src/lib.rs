//! `kforge optimize`'s decisions, without processes: which agents run, what they measured (the
//! dispatch family's `python3 -m kforge.optimize.dispatch` JSON and the config agent's
//! `python3 -m kforge.optimize.config` JSON, read here), and what the run ends with — a winner
//! that measured beyond noise and that `kforge verify` then accepted, the faster of the two
//! families' ([`across`]), or the baseline kept (the fallback) with the reason. The binary runs
//! the agents, writes the result files and verifies them; this crate says what that means.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub mod beam;
pub mod budget;
pub mod decisions;
pub mod diff;
pub mod goals;
pub mod html;
pub mod journal;
pub mod llm;
pub mod redecide;
pub mod search;

/// An agent: what proposes candidates. Closed: a name outside it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Agent {
    /// Eager or a torch.compile mode per problem, by measurement.
    Dispatch,
    /// The baseline's mode with one of Inductor's knobs changed (`MODE+KNOB`), by measurement.
    Inductor,
    /// The forward rewritten by the FX rewrite rules, run in a mode (`MODE~rewrite`), by measurement.
    Rewrite,
    /// The baseline's generated Triton kernels with their launch configurations searched and
    /// pinned (`config`), by measurement in its own step (a GPU only).
    Config,
    /// LLM agents (planner, executors, summarizer) writing new kernels through an
    /// OpenAI-compatible endpoint, each candidate judged by `kforge verify` (`llm:ID`), in its
    /// own step.
    Llm,
}

impl Agent {
    pub const ALL: [(&'static str, Agent); 5] = [
        ("dispatch", Agent::Dispatch),
        ("inductor", Agent::Inductor),
        ("rewrite", Agent::Rewrite),
        ("config", Agent::Config),
        ("llm", Agent::Llm),
    ];

    /// The agent that proposed a measured variant: `MODE+KNOB` is the inductor agent's,
    /// `MODE~rewrite` the rewrite agent's, `config` the config agent's.
    pub fn of_variant(variant: &str) -> Agent {
        if variant == CONFIG_VARIANT {
            Agent::Config
        } else if variant.starts_with("llm:") {
            Agent::Llm
        } else if variant.ends_with("~rewrite") {
            Agent::Rewrite
        } else if variant.contains('+') {
            Agent::Inductor
        } else {
            Agent::Dispatch
        }
    }

    pub fn name(self) -> &'static str {
        Agent::ALL.iter().find(|(_, a)| *a == self).map(|(n, _)| *n).unwrap_or("?")
    }
}

/// What `kforge optimize` is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Baseline {
    Default,
    MaxAutotune,
}

impl Baseline {
    pub fn mode(self) -> &'static str {
        match self {
            Baseline::Default => "default",
            Baseline::MaxAutotune => "max-autotune",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OptimizeError {
    #[error("--agents: unknown agent {0:?} (known: {known})", known = Agent::ALL.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "))]
    UnknownAgent(String),
    #[error("--agents: no agent named")]
    NoAgent,
    #[error("{path}: not a problem file: {why}")]
    NotAProblem { path: String, why: String },
    #[error("the dispatch agent's result is not readable: {0}")]
    Measurement(String),
    #[error("the config agent's result is not readable: {0}")]
    ConfigMeasurement(String),
    #[error("--agents {0}: {CONFIG_NEEDS_A_GPU}; on the CPU nothing here can be measured (add dispatch, inductor or rewrite)")]
    NothingToMeasure(String),
    #[error("{flag} must be a positive number of seconds, got {value}")]
    Budget { flag: &'static str, value: f64 },
    #[error("--redecide: {0}")]
    Redecide(String),
}

/// `--agents LIST`: comma-separated names, each known, in order, without repeats.
pub fn parse_agents(list: &str) -> Result<Vec<Agent>, OptimizeError> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let (_, a) =
            Agent::ALL.iter().find(|(n, _)| *n == name).ok_or_else(|| OptimizeError::UnknownAgent(name.into()))?;
        if !out.contains(a) {
            out.push(*a);
        }
    }
    if out.is_empty() {
        return Err(OptimizeError::NoAgent);
    }
    Ok(out)
}

/// Inductor's knobs the inductor agent tries on a device (python/kforge/optimize/dispatch.py
/// `KNOBS`): on the CPU those that change its C++ backend's code.
pub fn inductor_knobs(gpu: bool) -> &'static [&'static str] {
    if gpu {
        &[
            "freezing",
            "aggressive-fusion",
            "coordinate-descent",
            "no-layout-optimization",
            "max-autotune-pointwise",
            "no-epilogue-fusion",
        ]
    } else {
        &["freezing", "aggressive-fusion"]
    }
}

/// The modes the dispatch agent measures on a device: CUDA graphs only on a GPU.
pub fn dispatch_modes(gpu: bool) -> &'static [&'static str] {
    if gpu {
        &["eager", "default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead"]
    } else {
        &["eager", "default", "max-autotune-no-cudagraphs"]
    }
}

/// One timed mode of the dispatch agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeTiming {
    pub speedup: f64,
    pub ci95: [f64; 2],
    pub beyond_noise: bool,
}

/// One prepared mode: whether it ran and matched eager, else why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prepared {
    pub ok: bool,
    #[serde(default)]
    pub why: Option<String>,
    #[serde(default)]
    pub first_call_s: Option<f64>,
    /// A rewrite variant's rules, in the order applied (absent for other variants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<String>>,
    /// A rewrite variant's weakest exactness class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exactness: Option<String>,
    /// A knob variant whose compile generated exactly the code of a variant of its mode with a
    /// subset of its knobs (the mode, or a single knob): that variant (this one is not timed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_code_as: Option<String>,
    /// A knob variant not compiled: why its knobs cannot change this problem's graphs (no op
    /// for them to act on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_effect: Option<String>,
    /// A variant not prepared: the measure step's deadline came first (a step no wall budget
    /// of its size holds is bounded, `--prepare-until`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_prepared: Option<String>,
}

impl Prepared {
    /// Why a variant that was prepared has no timing: it failed or computed otherwise, or it is
    /// its mode's code again; empty for one that was timed.
    pub fn note(&self) -> String {
        if let Some(why) = &self.no_effect {
            return format!("not compiled: {why}");
        }
        if let Some(why) = &self.not_prepared {
            return format!("not prepared: {why}");
        }
        match (&self.same_code_as, self.ok) {
            (Some(mode), _) => format!("not timed: its compile generated the same code as {mode}"),
            (None, true) => String::new(),
            (None, false) => format!("left out: {}", self.why.as_deref().unwrap_or("differs from eager")),
        }
    }
}

impl DispatchMeasurement {
    /// The measurement when no agent of the dispatch family runs (`--agents llm`, `--agents
    /// config`): nothing timed, the baseline the winner; its result file is the baseline's.
    pub fn baseline_only(baseline: Baseline) -> DispatchMeasurement {
        DispatchMeasurement {
            baseline: baseline.mode().into(),
            winner: baseline.mode().into(),
            fallback: true,
            noise_floor: None,
            modes: BTreeMap::new(),
            prepared: BTreeMap::new(),
            rewrite: None,
            graphs: None,
            baseline_profile: None,
            duplicates: BTreeMap::new(),
            not_prepared: Vec::new(),
            rounds_cut: None,
            input_bytes: None,
        }
    }
}

/// What the dispatch agent measured (the fields of its JSON this side reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DispatchMeasurement {
    pub baseline: String,
    pub winner: String,
    pub fallback: bool,
    #[serde(default)]
    pub noise_floor: Option<f64>,
    #[serde(default)]
    pub modes: BTreeMap<String, ModeTiming>,
    #[serde(default)]
    pub prepared: BTreeMap<String, Prepared>,
    /// What the rewrite agent proposed (`None`: it did not run).
    #[serde(default)]
    pub rewrite: Option<RewriteProposal>,
    /// The dispatch agent's per-graph search (`None`: it did not run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graphs: Option<GraphSearch>,
    /// The compiled baseline's profile (with the config agent on a GPU): its Triton kernels'
    /// share of device time, or why there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_profile: Option<BaselineProfile>,
    /// Variants not measured because they compile exactly as another does (the same Inductor
    /// options), each with that one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub duplicates: BTreeMap<String, String>,
    /// What a bounded measure step left out, its deadline first: variants, "the rewrite", "the
    /// per-graph search" (empty: it prepared everything).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_prepared: Vec<String>,
    /// A measure step that timed fewer rounds than asked, its end (`--until`: bounded, or the
    /// safety net's) coming first: how many ("2 of 5 rounds timed: …"); its intervals are that
    /// much wider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds_cut: Option<String>,
    /// The bytes of the forward's tensor inputs, recorded on a GPU when a mode with CUDA graphs
    /// was measured: what such a mode copies into its graphs' static buffers every call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_bytes: Option<u64>,
}

/// Modes whose compiled forward replays CUDA graphs (on a GPU).
pub const CUDA_GRAPH_MODES: [&str; 2] = ["max-autotune", "reduce-overhead"];

/// Whether `variant` (`MODE[+KNOB...][~rewrite]`) replays CUDA graphs: its mode is one of
/// [`CUDA_GRAPH_MODES`]; a per-graph plan (`graphs:M0/M1/...`) when one of its graphs' does.
pub fn uses_cuda_graphs(variant: &str) -> bool {
    if let Some(plan) = variant.strip_prefix("graphs:") {
        return plan.split('/').any(uses_cuda_graphs);
    }
    let mode = variant.split(['+', '~']).next().unwrap_or(variant);
    CUDA_GRAPH_MODES.contains(&mode)
}

impl DispatchMeasurement {
    /// The table's line on CUDA graphs' input copies, when the baseline replays CUDA graphs and
    /// the inputs' size is known: at the large preset that copy made max-autotune 2.3-3.7x slower
    /// than the same kernels without graphs on bandwidth-bound problems, so a winner without
    /// CUDA graphs may owe its speedup to it rather than to its kernels.
    pub fn cuda_graph_line(&self) -> Option<String> {
        let bytes = self.input_bytes.filter(|_| uses_cuda_graphs(&self.baseline))?;
        let without = if uses_cuda_graphs(&self.winner) || self.winner == self.baseline {
            String::new()
        } else {
            format!("; {} has none: part of its speedup may be that copy", self.winner)
        };
        Some(format!(
            "CUDA graphs: {} copies the forward's {} of tensor inputs into its graphs' buffers every call{without}\n",
            self.baseline,
            human_bytes(bytes)
        ))
    }
}

/// `bytes` for people: GiB, MiB or KiB with two decimals, or bytes.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    UNITS
        .iter()
        .find(|(_, size)| bytes >= *size)
        .map(|(unit, size)| format!("{:.2} {unit}", bytes as f64 / *size as f64))
        .unwrap_or_else(|| format!("{bytes} B"))
}

/// The dispatch agent's per-graph search: the graphs Dynamo split the forward into, why each
/// break happened, the plan it ended with (`graphs:M0/M1/...`, or a mode) after how many rounds,
/// or why it searched nothing (one graph: not an error).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphSearch {
    pub count: usize,
    #[serde(default)]
    pub breaks: Vec<String>,
    #[serde(default)]
    pub plan: Option<String>,
    #[serde(default)]
    pub rounds: Vec<GraphRound>,
    #[serde(default)]
    pub why: Option<String>,
}

/// One round of the per-graph search: the plan it started from, the plans one graph away it
/// timed (against the baseline, as every variant), and the plan it moved to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphRound {
    pub from: String,
    #[serde(default)]
    pub modes: BTreeMap<String, ModeTiming>,
    #[serde(default)]
    pub moved_to: Option<String>,
}

impl GraphSearch {
    /// The plans its rounds timed that the measurement's own variants do not hold (the plan each
    /// round started from, and the one the search ended with, are there or in an earlier round).
    pub fn plans_timed<'a>(&'a self, m: &'a DispatchMeasurement) -> BTreeMap<String, ModeTiming> {
        self.rounds
            .iter()
            .flat_map(|r| r.modes.iter().filter(move |(v, _)| **v != r.from))
            .filter(|(v, _)| !m.modes.contains_key(*v))
            .map(|(v, t)| (v.clone(), t.clone()))
            .collect()
    }
}

/// The dispatch agent's one profile of the compiled baseline (`--profile-baseline 1`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineProfile {
    #[serde(default)]
    pub triton_share: Option<f64>,
    #[serde(default)]
    pub why: Option<String>,
}

/// Why the config family cannot win, or `None`: no launch configuration makes the model faster
/// than its Amdahl ceiling, 1 / (1 − `share`), the generated Triton kernels' share of the
/// baseline's device time; a family wins `across` only by a larger speedup than `beat`, the
/// other family's verified one (1.0: the baseline alone). The config agent's own `--beat` rule
/// (python/kforge/optimize/config.py `pruned_why`), here before its step, from the dispatch
/// agent's profile.
pub fn config_cannot_win(share: f64, beat: f64) -> Option<String> {
    if !(0.0..=1.0).contains(&share) {
        return None; // not a share: no claim
    }
    let ceiling = amdahl_ceiling(share);
    (ceiling <= beat).then(|| {
        format!(
            "its Amdahl ceiling is {ceiling:.3}x (the baseline's Triton kernels: {:.0} % of its device time), \
             not above the {beat:.3}x the dispatch family's verified result has",
            share * 100.0
        )
    })
}

/// The model's speedup if kernels taking `share` of its device time took none (infinite at 1).
pub fn amdahl_ceiling(share: f64) -> f64 {
    1.0 / (1.0 - share)
}

/// The prefix of a per-graph plan's variant (python/kforge/optimize/dispatch.py `GRAPHS`).
pub const GRAPHS_VARIANT: &str = "graphs:";

impl GraphSearch {
    /// One line for the table; empty for a forward of one graph (nothing to say).
    pub fn line(&self) -> String {
        if self.count < 2 {
            return String::new();
        }
        let breaks = self.breaks.join("; ");
        let what = match (&self.why, &self.plan) {
            (Some(why), _) => why.clone(),
            (None, Some(plan)) => format!("{} round(s), ended with {plan}", self.rounds.len()),
            (None, None) => "no plan".into(),
        };
        format!("per graph: {} graphs (breaks: {breaks}): {what}\n", self.count)
    }
}

/// One rewrite rule applied to the problem's FX graph, with its exactness class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewriteApplication {
    pub rule: String,
    pub exactness: String,
}

/// What the rewrite agent proposed: the rules that fired (its variants `MODE~rewrite`), or
/// nothing, and why (no rule fired: not an error).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewriteProposal {
    pub fired: bool,
    #[serde(default)]
    pub rules: Vec<RewriteApplication>,
    #[serde(default)]
    pub why: Option<String>,
}

impl RewriteProposal {
    /// One line for the table.
    pub fn line(&self) -> String {
        if self.fired {
            let rules: Vec<String> = self.rules.iter().map(|r| format!("{} ({})", r.rule, r.exactness)).collect();
            format!("rewrite: {}", rules.join(", "))
        } else {
            format!("rewrite: {}", self.why.as_deref().unwrap_or("proposes nothing"))
        }
    }
}

impl DispatchMeasurement {
    pub fn parse(text: &str) -> Result<DispatchMeasurement, OptimizeError> {
        let m: DispatchMeasurement =
            serde_json::from_str(text).map_err(|e| OptimizeError::Measurement(e.to_string()))?;
        if m.winner != m.baseline && !m.modes.contains_key(&m.winner) {
            return Err(OptimizeError::Measurement(format!("the winner {:?} was not timed", m.winner)));
        }
        Ok(m)
    }
}

/// The config agent's variant: the baseline with its kernels' tuned configurations pinned.
pub const CONFIG_VARIANT: &str = "config";

/// Why the config agent does not run on the CPU (its step is skipped there, not failed).
pub const CONFIG_NEEDS_A_GPU: &str = "config: needs a GPU: Inductor's CPU backend generates C++, no Triton kernels";

/// The agents can measure something on this device: not the config agent alone on the CPU.
pub fn check_agents(agents: &[Agent], gpu: bool) -> Result<(), OptimizeError> {
    if !gpu && agents == [Agent::Config] {
        return Err(OptimizeError::NothingToMeasure("config".into()));
    }
    Ok(())
}

/// One launch configuration of a Triton kernel (config.py `LaunchConfig.as_dict`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchConfig {
    #[serde(default)]
    pub kwargs: BTreeMap<String, i64>,
    pub num_warps: i64,
    pub num_stages: i64,
}

impl LaunchConfig {
    /// `XBLOCK=64 R0_BLOCK=8 warps=4 stages=1`, as config.py labels it.
    pub fn label(&self) -> String {
        let mut parts: Vec<String> = self.kwargs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts.extend([format!("warps={}", self.num_warps), format!("stages={}", self.num_stages)]);
        parts.join(" ")
    }
}

/// One kernel's search by the config agent (the fields of its `kernels` entry this side reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelTuning {
    /// Its share of the baseline's device time.
    #[serde(default)]
    pub share: Option<f64>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub original: Option<LaunchConfig>,
    #[serde(default)]
    pub new: Option<LaunchConfig>,
    /// The new configuration's speedup over the original (kernel level).
    #[serde(default)]
    pub speedup: Option<f64>,
    #[serde(default)]
    pub ci95: Option<[f64; 2]>,
    /// True: the original stays (nothing beat it beyond noise, or the search failed).
    #[serde(default = "yes")]
    pub fallback: bool,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub why: Option<String>,
}

fn yes() -> bool {
    true
}

impl KernelTuning {
    /// `old -> new (1.234x)`, or why the original stays.
    pub fn choice(&self) -> String {
        let label = |c: &Option<LaunchConfig>| c.as_ref().map(LaunchConfig::label).unwrap_or_else(|| "?".into());
        if let Some(e) = &self.error {
            return format!("failed: {e}");
        }
        if self.fallback {
            let why = self.why.as_deref().unwrap_or("no configuration beat it beyond noise");
            return format!("{} kept ({why})", label(&self.original));
        }
        format!("{} -> {} ({:.3}x)", label(&self.original), label(&self.new), self.speedup.unwrap_or(1.0))
    }
}

/// What the config agent measured: the dispatch agent's schema (`baseline`, `winner` — `config`
/// or the baseline —, `fallback`, `noise_floor`, `modes.config`) and its kernels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigMeasurement {
    pub baseline: String,
    pub winner: String,
    pub fallback: bool,
    #[serde(default)]
    pub noise_floor: Option<f64>,
    #[serde(default)]
    pub modes: BTreeMap<String, ModeTiming>,
    #[serde(default)]
    pub kernels: BTreeMap<String, KernelTuning>,
    /// Kernels not searched, and why (not `*_fused_*`, ...).
    #[serde(default)]
    pub skipped: BTreeMap<String, String>,
    #[serde(default)]
    pub why: Option<String>,
    /// The generated Triton kernels' share of the baseline's device time (its profile).
    #[serde(default)]
    pub triton_share: Option<f64>,
    /// The speedup it had to beat (another family's verified result; 1.0: the baseline alone):
    /// the kernels were searched only when their Amdahl ceiling exceeded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beat: Option<f64>,
    /// Selected kernels a bounded step (`--tune-until`) had no time to tune, by time share.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_tuned: Vec<String>,
    /// Set when the step's end (`--until`) cut the re-stitched model's timing rounds: how many
    /// of how many were timed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds_cut: Option<String>,
    /// The generated kernels against the device's bandwidth (absent in steps before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roofline: Option<Roofline>,
}

/// The config agent's roofline (python/kforge/inspect/roofline.py `roofline_summary`): each
/// generated pointwise or reduction kernel's least traffic against the device's bandwidth (the
/// larger of a copy's and a read's rate), and the model's speedup were every one of them at its roof.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    /// The device's bandwidth the kernels are held against, bytes per second (the larger of a
    /// device-to-device copy's rate, read + write, and a read's); `None`: not measured (`why`).
    #[serde(default)]
    pub peak_bytes_per_s: Option<f64>,
    /// The fraction of the device's bandwidth at which a kernel was left untuned.
    #[serde(default)]
    pub skip_at: Option<f64>,
    /// The model's roofline ceiling: vendor time unchanged, each kernel with a roofline at its
    /// roof, the others at no time; `None` (also for an unbounded one) when not known.
    #[serde(default)]
    pub ceiling: Option<f64>,
    #[serde(default)]
    pub kernels: BTreeMap<String, KernelRoof>,
    #[serde(default)]
    pub why: Option<String>,
}

/// One kernel against the device's bandwidth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelRoof {
    #[serde(default)]
    pub kind: Option<String>,
    /// Its least traffic per launch, bytes.
    #[serde(default)]
    pub bytes: Option<f64>,
    /// The fraction of the device's bandwidth that traffic moves at.
    #[serde(default)]
    pub of_peak: Option<f64>,
    /// The most any launch configuration can speed it up; `None` where the estimate does not hold (`why`).
    #[serde(default)]
    pub ceiling: Option<f64>,
    #[serde(default)]
    pub why: Option<String>,
    /// Left untuned because it runs at its roof (the config agent marks it so).
    #[serde(default)]
    pub skipped: bool,
}

impl Roofline {
    /// The kernels the config agent left untuned at their roof, by name.
    pub fn at_roof(&self) -> Vec<(&String, &KernelRoof)> {
        self.kernels.iter().filter(|(_, k)| k.skipped).collect()
    }

    /// `config: roofline ceiling 1.030x (…; device bandwidth 2.95 TB/s); 2 at their roof, not
    /// tuned`, or why there is none.
    pub fn line(&self) -> String {
        let Some(peak) = self.peak_bytes_per_s else {
            return format!("config: no roofline: {}\n", self.why.as_deref().unwrap_or("no bandwidth measured"));
        };
        let ceiling = self.ceiling.map(|c| format!("{c:.3}x")).unwrap_or_else(|| "unbounded".into());
        let roof = self.at_roof().len();
        format!(
            "config: roofline ceiling {ceiling} (every generated kernel at its bandwidth roof; device bandwidth {:.2} TB/s){}\n",
            peak / 1e12,
            if roof > 0 { format!("; {roof} at their roof, not tuned") } else { String::new() }
        )
    }
}

impl KernelRoof {
    /// `at 102% of the device's bandwidth: at most 1.027x`.
    pub fn at_roof_text(&self) -> String {
        match (self.of_peak, self.ceiling) {
            (Some(f), Some(c)) => format!("at {:.0}% of the device's bandwidth: at most {c:.3}x", f * 100.0),
            _ => self.why.clone().unwrap_or_default(),
        }
    }
}

impl ConfigMeasurement {
    /// The Amdahl ceiling of any search over the generated kernels: the speedup if every one of
    /// them took no time at all (the vendor calls and the rest unchanged). `None` without a
    /// profile; infinite when the Triton kernels were all of the device time.
    pub fn amdahl_ceiling(&self) -> Option<f64> {
        self.triton_share.filter(|s| (0.0..=1.0).contains(s)).map(amdahl_ceiling)
    }

    pub fn parse(text: &str) -> Result<ConfigMeasurement, OptimizeError> {
        let m: ConfigMeasurement =
            serde_json::from_str(text).map_err(|e| OptimizeError::ConfigMeasurement(e.to_string()))?;
        if m.winner != m.baseline && m.winner != CONFIG_VARIANT {
            return Err(OptimizeError::ConfigMeasurement(format!(
                "the winner {:?} is neither config nor the baseline {:?}",
                m.winner, m.baseline
            )));
        }
        if m.winner == CONFIG_VARIANT && !m.modes.contains_key(CONFIG_VARIANT) {
            return Err(OptimizeError::ConfigMeasurement("the winner config was not timed".into()));
        }
        Ok(m)
    }

    /// Whether `config` won its measurement (its result file is then verified).
    pub fn won(&self) -> bool {
        !self.fallback && self.winner == CONFIG_VARIANT
    }

    /// The kernels in order of their share, largest first.
    pub fn kernels_by_share(&self) -> Vec<(&String, &KernelTuning)> {
        let mut k: Vec<(&String, &KernelTuning)> = self.kernels.iter().collect();
        k.sort_by(|a, b| b.1.share.unwrap_or(0.0).total_cmp(&a.1.share.unwrap_or(0.0)).then(a.0.cmp(b.0)));
        k
    }
}

/// The config family's decision on its own: `config` when it won its measurement beyond noise
/// and its result file passed verification (as [`decide`] counts it), else why not.
pub fn decide_config(m: &ConfigMeasurement, verified: Option<Verified>, gpu: bool) -> Decision {
    let timing = m.modes.get(CONFIG_VARIANT);
    let Some(t) = timing.filter(|t| m.won() && t.beyond_noise) else {
        let why = match (timing, m.noise_floor) {
            (Some(t), Some(f)) if !t.beyond_noise => format!(
                "config did not beat {} beyond the noise floor {f:.3} ({:.3}x, interval {:.3}-{:.3})",
                m.baseline, t.speedup, t.ci95[0], t.ci95[1]
            ),
            _ => format!("config: {}", m.why.as_deref().unwrap_or("no kernel's configuration won")),
        };
        return Decision::Fallback { reason: why };
    };
    if passed(verified, gpu) {
        Decision::Improved { agent: Agent::Config, mode: CONFIG_VARIANT.into(), speedup: t.speedup, ci95: t.ci95 }
    } else {
        Decision::Fallback {
            reason: format!("config measured {:.3}x but its result file was {}", t.speedup, verified_how(verified)),
        }
    }
}

/// The decision across families (each a verified winner against the same baseline, or why
/// not): the larger speedup wins, on a tie the first family (dispatch: the simpler result);
/// none: the first family's fallback, with the others' reasons after it.
pub fn across(families: &[Decision]) -> Decision {
    let mut best: Option<&Decision> = None;
    for d in families {
        if let Decision::Improved { speedup, .. } = d {
            match best {
                Some(Decision::Improved { speedup: s, .. }) if *s >= *speedup => {}
                _ => best = Some(d),
            }
        }
    }
    if let Some(d) = best {
        return d.clone();
    }
    let reasons: Vec<&str> = families
        .iter()
        .filter_map(|d| match d {
            Decision::Fallback { reason } => Some(reason.as_str()),
            Decision::Improved { .. } => None,
        })
        .collect();
    Decision::Fallback { reason: reasons.join("; ") }
}

/// Where the run's result file (`model_new.py`, `policy.toml`) comes from once decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultFrom {
    /// As the result step wrote it: the dispatch family's winner, or its baseline.
    AsWritten,
    /// The config agent's result (`config/`), copied into place.
    Config,
    /// Rewritten for the baseline: the dispatch family's winner did not pass, nothing else won.
    Baseline,
    /// The LLM family's best candidate (`llm/`), copied into place.
    Llm,
}

/// The result file's source for `decision`, given the dispatch family's measurement and its
/// decision on its own.
pub fn result_from(m: &DispatchMeasurement, dispatch: &Decision, decision: &Decision) -> ResultFrom {
    match decision {
        Decision::Improved { agent: Agent::Config, .. } => ResultFrom::Config,
        Decision::Improved { agent: Agent::Llm, .. } => ResultFrom::Llm,
        Decision::Fallback { .. } if m.winner != m.baseline && matches!(dispatch, Decision::Fallback { .. }) => {
            ResultFrom::Baseline
        }
        _ => ResultFrom::AsWritten,
    }
}

/// The config family in a report: why its step did not run, or what it measured, how its result
/// file was judged and its decision on its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigReport {
    /// Why the config step did not run (on the CPU: [`CONFIG_NEEDS_A_GPU`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// Why the config step failed (its family then falls back; the problem does not fail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measurement: Option<ConfigMeasurement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<Verified>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// The config result on its own (`config/model_new.py`; copied to the result when it wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
}

impl ConfigReport {
    /// The family's decision for [`across`]: its own, or a fallback saying why it has none.
    pub fn family_decision(&self) -> Option<Decision> {
        let why = || match (&self.skipped, &self.error) {
            (Some(s), _) => Some(s.clone()),
            (None, Some(e)) => Some(format!("config: failed: {e}")),
            (None, None) => None,
        };
        self.decision.clone().or_else(|| why().map(|reason| Decision::Fallback { reason }))
    }

    /// The table's config section: one line per searched kernel, then the model's timing.
    pub fn lines(&self) -> String {
        if let Some(why) = &self.skipped {
            return format!("config: skipped: {}\n", why.strip_prefix("config: ").unwrap_or(why));
        }
        if let Some(e) = &self.error {
            return format!("config: failed: {e}\n");
        }
        let Some(m) = &self.measurement else { return String::new() };
        let mut t = match (m.triton_share, m.amdahl_ceiling()) {
            (Some(s), Some(c)) => format!(
                "config: Triton kernels {:.0}% of the baseline's device time: Amdahl ceiling {}\n",
                s * 100.0,
                if c.is_finite() { format!("{c:.2}x") } else { "unbounded (no vendor time)".into() }
            ),
            _ => String::new(),
        };
        if let Some(r) = &m.roofline {
            t.push_str(&r.line());
        }
        t.push_str(&format!("{:<52} {:>6}  {}\n", "CONFIG KERNEL", "SHARE", "OLD -> NEW (KERNEL SPEEDUP)"));
        for (name, k) in m.kernels_by_share() {
            let share = k.share.map(|s| format!("{:.0}%", s * 100.0)).unwrap_or_else(|| "-".into());
            t.push_str(&format!("{name:<52} {share:>6}  {}\n", k.choice()));
        }
        for (name, k) in m.roofline.iter().flat_map(Roofline::at_roof) {
            t.push_str(&format!("{name:<52} {:>6}  not tuned: {}\n", "-", k.at_roof_text()));
        }
        for name in &m.not_tuned {
            t.push_str(&format!("{name:<52} {:>6}  not tuned: the step's deadline came first\n", "-"));
        }
        match m.modes.get(CONFIG_VARIANT) {
            Some(c) => t.push_str(&format!(
                "{:<28} {:>8.3}x {:>9.3}-{:<9.3}  {}{}\n",
                "config (model)",
                c.speedup,
                c.ci95[0],
                c.ci95[1],
                if c.beyond_noise { "beyond noise" } else { "within noise" },
                m.noise_floor.map(|f| format!(", noise floor {f:.3}")).unwrap_or_default()
            )),
            None => t.push_str(&format!(
                "config (model): not timed ({})\n",
                m.why.as_deref().unwrap_or("no kernel's configuration won")
            )),
        }
        if let Some(v) = self.verified {
            t.push_str(&format!("config result: {}\n", verified_how(Some(v))));
        }
        t
    }
}

/// How `kforge verify` judged the result file (its outcome's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verified {
    Accepted,
    PassedWithoutPerformance,
    Rejected,
    CouldNotRun,
}

/// What the run ends with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Decision {
    /// A mode beat the baseline beyond noise and the result file passed verification.
    Improved { agent: Agent, mode: String, speedup: f64, ci95: [f64; 2] },
    /// The baseline is the result: nothing won, or the winner's file did not pass.
    Fallback { reason: String },
}

/// The decision from what was measured and how the winner's result file was judged. On a GPU
/// only `accepted` counts (gate 4 confirmed the speedup against the same baseline); without
/// one, `passed-without-performance` (every other gate passed; the speed is the agent's own
/// interleaved measurement).
/// Runner-ups verified after a rejected winner, at most: a measured winner whose result file
/// the cascade rejects (a variant that measured faster than it runs as a standalone file) gives
/// way to the next fastest variant beyond the noise floor, then to the baseline.
pub const RUNNER_UPS: usize = 2;

/// The fastest variant of `m` beyond its noise floor that is neither the baseline nor one of
/// `tried` (variants whose result files were verified already): the next to verify after a
/// rejection, or `None`.
pub fn runner_up(m: &DispatchMeasurement, tried: &[String]) -> Option<String> {
    m.modes
        .iter()
        .filter(|(v, t)| t.beyond_noise && **v != m.baseline && !tried.contains(v))
        .max_by(|a, b| a.1.speedup.total_cmp(&b.1.speedup))
        .map(|(v, _)| v.clone())
}

/// After the result files of `tried` were verified in turn (the measured winner first): the
/// next variant of `m` to verify, or `None` — the last one passed (`passed`) or could not run
/// (the environment's failure: a runner-up would meet it too), `RUNNER_UPS` runner-ups were
/// tried already, or no other variant is beyond noise.
pub fn next_to_verify(m: &DispatchMeasurement, tried: &[Tried], gpu: bool) -> Option<String> {
    let last = tried.last()?;
    if passed(Some(last.verified), gpu) || last.verified == Verified::CouldNotRun || tried.len() > RUNNER_UPS {
        return None;
    }
    let names: Vec<String> = tried.iter().map(|t| t.variant.clone()).collect();
    runner_up(m, &names)
}

/// `m` with `variant` as its winner (a runner-up: the decision and the result file are then
/// its).
pub fn with_winner(m: &DispatchMeasurement, variant: &str) -> DispatchMeasurement {
    DispatchMeasurement { winner: variant.to_string(), fallback: false, ..m.clone() }
}

/// A variant whose result file was verified, in the order tried: the measured winner first, its
/// runner-ups after a rejection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tried {
    pub variant: String,
    pub verified: Verified,
}

pub fn decide(m: &DispatchMeasurement, verified: Option<Verified>, gpu: bool) -> Decision {
    if m.fallback || m.winner == m.baseline {
        return Decision::Fallback { reason: fallback_reason(m) };
    }
    let timing = &m.modes[&m.winner];
    if passed(verified, gpu) {
        Decision::Improved {
            agent: Agent::of_variant(&m.winner),
            mode: m.winner.clone(),
            speedup: timing.speedup,
            ci95: timing.ci95,
        }
    } else {
        Decision::Fallback {
            reason: format!(
                "the winner {} measured {:.3}x but its result file was {}",
                m.winner,
                timing.speedup,
                verified_how(verified)
            ),
        }
    }
}

/// Whether a verdict counts: `accepted`, or without a GPU `passed-without-performance`.
pub fn passed(verified: Option<Verified>, gpu: bool) -> bool {
    match verified {
        Some(Verified::Accepted) => true,
        Some(Verified::PassedWithoutPerformance) => !gpu,
        _ => false,
    }
}

/// The verdict's name as verify writes it, or `not verified`.
fn verified_how(verified: Option<Verified>) -> String {
    match verified {
        Some(v) => serde_json::to_value(v).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
        None => "not verified".into(),
    }
}

fn fallback_reason(m: &DispatchMeasurement) -> String {
    if m.prepared.is_empty() && m.modes.is_empty() {
        return format!(
            "the dispatch family timed nothing: none of its agents was asked for (the baseline {})",
            m.baseline
        );
    }
    let failed: Vec<String> = m
        .prepared
        .iter()
        .filter(|(_, p)| !p.ok && p.not_prepared.is_none())
        .map(|(n, p)| format!("{n}: {}", p.why.as_deref().unwrap_or("output differs from eager")))
        .collect();
    let best = m.modes.iter().max_by(|a, b| a.1.speedup.total_cmp(&b.1.speedup));
    let mut why = match (best, m.noise_floor) {
        (Some((n, t)), Some(f)) => format!(
            "no mode beat {} beyond the noise floor {f:.3} (best: {n} {:.3}x, interval {:.3}-{:.3})",
            m.baseline, t.speedup, t.ci95[0], t.ci95[1]
        ),
        _ => format!("no mode besides {} runs and matches eager", m.baseline),
    };
    if !failed.is_empty() {
        why.push_str(&format!("; left out: {}", failed.join("; ")));
    }
    let alike: Vec<&str> =
        m.prepared.iter().filter(|(_, p)| p.same_code_as.is_some()).map(|(n, _)| n.as_str()).collect();
    if !alike.is_empty() {
        why.push_str(&format!("; not timed, generating the code of a variant with fewer knobs: {}", alike.join(", ")));
    }
    let idle: Vec<&str> = m.prepared.iter().filter(|(_, p)| p.no_effect.is_some()).map(|(n, _)| n.as_str()).collect();
    if !idle.is_empty() {
        why.push_str(&format!("; not compiled, no op for the knob to act on: {}", idle.join(", ")));
    }
    if let Some(r) = m.rewrite.as_ref().filter(|r| !r.fired) {
        why.push_str(&format!("; {}", r.line()));
    }
    if !m.not_prepared.is_empty() {
        why.push_str(&format!("; not prepared, the step's deadline came first: {}", m.not_prepared.join(", ")));
    }
    why
}

/// What a run is asked: the problem and everything that decides its answer (`--resume` takes an
/// earlier report only for the same question).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    pub problem: String,
    pub size: String,
    pub device: String,
    pub baseline: Baseline,
    pub agents: Vec<Agent>,
    /// The dispatch agent's timing rounds.
    pub rounds: u32,
    /// The beam's width: knobs combined in its second round (0: no second round).
    #[serde(default)]
    pub beam_width: u32,
    /// What the steps meant when it was asked (`STEPS_VERSION`; 1 for reports from before it):
    /// a report or step of another version answers another question.
    #[serde(default = "first_steps_version")]
    pub steps: u32,
}

/// The steps' meaning, bumped when a step's output for the same input changes meaning, so that
/// `--resume` redoes what older code measured or decided. 2: variants judged by the fp64 rule
/// after a tolerance miss, every variant compiled (Dynamo's recompile limit raised), runner-ups
/// verified after a rejected winner, a warm-up round before the counted ones. 3: per-graph plans
/// (`graphs:M0/M1/...`) for a forward of several graphs. 4: a knob variant whose compile
/// generated the code of one with fewer knobs is not timed (`Prepared::same_code_as`), one whose
/// knobs have no op to act on is not compiled (`Prepared::no_effect`).
pub const STEPS_VERSION: u32 = 4;

fn first_steps_version() -> u32 {
    1
}

/// The run's report: what was asked, measured, judged and decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    #[serde(flatten)]
    pub question: Question,
    pub measurement: DispatchMeasurement,
    /// The winner's verification (`None` when nothing won).
    pub verified: Option<Verified>,
    pub decision: Decision,
    /// The result file and its verify policy.
    pub result: String,
    pub policy: String,
    /// The beam's second round, when the beam was asked for (`--beam-width`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beam: Option<BeamOutcome>,
    /// The config family (`None`: the config agent was not asked for; absent in reports from
    /// before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigReport>,
    /// The LLM family (`None`: the llm agent was not asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<llm::LlmReport>,
    /// The dispatch family's result files verified, in turn (the measured winner, then its
    /// runner-ups after a rejection: `RUNNER_UPS`); empty when nothing won or before runner-ups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tried: Vec<Tried>,
    /// What deciding it cost, over every run it took (absent in reports from before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<Spent>,
    /// The machine it was decided on (the GPU's name, or `cpu`, and torch's version), where the
    /// run could tell: `--resume` does not take it on another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// The content hash of the problem's source it was decided for: `--resume` does not take
    /// it once the file changed (absent in reports from before it: taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_hash: Option<String>,
    /// The winner's speedup as gate 4 measured its shipped result file: in `kforge verify`'s
    /// own process, against a fresh compile of the baseline (`Verdict::speedup`). The decision's
    /// speedup was measured beside every other variant in the agent's process; a host-paced
    /// variant (no CUDA graphs) can differ there, so the summary counts this one where it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed: Option<f64>,
}

/// What deciding a problem cost: the wall seconds of the run that decided it plus those of the
/// steps it took from earlier runs (`--resume`), and the device seconds likewise (region time
/// where known). A problem resumed later counts with it, so a campaign chained over several
/// calls reports its real cost per problem, not the last call's.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Spent {
    pub seconds: f64,
    pub gpu_seconds: f64,
}

/// What the beam's second round did: measured knob combinations beside the first round's best
/// (`measurement`, the one the decision then used), or why the search stopped after round 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BeamOutcome {
    #[serde(default)]
    pub measurement: Option<DispatchMeasurement>,
    #[serde(default)]
    pub stopped: Option<String>,
}

impl Report {
    /// The measurement the decision used: the beam's second round when it ran, else the first.
    pub fn decisive(&self) -> &DispatchMeasurement {
        self.beam.as_ref().and_then(|b| b.measurement.as_ref()).unwrap_or(&self.measurement)
    }

    /// A table for people: every mode's timing, then the decision.
    pub fn table(&self) -> String {
        let q = &self.question;
        let mut t = format!("{} (size {}, device {}) against {}\n", q.problem, q.size, q.device, q.baseline.mode());
        if !self.measurement.prepared.is_empty() || !self.measurement.modes.is_empty() {
            t.push_str(&format!("{:<28} {:>9} {:>19}  {}\n", "MODE", "SPEEDUP", "95% INTERVAL", "NOTE"));
        }
        for (name, p) in &self.measurement.prepared {
            let note = p.note();
            match self.measurement.modes.get(name) {
                Some(m) => t.push_str(&format!(
                    "{name:<28} {:>8.3}x {:>9.3}-{:<9.3}  {}\n",
                    m.speedup,
                    m.ci95[0],
                    m.ci95[1],
                    if m.beyond_noise { "beyond noise" } else { "within noise" }
                )),
                None if name == &self.measurement.baseline => {
                    t.push_str(&format!("{name:<28} {:>9} {:>19}  baseline\n", "1.000x", "-"))
                }
                None => t.push_str(&format!("{name:<28} {:>9} {:>19}  {note}\n", "-", "-")),
            }
        }
        if let Some(f) = self.measurement.noise_floor {
            t.push_str(&format!("noise floor {f:.3}\n"));
        }
        if let Some(line) = self.decisive().cuda_graph_line() {
            t.push_str(&line);
        }
        if let Some(r) = &self.measurement.rewrite {
            t.push_str(&format!("{}\n", r.line()));
        }
        if let Some(g) = &self.measurement.graphs {
            t.push_str(&g.line());
        }
        for (variant, same) in &self.measurement.duplicates {
            t.push_str(&format!(
                "{variant:<28} not measured: it compiles exactly as {same} (the same Inductor options)\n"
            ));
        }
        t.push_str(&self.beam_lines());
        if let Some(c) = &self.config {
            t.push_str(&c.lines());
        }
        if let Some(l) = &self.llm {
            t.push_str(&l.lines());
        }
        if self.tried.len() > 1 {
            let each: Vec<String> =
                self.tried.iter().map(|x| format!("{} {}", x.variant, journal::verified_name(x.verified))).collect();
            t.push_str(&format!("verified in turn: {}\n", each.join(", then ")));
        }
        match &self.decision {
            Decision::Improved { agent, mode, speedup, .. } => {
                t.push_str(&format!("result: {mode} ({}), {speedup:.3}x, verified; {}\n", agent.name(), self.result))
            }
            Decision::Fallback { reason } => {
                t.push_str(&format!("result: the baseline kept ({reason}); {}\n", self.result))
            }
        }
        t
    }

    /// The beam's second round in the table: each variant measured again, or why none was.
    fn beam_lines(&self) -> String {
        let Some(b) = &self.beam else { return String::new() };
        match (&b.measurement, &b.stopped) {
            (Some(m), _) => {
                let mut t = format!("beam round 2 (knobs combined, against {} again):\n", m.baseline);
                for (name, x) in &m.modes {
                    t.push_str(&format!(
                        "  {name:<26} {:>8.3}x {:>9.3}-{:<9.3}  {}\n",
                        x.speedup,
                        x.ci95[0],
                        x.ci95[1],
                        if x.beyond_noise { "beyond noise" } else { "within noise" }
                    ));
                }
                t
            }
            (None, Some(why)) => format!("{why}\n"),
            (None, None) => String::new(),
        }
    }
}

/// One problem of a campaign: its report's decision, why it could not be optimized, or why it
/// was not reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProblemOutcome {
    pub problem: String,
    /// The group it is summarised in: its folder's name (`level1`), else `.`.
    pub level: String,
    /// The decision (`None`: the run failed, `error` says why, or it was not reached).
    pub decision: Option<Decision>,
    #[serde(default)]
    pub error: Option<String>,
    /// Why no step of it (or not all) ran: `budget` (a budget was spent first). Not a failure:
    /// `--resume` continues it.
    #[serde(default)]
    pub not_reached: Option<String>,
    /// Its wall seconds: for a decided problem what deciding it cost over every run it took
    /// (`Report::spent`; a resumed one's as it was decided), else this run's.
    pub seconds: f64,
    /// The device seconds its steps spent (region time where known, else the steps' wall
    /// seconds; see the journal), counted as `seconds` is.
    #[serde(default)]
    pub gpu_seconds: f64,
    /// Taken from an earlier run's report (`--resume`), not run again.
    #[serde(default)]
    pub resumed: bool,
    /// The generated Triton kernels' share of the baseline's device time, where a profile gave it
    /// (the config agent's, else the dispatch agent's): what `goals` calls vendor-bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triton_share: Option<f64>,
    /// Gate 4's speedup of the shipped result file (`Report::confirmed`), where it measured one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed: Option<f64>,
    /// The config agent's roofline ceiling (`Roofline::ceiling`), where its step measured one:
    /// what `goals` calls at the bandwidth roof.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roofline_ceiling: Option<f64>,
    /// How much its bounded measure step left out (variants, the rewrite, the per-graph search:
    /// `DispatchMeasurement::not_prepared`): decided over a partial search when above 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_prepared: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Report {
    /// The Triton share a profile of the baseline gave: the config agent's, else the dispatch
    /// agent's (`baseline_profile`).
    pub fn triton_share(&self) -> Option<f64> {
        let config = self.config.as_ref().and_then(|c| c.measurement.as_ref()).and_then(|m| m.triton_share);
        config.or_else(|| self.measurement.baseline_profile.as_ref().and_then(|p| p.triton_share))
    }

    /// The config agent's roofline ceiling, where its step measured one.
    pub fn roofline_ceiling(&self) -> Option<f64> {
        let m = self.config.as_ref().and_then(|c| c.measurement.as_ref())?;
        m.roofline.as_ref().and_then(|r| r.ceiling)
    }
}

impl ProblemOutcome {
    /// The speedup it counts with: the verified winner's, else 1.0 (the baseline kept, or a
    /// failed run: the campaign ships the baseline for it).
    pub fn speedup(&self) -> f64 {
        match &self.decision {
            Some(Decision::Improved { speedup, .. }) => *speedup,
            _ => 1.0,
        }
    }

    /// The speedup the summary counts: gate 4's confirmed one for a winner where it measured
    /// one, else `speedup`.
    pub fn confirmed_speedup(&self) -> f64 {
        match (&self.decision, self.confirmed) {
            (Some(Decision::Improved { .. }), Some(c)) => c,
            _ => self.speedup(),
        }
    }
}

/// A campaign's summary for one level (or all): geometric-mean speedup over the baseline
/// (fallbacks and failures count as 1.0), how many were optimized, kept, failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelSummary {
    pub level: String,
    pub problems: usize,
    pub optimized: usize,
    pub fallbacks: usize,
    pub failed: usize,
    /// Not reached (a budget was spent); counted as the baseline like a fallback.
    #[serde(default)]
    pub not_reached: usize,
    /// Over the decisions' measured speedups.
    pub geomean: f64,
    /// Over the confirmed speedups (`ProblemOutcome::confirmed_speedup`): what the goals judge.
    #[serde(default)]
    pub geomean_confirmed: f64,
    /// Share of problems faster than the baseline by a verified winner (KernelBench's fast_1).
    pub fast_1: f64,
    pub seconds: f64,
    #[serde(default)]
    pub gpu_seconds: f64,
}

/// Per level, in name order, then `all`.
pub fn summarize(outcomes: &[ProblemOutcome]) -> Vec<LevelSummary> {
    let mut levels: Vec<String> = outcomes.iter().map(|o| o.level.clone()).collect();
    levels.sort();
    levels.dedup();
    let mut out: Vec<LevelSummary> =
        levels.iter().map(|l| level_summary(l, outcomes.iter().filter(|o| &o.level == l))).collect();
    if levels.len() != 1 {
        out.push(level_summary("all", outcomes.iter()));
    }
    out
}

fn level_summary<'a>(level: &str, of: impl Iterator<Item = &'a ProblemOutcome>) -> LevelSummary {
    let of: Vec<&ProblemOutcome> = of.collect();
    let n = of.len();
    let optimized = of.iter().filter(|o| matches!(o.decision, Some(Decision::Improved { .. }))).count();
    let not_reached = of.iter().filter(|o| o.decision.is_none() && o.not_reached.is_some()).count();
    let failed = of.iter().filter(|o| o.decision.is_none()).count() - not_reached;
    let geomean = |f: fn(&ProblemOutcome) -> f64| {
        if n == 0 {
            1.0
        } else {
            (of.iter().map(|o| f(o).ln()).sum::<f64>() / n as f64).exp()
        }
    };
    LevelSummary {
        level: level.into(),
        problems: n,
        optimized,
        fallbacks: n - optimized - failed - not_reached,
        failed,
        not_reached,
        geomean: geomean(ProblemOutcome::speedup),
        geomean_confirmed: geomean(ProblemOutcome::confirmed_speedup),
        fast_1: if n == 0 { 0.0 } else { optimized as f64 / n as f64 },
        seconds: of.iter().map(|o| o.seconds).sum(),
        gpu_seconds: of.iter().map(|o| o.gpu_seconds).sum(),
    }
}

/// The campaign's table: one row per problem, then one per level.
pub fn campaign_table(outcomes: &[ProblemOutcome], summary: &[LevelSummary]) -> String {
    let mut t = format!(
        "{:<52} {:>9} {:>9} {:>8} {:>8}  {}\n",
        "PROBLEM", "SPEEDUP", "CONFIRMED", "SECONDS", "GPU-S", "RESULT"
    );
    for o in outcomes {
        let what = match (&o.decision, &o.error, &o.not_reached) {
            (Some(Decision::Improved { mode, agent, .. }), _, _) => format!("{mode} ({})", agent.name()),
            (Some(Decision::Fallback { .. }), _, _) => "baseline kept".to_string(),
            (None, _, Some(why)) => format!("not reached: {why}"),
            (None, e, None) => format!("failed: {}", e.as_deref().unwrap_or("?")),
        };
        let resumed = if o.resumed { " (resumed)" } else { "" };
        let bounded = match o.not_prepared {
            0 => String::new(),
            n => format!(" (a bounded search: {n} not prepared)"),
        };
        let confirmed = o.confirmed.map(|c| format!("{c:.3}x")).unwrap_or("-".into());
        t.push_str(&format!(
            "{:<52} {:>8.3}x {:>9} {:>8.1} {:>8.1}  {what}{bounded}{resumed}\n",
            o.problem,
            o.speedup(),
            confirmed,
            o.seconds,
            o.gpu_seconds
        ));
    }
    t.push_str(&format!(
        "\n{:<10} {:>8} {:>9} {:>9} {:>6} {:>11} {:>8} {:>9} {:>6} {:>9} {:>8}\n",
        "LEVEL",
        "PROBLEMS",
        "OPTIMIZED",
        "FALLBACKS",
        "FAILED",
        "NOT-REACHED",
        "GEOMEAN",
        "CONFIRMED",
        "FAST_1",
        "SECONDS",
        "GPU-S"
    ));
    for s in summary {
        t.push_str(&format!(
            "{:<10} {:>8} {:>9} {:>9} {:>6} {:>11} {:>7.3}x {:>8.3}x {:>6.2} {:>9.1} {:>8.1}\n",
            s.level,
            s.problems,
            s.optimized,
            s.fallbacks,
            s.failed,
            s.not_reached,
            s.geomean,
            s.geomean_confirmed,
            s.fast_1,
            s.seconds,
            s.gpu_seconds
        ));
    }
    t
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A decided report of `problem` against `baseline` (the dispatch agent's default winner).
    pub(crate) fn report_for(problem: &str, baseline: &str) -> Report {
        let baseline = if baseline == "default" { Baseline::Default } else { Baseline::MaxAutotune };
        let mut m = measured("default", false);
        m.baseline = baseline.mode().into();
        let question = Question {
            problem: problem.into(),
            size: "default".into(),
            device: "0".into(),
            baseline,
            agents: vec![Agent::Dispatch],
            rounds: 5,
            beam_width: 0,
            steps: STEPS_VERSION,
        };
        Report {
            question,
            decision: decide(&m, Some(Verified::Accepted), true),
            measurement: m,
            verified: Some(Verified::Accepted),
            result: "out/model_new.py".into(),
            policy: "out/policy.toml".into(),
            beam: None,
            config: None,
            llm: None,
            tried: Vec::new(),
            spent: None,
            machine: None,
            source_hash: None,
            confirmed: None,
        }
    }

    fn measured(winner: &str, fallback: bool) -> DispatchMeasurement {
        DispatchMeasurement::parse(&format!(
            r#"{{"baseline": "max-autotune", "winner": "{winner}", "fallback": {fallback}, "noise_floor": 1.01,
                "modes": {{"default": {{"speedup": 1.2, "ci95": [1.15, 1.25], "beyond_noise": true}},
                          "eager": {{"speedup": 0.9, "ci95": [0.85, 0.95], "beyond_noise": false}}}},
                "prepared": {{"max-autotune": {{"ok": true}}, "default": {{"ok": true}}, "eager": {{"ok": true}},
                             "reduce-overhead": {{"ok": false, "why": "RuntimeError: boom"}}}}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn a_baseline_with_cuda_graphs_says_what_it_copies_every_call() {
        let mut m = measured("default", false);
        m.winner = "max-autotune-no-cudagraphs".into();
        assert_eq!(m.cuda_graph_line(), None, "no size recorded (a CPU run): no line");
        m.input_bytes = Some(3 << 30);
        assert_eq!(
            m.cuda_graph_line().as_deref(),
            Some(
                "CUDA graphs: max-autotune copies the forward's 3.00 GiB of tensor inputs into its graphs' buffers \
                 every call; max-autotune-no-cudagraphs has none: part of its speedup may be that copy\n"
            )
        );
        m.winner = "reduce-overhead".into(); // graphs too: no claim about the winner
        assert!(m.cuda_graph_line().unwrap().ends_with("every call\n"));
        m.winner = "max-autotune+freezing~rewrite".into();
        assert!(m.cuda_graph_line().unwrap().ends_with("every call\n"));
        m.winner = "graphs:eager/max-autotune".into(); // one of its graphs replays: no claim
        assert!(m.cuda_graph_line().unwrap().ends_with("every call\n"));
        m.winner = "max-autotune".into(); // the baseline kept
        assert!(m.cuda_graph_line().unwrap().ends_with("every call\n"));
        let mut r = report_for("p.py", "max-autotune");
        assert!(!r.table().contains("CUDA graphs"));
        r.measurement.input_bytes = Some(151 << 20);
        assert!(r.table().contains("CUDA graphs: max-autotune copies the forward's 151.00 MiB of tensor inputs"));
        m.baseline = "default".into(); // a baseline without graphs copies nothing
        assert_eq!(m.cuda_graph_line(), None);
        assert!(uses_cuda_graphs("reduce-overhead+freezing") && !uses_cuda_graphs("max-autotune-no-cudagraphs"));
        assert!(uses_cuda_graphs("graphs:eager/max-autotune") && !uses_cuda_graphs("graphs:eager/default"));
        assert_eq!(
            [human_bytes(512), human_bytes(1536), human_bytes(151 << 20)],
            ["512 B".to_string(), "1.50 KiB".into(), "151.00 MiB".into()]
        );
    }

    #[test]
    fn a_measurement_says_when_its_end_cut_its_rounds() {
        assert_eq!(measured("default", false).rounds_cut, None);
        let m = DispatchMeasurement::parse(
            r#"{"baseline": "default", "winner": "default", "fallback": true, "noise_floor": null, "modes": {},
                "prepared": {"default": {"ok": true}}, "until": 1.5,
                "rounds_cut": "2 of 5 rounds timed: another would have ended past the step's end"}"#,
        )
        .unwrap();
        assert_eq!(m.rounds_cut.as_deref(), Some("2 of 5 rounds timed: another would have ended past the step's end"));
    }

    #[test]
    fn a_fallback_names_the_knobs_that_generated_the_baselines_code() {
        let mut m = measured("max-autotune", true);
        m.modes.clear();
        m.noise_floor = None;
        let same = Prepared { same_code_as: Some("max-autotune".into()), ..m.prepared["default"].clone() };
        m.prepared.insert("max-autotune+freezing".into(), same);
        let Decision::Fallback { reason } = decide(&m, None, true) else { panic!("a fallback") };
        assert!(reason.starts_with("no mode besides max-autotune runs and matches eager"), "{reason}");
        assert!(
            reason.ends_with("; not timed, generating the code of a variant with fewer knobs: max-autotune+freezing"),
            "{reason}"
        );
    }

    #[test]
    fn a_fallback_of_a_bounded_step_names_what_its_deadline_left_out_not_as_failures() {
        let mut m = measured("max-autotune", true);
        m.modes.clear();
        m.noise_floor = None;
        m.prepared.remove("reduce-overhead");
        let cut = Prepared {
            ok: false,
            not_prepared: Some("the step's deadline came first".into()),
            ..m.prepared["default"].clone()
        };
        m.prepared.insert("max-autotune+freezing".into(), cut);
        m.not_prepared = vec!["max-autotune+freezing".into(), "the rewrite".into()];
        let Decision::Fallback { reason } = decide(&m, None, true) else { panic!("a fallback") };
        assert!(!reason.contains("left out"), "not prepared is not a failure: {reason}");
        assert!(
            reason.ends_with("; not prepared, the step's deadline came first: max-autotune+freezing, the rewrite"),
            "{reason}"
        );
    }

    #[test]
    fn agents_are_a_closed_list() {
        assert_eq!(parse_agents("dispatch"), Ok(vec![Agent::Dispatch]));
        assert_eq!(parse_agents(" dispatch, dispatch "), Ok(vec![Agent::Dispatch]));
        assert_eq!(parse_agents("inductor,dispatch"), Ok(vec![Agent::Inductor, Agent::Dispatch]));
        assert_eq!(
            (Agent::of_variant("max-autotune+freezing"), Agent::of_variant("eager")),
            (Agent::Inductor, Agent::Dispatch)
        );
        assert_eq!(
            (Agent::of_variant("max-autotune~rewrite"), Agent::of_variant("eager~rewrite")),
            (Agent::Rewrite, Agent::Rewrite)
        );
        assert_eq!(parse_agents("dispatch,rewrite"), Ok(vec![Agent::Dispatch, Agent::Rewrite]));
        assert_eq!(parse_agents("dispatch,llm"), Ok(vec![Agent::Dispatch, Agent::Llm]));
        assert_eq!(Agent::of_variant("llm:i1-c0-p0-a0"), Agent::Llm);
        assert_eq!(parse_agents("dispatch,gpt"), Err(OptimizeError::UnknownAgent("gpt".into())));
        assert_eq!(parse_agents(" , "), Err(OptimizeError::NoAgent));
        assert!(OptimizeError::UnknownAgent("x".into())
            .to_string()
            .contains("known: dispatch, inductor, rewrite, config, llm"));
    }

    #[test]
    fn a_verified_winner_is_the_result_else_the_baseline_stays() {
        let m = measured("default", false);
        let improved = decide(&m, Some(Verified::Accepted), true);
        assert_eq!(
            improved,
            Decision::Improved { agent: Agent::Dispatch, mode: "default".into(), speedup: 1.2, ci95: [1.15, 1.25] }
        );
        // Without a GPU gate 4 cannot run: every other gate passing is what verification can say.
        assert_eq!(decide(&m, Some(Verified::PassedWithoutPerformance), false), improved);
        // On a GPU, passing without the performance gate is not enough; a rejection never is.
        for (v, gpu) in
            [(Some(Verified::PassedWithoutPerformance), true), (Some(Verified::Rejected), false), (None, false)]
        {
            match decide(&m, v, gpu) {
                Decision::Fallback { reason } => assert!(reason.contains("default measured 1.200x"), "{reason}"),
                d => panic!("{d:?}"),
            }
        }
    }

    #[test]
    fn a_rejected_winner_gives_way_to_the_next_fastest_beyond_noise() {
        let mut m = measured("default", false);
        m.winner = "max-autotune+freezing".into();
        let t = |speedup: f64, beyond_noise: bool| ModeTiming { speedup, ci95: [speedup, speedup], beyond_noise };
        m.modes.insert("max-autotune+freezing".into(), t(2.0, true));
        m.modes.insert("max-autotune-no-cudagraphs".into(), t(1.5, true));
        m.modes.insert("max-autotune".into(), t(3.0, true)); // the baseline is never its own runner-up
        let tried = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(runner_up(&m, &tried(&["max-autotune+freezing"])).as_deref(), Some("max-autotune-no-cudagraphs"));
        let next = tried(&["max-autotune+freezing", "max-autotune-no-cudagraphs"]);
        assert_eq!(runner_up(&m, &next).as_deref(), Some("default"));
        // eager (0.9x) is not beyond noise: nothing after default.
        assert_eq!(runner_up(&m, &[next.clone(), tried(&["default"])].concat()), None);
        // The runner-up's decision is its own timing, improved when its file is verified.
        let r = with_winner(&m, "max-autotune-no-cudagraphs");
        assert_eq!(
            decide(&r, Some(Verified::Accepted), true),
            Decision::Improved {
                agent: Agent::Dispatch,
                mode: "max-autotune-no-cudagraphs".into(),
                speedup: 1.5,
                ci95: [1.5, 1.5]
            }
        );
        assert!(passed(Some(Verified::Accepted), true) && !passed(Some(Verified::Rejected), true));
        // In turn: a rejection asks for the runner-up; an acceptance, or RUNNER_UPS runner-ups, stop.
        let v = |variant: &str, verified: Verified| Tried { variant: variant.into(), verified };
        let rejected = vec![v("max-autotune+freezing", Verified::Rejected)];
        assert_eq!(next_to_verify(&m, &rejected, true).as_deref(), Some("max-autotune-no-cudagraphs"));
        assert_eq!(next_to_verify(&m, &[v("max-autotune+freezing", Verified::Accepted)], true), None);
        assert_eq!(next_to_verify(&m, &[v("max-autotune+freezing", Verified::CouldNotRun)], true), None);
        // Without a GPU, passing without the performance gate is a pass; on a GPU it is not.
        let cpu_pass = vec![v("max-autotune+freezing", Verified::PassedWithoutPerformance)];
        assert_eq!(next_to_verify(&m, &cpu_pass, false), None);
        assert!(next_to_verify(&m, &cpu_pass, true).is_some());
        let all: Vec<Tried> = ["max-autotune+freezing", "max-autotune-no-cudagraphs", "default"]
            .iter()
            .map(|n| v(n, Verified::Rejected))
            .collect();
        assert_eq!(all.len(), RUNNER_UPS + 1);
        assert_eq!(next_to_verify(&m, &all, true), None);
        assert_eq!(next_to_verify(&m, &[], true), None);
    }

    #[test]
    fn a_fallback_says_why() {
        let m = DispatchMeasurement { winner: "max-autotune".into(), fallback: true, ..measured("default", false) };
        match decide(&m, None, true) {
            Decision::Fallback { reason } => {
                assert!(reason.contains("no mode beat max-autotune beyond the noise floor 1.010"), "{reason}");
                assert!(
                    reason.contains("best: default 1.200x") && reason.contains("reduce-overhead: RuntimeError: boom"),
                    "{reason}"
                );
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn the_config_family_is_not_run_when_its_ceiling_cannot_beat_the_dispatch_family() {
        let why = config_cannot_win(0.25, 3.955).unwrap(); // the pilot's 007: eager 3.955x, share 25 %
        assert!(why.contains("1.333x") && why.contains("25 %") && why.contains("3.955x"), "{why}");
        assert!(why.contains("device time), not above the 3.955x"), "one space where the line is continued: {why}");
        assert_eq!(config_cannot_win(0.5, 1.9), None, "a ceiling of 2.0 may still beat 1.9");
        assert_eq!(config_cannot_win(1.0, 100.0), None, "all Triton: no ceiling");
        assert!(config_cannot_win(0.0, 1.0).is_some(), "no Triton kernel time: nothing to tune");
        assert_eq!(config_cannot_win(f64::NAN, 2.0), None);
        let m = DispatchMeasurement::parse(
            r#"{"baseline": "max-autotune", "winner": "max-autotune", "fallback": true,
                "baseline_profile": {"triton_share": 0.4}}"#,
        )
        .unwrap();
        assert_eq!(m.baseline_profile.and_then(|p| p.triton_share), Some(0.4));
    }

    #[test]
    fn a_per_graph_plan_is_the_dispatch_agents_and_its_search_is_said() {
        let json = r#"{"baseline": "max-autotune", "winner": "graphs:eager/max-autotune", "fallback": false,
            "noise_floor": 1.01, "modes": {"graphs:eager/max-autotune": {"speedup": 1.5, "ci95": [1.4, 1.6],
            "beyond_noise": true}}, "graphs": {"count": 2, "ops": [3, 2], "breaks": ["hook (m.py:24)"],
            "rounds": [{"from": "max-autotune", "moved_to": "graphs:eager/max-autotune", "modes": {
                "graphs:eager/max-autotune": {"speedup": 1.5, "ci95": [1.4, 1.6], "beyond_noise": true},
                "graphs:max-autotune/eager": {"speedup": 0.9, "ci95": [0.8, 1.0], "beyond_noise": false}}},
                {"from": "graphs:eager/max-autotune", "modes": {
                "graphs:eager/max-autotune": {"speedup": 1.5, "ci95": [1.4, 1.6], "beyond_noise": true}}}],
            "plan": "graphs:eager/max-autotune"}}"#;
        let m = DispatchMeasurement::parse(json).unwrap();
        assert_eq!(Agent::of_variant(&m.winner), Agent::Dispatch);
        assert!(m.winner.starts_with(GRAPHS_VARIANT));
        let g = m.graphs.as_ref().unwrap();
        assert_eq!(
            g.line(),
            "per graph: 2 graphs (breaks: hook (m.py:24)): 2 round(s), ended with graphs:eager/max-autotune\n"
        );
        // Journaled beside the measurement's variants: the plans the rounds timed, each once.
        assert_eq!(g.plans_timed(&m).keys().collect::<Vec<_>>(), ["graphs:max-autotune/eager"]);
        let one = GraphSearch { count: 1, breaks: vec![], plan: None, rounds: vec![], why: Some("one graph".into()) };
        assert_eq!(one.line(), "", "a forward of one graph: nothing to say");
        match decide(&m, Some(Verified::Accepted), true) {
            Decision::Improved { agent, mode, .. } => {
                assert_eq!((agent, mode.as_str()), (Agent::Dispatch, "graphs:eager/max-autotune"))
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn a_rewrite_winner_is_the_rewrite_agents_and_no_rule_fired_is_said() {
        let mut m = measured("default", false);
        m.winner = "max-autotune~rewrite".into();
        m.modes
            .insert("max-autotune~rewrite".into(), ModeTiming { speedup: 3.0, ci95: [2.5, 3.5], beyond_noise: true });
        m.rewrite = Some(RewriteProposal {
            fired: true,
            rules: vec![RewriteApplication { rule: "diag-matmul".into(), exactness: "exact".into() }],
            why: None,
        });
        match decide(&m, Some(Verified::Accepted), true) {
            Decision::Improved { agent, mode, .. } => {
                assert_eq!((agent, mode.as_str()), (Agent::Rewrite, "max-autotune~rewrite"))
            }
            d => panic!("{d:?}"),
        }
        assert_eq!(m.rewrite.as_ref().unwrap().line(), "rewrite: diag-matmul (exact)");
        // Nothing fired: the agent proposed nothing, and the fallback says so.
        let none = DispatchMeasurement {
            modes: BTreeMap::new(),
            noise_floor: None,
            fallback: true,
            winner: "max-autotune".into(),
            rewrite: Some(RewriteProposal { fired: false, rules: vec![], why: Some("no rule fired".into()) }),
            ..m
        };
        match decide(&none, None, true) {
            Decision::Fallback { reason } => assert!(reason.ends_with("; rewrite: no rule fired"), "{reason}"),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn a_measurement_that_names_an_untimed_winner_is_refused() {
        let bad = r#"{"baseline": "default", "winner": "eager", "fallback": false, "modes": {}}"#;
        assert!(
            matches!(DispatchMeasurement::parse(bad), Err(OptimizeError::Measurement(w)) if w.contains("not timed"))
        );
        assert!(matches!(DispatchMeasurement::parse("{"), Err(OptimizeError::Measurement(_))));
    }

    #[test]
    fn the_beams_second_round_decides_when_it_ran_and_the_table_shows_it() {
        let first = measured("default", false);
        let mut second = measured("default", false);
        second.modes.insert(
            "max-autotune+freezing+coordinate-descent".into(),
            ModeTiming { speedup: 1.4, ci95: [1.35, 1.45], beyond_noise: true },
        );
        second.winner = "max-autotune+freezing+coordinate-descent".into();
        let question = Question {
            problem: "p.py".into(),
            size: "default".into(),
            device: "0".into(),
            baseline: Baseline::MaxAutotune,
            agents: vec![Agent::Dispatch, Agent::Inductor],
            rounds: 5,
            beam_width: 2,
            steps: STEPS_VERSION,
        };
        let mut r = Report {
            question,
            decision: decide(&second, Some(Verified::Accepted), true),
            measurement: first,
            verified: Some(Verified::Accepted),
            result: "model_new.py".into(),
            policy: "policy.toml".into(),
            beam: Some(BeamOutcome { measurement: Some(second), stopped: None }),
            config: None,
            llm: None,
            tried: Vec::new(),
            spent: None,
            machine: None,
            source_hash: None,
            confirmed: None,
        };
        assert_eq!(r.decisive().winner, "max-autotune+freezing+coordinate-descent");
        assert!(matches!(&r.decision, Decision::Improved { agent: Agent::Inductor, speedup, .. } if *speedup == 1.4));
        r.measurement.duplicates.insert("max-autotune+coordinate-descent".into(), "max-autotune".into());
        let t = r.table();
        assert!(
            t.contains("max-autotune+coordinate-descent not measured: it compiles exactly as max-autotune"),
            "a duplicate is named: {t}"
        );
        assert!(t.contains("beam round 2 (knobs combined, against max-autotune again)"), "{t}");
        let same =
            Prepared { ok: true, same_code_as: Some("max-autotune".into()), ..r.measurement.prepared["eager"].clone() };
        r.measurement.prepared.insert("max-autotune+aggressive-fusion".into(), same);
        let t = r.table();
        assert!(
            t.contains("max-autotune+aggressive-fusion         -                   -  not timed: its compile generated the same code as max-autotune"),
            "a knob that changed no code is named: {t}"
        );
        let idle = Prepared {
            no_effect: Some("no-layout-optimization: no convolution".into()),
            ..r.measurement.prepared["eager"].clone()
        };
        r.measurement.prepared.insert("max-autotune+no-layout-optimization".into(), idle);
        assert!(
            r.table().contains("not compiled: no-layout-optimization: no convolution"),
            "a knob with nothing to act on is named: {}",
            r.table()
        );
        let cut = Prepared {
            ok: false,
            not_prepared: Some("the step's deadline came first".into()),
            ..r.measurement.prepared["eager"].clone()
        };
        r.measurement.prepared.insert("max-autotune+coordinate-descent".into(), cut);
        assert!(
            r.table().contains("not prepared: the step's deadline came first"),
            "a variant a bounded step left out is named: {}",
            r.table()
        );
        assert!(t.contains("max-autotune+freezing+coordinate-descent    1.400x"), "{t}");
        let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        r.beam =
            Some(BeamOutcome { measurement: None, stopped: Some("beam: stopped after round 1: 1 knob(s)".into()) });
        assert_eq!(r.decisive().winner, "default", "no second round: the first decides");
        assert!(r.table().contains("beam: stopped after round 1"));
        // A report from before the beam reads back (no beam_width, no beam).
        let mut old = serde_json::to_value(&r).unwrap();
        old.as_object_mut().unwrap().remove("beam_width");
        old.as_object_mut().unwrap().remove("beam");
        let back: Report = serde_json::from_value(old).unwrap();
        assert_eq!((back.question.beam_width, back.beam), (0, None));
    }

    #[test]
    fn the_table_lists_every_mode_and_the_decision() {
        let r = report_for("p.py", "max-autotune");
        let question = r.question.clone();
        // The report reads back as written, its question flattened into it (--resume reads it).
        let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(serde_json::to_value(&r).unwrap()["problem"], "p.py");
        assert_ne!(back.question, Question { rounds: 3, ..question.clone() });
        // A report from before the steps' version answers another question: --resume redoes it.
        let mut old = serde_json::to_value(&r).unwrap();
        old.as_object_mut().unwrap().remove("steps");
        let before: Report = serde_json::from_value(old).unwrap();
        assert_eq!(before.question.steps, 1);
        assert_ne!(before.question, question);
        let t = r.table();
        for want in [
            "max-autotune",
            "baseline",
            "1.200x",
            "beyond noise",
            "within noise",
            "left out: RuntimeError: boom",
            "result: default (dispatch), 1.200x, verified",
        ] {
            assert!(t.contains(want), "{want} in\n{t}");
        }
    }

    const CONFIG_JSON: &str = include_str!("../testdata/config.json");

    fn improved(agent: Agent, mode: &str, speedup: f64) -> Decision {
        Decision::Improved { agent, mode: mode.into(), speedup, ci95: [speedup - 0.05, speedup + 0.05] }
    }

    #[test]
    fn a_config_result_is_read_with_its_kernels_choices() {
        let m = ConfigMeasurement::parse(CONFIG_JSON).unwrap();
        assert!(m.won() && m.modes["config"].beyond_noise);
        // The Amdahl ceiling: Triton kernels 91 % of the device time, so at most 1 / 0.09.
        let ceiling = m.amdahl_ceiling().unwrap();
        assert!((ceiling - 1.0 / 0.09).abs() < 1e-9, "{ceiling}");
        let all = ConfigMeasurement { triton_share: Some(1.0), ..m.clone() };
        assert_eq!(all.amdahl_ceiling(), Some(f64::INFINITY));
        assert_eq!(ConfigMeasurement { triton_share: Some(1.5), ..m.clone() }.amdahl_ceiling(), None);
        assert_eq!((m.baseline.as_str(), m.noise_floor), ("max-autotune", Some(1.015)));
        let names: Vec<&str> = m.kernels_by_share().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["triton_red_fused_native_layer_norm_0", "triton_poi_fused_add_1", "triton_per_fused_sum_2"]);
        let k = &m.kernels["triton_red_fused_native_layer_norm_0"];
        assert_eq!(
            k.choice(),
            "R0_BLOCK=2048 XBLOCK=1 warps=16 stages=1 -> R0_BLOCK=4096 XBLOCK=1 warps=8 stages=1 (1.310x)"
        );
        assert!(m.kernels["triton_poi_fused_add_1"].choice().starts_with("XBLOCK=1024 warps=4 stages=1 kept"));
        assert!(m.kernels["triton_per_fused_sum_2"].choice().starts_with("failed: ConfigError"));
        assert_eq!(m.skipped.len(), 1);
        // The dispatch agent's reader takes it too (the same schema).
        assert_eq!(DispatchMeasurement::parse(CONFIG_JSON).unwrap().winner, "config");
        // A winner that is neither config nor the baseline, or untimed, is refused.
        let other = CONFIG_JSON.replace(r#""winner": "config""#, r#""winner": "default""#);
        assert!(
            matches!(ConfigMeasurement::parse(&other), Err(OptimizeError::ConfigMeasurement(w)) if w.contains("neither"))
        );
        let untimed = r#"{"baseline": "default", "winner": "config", "fallback": false}"#;
        assert!(
            matches!(ConfigMeasurement::parse(untimed), Err(OptimizeError::ConfigMeasurement(w)) if w.contains("not timed"))
        );
        assert!(OptimizeError::ConfigMeasurement("x".into()).to_string().contains("config agent"));
    }

    #[test]
    fn the_config_family_decides_on_its_own_verdict() {
        let m = ConfigMeasurement::parse(CONFIG_JSON).unwrap();
        let won = Decision::Improved { agent: Agent::Config, mode: "config".into(), speedup: 1.21, ci95: [1.17, 1.25] };
        assert_eq!(decide_config(&m, Some(Verified::Accepted), true), won);
        for (v, gpu) in
            [(Some(Verified::PassedWithoutPerformance), true), (Some(Verified::Rejected), true), (None, true)]
        {
            match decide_config(&m, v, gpu) {
                Decision::Fallback { reason } => assert!(reason.starts_with("config measured 1.210x but"), "{reason}"),
                d => panic!("{d:?}"),
            }
        }
        // Not beyond noise, or nothing won: why, whatever the verdict.
        let mut within = m.clone();
        within.modes.get_mut("config").unwrap().beyond_noise = false;
        match decide_config(&within, Some(Verified::Accepted), true) {
            Decision::Fallback { reason } => assert!(reason.contains("beyond the noise floor 1.015"), "{reason}"),
            d => panic!("{d:?}"),
        }
        let none = ConfigMeasurement {
            winner: "max-autotune".into(),
            fallback: true,
            modes: BTreeMap::new(),
            why: Some("no kernel's configuration beat its original beyond noise".into()),
            ..m.clone()
        };
        // Timed beyond noise, but its result file did not reproduce the winners: config.py's why.
        let unreproduced = ConfigMeasurement {
            winner: "max-autotune".into(),
            fallback: true,
            why: Some("the result file does not reproduce the winners (missed [...]; output ok: True)".into()),
            ..m.clone()
        };
        match decide_config(&unreproduced, Some(Verified::Accepted), true) {
            Decision::Fallback { reason } => {
                assert!(reason.starts_with("config: the result file does not"), "{reason}")
            }
            d => panic!("{d:?}"),
        }
        match decide_config(&none, None, true) {
            Decision::Fallback { reason } => {
                assert_eq!(reason, "config: no kernel's configuration beat its original beyond noise")
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn across_families_the_faster_verified_winner_wins() {
        let dispatch = improved(Agent::Dispatch, "default", 1.1);
        let config = improved(Agent::Config, "config", 1.3);
        let kept = |why: &str| Decision::Fallback { reason: why.into() };
        // Config wins: it is faster.
        assert_eq!(across(&[dispatch.clone(), config.clone()]), config);
        // Dispatch wins: it is faster, or config is unverified (its decision a fallback).
        let fast = improved(Agent::Inductor, "max-autotune+freezing", 1.5);
        assert_eq!(across(&[fast.clone(), config.clone()]), fast);
        assert_eq!(
            across(&[dispatch.clone(), kept("config measured 1.300x but its result file was rejected")]),
            dispatch
        );
        // A tie goes to the first family.
        assert_eq!(across(&[dispatch.clone(), improved(Agent::Config, "config", 1.1)]), dispatch);
        // Config alone (dispatch kept the baseline), or no family at all.
        assert_eq!(across(&[kept("no mode beat default"), config.clone()]), config);
        assert_eq!(across(std::slice::from_ref(&dispatch)), dispatch);
        // Neither: the dispatch family's fallback, then config's reason.
        assert_eq!(
            across(&[kept("no mode beat default"), kept(CONFIG_NEEDS_A_GPU)]),
            kept(&format!("no mode beat default; {CONFIG_NEEDS_A_GPU}"))
        );
    }

    #[test]
    fn the_result_file_is_the_deciding_familys() {
        let won = measured("default", false);
        let none = DispatchMeasurement { winner: "max-autotune".into(), fallback: true, ..won.clone() };
        let dispatch = decide(&won, Some(Verified::Accepted), true);
        let unverified = decide(&won, Some(Verified::Rejected), true);
        let config = improved(Agent::Config, "config", 1.3);
        let kept = Decision::Fallback { reason: "nothing won".into() };
        // Config decided: its result copied into place, whatever the dispatch family did.
        for d in [&dispatch, &unverified] {
            assert_eq!(result_from(&won, d, &config), ResultFrom::Config);
        }
        assert_eq!(result_from(&none, &kept, &config), ResultFrom::Config);
        // The dispatch family decided: its result as written.
        assert_eq!(result_from(&won, &dispatch, &dispatch), ResultFrom::AsWritten);
        // Its winner did not pass and nothing else won: rewritten for the baseline; no winner at
        // all: the result step already wrote the baseline's.
        assert_eq!(result_from(&won, &unverified, &kept), ResultFrom::Baseline);
        assert_eq!(result_from(&none, &kept, &kept), ResultFrom::AsWritten);
    }

    #[test]
    fn the_config_agent_alone_on_the_cpu_measures_nothing() {
        assert_eq!(parse_agents("dispatch,config"), Ok(vec![Agent::Dispatch, Agent::Config]));
        assert_eq!(Agent::of_variant("config"), Agent::Config);
        assert!(
            check_agents(&[Agent::Config], true).is_ok()
                && check_agents(&[Agent::Dispatch, Agent::Config], false).is_ok()
        );
        let e = check_agents(&[Agent::Config], false).unwrap_err();
        assert!(e.to_string().starts_with("--agents config: config: needs a GPU: Inductor's CPU backend"), "{e}");
    }

    #[test]
    fn a_report_shows_the_config_family_and_reads_back_without_it() {
        let m = measured("default", false);
        let c = ConfigMeasurement::parse(CONFIG_JSON).unwrap();
        let config = ConfigReport {
            decision: Some(decide_config(&c, Some(Verified::Accepted), true)),
            measurement: Some(c),
            verified: Some(Verified::Accepted),
            result: Some("out/config/model_new.py".into()),
            skipped: None,
            error: None,
        };
        let question = Question {
            problem: "p.py".into(),
            size: "default".into(),
            device: "0".into(),
            baseline: Baseline::MaxAutotune,
            agents: vec![Agent::Dispatch, Agent::Config],
            rounds: 5,
            beam_width: 0,
            steps: STEPS_VERSION,
        };
        let decision = across(&[decide(&m, Some(Verified::Accepted), true), config.decision.clone().unwrap()]);
        let r = Report {
            question,
            measurement: m,
            verified: Some(Verified::Accepted),
            decision,
            result: "out/model_new.py".into(),
            policy: "out/policy.toml".into(),
            beam: None,
            config: Some(config),
            llm: None,
            tried: Vec::new(),
            spent: None,
            machine: None,
            source_hash: None,
            confirmed: None,
        };
        let t = r.table();
        assert!(t.contains("Triton kernels 91% of the baseline's device time: Amdahl ceiling 11.11x"), "{t}");
        for want in [
            "triton_red_fused_native_layer_norm_0",
            "71%",
            "-> R0_BLOCK=4096 XBLOCK=1 warps=8 stages=1 (1.310x)",
            "config (model)",
            "1.210x",
            "noise floor 1.015",
            "config result: accepted",
            "result: config (config), 1.210x, verified",
        ] {
            assert!(t.contains(want), "{want} in\n{t}");
        }
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["decision"]["agent"], "config");
        assert_eq!(serde_json::from_value::<Report>(v.clone()).unwrap(), r);
        // A report from before the config agent (no `config` key) still reads (--resume).
        let mut old = v;
        old.as_object_mut().unwrap().remove("config");
        assert_eq!(serde_json::from_value::<Report>(old).unwrap().config, None);
        let skipped = ConfigReport { skipped: Some(CONFIG_NEEDS_A_GPU.into()), ..ConfigReport::default() };
        assert_eq!(
            skipped.lines(),
            "config: skipped: needs a GPU: Inductor's CPU backend generates C++, no Triton kernels\n"
        );
        assert_eq!(skipped.family_decision(), Some(Decision::Fallback { reason: CONFIG_NEEDS_A_GPU.into() }));
        let failed =
            ConfigReport { error: Some("the config step ended with 2: boom".into()), ..ConfigReport::default() };
        assert_eq!(failed.lines(), "config: failed: the config step ended with 2: boom\n");
        let reason = "config: failed: the config step ended with 2: boom".to_string();
        assert_eq!(failed.family_decision(), Some(Decision::Fallback { reason }));
        assert_eq!(ConfigReport::default().family_decision(), None);
        // A bounded step's kernels it had no time for are named in the table, and read back.
        let cut = CONFIG_JSON.replacen('{', r#"{"not_tuned": ["triton_poi_fused_mul_3"], "#, 1);
        let c = ConfigMeasurement::parse(&cut).unwrap();
        assert_eq!(c.not_tuned, ["triton_poi_fused_mul_3"]);
        let bounded = ConfigReport { measurement: Some(c), ..ConfigReport::default() };
        assert!(bounded.lines().contains("triton_poi_fused_mul_3"), "{}", bounded.lines());
        assert!(bounded.lines().contains("not tuned: the step's deadline came first"), "{}", bounded.lines());
        assert!(ConfigMeasurement::parse(CONFIG_JSON).unwrap().not_tuned.is_empty(), "none: an older result reads");
        let cut = CONFIG_JSON.replacen('{', r#"{"rounds_cut": "2 of 5 rounds timed", "#, 1);
        assert_eq!(ConfigMeasurement::parse(&cut).unwrap().rounds_cut.as_deref(), Some("2 of 5 rounds timed"));
        assert_eq!(ConfigMeasurement::parse(CONFIG_JSON).unwrap().rounds_cut, None);
    }

    #[test]
    fn the_roofline_is_read_and_its_kernels_at_their_roof_are_named_in_the_table() {
        // As python/kforge/inspect/roofline.py `roofline_summary` and the config agent write it:
        // one kernel left at its roof (102 %), one at 103 % but skipped for another reason (not
        // marked), one within the L2; the model's ceiling 1.08x.
        let roof = r#"{"roofline": {"peak_bytes_per_s": 2.9e12, "copy_bytes_per_s": 2.9e12, "read_bytes_per_s": 2.8e12,
            "l2_bytes": 52428800, "skip_at": 1.02, "ceiling": 1.08,
            "kernels": {"triton_poi_fused_silu_0": {"kind": "pointwise", "bytes": 6.4e9, "us_per_launch": 2275.1,
                            "bytes_per_s": 2.96e12, "of_peak": 1.022, "ceiling": 1.0274, "skipped": true},
                        "triton_poi_2": {"kind": "pointwise", "bytes": 6.4e9, "of_peak": 1.03, "ceiling": 1.0194},
                        "triton_red_fused_sum_1": {"kind": "reduction", "bytes": 1.0e6, "us_per_launch": 3.0,
                            "bytes_per_s": 3.3e11, "of_peak": 0.11, "why": "its traffic (1.0 MB a launch) is within 4x the L2"}}},"#;
        let m = ConfigMeasurement::parse(&CONFIG_JSON.replacen('{', roof, 1)).unwrap();
        let r = m.roofline.clone().unwrap();
        let at_roof: Vec<&str> = r.at_roof().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(at_roof, ["triton_poi_fused_silu_0"]);
        let t = ConfigReport { measurement: Some(m.clone()), ..ConfigReport::default() }.lines();
        for want in [
            "config: roofline ceiling 1.080x (every generated kernel at its bandwidth roof; device bandwidth 2.90 TB/s); 1 at their roof, not tuned",
            "not tuned: at 102% of the device's bandwidth: at most 1.027x",
        ] {
            assert!(t.contains(want), "{want} in\n{t}");
        }
        assert!(!t.contains("triton_red_fused_sum_1") && !t.contains("triton_poi_2"), "not left at the roof: {t}");
        let none =
            Roofline { peak_bytes_per_s: None, why: Some("no bandwidth measured: OutOfMemoryError".into()), ..r };
        assert_eq!(none.line(), "config: no roofline: no bandwidth measured: OutOfMemoryError\n");
        // The report's ceiling is the config step's; an older step without one reads as none.
        let report = |m: ConfigMeasurement| Report {
            config: Some(ConfigReport { measurement: Some(m), ..ConfigReport::default() }),
            ..report_for("level1/a.py", "max-autotune")
        };
        assert_eq!(report(m).roofline_ceiling(), Some(1.08));
        assert_eq!(report(ConfigMeasurement::parse(CONFIG_JSON).unwrap()).roofline_ceiling(), None);
    }

    fn outcome(problem: &str, level: &str, decision: Option<Decision>) -> ProblemOutcome {
        ProblemOutcome {
            problem: problem.into(),
            level: level.into(),
            decision,
            error: None,
            not_reached: None,
            seconds: 2.0,
            gpu_seconds: 1.5,
            resumed: false,
            triton_share: None,
            confirmed: None,
            roofline_ceiling: None,
            not_prepared: 0,
        }
    }

    #[test]
    fn a_campaign_counts_fallbacks_and_failures_as_the_baseline() {
        let won = |s: f64| {
            Some(Decision::Improved { agent: Agent::Dispatch, mode: "default".into(), speedup: s, ci95: [s, s] })
        };
        let kept = || Some(Decision::Fallback { reason: "nothing won".into() });
        let outcomes = vec![
            outcome("level1/a.py", "level1", won(4.0)),
            outcome("level1/b.py", "level1", kept()),
            outcome("level2/c.py", "level2", won(1.5)),
            ProblemOutcome {
                error: Some("the dispatch step ended with Some(1)".into()),
                ..outcome("level2/d.py", "level2", None)
            },
            ProblemOutcome { not_reached: Some("budget".into()), ..outcome("level2/e.py", "level2", None) },
        ];
        let s = summarize(&outcomes);
        assert_eq!(s.iter().map(|l| l.level.as_str()).collect::<Vec<_>>(), ["level1", "level2", "all"]);
        assert_eq!((s[0].problems, s[0].optimized, s[0].fallbacks, s[0].failed), (2, 1, 1, 0));
        assert!((s[0].geomean - 2.0).abs() < 1e-9, "sqrt(4 x 1)");
        // Not reached is neither a failure nor a fallback; it counts as the baseline.
        assert_eq!((s[1].optimized, s[1].fallbacks, s[1].failed, s[1].not_reached), (1, 0, 1, 1));
        assert!((s[1].geomean - 1.5f64.cbrt()).abs() < 1e-9);
        assert!((s[2].geomean - (4.0f64 * 1.5).powf(0.2)).abs() < 1e-9 && (s[2].fast_1 - 0.4).abs() < 1e-9);
        assert_eq!((s[2].seconds, s[2].gpu_seconds), (10.0, 7.5));
        let mut bounded = outcomes.clone();
        bounded[0].not_prepared = 3;
        assert!(
            campaign_table(&bounded, &s).contains("default (dispatch) (a bounded search: 3 not prepared)"),
            "a decision over a partial search says so"
        );
        let t = campaign_table(&outcomes, &s);
        assert!(!t.contains("bounded"), "{t}");
        for want in [
            "level1/a.py",
            "default (dispatch)",
            "baseline kept",
            "failed: the dispatch step ended",
            "not reached: budget",
            "GEOMEAN",
            "GPU-S",
            "all",
        ] {
            assert!(t.contains(want), "{want} in\n{t}");
        }
        // One level: no separate `all` row.
        assert_eq!(summarize(&outcomes[..2]).len(), 1);
        assert_eq!(s[0].geomean_confirmed, s[0].geomean, "nothing confirmed: the measured speedups count");

        // Gate 4's confirmed speedup of a winner's result file counts where it measured one; a
        // fallback's stays 1.0 whatever its verdict measured.
        let mut confirmed = outcomes.clone();
        confirmed[0].confirmed = Some(2.25);
        confirmed[1].confirmed = Some(0.5);
        let c = summarize(&confirmed);
        assert!((c[0].geomean - 2.0).abs() < 1e-9, "the measured geomean unchanged");
        assert!((c[0].geomean_confirmed - 1.5).abs() < 1e-9, "sqrt(2.25 x 1)");
        let t = campaign_table(&confirmed, &c);
        assert!(
            t.contains("CONFIRMED") && t.lines().any(|l| l.starts_with("level1/a.py") && l.contains("2.250x")),
            "{t}"
        );
        assert!(t.lines().any(|l| l.starts_with("level1 ") && l.contains("1.500x")), "{t}");
    }
}
