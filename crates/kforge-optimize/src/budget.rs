//! A campaign's budgets: GPU-seconds (what its steps spent on the device) and wall seconds
//! (since it started). When one is spent no new problem or step starts; what was not reached is
//! recorded as such (`not-reached: budget`), not as a failure. Nor does a step start that the
//! wall budget's remainder cannot hold: each kind of step is expected to take the upper quartile
//! of the finished ones of its kind (this run's, and with `--resume` the journal's earlier runs'),
//! so a run given a wall budget ends nearer it instead of being killed with steps half done. A
//! step an earlier run was killed in the middle of counts among them at the seconds it had run
//! (a lower bound), and it sets its own problem's floor: that problem's step takes at least as
//! long, whatever its folder's other steps took (one long problem does not hold back its
//! siblings). So does a step of an earlier run that ran bounded (`journal::BOUNDED`: its
//! deadlines cut it, or it started bounded), as its problem's floor only: a floor above what is
//! left of the wall budget makes the run take its bounded result instead of running it in full,
//! to be cut again. The steps so held back are counted and said in the budget's line.

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
    /// Wall seconds of steps, per step name and group (the problem's folder: a level's steps
    /// take what that level's take, not the campaign's): finished ones, and unfinished ones of
    /// killed runs at what they had run.
    durations: Mutex<BTreeMap<(String, String), Vec<Sample>>>,
    /// Steps not started because the wall budget's remainder could not hold them: how many, and
    /// the first one's reason.
    held: Mutex<(usize, Option<String>)>,
    /// Per step name and problem, the longest that step of an earlier run ran bounded: that
    /// problem's floor alone, not a sample of its kind (`observe_bounded`).
    bounded: Mutex<BTreeMap<(String, String), f64>>,
}

/// A bounded step starts only while at least this share of the wall budget is left (a run's
/// start), so that it gets most of a run.
pub const BOUNDED_START: f64 = 0.75;
/// A bounded step's own part (preparing variants): this share of the remainder; the rest is for
/// its timing rounds and the problem's result and verify steps.
pub const BOUNDED_SHARE: f64 = 0.65;
/// A bounded step's end (a measure step's `--until`: no timing round past its first two after
/// it): this share of the remainder. The rest is the slack before the run's kill; the problem's
/// result and verify steps wait for the next run when they no longer fit.
pub const BOUNDED_END_SHARE: f64 = 0.9;
/// A step admitted in full under a wall budget still gets deadlines, as a safety net for an
/// estimate that proves short (a first run has none; a max-autotune compile at the large preset
/// outlived a whole device call): no variant's preparation goes past the budget's end (this
/// share of the remainder), and no timing round past the first two past `SAFETY_END_SHARE` of
/// it. The budget stops new work, not a step in flight: a step that overruns its estimate a
/// little still finishes, one that would outlive the run's kill (a device call's limit, past the
/// budget) ends with what it measured instead of being killed with all of it.
pub const SAFETY_PART_SHARE: f64 = 1.0;
/// The safety net's end: a tenth of the remainder past the budget's end (a device campaign's
/// kill comes 60 s after a budget of 430 s).
pub const SAFETY_END_SHARE: f64 = 1.1;

/// One step's wall seconds among its kind's (`Spending::durations`).
#[derive(Debug, Clone)]
struct Sample {
    seconds: f64,
    /// `Some(problem)`: the step was left unfinished by a killed run of that problem, having run
    /// `seconds` (it takes at least that); `None`: it finished.
    killed: Option<String>,
}

/// Which step of which problem `Spending` is asked about: the kind of step (`measure`), the
/// problem's group (its folder) and the problem itself.
#[derive(Debug, Clone, Copy)]
pub struct StepOf<'a> {
    pub step: &'a str,
    pub group: &'a str,
    pub problem: &'a str,
}

/// Whether a step starts (`Spending::admit`).
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    Start,
    /// It starts with `seconds` for its own bounded part and must end within `end_seconds`;
    /// `why` says so.
    Bounded {
        seconds: f64,
        end_seconds: f64,
        why: String,
    },
    /// It does not start: why.
    Refused(String),
}

/// What a step is expected to take (`Spending::expected_s`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The upper quartile of its kind's steps' wall seconds, or the problem's own floor.
    pub seconds: f64,
    /// How many steps the quartile is of.
    pub of: usize,
    /// How many of those were left unfinished by a killed run (counted at what they had run).
    pub killed: usize,
    /// Whether they are the problem's group's own (else every group's: none of its own yet).
    pub in_group: bool,
    /// What `seconds` is.
    pub basis: Basis,
}

/// What an `Estimate`'s seconds are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The upper quartile, a finished step's seconds.
    Quartile,
    /// The upper quartile, an unfinished step's seconds: its kind takes at least about that.
    QuartileKilled,
    /// The problem's own step was left unfinished by a killed run, or ended bounded, after this
    /// long, no less than the quartile: it takes at least that.
    OwnFloor,
}

impl Estimate {
    /// Whether `seconds` is a lower bound (a killed or bounded step's), not a finished step's
    /// length.
    pub fn at_least(&self) -> bool {
        self.basis != Basis::Quartile
    }

    /// What a step takes, and from what: "at least 525 s here (this problem's had run …)" or
    /// "about 117 s here (the upper quartile of …)".
    fn took(&self, group: &str) -> String {
        if self.basis == Basis::OwnFloor {
            return format!(
                "at least {:.0} s here (this problem's had run that long when its run was killed or it ended bounded)",
                self.seconds
            );
        }
        let among = if self.in_group { format!("{group}'s") } else { "every folder's".to_string() };
        let killed = match self.killed {
            0 => String::new(),
            k => format!(", {k} of them unfinished when a run was killed, counted at what they had run"),
        };
        let lead = if self.basis == Basis::QuartileKilled { "at least about" } else { "about" };
        format!("{lead} {:.0} s here (the upper quartile of {among} {}{killed})", self.seconds, self.of)
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
            held: Mutex::default(),
            bounded: Mutex::default(),
        }
    }

    /// Count a finished step's wall seconds towards what a step of its kind and group is
    /// expected to take. Its problem's unfinished one of a killed run, if counted, goes: the
    /// finished length replaces the lower bound.
    pub fn observe(&self, of: StepOf<'_>, seconds: f64) {
        if seconds.is_finite() && seconds >= 0.0 {
            let mut d = self.durations.lock().unwrap_or_else(|e| e.into_inner());
            let xs = d.entry((of.step.to_string(), of.group.to_string())).or_default();
            xs.retain(|x| x.killed.as_deref() != Some(of.problem));
            xs.push(Sample { seconds, killed: None });
            drop(d);
            let mut bounded = self.bounded.lock().unwrap_or_else(|e| e.into_inner());
            bounded.remove(&(of.step.to_string(), of.problem.to_string()));
        }
    }

    /// Count a step of an earlier run that ran bounded (its deadlines cut it, or it started
    /// bounded) and ended after its work ran `seconds`: its problem's step takes at least that
    /// (the longest, if counted twice), until one finishes in full. Not a sample of its kind:
    /// the deadlines were its run's budget's, and a step cut at a budget's end says how long
    /// the budget was, not how long its siblings take.
    pub fn observe_bounded(&self, of: StepOf<'_>, seconds: f64) {
        if seconds.is_finite() && seconds > 0.0 {
            let mut bounded = self.bounded.lock().unwrap_or_else(|e| e.into_inner());
            let floor = bounded.entry((of.step.to_string(), of.problem.to_string())).or_insert(seconds);
            *floor = floor.max(seconds);
        }
    }

    /// Per step name, what `problem`'s step is known to take at least: the longest it ran
    /// bounded, or had run when a run was killed, until one ran in full (`observe` clears the
    /// bounded one and replaces the killed sample). What a decisions file carries to a fresh
    /// journal on another machine (`Decisions::set_floors`).
    pub fn floors_of(&self, problem: &str) -> BTreeMap<String, f64> {
        let mut floors: BTreeMap<String, f64> = BTreeMap::new();
        let mut keep = |step: &str, seconds: f64| {
            let f = floors.entry(step.to_string()).or_insert(seconds);
            *f = f.max(seconds);
        };
        for ((step, p), seconds) in self.bounded.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if p == problem {
                keep(step, *seconds);
            }
        }
        for ((step, _), samples) in self.durations.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            for x in samples.iter().filter(|x| x.killed.as_deref() == Some(problem)) {
                keep(step, x.seconds);
            }
        }
        floors
    }

    /// Count an unfinished step of an earlier, killed run: it had run `seconds` when its run was
    /// killed (`Journal::floor_seconds`). It counts among its kind and group's steps at that,
    /// and its problem's step takes at least that (the longest, if counted twice).
    pub fn observe_unfinished(&self, of: StepOf<'_>, seconds: f64) {
        if seconds.is_finite() && seconds > 0.0 {
            let mut d = self.durations.lock().unwrap_or_else(|e| e.into_inner());
            let xs = d.entry((of.step.to_string(), of.group.to_string())).or_default();
            match xs.iter_mut().find(|x| x.killed.as_deref() == Some(of.problem)) {
                Some(x) => x.seconds = x.seconds.max(seconds),
                None => xs.push(Sample { seconds, killed: Some(of.problem.to_string()) }),
            }
        }
    }

    /// What the step `of` is expected to take: the upper quartile (nearest rank) of its kind's
    /// steps in its group, else in every group (the `Estimate` says which, how many there were
    /// and how many of them a killed run left unfinished), and never less than what its own
    /// problem's step had run when a run was killed or it ended bounded; `None` before one
    /// finished or was killed, and the problem's own ran bounded.
    /// Not the median: a step that runs past the budget is killed with its work lost, one held
    /// back only waits for the next run.
    pub fn expected_s(&self, of: StepOf<'_>) -> Option<Estimate> {
        let d = self.durations.lock().unwrap_or_else(|e| e.into_inner());
        let own = d.get(&(of.step.to_string(), of.group.to_string())).filter(|xs| !xs.is_empty());
        let mut xs: Vec<&Sample> = match own {
            Some(xs) => xs.iter().collect(),
            None => d.iter().filter(|((s, _), _)| s == of.step).flat_map(|(_, xs)| xs).collect(),
        };
        xs.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
        let bounded = self.bounded.lock().unwrap_or_else(|e| e.into_inner());
        let bounded = bounded.get(&(of.step.to_string(), of.problem.to_string())).copied();
        let killed_floor = xs.iter().filter(|x| x.killed.as_deref() == Some(of.problem)).map(|x| x.seconds).next();
        let floor = killed_floor.into_iter().chain(bounded).reduce(f64::max);
        let n = xs.len();
        let Some(q) = (3 * n).div_ceil(4).checked_sub(1).and_then(|i| xs.get(i)) else {
            // No step of its kind finished or was killed yet: its own floor alone, if bounded.
            let (of, killed, in_group, basis) = (0, 0, false, Basis::OwnFloor);
            return floor.map(|seconds| Estimate { seconds, of, killed, in_group, basis });
        };
        let killed = xs.iter().filter(|x| x.killed.is_some()).count();
        let basis = if q.killed.is_some() { Basis::QuartileKilled } else { Basis::Quartile };
        let quartile = Estimate { seconds: q.seconds, of: n, killed, in_group: own.is_some(), basis };
        Some(match floor {
            Some(f) if f >= q.seconds => Estimate { seconds: f, basis: Basis::OwnFloor, ..quartile },
            _ => quartile,
        })
    }

    /// Why the step `of`, which cannot bound itself, must not start (`None`: it may): `admit`'s
    /// refusal, for the tests.
    #[cfg(test)]
    fn refuses(&self, of: StepOf<'_>) -> Option<String> {
        match self.admit(of, false) {
            Admission::Refused(why) => Some(why),
            Admission::Start | Admission::Bounded { .. } => None,
        }
    }

    /// Whether the step `of` starts, and how: refused when a budget is spent or the wall
    /// budget's remainder is below what the step is expected to take, except that a step that
    /// `bounds_itself` (a measure step: `--prepare-until`; a config step: `--tune-until`), which
    /// killed or bounded runs showed to take longer than the whole wall budget (its own problem's, or its kind's quartile), starts
    /// bounded while at least `BOUNDED_START` of the budget is left (a run's start): held back,
    /// it would never start in a run of this budget, and unbounded it would be killed again.
    pub fn admit(&self, of: StepOf<'_>, bounds_itself: bool) -> Admission {
        if let Some(which) = self.spent() {
            return Admission::Refused(format!("the {which} budget is spent"));
        }
        let Some(budget) = self.budget.wall_s else { return Admission::Start };
        let left = budget - self.wall_s();
        let Some(e) = self.expected_s(of) else { return Admission::Start };
        if e.seconds <= left {
            return Admission::Start;
        }
        let (step, group) = (of.step, of.group);
        if bounds_itself && self.starts_bounded(&e, budget) {
            let seconds = BOUNDED_SHARE * left;
            let then = match step {
                "config" => {
                    format!("it tunes kernels while their tuning and the result's compiles end within {seconds:.0} s")
                }
                _ => format!("it prepares variants for {seconds:.0} s, then times those"),
            };
            let why = format!(
                "no {step} step fits a --budget-wall-s of {budget:.0} in full: one takes {}; {then}",
                e.took(group)
            );
            return Admission::Bounded { seconds, end_seconds: BOUNDED_END_SHARE * left, why };
        }
        let took = e.took(group);
        let never = if bounds_itself && Self::bounded_at_a_runs_start(&e, budget) {
            format!(
                "; it starts bounded at a run's start (with {:.0} % of the --budget-wall-s of {budget:.0} left)",
                BOUNDED_START * 100.0
            )
        } else if e.seconds > budget {
            format!("; none fits a --budget-wall-s of {budget:.0}")
        } else {
            String::new()
        };
        Admission::Refused(self.hold(format!("{}{never}", short_of(step, &took, left))))
    }

    /// Whether the step `of` would start in full now: no budget spent, and the wall budget's
    /// remainder holds what it is expected to take. A bounded result of an earlier run (a
    /// stopgap: its variants left out) is then not taken; the step runs in full instead.
    pub fn fits_in_full(&self, of: StepOf<'_>) -> bool {
        if self.spent().is_some() {
            return false;
        }
        let Some(budget) = self.budget.wall_s else { return true };
        let left = budget - self.wall_s();
        self.expected_s(of).is_none_or(|e| e.seconds <= left)
    }

    /// Whether a step expected to take `seconds` in full would start in full now: no budget
    /// spent, and the wall budget's remainder holds it (`fits_in_full` with a length the caller
    /// knows better, `kforge optimize`'s extrapolation of a bounded result).
    pub fn holds_s(&self, seconds: f64) -> bool {
        if self.spent().is_some() {
            return false;
        }
        self.budget.wall_s.is_none_or(|budget| seconds <= budget - self.wall_s())
    }

    /// The safety net's deadlines of a step admitted in full, in seconds from now (its
    /// preparation's and its end's: `SAFETY_PART_SHARE` and `SAFETY_END_SHARE` of the wall
    /// budget's remainder); `None` without a wall budget or with none left.
    pub fn safety_net(&self) -> Option<(f64, f64)> {
        let left = self.budget.wall_s? - self.wall_s();
        (left > 0.0).then_some((SAFETY_PART_SHARE * left, SAFETY_END_SHARE * left))
    }

    /// Count a step held back by the wall budget (the first one's reason kept); returns `why`.
    fn hold(&self, why: String) -> String {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.0 += 1;
        held.1.get_or_insert_with(|| why.clone());
        why
    }

    /// Why the step `of`, admitted earlier but whose job the daemon starts only now (it waited in
    /// the daemon's queue: GPU memory, slots), must not run after all (`None`: it may): the wall
    /// budget is spent, or its remainder is below what the step is expected to take. Run, it would
    /// outlive the budget and be killed with its work lost; withdrawn, it waits for the next
    /// run, and is counted among the steps held back. A step started bounded is not asked (its
    /// deadline holds whenever it starts).
    pub fn no_longer_fits(&self, of: StepOf<'_>) -> Option<String> {
        let budget = self.budget.wall_s?;
        let left = budget - self.wall_s();
        let why = if left <= 0.0 {
            "the wall budget is spent".to_string()
        } else {
            let e = self.expected_s(of).filter(|e| e.seconds > left)?;
            short_of(of.step, &e.took(of.group), left)
        };
        Some(self.hold(why))
    }

    /// Whether a step that bounds itself, expected to take `e`, starts bounded now: killed runs
    /// showed it to take longer than the whole `budget`, and at least `BOUNDED_START` of the
    /// budget is left (a run's start).
    fn starts_bounded(&self, e: &Estimate, budget: f64) -> bool {
        Self::bounded_at_a_runs_start(e, budget) && budget - self.wall_s() >= BOUNDED_START * budget
    }

    /// Whether a step that bounds itself, expected to take `e`, starts bounded at a run's start:
    /// killed or bounded runs showed it to take longer than the whole `budget`.
    fn bounded_at_a_runs_start(e: &Estimate, budget: f64) -> bool {
        e.at_least() && e.seconds > budget
    }

    /// Whether the step `of` starts only at a run's start, bounded: its own problem's step, left
    /// unfinished by a killed run or ended bounded, had run longer than the whole wall budget (a
    /// campaign starts such a problem first, so that it is not held back again).
    pub fn starts_only_at_a_runs_start(&self, of: StepOf<'_>) -> bool {
        let (Some(budget), Some(e)) = (self.budget.wall_s, self.expected_s(of)) else { return false };
        e.basis == Basis::OwnFloor && Self::bounded_at_a_runs_start(&e, budget)
    }

    /// Why the step `of` cannot run in a run of this wall budget (`None`: it can, or nothing
    /// says otherwise): its estimate exceeds the whole budget, and it cannot start bounded
    /// either (`bounds_itself`, at a run's start: [`Spending::admit`]; later in a run, `admit`
    /// holds it back for the next run's start). An optional step (the config agent's) is then
    /// skipped rather than held back forever.
    pub fn never_fits(&self, of: StepOf<'_>, bounds_itself: bool) -> Option<String> {
        let budget = self.budget.wall_s?;
        let e = self.expected_s(of)?;
        (e.seconds > budget && !(bounds_itself && Self::bounded_at_a_runs_start(&e, budget))).then(|| {
            format!("no {} step fits a --budget-wall-s of {budget:.0}: one takes {}", of.step, e.took(of.group))
        })
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

/// Why a step does not fit what is left of the wall budget: "a measure step takes about 400 s
/// here (…), 100 s of the wall budget are left".
fn short_of(step: &str, took: &str, left: f64) -> String {
    format!("a {step} step takes {took}, {:.0} s of the wall budget are left", left.max(0.0))
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
    use std::time::Duration;

    #[test]
    fn a_step_whose_job_starts_late_is_withdrawn_when_the_rest_cannot_hold_it() {
        let of = StepOf { step: "measure", group: "level1", problem: "level1/a.py" };
        let none = Spending::new(Budget { gpu_s: Some(10.0), wall_s: None });
        none.observe(of, 1e6);
        assert_eq!(none.no_longer_fits(of), None, "no wall budget: nothing to outlive");
        let s = Spending::since(Budget { gpu_s: None, wall_s: Some(100.0) }, Instant::now());
        assert_eq!(s.no_longer_fits(of), None, "nothing says what it takes: it runs");
        s.observe(of, 40.0);
        assert_eq!(s.no_longer_fits(of), None, "40 s fit in the ~100 s left");
        s.observe(StepOf { problem: "level1/b.py", ..of }, 400.0);
        assert_eq!(
            s.no_longer_fits(of).as_deref(),
            Some("a measure step takes about 400 s here (the upper quartile of level1's 2), 100 s of the wall budget are left")
        );
        let late = Spending::since(Budget { gpu_s: None, wall_s: Some(1.0) }, Instant::now() - Duration::from_secs(5));
        assert_eq!(late.no_longer_fits(of).as_deref(), Some("the wall budget is spent"));
        assert_eq!(
            (s.status().held_back, late.status().held_back, none.status().held_back),
            (1, 1, 0),
            "each withdrawal counts among the steps held back"
        );
    }

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

    /// A step of kind `step` of the problem `problem` in folder `group`.
    fn of<'a>(step: &'a str, group: &'a str, problem: &'a str) -> StepOf<'a> {
        StepOf { step, group, problem }
    }

    /// Finished steps of kind `step` in `group`, one problem each (`group/pN.py`).
    fn finished(s: &Spending, step: &str, group: &str, seconds: &[f64]) {
        for (i, secs) in seconds.iter().enumerate() {
            s.observe(of(step, group, &format!("{group}/p{i}.py")), *secs);
        }
    }

    #[test]
    fn a_step_the_wall_budget_cannot_hold_does_not_start() {
        let s = Spending::new(Budget::new(None, Some(100.0)).unwrap());
        let m1 = of("measure", "level1", "level1/x.py");
        let r1 = of("result", "level1", "level1/x.py");
        assert_eq!(s.refuses(m1), None, "nothing finished yet: no estimate, it starts");
        finished(&s, "measure", "level1", &[80.0, 150.0, 120.0]);
        s.observe(r1, 0.5);
        s.observe(r1, f64::NAN); // not a duration
        let est = |o| s.expected_s(o).map(|e| (e.seconds, e.of, e.in_group, e.basis));
        assert_eq!(est(m1), Some((150.0, 3, true, Basis::Quartile)), "the upper quartile, nearest rank");
        assert_eq!(est(r1), Some((0.5, 1, true, Basis::Quartile)));
        finished(&s, "result", "level1", &[1.5, 1.0, 2.0]);
        assert_eq!(est(r1), Some((1.5, 4, true, Basis::Quartile)), "the third of four");
        assert_eq!(s.status().held_back, 0);
        let why = s.refuses(m1).expect("150 s expected, under 100 s left");
        assert!(why.contains("a measure step takes about 150 s here (the upper quartile of level1's 3)"), "{why}");
        assert!(why.ends_with("; none fits a --budget-wall-s of 100"), "150 s never fit 100: {why}");
        assert!(why.contains("s of the wall budget are left"), "{why}");
        assert_eq!(s.refuses(r1), None, "a short step still fits");
        s.refuses(m1);
        let st = s.status();
        assert_eq!((st.held_back, st.held_why.as_deref()), (2, Some(why.as_str())), "counted, the first reason kept");
        assert!(
            st.line().contains(&format!("; 2 step(s) held back ({why}): a larger --budget-wall-s")),
            "{}",
            st.line()
        );
        assert_eq!(s.refuses(of("verify", "level1", "level1/x.py")), None, "a kind never finished: no estimate");
        let gpu_only = Spending::new(Budget::new(Some(10.0), None).unwrap());
        gpu_only.observe(m1, 1e6);
        assert_eq!(gpu_only.refuses(m1), None, "no wall budget: durations do not matter");
        gpu_only.charge(10.0);
        assert_eq!(gpu_only.refuses(r1).as_deref(), Some("the gpu budget is spent"));
    }

    #[test]
    fn a_folder_is_estimated_by_its_own_steps_once_it_has_some() {
        let s = Spending::new(Budget::new(None, Some(100.0)).unwrap());
        finished(&s, "measure", "level1", &[20.0, 30.0, 40.0, 50.0]);
        let m = |group| of("measure", group, "a.py");
        let est = |group| s.expected_s(m(group)).map(|e| (e.seconds, e.of, e.in_group));
        assert_eq!(est("level3"), Some((40.0, 4, false)), "none of its own: every folder's");
        assert_eq!(s.refuses(m("level3")), None, "40 s fit");
        finished(&s, "measure", "level3", &[180.0]);
        assert_eq!(est("level3"), Some((180.0, 1, true)), "its own, once it has one");
        assert_eq!(est("level1"), Some((40.0, 4, true)), "another folder's steps do not move level1's");
        let why = s.refuses(m("level3")).expect("180 s expected");
        assert!(why.contains("the upper quartile of level3's 1)"), "{why}");
        finished(&s, "measure", "level2", &[500.0]);
        let pooled = s.expected_s(m("elsewhere")).unwrap();
        assert_eq!((pooled.seconds, pooled.of, pooled.in_group), (180.0, 6, false), "every folder's six");
        let why = s.refuses(m("elsewhere")).expect("180 s expected");
        assert!(why.contains("the upper quartile of every folder's 6)"), "{why}");
    }

    #[test]
    fn a_step_killed_unfinished_is_its_problems_floor_and_one_of_its_folders_steps() {
        // Level 3 as session 13 left it: seven measure steps finished in 175-360 s, the GRU's
        // and the LSTM's killed after 525 s.
        let s = Spending::new(Budget::new(None, Some(480.0)).unwrap());
        finished(&s, "measure", "level3", &[266.0, 244.0, 318.0, 360.0, 175.0, 246.0, 309.0]);
        let (gru, lstm, moe) = ("level3/008_gru.py", "level3/009_lstm.py", "level3/010_moe.py");
        s.observe_unfinished(of("measure", "level3", gru), 500.0);
        s.observe_unfinished(of("measure", "level3", gru), 525.0); // the longer of two counts
        s.observe_unfinished(of("measure", "level3", lstm), 525.0);
        s.observe_unfinished(of("measure", "level3", moe), f64::NAN); // not a duration
        let e = s.expected_s(of("measure", "level3", gru)).unwrap();
        assert_eq!((e.seconds, e.basis, e.of, e.killed), (525.0, Basis::OwnFloor, 9, 2), "its own floor");
        let why = s.refuses(of("measure", "level3", gru)).expect("at least 525 s, 480 s budget");
        assert!(
            why.contains(
                "a measure step takes at least 525 s here (this problem's had run that long when its run was killed or it ended bounded)"
            ),
            "{why}"
        );
        assert!(why.ends_with("; none fits a --budget-wall-s of 480"), "{why}");
        let sibling = s.expected_s(of("measure", "level3", moe)).unwrap();
        assert_eq!(
            (sibling.seconds, sibling.basis),
            (360.0, Basis::Quartile),
            "a sibling: the upper quartile of nine, the two killed counted at 525 s"
        );
        assert_eq!(s.refuses(of("measure", "level3", moe)), None, "360 s fit 480: the GRU does not hold it back");
        assert_eq!(s.expected_s(of("verify", "level3", gru)), None, "another kind has no floor");
        s.observe(of("measure", "level3", gru), 700.0);
        let e = s.expected_s(of("measure", "level3", gru)).unwrap();
        assert_eq!((e.of, e.killed, e.basis), (9, 1, Basis::Quartile), "finished: its length replaces its floor");
    }

    #[test]
    fn a_folder_of_killed_steps_only_is_estimated_at_least_at_their_quartile() {
        // Session 12: seven level-3 measure steps killed after 193-360 s, none finished.
        let s = Spending::new(Budget::new(None, Some(300.0)).unwrap());
        finished(&s, "measure", "level1", &[20.0, 30.0, 40.0, 50.0]);
        for (i, secs) in [193.0, 250.0, 280.0, 300.0, 320.0, 340.0, 360.0].iter().enumerate() {
            s.observe_unfinished(of("measure", "level3", &format!("level3/k{i}.py")), *secs);
        }
        let e = s.expected_s(of("measure", "level3", "level3/new.py")).unwrap();
        assert_eq!((e.seconds, e.basis, e.in_group), (340.0, Basis::QuartileKilled, true), "not level 1's 40 s");
        let why = s.refuses(of("measure", "level3", "level3/new.py")).expect("at least about 340 s");
        assert!(
            why.contains("takes at least about 340 s here (the upper quartile of level3's 7, 7 of them unfinished when a run was killed, counted at what they had run)"),
            "{why}"
        );
        assert_eq!(s.refuses(of("measure", "level1", "level1/a.py")), None, "level 1 keeps its own 40 s");
    }

    #[test]
    fn a_bounded_step_is_its_own_problems_floor_not_a_sample_of_its_kind() {
        let s = Spending::new(Budget { wall_s: Some(430.0), ..Budget::default() });
        let of = |problem| StepOf { step: "measure", group: "level3", problem };
        s.observe_bounded(of("level3/004.py"), 217.0);
        s.observe_bounded(of("level3/004.py"), 462.0);
        s.observe_bounded(of("level3/004.py"), 300.0);
        let e = s.expected_s(of("level3/004.py")).unwrap();
        assert_eq!(
            (e.seconds, e.basis, e.of),
            (462.0, Basis::OwnFloor, 0),
            "the longest bounded run, with no sample at all"
        );
        assert_eq!(s.expected_s(of("level3/007.py")), None, "a sibling: no estimate from it");
        assert!(!s.fits_in_full(of("level3/004.py")), "462 s do not fit 430: its bounded result is taken");
        s.observe(of("level3/001.py"), 100.0);
        assert_eq!(s.expected_s(of("level3/007.py")).unwrap().seconds, 100.0, "the sibling's quartile is its kind's");
        assert_eq!(s.expected_s(of("level3/004.py")).unwrap().seconds, 462.0, "the floor over the quartile");
        s.observe(of("level3/004.py"), 380.0);
        let e = s.expected_s(of("level3/004.py")).unwrap();
        assert_eq!((e.seconds, e.basis), (380.0, Basis::Quartile), "finished in full since: no floor");
    }

    #[test]
    fn a_problems_floors_are_its_bounded_and_killed_steps_until_one_runs_in_full() {
        let s = Spending::new(Budget { wall_s: Some(430.0), ..Budget::default() });
        let step = |step, problem| StepOf { step, group: "level3", problem };
        s.observe_bounded(step("measure", "level3/004.py"), 189.0);
        s.observe_bounded(step("measure", "level3/004.py"), 462.0);
        s.observe_unfinished(step("config", "level3/004.py"), 120.0);
        s.observe_unfinished(step("measure", "level3/007.py"), 300.0);
        s.observe(step("measure", "level3/001.py"), 100.0);
        let floors = s.floors_of("level3/004.py");
        assert_eq!(floors, [("config".to_string(), 120.0), ("measure".to_string(), 462.0)].into());
        assert_eq!(s.floors_of("level3/007.py"), [("measure".to_string(), 300.0)].into());
        assert!(s.floors_of("level3/001.py").is_empty(), "a full step is a sample, not a floor");
        s.observe(step("measure", "level3/004.py"), 380.0);
        s.observe(step("measure", "level3/007.py"), 250.0);
        assert_eq!(s.floors_of("level3/004.py").keys().collect::<Vec<_>>(), ["config"], "ran in full since");
        assert!(s.floors_of("level3/007.py").is_empty(), "its killed sample replaced by the full one");
    }

    #[test]
    fn a_self_bounding_step_no_budget_holds_starts_bounded_at_a_runs_start() {
        let s = Spending::new(Budget::new(None, Some(300.0)).unwrap());
        let m = of("measure", "level3", "level3/a.py");
        s.observe_unfinished(m, 360.0);
        match s.admit(m, true) {
            Admission::Bounded { seconds, end_seconds, why } => {
                assert!(seconds > 0.6 * 300.0 && seconds <= BOUNDED_SHARE * 300.0, "{seconds}");
                let end = end_seconds / BOUNDED_END_SHARE;
                assert!(end_seconds > seconds && (end - seconds / BOUNDED_SHARE).abs() < 1e-9, "{end_seconds}");
                assert!(why.starts_with("no measure step fits a --budget-wall-s of 300 in full: one takes at least 360 s here (this problem's had run that long when its run was killed or it ended bounded); it prepares variants for"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.status().held_back, 0, "a bounded start is not held back");
        assert!(!s.fits_in_full(m), "its floor, 360 s, is more than the 300 s budget");
        let larger = Spending::new(Budget::new(None, Some(400.0)).unwrap());
        larger.observe_unfinished(m, 360.0);
        assert!(larger.fits_in_full(m), "a budget that holds the floor runs it in full");
        assert!(Spending::new(Budget::default()).fits_in_full(m), "no budget: in full");
        assert!(larger.holds_s(360.0) && !larger.holds_s(1744.0), "a length the caller judged longer");
        assert!(Spending::new(Budget::default()).holds_s(1e9), "no budget holds any length");
        let (part, end) = larger.safety_net().unwrap();
        assert!(part > 0.99 * 400.0 && part <= 400.0 && end > part && end <= 1.1 * 400.0, "{part} {end}");
        assert_eq!(Spending::new(Budget::default()).safety_net(), None, "no wall budget: no net");
        assert!(matches!(s.admit(m, false), Admission::Refused(_)), "a step that cannot bound itself is held");
        let sibling = of("measure", "level3", "level3/b.py");
        assert!(
            matches!(s.admit(sibling, true), Admission::Bounded { .. }),
            "its folder's only step was killed after 360 s: a sibling is bounded too"
        );
        finished(&s, "measure", "level3", &[100.0, 120.0, 140.0]);
        assert_eq!(
            s.admit(sibling, true),
            Admission::Start,
            "three finished in 140 s or less: a sibling starts in full"
        );
        assert!(matches!(s.admit(m, true), Admission::Bounded { .. }), "the killed one's own floor stays");
        let c = of("config", "level3", "level3/a.py");
        s.observe_unfinished(c, 526.0);
        match s.admit(c, true) {
            Admission::Bounded { why, .. } => assert!(
                why.contains("it tunes kernels while their tuning and the result's compiles end within"),
                "{why}"
            ),
            other => panic!("a config step bounds itself too: {other:?}"),
        }
        let b = of("beam", "level3", "level3/a.py");
        s.observe_unfinished(b, 200.0);
        assert_eq!(s.admit(b, true), Admission::Start, "200 s fit what is left: unbounded");
        let v = of("verify", "level1", "level1/a.py");
        s.observe(v, 1000.0);
        assert!(matches!(s.admit(v, true), Admission::Refused(_)), "a finished step's length is not a floor: held");
        let late = Spending::since(
            Budget::new(None, Some(300.0)).unwrap(),
            Instant::now() - std::time::Duration::from_secs(100),
        );
        late.observe_unfinished(m, 360.0);
        assert!(matches!(late.admit(m, true), Admission::Refused(_)), "two thirds left: not a run's start");
        assert_eq!(Spending::new(Budget::default()).admit(m, true), Admission::Start, "no budget");
    }

    #[test]
    fn an_optional_step_no_run_of_the_budget_holds_is_said_so() {
        let s = Spending::new(Budget::new(None, Some(300.0)).unwrap());
        let c = of("config", "level3", "level3/a.py");
        assert_eq!(s.never_fits(c, false), None, "nothing known: it may fit");
        finished(&s, "config", "level3", &[250.0]);
        assert_eq!(s.never_fits(c, false), None, "250 s fit 300");
        s.observe_unfinished(c, 420.0);
        assert_eq!(
            s.never_fits(c, false).as_deref(),
            Some("no config step fits a --budget-wall-s of 300: one takes at least 420 s here (this problem's had run that long when its run was killed or it ended bounded)")
        );
        let sibling = of("config", "level3", "level3/b.py");
        let why = s.never_fits(sibling, false).expect("of two, the upper quartile is the killed one's 420 s");
        assert!(why.ends_with("one takes at least about 420 s here (the upper quartile of level3's 2, 1 of them unfinished when a run was killed, counted at what they had run)"), "{why}");
        finished(&s, "config", "level3", &[200.0, 210.0]);
        assert_eq!(s.never_fits(sibling, false), None, "of four, the upper quartile is 250 s");
        assert!(s.never_fits(c, false).is_some(), "its own floor stays");
        assert_eq!(Spending::new(Budget::default()).never_fits(c, false), None, "no wall budget");
        assert_eq!(s.never_fits(c, true), None, "a run's start: it starts bounded instead");
        let late = Spending::since(
            Budget::new(None, Some(300.0)).unwrap(),
            Instant::now() - std::time::Duration::from_secs(100),
        );
        late.observe_unfinished(c, 420.0);
        assert_eq!(late.never_fits(c, true), None, "two thirds left: not skipped, it starts bounded in the next run");
        match late.admit(c, true) {
            Admission::Refused(why) => assert!(
                why.ends_with("; it starts bounded at a run's start (with 75 % of the --budget-wall-s of 300 left)"),
                "{why}"
            ),
            other => panic!("held back for the next run's start: {other:?}"),
        }
        assert!(late.never_fits(c, false).is_some(), "one that cannot bound itself is skipped");
        assert!(late.starts_only_at_a_runs_start(c), "its own floor is over the budget");
        let sibling = of("config", "level3", "level3/b.py");
        assert!(late.expected_s(sibling).is_some_and(|e| e.at_least()), "the group's quartile is the killed one's");
        assert!(!late.starts_only_at_a_runs_start(sibling), "a sibling's floor is not its own");
        assert!(!Spending::new(Budget::default()).starts_only_at_a_runs_start(c), "no wall budget");
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
