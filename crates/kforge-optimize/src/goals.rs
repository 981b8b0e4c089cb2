//! Issue 18's goals against a campaign's result: per level the geomean goal over the baseline
//! (fallbacks counted as 1.0), the cost goals per problem, and, where a goal is missed, why — the
//! problems that kept their baseline, split into those whose generated Triton kernels are a small
//! share of the baseline's device time (vendor-bound: a search over them has a low Amdahl
//! ceiling), those whose generated kernels already move their bytes near the device's copy
//! bandwidth (at the bandwidth roof: the config agent's roofline ceiling) and the rest (nothing
//! beat the baseline beyond noise, or its result did not verify).

use crate::{Baseline, Decision, LevelSummary, ProblemOutcome};
use serde::{Deserialize, Serialize};

/// Wall seconds per problem on average at `--jobs 8` (issue 18: at most 5 minutes), over the
/// problems decided or failed (not those not reached).
pub const WALL_S_PER_PROBLEM: f64 = 300.0;
/// Exclusive (region) GPU seconds per problem on average (issue 18: at most 60 s).
pub const GPU_S_PER_PROBLEM: f64 = 60.0;
/// A Triton share below this is vendor-bound: the Amdahl ceiling of a search over the generated
/// kernels is below 1 / (1 − 0.25) = 1.33×.
pub const VENDOR_BOUND_SHARE: f64 = 0.25;
/// A roofline ceiling at or below this is at the bandwidth roof: were every generated kernel to
/// move its least traffic at the device's bandwidth, the model would be at most 5 % faster.
pub const AT_ROOF_CEILING: f64 = 1.05;

/// The geomean goal of a level (`level1`..`level3`) over a baseline; `None` for another folder.
pub fn geomean_goal(level: &str, baseline: Baseline) -> Option<f64> {
    let i = ["level1", "level2", "level3"].iter().position(|l| *l == level)?;
    Some(match baseline {
        Baseline::MaxAutotune => [1.25, 1.08, 1.05][i],
        Baseline::Default => [1.35, 1.20, 1.25][i],
    })
}

/// One level against the goals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoalCheck {
    pub level: String,
    /// `None`: no goal for this folder (the other checks still hold).
    pub geomean_goal: Option<f64>,
    /// The level's geomean over the confirmed speedups (`LevelSummary::geomean_confirmed`).
    #[serde(alias = "geomean")]
    pub geomean_confirmed: f64,
    pub geomean_met: Option<bool>,
    pub wall_s_per_problem: f64,
    pub gpu_s_per_problem: f64,
    /// `None` when no problem of the level was decided or failed (no cost known yet).
    pub cost_met: Option<bool>,
    /// The smallest speedup a problem counts with (issue 18: none below 0.99×).
    pub lowest: f64,
    /// Problems that kept the baseline with a Triton share below [`VENDOR_BOUND_SHARE`].
    pub vendor_bound: Vec<String>,
    /// Problems that kept the baseline, not vendor-bound, whose roofline ceiling is at most
    /// [`AT_ROOF_CEILING`]: their generated kernels already move their bytes near the device's bandwidth.
    #[serde(default)]
    pub at_roof: Vec<String>,
    /// Problems that kept the baseline otherwise (or without a known share).
    pub nothing_won: Vec<String>,
    /// Failed or not reached: counted as 1.0 though nothing was decided.
    pub undecided: Vec<String>,
    /// Decided problems whose bounded measure step left variants, the rewrite or the per-graph
    /// search out (`ProblemOutcome::not_prepared`): decided over a part of the search, kept or not.
    #[serde(default)]
    pub searched_in_part: Vec<String>,
}

/// Every level of `summary` (not `all`) against the goals for `baseline`.
pub fn check(outcomes: &[ProblemOutcome], summary: &[LevelSummary], baseline: Baseline) -> Vec<GoalCheck> {
    summary
        .iter()
        .filter(|s| s.level != "all")
        .map(|s| {
            let of: Vec<&ProblemOutcome> = outcomes.iter().filter(|o| o.level == s.level).collect();
            // Per problem that cost all it will: decided or failed (one not reached has spent a
            // part, or nothing, of what deciding it takes; counting it would flatter a partial campaign).
            let settled: Vec<&&ProblemOutcome> = of.iter().filter(|o| o.not_reached.is_none()).collect();
            let n = settled.len().max(1) as f64;
            let wall = settled.iter().fold(0.0, |t, o| t + o.seconds) / n; // (sum() of none is -0.0)
            let gpu = settled.iter().fold(0.0, |t, o| t + o.gpu_seconds) / n;
            let goal = geomean_goal(&s.level, baseline);
            let kept = |o: &ProblemOutcome| matches!(o.decision, Some(Decision::Fallback { .. }));
            let vendor_bound = |o: &ProblemOutcome| o.triton_share.is_some_and(|x| x < VENDOR_BOUND_SHARE);
            let roof =
                |o: &ProblemOutcome| !vendor_bound(o) && o.roofline_ceiling.is_some_and(|c| c <= AT_ROOF_CEILING);
            let names = |f: &dyn Fn(&ProblemOutcome) -> bool| -> Vec<String> {
                of.iter().filter(|o| f(o)).map(|o| o.problem.clone()).collect()
            };
            GoalCheck {
                level: s.level.clone(),
                geomean_goal: goal,
                geomean_confirmed: s.geomean_confirmed,
                geomean_met: goal.map(|g| s.geomean_confirmed >= g),
                wall_s_per_problem: wall,
                gpu_s_per_problem: gpu,
                cost_met: (!settled.is_empty()).then_some(wall <= WALL_S_PER_PROBLEM && gpu <= GPU_S_PER_PROBLEM),
                lowest: of.iter().map(|o| o.confirmed_speedup()).fold(f64::INFINITY, f64::min),
                vendor_bound: names(&|o| kept(o) && vendor_bound(o)),
                at_roof: names(&|o| kept(o) && roof(o)),
                nothing_won: names(&|o| kept(o) && !vendor_bound(o) && !roof(o)),
                undecided: names(&|o| o.decision.is_none()),
                searched_in_part: names(&|o| o.decision.is_some() && o.not_prepared > 0),
            }
        })
        .collect()
}

/// The goals' lines for the campaign's table.
pub fn lines(checks: &[GoalCheck]) -> String {
    let mut t = format!(
        "\n{:<10} {:>9} {:>8} {:>6} {:>10} {:>8} {:>6} {:>8}  {}\n",
        "GOALS",
        "CONFIRMED",
        "GOAL",
        "MET",
        "WALL-S/P",
        "GPU-S/P",
        "COST",
        "LOWEST",
        "WHY BASELINES WERE KEPT; PARTIAL SEARCHES"
    );
    for c in checks {
        let goal = c.geomean_goal.map(|g| format!("{g:.2}x")).unwrap_or_else(|| "-".into());
        let met = match c.geomean_met {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        let why = format!(
            "{} vendor-bound (Triton < {:.0} %), {} at the bandwidth roof, {} nothing beat it, {} undecided; {} searched in part",
            c.vendor_bound.len(),
            VENDOR_BOUND_SHARE * 100.0,
            c.at_roof.len(),
            c.nothing_won.len(),
            c.undecided.len(),
            c.searched_in_part.len()
        );
        t.push_str(&format!(
            "{:<10} {:>8.3}x {:>8} {:>6} {:>10.1} {:>8.1} {:>6} {:>7.3}x  {why}\n",
            c.level,
            c.geomean_confirmed,
            goal,
            met,
            c.wall_s_per_problem,
            c.gpu_s_per_problem,
            match c.cost_met {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            },
            c.lowest
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{summarize, Agent};

    fn outcome(problem: &str, decision: Option<Decision>, share: Option<f64>) -> ProblemOutcome {
        ProblemOutcome {
            problem: problem.into(),
            level: problem.split('/').next().unwrap().into(),
            decision,
            error: None,
            not_reached: None,
            seconds: 200.0,
            gpu_seconds: 10.0,
            resumed: false,
            triton_share: share,
            confirmed: None,
            roofline_ceiling: None,
            not_prepared: 0,
        }
    }

    fn improved(speedup: f64) -> Option<Decision> {
        Some(Decision::Improved { agent: Agent::Dispatch, mode: "eager".into(), speedup, ci95: [speedup, speedup] })
    }

    fn kept() -> Option<Decision> {
        Some(Decision::Fallback { reason: "no mode beat it".into() })
    }

    #[test]
    fn each_level_is_checked_against_its_goal_and_the_kept_baselines_are_explained() {
        let outcomes = [
            outcome("level1/a.py", improved(2.0), Some(0.5)),
            outcome("level1/b.py", kept(), Some(0.1)),
            outcome("level1/c.py", kept(), Some(0.6)),
            outcome("level2/d.py", improved(1.1), None),
            outcome("level2/e.py", None, None),
            ProblemOutcome { not_reached: Some("budget".into()), seconds: 30.0, ..outcome("level2/g.py", None, None) },
            outcome("extra/f.py", kept(), None),
        ];
        let summary = summarize(&outcomes);
        let checks = check(&outcomes, &summary, Baseline::MaxAutotune);
        assert_eq!(checks.iter().map(|c| c.level.as_str()).collect::<Vec<_>>(), ["extra", "level1", "level2"]);
        let l1 = &checks[1];
        assert_eq!((l1.geomean_goal, l1.geomean_met), (Some(1.25), Some(true)), "2^(1/3) = 1.26: {l1:?}");
        assert_eq!(
            (l1.vendor_bound.clone(), l1.nothing_won.clone()),
            (vec!["level1/b.py".to_string()], vec!["level1/c.py".to_string()])
        );
        assert!((l1.wall_s_per_problem, l1.gpu_s_per_problem, l1.cost_met) == (200.0, 10.0, Some(true)));
        assert_eq!(l1.lowest, 1.0);
        let l2 = &checks[2];
        let undecided = vec!["level2/e.py".to_string(), "level2/g.py".to_string()];
        assert_eq!((l2.geomean_met, l2.undecided.clone()), (Some(false), undecided), "{l2:?}");
        assert_eq!(l2.wall_s_per_problem, 200.0, "per problem decided or failed: g, not reached, is not one");
        let none = [ProblemOutcome { not_reached: Some("budget".into()), ..outcome("level3/h.py", None, None) }];
        let c = check(&none, &summarize(&none), Baseline::MaxAutotune);
        assert_eq!(c[0].cost_met, None, "nothing decided: no cost known");
        assert!(lines(&c).contains("       0.0      0.0      -"), "{}", lines(&c));
        // The lowest speedup is the confirmed one.
        let mut low = outcomes.clone();
        low[0].confirmed = Some(0.95);
        let l1 = check(&low, &summarize(&low), Baseline::MaxAutotune).remove(1);
        assert_eq!(l1.lowest, 0.95, "{l1:?}");
        assert_eq!((checks[0].geomean_goal, checks[0].geomean_met), (None, None));
        assert_eq!(geomean_goal("level3", Baseline::Default), Some(1.25));
        let t = lines(&checks);
        assert!(
            t.contains("level1")
                && t.contains("1.25x")
                && t.contains(
                    "1 vendor-bound (Triton < 25 %), 0 at the bandwidth roof, 1 nothing beat it, 0 undecided; 0 searched in part"
                ),
            "{t}"
        );
        assert!(t.lines().any(|l| l.starts_with("level2") && l.contains(" no ")), "{t}");
    }

    #[test]
    fn a_kept_baseline_whose_kernels_run_at_their_roof_is_told_apart_from_one_nothing_beat() {
        let roof = |p: &str, share: f64, ceiling: f64| ProblemOutcome {
            roofline_ceiling: Some(ceiling),
            ..outcome(p, kept(), Some(share))
        };
        let won = ProblemOutcome { decision: improved(1.2), ..roof("level1/won.py", 1.0, 1.02) }; // not kept
        let outcomes = [
            roof("level1/silu.py", 1.0, 1.03),    // at the roof
            roof("level1/softmax.py", 1.0, 1.05), // at the bound: at the roof
            roof("level1/norm.py", 1.0, 1.4),     // room left: nothing beat it
            roof("level1/gemm.py", 0.02, 1.01),   // vendor-bound first
            won,
            outcome("level1/unknown.py", kept(), Some(0.9)), // no roofline: nothing beat it
        ];
        let c = check(&outcomes, &summarize(&outcomes), Baseline::Default).remove(0);
        let names = |v: &[String]| v.iter().map(|p| p.trim_start_matches("level1/").to_string()).collect::<Vec<_>>();
        assert_eq!(names(&c.at_roof), ["silu.py", "softmax.py"], "{c:?}");
        assert_eq!(names(&c.vendor_bound), ["gemm.py"]);
        assert_eq!(names(&c.nothing_won), ["norm.py", "unknown.py"]);
        assert!(lines(&[c]).contains("1 vendor-bound (Triton < 25 %), 2 at the bandwidth roof, 2 nothing beat it"));
        // A campaign file written before the field reads back without it.
        let old = r#"{"level":"level1","geomean_goal":1.35,"geomean_confirmed":1.0,"geomean_met":false,"wall_s_per_problem":1.0,
            "gpu_s_per_problem":1.0,"cost_met":true,"lowest":1.0,"vendor_bound":[],"nothing_won":[],"undecided":[]}"#;
        let read = serde_json::from_str::<GoalCheck>(old).unwrap();
        assert!(read.at_roof.is_empty() && read.searched_in_part.is_empty());
    }

    #[test]
    fn problems_decided_over_a_bounded_measure_step_are_named_as_searched_in_part() {
        let part =
            |p: &str, d: Option<Decision>, n: usize| ProblemOutcome { not_prepared: n, ..outcome(p, d, Some(0.5)) };
        let outcomes = [
            part("level3/decoder.py", improved(1.004), 5), // won, but over a part of the search
            part("level3/moe.py", kept(), 8),              // kept over a part of it
            part("level3/mlp.py", improved(1.002), 0),     // searched whole
            ProblemOutcome { not_reached: Some("budget".into()), ..part("level3/gru.py", None, 3) }, // undecided
        ];
        let c = check(&outcomes, &summarize(&outcomes), Baseline::MaxAutotune).remove(0);
        assert_eq!(c.searched_in_part, ["level3/decoder.py", "level3/moe.py"], "{c:?}");
        assert_eq!(c.undecided, ["level3/gru.py"]);
        assert!(lines(&[c]).contains("1 nothing beat it, 1 undecided; 2 searched in part"));
    }
}
