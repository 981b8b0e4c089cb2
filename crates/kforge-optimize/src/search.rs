//! One problem's search as a list of steps, and what each agent puts into them. Two families of
//! candidates, each measured interleaved with the same baseline inside regions:
//! - the dispatch family (dispatch, inductor, rewrite): one measurement in the dispatch agent's
//!   process (`python3 -m kforge.optimize.dispatch`), each agent contributing its variants through
//!   a flag ([`measure_flag`]); the winner's result file is written and verified;
//! - the config agent: its own process and step ([`Step::Config`], `python3 -m
//!   kforge.optimize.config`, a GPU only), which writes its own result file; verified when it won
//!   ([`Step::ConfigVerify`]).
//!
//! The faster verified family wins (`crate::across`). Adding an agent is one arm in
//! [`measure_flag`] (and `Agent::of_variant`): `Some` for a variant of the dispatch measurement,
//! `None` for an agent with its own steps in [`steps`].

use crate::{dispatch_modes, inductor_knobs, Agent};

/// A step of one problem's run, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Every agent's variants timed against the baseline: `dispatch.json`.
    Measure,
    /// The beam's second round (`crate::beam`): the knobs that helped, combined, timed beside the
    /// first round's best against the baseline: `beam.json`.
    Beam,
    /// The winner's standalone result file and its verify policy: `model_new.py`, `policy.toml`.
    Result,
    /// `kforge verify` of the result file: `verdict.json`.
    Verify,
    /// The config agent's search and its result file: `config/config.json`,
    /// `config/model_new.py`, `config/policy.toml` (skipped without a GPU).
    Config,
    /// `kforge verify` of the config result: `config/verdict.json`.
    ConfigVerify,
    /// The LLM agents' search, every candidate judged by `kforge verify`: `llm/search.json`,
    /// and the best candidate's `llm/model_new.py`, `llm/policy.toml`.
    Llm,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Measure => "measure",
            Step::Beam => "beam",
            Step::Result => "result",
            Step::Verify => "verify",
            Step::Config => "config",
            Step::ConfigVerify => "config-verify",
            Step::Llm => "llm",
        }
    }

    /// Whether it can run to a deadline (`--prepare-until`: measure and beam; `--tune-until`:
    /// config), so that a wall budget no run of which holds it starts it bounded
    /// (`budget::Spending::admit`) rather than never.
    pub fn bounds_itself(self) -> bool {
        matches!(self, Step::Measure | Step::Beam | Step::Config)
    }

    /// Whether it runs on the device (its seconds count against `--budget-gpu-s`).
    pub fn uses_device(self) -> bool {
        matches!(self, Step::Measure | Step::Beam | Step::Verify | Step::Config | Step::ConfigVerify | Step::Llm)
    }
}

/// The steps a problem's run takes for these agents and beam width (the beam's second round
/// combines the inductor agent's knobs: only with that agent and a width of 2 or more). A verify
/// step runs only when its family's candidate won its measurement; the config steps only on a GPU.
pub fn steps(agents: &[Agent], beam_width: u32) -> Vec<Step> {
    let beam = agents.contains(&Agent::Inductor) && beam_width >= 2;
    let mut steps: Vec<Step> =
        [Step::Measure].into_iter().chain(beam.then_some(Step::Beam)).chain([Step::Result, Step::Verify]).collect();
    if agents.contains(&Agent::Config) {
        steps.extend([Step::Config, Step::ConfigVerify]);
    }
    if agents.contains(&Agent::Llm) {
        steps.push(Step::Llm);
    }
    steps
}

/// The measure step's flag that carries an agent's variants on a device, and the variants;
/// `None` for an agent measured in its own step (config).
pub fn measure_flag(agent: Agent, gpu: bool) -> Option<(&'static str, &'static [&'static str])> {
    match agent {
        Agent::Dispatch => Some(("--modes", dispatch_modes(gpu))),
        Agent::Inductor => Some(("--knobs", inductor_knobs(gpu))),
        Agent::Rewrite => Some(("--rewrite", REWRITE_CLASSES)),
        Agent::Config | Agent::Llm => None,
    }
}

/// The exactness classes of rewrite rules the rewrite agent may use (python/kforge/optimize/
/// rewrite.py `EXACTNESS`): both stay within verify's default tolerance.
pub const REWRITE_CLASSES: &[&str] = &["exact", "reassociates"];

/// Whether an agent of the dispatch family (its variants in the measure step) is asked for; with
/// none, the measure step times nothing and the baseline stands for the family.
pub fn dispatch_family(agents: &[Agent]) -> bool {
    agents.iter().any(|a| measure_flag(*a, false).is_some())
}

/// The dispatch agent's rounds of per-graph plans, for a forward of several graphs
/// (python/kforge/optimize/dispatch.py `GRAPH_ROUNDS`, `--graph-rounds`).
pub const GRAPH_ROUNDS: u32 = 2;

/// Every measure flag with its comma-separated variants (empty for an agent not asked for: the
/// dispatch agent then times the baseline's variants alone), and the dispatch agent's per-graph
/// rounds (0 without it).
pub fn measure_args(agents: &[Agent], gpu: bool) -> Vec<(&'static str, String)> {
    let mut args: Vec<(&'static str, String)> = Agent::ALL
        .iter()
        .filter_map(|(_, a)| {
            let (flag, variants) = measure_flag(*a, gpu)?;
            Some((flag, if agents.contains(a) { variants.join(",") } else { String::new() }))
        })
        .collect();
    let graph_rounds = if agents.contains(&Agent::Dispatch) { GRAPH_ROUNDS } else { 0 };
    args.push(("--graph-rounds", graph_rounds.to_string()));
    // The config agent's Amdahl ceiling before its own step (`crate::config_cannot_win`).
    let profile = agents.contains(&Agent::Config) && gpu;
    args.push(("--profile-baseline", if profile { "1" } else { "0" }.to_string()));
    args
}

/// `--compile-workers` at most: processes per measure step.
pub const MAX_COMPILE_WORKERS: usize = 8;

/// The compile workers a measure step gets by default (`--compile-workers` not given): on a GPU,
/// the cores left per problem in flight beside the step's own process (`cores / jobs - 1`), at
/// most 3 (a level-3 step prepares about 9 compiled variants: three workers and the step keep
/// each compiling two or three); on the CPU none (the CPU's compiles would compete with its own
/// timings, and the CI machine has two cores).
pub fn compile_workers_for(cores: usize, jobs: usize, gpu: bool) -> usize {
    if !gpu {
        return 0;
    }
    (cores / jobs.max(1)).saturating_sub(1).min(3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_workers_by_default_share_the_cores_among_the_problems_in_flight() {
        assert_eq!(compile_workers_for(16, 4, true), 3, "16 cores, 4 in flight: 4 each, the step and 3");
        assert_eq!(compile_workers_for(16, 8, true), 1);
        assert_eq!(compile_workers_for(16, 16, true), 0, "a core each: none");
        assert_eq!(compile_workers_for(64, 1, true), 3, "at most 3");
        assert_eq!(compile_workers_for(16, 0, true), 3, "jobs of 0 counted as 1");
        assert_eq!(compile_workers_for(128, 1, false), 0, "the CPU: none");
    }

    #[test]
    fn each_agent_contributes_its_variants_to_the_measurement() {
        let args = measure_args(&[Agent::Inductor], false);
        assert_eq!(
            args,
            [
                ("--modes", String::new()),
                ("--knobs", "freezing,aggressive-fusion".to_string()),
                ("--rewrite", String::new()),
                ("--graph-rounds", "0".to_string()),
                ("--profile-baseline", "0".to_string())
            ]
        );
        assert_eq!(measure_args(&[Agent::Dispatch], false)[3], ("--graph-rounds", GRAPH_ROUNDS.to_string()));
        assert_eq!(measure_args(&[Agent::Dispatch, Agent::Config], true)[4], ("--profile-baseline", "1".to_string()));
        assert_eq!(measure_args(&[Agent::Dispatch, Agent::Config], false)[4].1, "0", "no GPU: nothing to profile");
        assert!(dispatch_family(&[Agent::Llm, Agent::Rewrite]) && !dispatch_family(&[Agent::Llm, Agent::Config]));
        let rewrite = measure_args(&[Agent::Rewrite], true);
        assert_eq!(rewrite[2], ("--rewrite", "exact,reassociates".to_string()));
        let both = measure_args(&[Agent::Dispatch, Agent::Inductor], true);
        assert!(both[0].1.contains("reduce-overhead") && both[1].1.contains("coordinate-descent"), "{both:?}");
        assert_eq!(
            steps(&[Agent::Dispatch], 3).iter().map(|s| s.name()).collect::<Vec<_>>(),
            ["measure", "result", "verify"]
        );
        assert_eq!(
            steps(&[Agent::Dispatch, Agent::Inductor], 3).iter().map(|s| s.name()).collect::<Vec<_>>(),
            ["measure", "beam", "result", "verify"],
            "the beam combines the inductor agent's knobs"
        );
        assert_eq!(steps(&[Agent::Inductor], 0).len(), 3, "width 0: no second round");
        assert!(Step::Verify.uses_device() && !Step::Result.uses_device());
        // The config agent adds no variant to the measurement, only its own steps (and, on a
        // GPU, the baseline's profile for its ceiling).
        assert_eq!(measure_args(&[Agent::Dispatch, Agent::Config], true).len(), 5);
        let set: Vec<_> =
            measure_args(&[Agent::Config], true).into_iter().filter(|(_, v)| !v.is_empty() && v != "0").collect();
        assert_eq!(set, [("--profile-baseline", "1".to_string())]);
        assert_eq!(
            steps(&[Agent::Dispatch, Agent::Config], 0).iter().map(|s| s.name()).collect::<Vec<_>>(),
            ["measure", "result", "verify", "config", "config-verify"]
        );
        assert!(Step::Config.uses_device() && Step::ConfigVerify.uses_device());
    }
}
