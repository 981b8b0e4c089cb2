//! A campaign's budgets: GPU-seconds (what its steps spent on the device) and wall seconds
//! (since it started). When one is spent no new problem or step starts; what was not reached is
//! recorded as such (`not-reached: budget`), not as a failure. Nor does a step start that the
//! wall budget's remainder cannot hold: each kind of step is expected to take the upper quartile
//! of the finished ones of its kind (this run's, and with `--resume` the journal's earlier runs'),
//! so a run given a wall budget ends nearer it instead of being killed with steps half done; a
//! step an earlier run was killed in the middle of sets a floor: one of its kind takes at least
//! as long as that one had run. The steps so held back are counted and said in the budget's line.

use crate::OptimizeError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

/// `--budget-gpu-s`, `--budget-wall-s`: each positive when given.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Budget {
    pub gpu_s: Option<f64>,
    pub wall_s: Option<f64>,
}

impl Budget {
    pub fn new(gpu_s: Option<f64>, wall_s: Option<f64>) -> Result<Budget, OptimizeError> {
        for (flag, v) in [("--budget-gpu-s", gpu_s), ("--budget-wall-s", wall_s)] {
            if let Some(v) = v {
                if !(v > 0.0 && v.is_finite()) {
                    return Err(OptimizeError::Budget { flag, value: v });
                }
            }
        }
        Ok(Budget { gpu_s, wall_s })
    }
}

/// What a campaign spent so far against its budget (shared by the problems in flight).
#[derive(Debug)]
pub struct Spending {
    budget: Budget,
    start: Instant,
    gpu_s: Mutex<f64>,
    /// Wall seconds of finished steps, per step name and group (the problem's folder: a
    /// level's steps take what that level's take, not the campaign's).
    durations: Mutex<BTreeMap<(String, String), Vec<f64>>>,
    /// The longest a step of each name and group had run when an earlier run was killed (the
    /// step unfinished): such a step takes at least that.
    floors: Mutex<BTreeMap<(String, String), f64>>,
    /// Steps not started because the wall budget's remainder could not hold them: how many, and
    /// the first one's reason.
    held: Mutex<(usize, Option<String>)>,
}

/// A bounded step starts only while at least this share of the wall budget is left (a run's
/// start), so that it gets most of a run.
pub const BOUNDED_START: f64 = 0.75;
/// A bounded step's own part (preparing variants): this share of the remainder; the rest is for
/// its timing rounds and the problem's result and verify steps.
pub const BOUNDED_SHARE: f64 = 0.65;

/// Whether a step starts (`Spending::admit`).
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    Start,
    /// It starts with `seconds` for its own bounded part; `why` says so.
    Bounded {
        seconds: f64,
        why: String,
    },
    /// It does not start: why.
    Refused(String),
}

/// What a kind of step is expected to take (`Spending::expected_s`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The upper quartile of the finished steps' wall seconds.
    pub seconds: f64,
    /// How many finished steps it is of.
    pub of: usize,
    /// Whether they are the problem's group's own (else every group's: none of its own yet).
    pub in_group: bool,
    /// Whether `seconds` is the group's floor (an unfinished step of a killed run had run that
    /// long), above the finished ones' quartile.
    pub floor: bool,
}

impl Estimate {
    /// What a step takes, and from what: "at least 360 s here (one of level3's had run …)" or
    /// "about 117 s here (the upper quartile of …)".
    fn took(&self, group: &str) -> String {
        if self.floor {
            format!("at least {:.0} s here (one of {group}'s had run that long when its run was killed)", self.seconds)
        } else {
            let among = if self.in_group { format!("{group}'s") } else { "every folder's".to_string() };
            format!("about {:.0} s here (the upper quartile of {among} {})", self.seconds, self.of)
        }
    }
}

/// The budget's state for the summary: spent, given, and which one ran out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetStatus {
    pub gpu_s: f64,
    pub budget_gpu_s: Option<f64>,
    pub wall_s: f64,
    pub budget_wall_s: Option<f64>,
    /// `gpu` or `wall` when that budget was spent.
    pub spent: Option<String>,
    /// Steps not started because the wall budget's remainder could not hold them.
    #[serde(default)]
    pub held_back: usize,
    /// The first of them's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_why: Option<String>,
}

impl Spending {
    pub fn new(budget: Budget) -> Spending {
        Spending::since(budget, Instant::now())
    }

    /// Spending of a run that started at `start` (its wall budget counts from there).
    pub fn since(budget: Budget, start: Instant) -> Spending {
        Spending {
            budget,
            start,
            gpu_s: Mutex::new(0.0),
            durations: Mutex::default(),
            floors: Mutex::default(),
            held: Mutex::default(),
        }
    }

    /// Count a finished step's wall seconds towards what a step named `step` of a problem in
    /// `group` is expected to take.
    pub fn observe(&self, step: &str, group: &str, seconds: f64) {
        if seconds.is_finite() && seconds >= 0.0 {
            let mut d = self.durations.lock().unwrap_or_else(|e| e.into_inner());
            d.entry((step.to_string(), group.to_string())).or_default().push(seconds);
        }
    }

    /// Count an unfinished step of an earlier, killed run: it had run `seconds` when its run was
    /// killed, so a step named `step` of a problem in `group` takes at least that.
    pub fn observe_unfinished(&self, step: &str, group: &str, seconds: f64) {
        if seconds.is_finite() && seconds > 0.0 {
            let mut f = self.floors.lock().unwrap_or_else(|e| e.into_inner());
            let e = f.entry((step.to_string(), group.to_string())).or_insert(seconds);
            *e = e.max(seconds);
        }
    }

    /// What a step named `step` of a problem in `group` is expected to take: the upper quartile
    /// (nearest rank) of the finished ones' wall seconds in `group`, else in every group (the
    /// `Estimate` says which, and how many there were), and never less than the group's floor (an
    /// unfinished one of a killed run); `None` before one finished or was killed. Not the median:
    /// a step that runs past the budget is killed with its work lost, one held back only waits
    /// for the next run.
    pub fn expected_s(&self, step: &str, group: &str) -> Option<Estimate> {
        let key = (step.to_string(), group.to_string());
        let floor = self.floors.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied();
        let d = self.durations.lock().unwrap_or_else(|e| e.into_inner());
        let own = d.get(&key).filter(|xs| !xs.is_empty());
        let mut xs: Vec<f64> = match own {
            Some(xs) => xs.clone(),
            None => d.iter().filter(|((s, _), _)| s == step).flat_map(|(_, xs)| xs.iter().copied()).collect(),
        };
        xs.sort_by(f64::total_cmp);
        let n = xs.len();
        let quartile = (n > 0).then(|| xs[(3 * n).div_ceil(4) - 1]);
        let at_floor = |f| Some(Estimate { seconds: f, of: n, in_group: true, floor: true });
        match (quartile, floor) {
            (Some(q), Some(f)) if f > q => at_floor(f),
            (Some(q), _) => Some(Estimate { seconds: q, of: n, in_group: own.is_some(), floor: false }),
            (None, Some(f)) => at_floor(f),
            (None, None) => None,
        }
    }

    /// Why a step named `step` of a problem in `group` that cannot bound itself must not start
    /// (`None`: it may): `admit`'s refusal, for the tests.
    #[cfg(test)]
    fn refuses(&self, step: &str, group: &str) -> Option<String> {
        match self.admit(step, group, false) {
            Admission::Refused(why) => Some(why),
            Admission::Start | Admission::Bounded { .. } => None,
        }
    }

    /// Whether a step named `step` of a problem in `group` starts, and how: refused when a
    /// budget is spent or the wall budget's remainder is below what such a step is expected to
    /// take, except that a step that `bounds_itself` (a measure step: `--prepare-until`), of a kind a
    /// killed run showed to take longer than the whole wall budget, starts bounded while at
    /// least `BOUNDED_START` of the budget is left (a run's start): held back, it would never
    /// start in a run of this budget, and unbounded it would be killed again.
    pub fn admit(&self, step: &str, group: &str, bounds_itself: bool) -> Admission {
        if let Some(which) = self.spent() {
            return Admission::Refused(format!("the {which} budget is spent"));
        }
        let Some(budget) = self.budget.wall_s else { return Admission::Start };
        let left = budget - self.wall_s();
        let Some(e) = self.expected_s(step, group) else { return Admission::Start };
        if e.seconds <= left {
            return Admission::Start;
        }
        if bounds_itself && e.floor && e.seconds > budget && left >= BOUNDED_START * budget {
            let seconds = BOUNDED_SHARE * left;
            let why = format!(
                "no {step} step fits a --budget-wall-s of {budget:.0} in full (one of {group}'s had run {:.0} s when its run was killed): it prepares variants for {seconds:.0} s, then times those",
                e.seconds
            );
            return Admission::Bounded { seconds, why };
        }
        let took = e.took(group);
        let never =
            if e.seconds > budget { format!("; none fits a --budget-wall-s of {budget:.0}") } else { String::new() };
        let why = format!("a {step} step takes {took}, {:.0} s of the wall budget are left{never}", left.max(0.0));
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.0 += 1;
        held.1.get_or_insert_with(|| why.clone());
        Admission::Refused(why)
    }

    /// Why no step named `step` of a problem in `group` can run in a run of this wall budget
    /// (`None`: one can, or nothing says otherwise): its estimate exceeds the whole budget. An
    /// optional step (the config agent's) is then skipped rather than held back forever.
    pub fn never_fits(&self, step: &str, group: &str) -> Option<String> {
        let budget = self.budget.wall_s?;
        let e = self.expected_s(step, group)?;
        (e.seconds > budget)
            .then(|| format!("no {step} step fits a --budget-wall-s of {budget:.0}: one takes {}", e.took(group)))
    }

    /// Count a step's GPU-seconds.
    pub fn charge(&self, gpu_s: f64) {
        *self.gpu_s.lock().unwrap_or_else(|e| e.into_inner()) += gpu_s.max(0.0);
    }

    pub fn gpu_s(&self) -> f64 {
        *self.gpu_s.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn wall_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// The budget that is spent (`gpu` first), if one is.
    pub fn spent(&self) -> Option<&'static str> {
        match self.budget {
            Budget { gpu_s: Some(b), .. } if self.gpu_s() >= b => Some("gpu"),
            Budget { wall_s: Some(b), .. } if self.wall_s() >= b => Some("wall"),
            _ => None,
        }
    }

    /// For a progress line: `elapsed 12.0 s; left: gpu 3.1 s, wall 40.0 s` (only budgets given).
    pub fn progress(&self) -> String {
        let mut left = Vec::new();
        if let Some(b) = self.budget.gpu_s {
            left.push(format!("gpu {:.1} s", (b - self.gpu_s()).max(0.0)));
        }
        if let Some(b) = self.budget.wall_s {
            left.push(format!("wall {:.1} s", (b - self.wall_s()).max(0.0)));
        }
        let left = if left.is_empty() { "no budget".to_string() } else { format!("left: {}", left.join(", ")) };
        format!("elapsed {:.1} s; {left}", self.wall_s())
    }

    pub fn status(&self) -> BudgetStatus {
        let (held_back, held_why) = self.held.lock().unwrap_or_else(|e| e.into_inner()).clone();
        BudgetStatus {
            gpu_s: self.gpu_s(),
            budget_gpu_s: self.budget.gpu_s,
            wall_s: self.wall_s(),
            budget_wall_s: self.budget.wall_s,
            spent: self.spent().map(String::from),
            held_back,
            held_why,
        }
    }
}

impl BudgetStatus {
    /// One line for the campaign's summary.
    pub fn line(&self) -> String {
        let of = |b: Option<f64>| b.map(|b| format!(" of {b:.1}")).unwrap_or_default();
        let spent = match self.spent.as_deref() {
            Some(which) => format!("; the {which} budget is spent"),
            None => String::new(),
        };
        let held = match (&self.held_why, self.held_back) {
            (Some(why), n) if n > 0 => {
                format!("; {n} step(s) held back ({why}): a larger --budget-wall-s lets them start")
            }
            _ => String::new(),
        };
        format!(
            "budget: gpu {:.1}{} s, wall {:.1}{} s{spent}{held}\n",
            self.gpu_s,
            of(self.budget_gpu_s),
            self.wall_s,
            of(self.budget_wall_s)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_positive_and_finite() {
        assert_eq!(Budget::new(None, Some(60.0)), Ok(Budget { gpu_s: None, wall_s: Some(60.0) }));
        for (gpu, wall, flag) in [
            (Some(0.0), None, "--budget-gpu-s"),
            (Some(-5.0), None, "--budget-gpu-s"),
            (None, Some(f64::NAN), "--budget-wall-s"),
            (Some(1.0), Some(f64::INFINITY), "--budget-wall-s"),
        ] {
            let e = Budget::new(gpu, wall).unwrap_err();
            assert!(matches!(e, OptimizeError::Budget { flag: f, .. } if f == flag), "{e}");
            assert!(e.to_string().contains(flag) && e.to_string().contains("positive"), "{e}");
        }
    }

    #[test]
    fn spending_runs_out_by_gpu_seconds() {
        let s = Spending::new(Budget::new(Some(10.0), None).unwrap());
        s.charge(4.0);
        assert_eq!(s.spent(), None);
        assert!(s.progress().contains("left: gpu 6.0 s"), "{}", s.progress());
        s.charge(6.5);
        assert_eq!(s.spent(), Some("gpu"));
        let st = s.status();
        assert_eq!((st.gpu_s, st.spent.as_deref()), (10.5, Some("gpu")));
        assert!(st.line().contains("gpu 10.5 of 10.0 s") && st.line().contains("the gpu budget is spent"));
        assert_eq!(Spending::new(Budget::default()).spent(), None, "no budget: never spent");
        assert!(Spending::new(Budget::default()).progress().ends_with("no budget"));
    }

    #[test]
    fn a_step_the_wall_budget_cannot_hold_does_not_start() {
        let s = Spending::new(Budget::new(None, Some(100.0)).unwrap());
        assert_eq!(s.refuses("measure", "level1"), None, "nothing finished yet: no estimate, it starts");
        for secs in [80.0, 150.0, 120.0] {
            s.observe("measure", "level1", secs);
        }
        s.observe("result", "level1", 0.5);
        s.observe("result", "level1", f64::NAN); // not a duration
        let est = |step, group| s.expected_s(step, group).map(|e| (e.seconds, e.of, e.in_group, e.floor));
        assert_eq!(est("measure", "level1"), Some((150.0, 3, true, false)), "the upper quartile, nearest rank");
        assert_eq!(est("result", "level1"), Some((0.5, 1, true, false)));
        for secs in [1.5, 1.0, 2.0] {
            s.observe("result", "level1", secs);
        }
        assert_eq!(est("result", "level1"), Some((1.5, 4, true, false)), "the third of four");
        assert_eq!(s.status().held_back, 0);
        let why = s.refuses("measure", "level1").expect("150 s expected, under 100 s left");
        assert!(why.contains("a measure step takes about 150 s here (the upper quartile of level1's 3)"), "{why}");
        assert!(why.ends_with("; none fits a --budget-wall-s of 100"), "150 s never fit 100: {why}");
        assert!(why.contains("s of the wall budget are left"), "{why}");
        assert_eq!(s.refuses("result", "level1"), None, "a short step still fits");
        s.refuses("measure", "level1");
        let st = s.status();
        assert_eq!((st.held_back, st.held_why.as_deref()), (2, Some(why.as_str())), "counted, the first reason kept");
        assert!(
            st.line().contains(&format!("; 2 step(s) held back ({why}): a larger --budget-wall-s")),
            "{}",
            st.line()
        );
        assert_eq!(s.refuses("verify", "level1"), None, "a kind never finished: no estimate");
        let gpu_only = Spending::new(Budget::new(Some(10.0), None).unwrap());
        gpu_only.observe("measure", "level1", 1e6);
        assert_eq!(gpu_only.refuses("measure", "level1"), None, "no wall budget: durations do not matter");
        gpu_only.charge(10.0);
        assert_eq!(gpu_only.refuses("result", "level1").as_deref(), Some("the gpu budget is spent"));
    }

    #[test]
    fn a_folder_is_estimated_by_its_own_steps_once_it_has_some() {
        let s = Spending::new(Budget::new(None, Some(100.0)).unwrap());
        for secs in [20.0, 30.0, 40.0, 50.0] {
            s.observe("measure", "level1", secs);
        }
        let est = |group| s.expected_s("measure", group).map(|e| (e.seconds, e.of, e.in_group));
        assert_eq!(est("level3"), Some((40.0, 4, false)), "none of its own: every folder's");
        assert_eq!(s.refuses("measure", "level3"), None, "40 s fit");
        s.observe("measure", "level3", 180.0);
        assert_eq!(est("level3"), Some((180.0, 1, true)), "its own, once it has one");
        assert_eq!(est("level1"), Some((40.0, 4, true)), "another folder's steps do not move level1's");
        let why = s.refuses("measure", "level3").expect("180 s expected");
        assert!(why.contains("the upper quartile of level3's 1"), "{why}");
        s.observe("measure", "level2", 500.0);
        let pooled = s.expected_s("measure", "elsewhere").unwrap();
        assert_eq!((pooled.seconds, pooled.of, pooled.in_group), (180.0, 6, false), "every folder's six");
        let why = s.refuses("measure", "elsewhere").expect("180 s expected");
        assert!(why.contains("the upper quartile of every folder's 6"), "{why}");
    }

    #[test]
    fn a_step_killed_unfinished_sets_its_folders_floor() {
        let s = Spending::new(Budget::new(None, Some(300.0)).unwrap());
        for secs in [20.0, 30.0, 40.0, 50.0] {
            s.observe("measure", "level1", secs);
        }
        s.observe_unfinished("measure", "level3", 250.0);
        s.observe_unfinished("measure", "level3", 340.0);
        s.observe_unfinished("measure", "level3", f64::NAN); // not a duration
        let e = s.expected_s("measure", "level3").unwrap();
        assert_eq!(
            (e.seconds, e.floor, e.in_group),
            (340.0, true, true),
            "the longest unfinished one, not level 1's 40 s"
        );
        let why = s.refuses("measure", "level3").expect("at least 340 s, 300 s budget");
        assert!(
            why.contains(
                "a measure step takes at least 340 s here (one of level3's had run that long when its run was killed)"
            ),
            "{why}"
        );
        assert!(why.ends_with("; none fits a --budget-wall-s of 300"), "{why}");
        assert_eq!(s.refuses("measure", "level1"), None, "level 1 keeps its own 40 s");
        s.observe("measure", "level3", 100.0);
        assert_eq!(
            s.expected_s("measure", "level3").map(|e| (e.seconds, e.floor)),
            Some((340.0, true)),
            "a floor above the quartile stays"
        );
        s.observe("measure", "level3", 400.0);
        assert_eq!(
            s.expected_s("measure", "level3").map(|e| (e.seconds, e.floor)),
            Some((400.0, false)),
            "a quartile above it wins"
        );
        assert_eq!(s.expected_s("verify", "level3"), None, "another kind has no floor");
    }

    #[test]
    fn a_self_bounding_step_no_budget_holds_starts_bounded_at_a_runs_start() {
        let s = Spending::new(Budget::new(None, Some(300.0)).unwrap());
        s.observe_unfinished("measure", "level3", 360.0);
        match s.admit("measure", "level3", true) {
            Admission::Bounded { seconds, why } => {
                assert!(seconds > 0.6 * 300.0 && seconds <= BOUNDED_SHARE * 300.0, "{seconds}");
                assert!(why.starts_with("no measure step fits a --budget-wall-s of 300 in full (one of level3's had run 360 s when its run was killed): it prepares variants for"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.status().held_back, 0, "a bounded start is not held back");
        assert!(
            matches!(s.admit("measure", "level3", false), Admission::Refused(_)),
            "a step that cannot bound itself is held"
        );
        s.observe_unfinished("beam", "level3", 200.0);
        assert_eq!(s.admit("beam", "level3", true), Admission::Start, "200 s fit what is left: unbounded");
        s.observe("verify", "level1", 1000.0);
        assert!(
            matches!(s.admit("verify", "level1", true), Admission::Refused(_)),
            "a finished step's length is not a floor: held"
        );
        let late = Spending::since(
            Budget::new(None, Some(300.0)).unwrap(),
            Instant::now() - std::time::Duration::from_secs(100),
        );
        late.observe_unfinished("measure", "level3", 360.0);
        assert!(
            matches!(late.admit("measure", "level3", true), Admission::Refused(_)),
            "two thirds left: not a run's start"
        );
        assert_eq!(Spending::new(Budget::default()).admit("measure", "level3", true), Admission::Start, "no budget");
    }

    #[test]
    fn an_optional_step_no_run_of_the_budget_holds_is_said_so() {
        let s = Spending::new(Budget::new(None, Some(300.0)).unwrap());
        assert_eq!(s.never_fits("config", "level3"), None, "nothing known: it may fit");
        s.observe("config", "level3", 250.0);
        assert_eq!(s.never_fits("config", "level3"), None, "250 s fit 300");
        s.observe_unfinished("config", "level3", 420.0);
        assert_eq!(
            s.never_fits("config", "level3").as_deref(),
            Some("no config step fits a --budget-wall-s of 300: one takes at least 420 s here (one of level3's had run that long when its run was killed)")
        );
        assert_eq!(Spending::new(Budget::default()).never_fits("config", "level3"), None, "no wall budget");
        assert_eq!(s.status().held_back, 0, "saying so holds nothing back");
    }

    #[test]
    fn spending_runs_out_by_wall_seconds() {
        let s = Spending::new(Budget::new(None, Some(1e-9)).unwrap());
        let t = Instant::now();
        while t.elapsed().as_nanos() < 10 {} // the clock moves past the budget
        assert_eq!(s.spent(), Some("wall"));
    }
}
