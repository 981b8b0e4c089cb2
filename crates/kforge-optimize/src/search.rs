//! One problem's search as a list of steps, and what each agent puts into them. Every agent's
//! candidates are measured in one interleaved measurement against one baseline (the dispatch
//! agent's process, `python3 -m kforge.optimize.dispatch`): an agent contributes its variants to
//! that step through a flag ([`measure_flag`]); the winner's result file is written, verified
//! and decided on. Adding an agent is one arm in [`measure_flag`] (and `Agent::of_variant`), or,
//! for an agent that must first write a candidate (a rewrite of the source), a step before
//! [`Step::Measure`] in [`steps`].

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
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Measure => "measure",
            Step::Beam => "beam",
            Step::Result => "result",
            Step::Verify => "verify",
        }
    }

    /// Whether it runs on the device (its seconds count against `--budget-gpu-s`).
    pub fn uses_device(self) -> bool {
        matches!(self, Step::Measure | Step::Beam | Step::Verify)
    }
}

/// The steps a problem's run takes for these agents and beam width (the beam's second round
/// combines the inductor agent's knobs: only with that agent and a width of 2 or more). The
/// verify step runs only when a variant won the measurement.
pub fn steps(agents: &[Agent], beam_width: u32) -> Vec<Step> {
    let beam = agents.contains(&Agent::Inductor) && beam_width >= 2;
    [Step::Measure].into_iter().chain(beam.then_some(Step::Beam)).chain([Step::Result, Step::Verify]).collect()
}

/// The measure step's flag that carries an agent's variants on a device, and the variants.
pub fn measure_flag(agent: Agent, gpu: bool) -> (&'static str, &'static [&'static str]) {
    match agent {
        Agent::Dispatch => ("--modes", dispatch_modes(gpu)),
        Agent::Inductor => ("--knobs", inductor_knobs(gpu)),
        Agent::Rewrite => ("--rewrite", REWRITE_CLASSES),
    }
}

/// The exactness classes of rewrite rules the rewrite agent may use (python/kforge/optimize/
/// rewrite.py `EXACTNESS`): both stay within verify's default tolerance.
pub const REWRITE_CLASSES: &[&str] = &["exact", "reassociates"];

/// Every measure flag with its comma-separated variants (empty for an agent not asked for: the
/// dispatch agent then times the baseline's variants alone).
pub fn measure_args(agents: &[Agent], gpu: bool) -> Vec<(&'static str, String)> {
    Agent::ALL
        .iter()
        .map(|(_, a)| {
            let (flag, variants) = measure_flag(*a, gpu);
            (flag, if agents.contains(a) { variants.join(",") } else { String::new() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_agent_contributes_its_variants_to_the_measurement() {
        let args = measure_args(&[Agent::Inductor], false);
        assert_eq!(
            args,
            [
                ("--modes", String::new()),
                ("--knobs", "freezing,aggressive-fusion".to_string()),
                ("--rewrite", String::new())
            ]
        );
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
    }
}
