//! Budgets in tokens and money, per run and per problem, and the [`Meter`] that enforces them.
//!
//! A call is admitted only while every limit that applies has something left, and its reply's
//! length is clamped to what is left (the prompt's estimated tokens and cost taken off first),
//! so a run stops at its limit, not one long reply past it. Admitted calls hold their
//! allowance until charged or released, so calls in flight at once cannot together pass a
//! limit either (as far as the estimate of their prompts is right).

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex};

use serde::Serialize;

use crate::chat::Usage;
use crate::config::Price;
use crate::{LlmError, Scope};

/// The limits; `None`: unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Limits {
    /// Tokens (prompt + completion) of all calls of the run.
    pub run_tokens: Option<u64>,
    /// US dollars of all calls of the run.
    pub run_usd: Option<f64>,
    /// Tokens of the calls of any one problem.
    pub problem_tokens: Option<u64>,
    /// US dollars of the calls of any one problem.
    pub problem_usd: Option<f64>,
}

/// What was spent: calls charged, tokens (prompt + completion), US dollars.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Spent {
    /// Calls charged.
    pub calls: u64,
    /// Prompt plus completion tokens.
    pub tokens: u64,
    /// US dollars.
    pub usd: f64,
}

/// What the run spent, in all and per problem.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Spending {
    /// All calls.
    pub total: Spent,
    /// The calls of each problem (by [`Scope::problem`]).
    pub problems: BTreeMap<String, Spent>,
}

/// The unit of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Unit {
    /// Prompt plus completion tokens.
    Tokens,
    /// US dollars.
    Usd,
}

/// One limit that applies to a call and how much of it is left.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Left {
    /// E.g. `tokens of the run`, `usd of problem level1/a.py`.
    pub what: String,
    /// What the limit counts.
    pub unit: Unit,
    /// The limit, in `unit`.
    pub limit: f64,
    /// Spent plus held by calls in flight.
    pub spent: f64,
}

impl Left {
    /// What is left (never negative).
    pub fn left(&self) -> f64 {
        (self.limit - self.spent).max(0.0)
    }

    fn refusal(&self) -> LlmError {
        LlmError::Budget { what: self.what.clone(), limit: self.limit, spent: self.spent }
    }
}

/// The limits that apply to a scope now, each with what is left.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Allowance {
    /// Every limit that applies (none: unlimited).
    pub limits: Vec<Left>,
}

impl Allowance {
    /// The most reply tokens a call may ask for so that no limit is passed, given its prompt's
    /// estimated tokens and the model's price (`None`: no limit applies). `Err` when not even
    /// one reply token fits: the limit that binds is named.
    pub fn reply_cap(&self, prompt_tokens: u64, price: Option<&Price>) -> Result<Option<u64>, LlmError> {
        let mut cap: Option<(u64, &Left)> = None;
        for l in &self.limits {
            let tokens = match l.unit {
                Unit::Tokens => (l.left() - prompt_tokens as f64).max(0.0).floor() as u64,
                Unit::Usd => match price {
                    // Unpriced: money is never spent, so a USD limit does not bind.
                    None => continue,
                    Some(p) => {
                        let after_prompt = l.left() - prompt_tokens as f64 * p.input_usd_per_mtok / 1e6;
                        if p.output_usd_per_mtok <= 0.0 {
                            if after_prompt > 0.0 {
                                continue;
                            }
                            0
                        } else {
                            // The epsilon absorbs decimal prices' rounding (0.011 - 0.001 is 0.00999…).
                            (after_prompt.max(0.0) * 1e6 / p.output_usd_per_mtok + 1e-6).floor() as u64
                        }
                    }
                },
            };
            if cap.is_none_or(|(c, _)| tokens < c) {
                cap = Some((tokens, l));
            }
        }
        match cap {
            Some((0, l)) => Err(l.refusal()),
            other => Ok(other.map(|(c, _)| c)),
        }
    }
}

/// What an admitted call holds against the limits until it is charged or released.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    problem: String,
    tokens: u64,
    usd: f64,
    /// The reply's length limit to send (the request's, clamped to the allowance).
    pub max_tokens: Option<u64>,
}

#[derive(Debug, Default)]
struct Ledger {
    spent: Spending,
    held_total: (u64, f64),
    held: BTreeMap<String, (u64, f64)>,
}

/// Counts what calls spend and refuses calls once a limit is reached. Thread-safe.
#[derive(Debug, Default)]
pub struct Meter {
    limits: Limits,
    ledger: Mutex<Ledger>,
    /// Told whenever a hold is freed (charged or released).
    freed: Condvar,
}

impl Meter {
    /// A meter enforcing `limits`.
    pub fn new(limits: Limits) -> Meter {
        Meter { limits, ledger: Mutex::new(Ledger::default()), freed: Condvar::new() }
    }

    /// The limits it enforces.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        // A panic elsewhere while holding the lock leaves whole numbers behind; keep counting.
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Before a call: refuses with [`LlmError::Budget`] when a limit that applies to `scope` is
    /// already reached, else says what is left of each.
    pub fn check(&self, scope: &Scope) -> Result<Allowance, LlmError> {
        let allowance = self.allowance(&self.ledger(), &scope.problem);
        match allowance.limits.iter().find(|l| l.left() <= 0.0) {
            Some(l) => Err(l.refusal()),
            None => Ok(allowance),
        }
    }

    fn allowance(&self, ledger: &Ledger, problem: &str) -> Allowance {
        let total = ledger.spent.total;
        let spent = ledger.spent.problems.get(problem).copied().unwrap_or_default();
        let held = ledger.held.get(problem).copied().unwrap_or_default();
        let (run_held_tokens, run_held_usd) = ledger.held_total;
        let mut limits = Vec::new();
        let mut add = |limit: Option<f64>, what: String, unit, spent: f64| {
            if let Some(limit) = limit {
                limits.push(Left { what, unit, limit, spent });
            }
        };
        let of_problem = |unit: &str| format!("{unit} of problem {problem}");
        add(
            self.limits.run_tokens.map(|t| t as f64),
            "tokens of the run".into(),
            Unit::Tokens,
            (total.tokens + run_held_tokens) as f64,
        );
        add(self.limits.run_usd, "usd of the run".into(), Unit::Usd, total.usd + run_held_usd);
        add(
            self.limits.problem_tokens.map(|t| t as f64),
            of_problem("tokens"),
            Unit::Tokens,
            (spent.tokens + held.0) as f64,
        );
        add(self.limits.problem_usd, of_problem("usd"), Unit::Usd, spent.usd + held.1);
        Allowance { limits }
    }

    /// Admits a call atomically: checks the limits, clamps `max_tokens` (the request's) to
    /// what is left after the prompt's `prompt_tokens` (estimated), and holds that much until
    /// [`Meter::charge`] or [`Meter::release`].
    pub fn admit(
        &self,
        scope: &Scope,
        prompt_tokens: u64,
        price: Option<&Price>,
        max_tokens: Option<u64>,
    ) -> Result<Hold, LlmError> {
        let mut ledger = self.ledger();
        // Refused only for what was spent: while calls in flight hold the rest, wait for them
        // to be charged or released (a call does not fail for what a sibling merely holds).
        let cap = loop {
            let allowance = self.allowance(&ledger, &scope.problem);
            let verdict = match allowance.limits.iter().find(|l| l.left() <= 0.0) {
                Some(l) => Err(l.refusal()),
                None => allowance.reply_cap(prompt_tokens, price),
            };
            match verdict {
                Ok(cap) => break cap,
                Err(e) if ledger.held_total.0 == 0 && ledger.held_total.1 <= 0.0 => return Err(e),
                Err(_) => ledger = self.freed.wait(ledger).unwrap_or_else(|e| e.into_inner()),
            }
        };
        let max_tokens = match (max_tokens, cap) {
            (Some(m), Some(c)) => Some(m.min(c)),
            (m, c) => m.or(c),
        };
        // Unbounded replies hold only their prompt: nothing limits them anyway.
        let tokens = prompt_tokens + max_tokens.filter(|_| cap.is_some()).unwrap_or(0);
        let usd = price
            .map(|p| p.cost(&Usage { prompt_tokens, completion_tokens: tokens - prompt_tokens, estimated: true }))
            .unwrap_or(0.0);
        let hold = Hold { problem: scope.problem.clone(), tokens, usd, max_tokens };
        ledger.held_total.0 += tokens;
        ledger.held_total.1 += usd;
        let h = ledger.held.entry(hold.problem.clone()).or_default();
        h.0 += tokens;
        h.1 += usd;
        Ok(hold)
    }

    /// A call admitted with `hold` gave no reply: what it held is free again.
    pub fn release(&self, hold: Hold) {
        Self::unhold(&mut self.ledger(), &hold);
        self.freed.notify_all();
    }

    fn unhold(ledger: &mut Ledger, hold: &Hold) {
        ledger.held_total.0 = ledger.held_total.0.saturating_sub(hold.tokens);
        ledger.held_total.1 = (ledger.held_total.1 - hold.usd).max(0.0);
        if let Some(h) = ledger.held.get_mut(&hold.problem) {
            h.0 = h.0.saturating_sub(hold.tokens);
            h.1 = (h.1 - hold.usd).max(0.0);
        }
    }

    /// After a call admitted with `hold`: charges what it really used and frees the hold.
    pub fn charge(&self, hold: Hold, usage: &Usage, usd: f64) {
        let mut ledger = self.ledger();
        Self::unhold(&mut ledger, &hold);
        let problem = hold.problem;
        add(&mut ledger.spent.total, usage, usd);
        add(ledger.spent.problems.entry(problem).or_default(), usage, usd);
        drop(ledger);
        self.freed.notify_all();
    }

    /// Charges a call that was not admitted now: one answered from a killed run's records on
    /// `--resume` (that run spent it, and the budget is the run's).
    pub fn charge_recorded(&self, scope: &Scope, usage: &Usage, usd: f64) {
        let mut ledger = self.ledger();
        add(&mut ledger.spent.total, usage, usd);
        add(ledger.spent.problems.entry(scope.problem.clone()).or_default(), usage, usd);
    }

    /// What was spent so far.
    pub fn spent(&self) -> Spending {
        self.ledger().spent.clone()
    }
}

fn add(s: &mut Spent, usage: &Usage, usd: f64) {
    s.calls += 1;
    s.tokens += usage.total();
    s.usd += usd;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(problem: &str) -> Scope {
        Scope { problem: problem.into(), role: "planner".into(), task: String::new() }
    }

    fn usage(p: u64, c: u64) -> Usage {
        Usage { prompt_tokens: p, completion_tokens: c, estimated: false }
    }

    #[test]
    fn reply_is_clamped_to_what_is_left_of_the_run() {
        let m = Meter::new(Limits { run_tokens: Some(1000), ..Limits::default() });
        let h = m.admit(&scope("a"), 100, None, Some(4096)).unwrap();
        assert_eq!(h.max_tokens, Some(900));
        m.charge(h, &usage(100, 500), 0.0);
        let h = m.admit(&scope("b"), 100, None, Some(4096)).unwrap();
        assert_eq!(h.max_tokens, Some(300));
        m.charge(h, &usage(100, 300), 0.0);
        let e = m.admit(&scope("c"), 10, None, Some(4096)).unwrap_err();
        assert!(
            matches!(&e, LlmError::Budget { what, limit, spent } if what == "tokens of the run" && *limit == 1000.0 && *spent == 1000.0),
            "{e}"
        );
        assert_eq!(m.spent().total, Spent { calls: 2, tokens: 1000, usd: 0.0 });
    }

    #[test]
    fn prompt_alone_past_the_limit_is_refused() {
        let m = Meter::new(Limits { problem_tokens: Some(50), ..Limits::default() });
        let e = m.admit(&scope("level1/a.py"), 60, None, None).unwrap_err();
        assert!(matches!(&e, LlmError::Budget { what, .. } if what == "tokens of problem level1/a.py"), "{e}");
        // Another problem has its own allowance.
        assert_eq!(m.admit(&scope("b"), 10, None, None).unwrap().max_tokens, Some(40));
    }

    #[test]
    fn calls_in_flight_hold_their_allowance() {
        let m = Meter::new(Limits { run_tokens: Some(1000), ..Limits::default() });
        let first = m.admit(&scope("a"), 100, None, Some(400)).unwrap();
        let second = m.admit(&scope("b"), 100, None, Some(4096)).unwrap();
        assert_eq!(second.max_tokens, Some(400), "the first call holds 500");
        m.release(first);
        m.release(second);
        assert_eq!(m.admit(&scope("c"), 100, None, Some(4096)).unwrap().max_tokens, Some(900));
        assert_eq!(m.spent().total.calls, 0);
    }

    #[test]
    fn a_call_waits_for_what_a_sibling_holds_rather_than_fail_for_it() {
        let m = Meter::new(Limits { run_tokens: Some(1000), ..Limits::default() });
        let first = m.admit(&scope("a"), 100, None, Some(4096)).unwrap();
        assert_eq!(first.max_tokens, Some(900), "the first call holds the whole allowance");
        let second = std::thread::scope(|s| {
            let waiting = s.spawn(|| m.admit(&scope("b"), 100, None, Some(4096)));
            m.release(first);
            waiting.join().unwrap()
        });
        assert_eq!(second.unwrap().max_tokens, Some(900), "admitted once the first was released");
    }

    #[test]
    fn usd_limits_clamp_through_the_price() {
        let price = Price { input_usd_per_mtok: 1.0, output_usd_per_mtok: 10.0 };
        let m = Meter::new(Limits { problem_usd: Some(0.011), ..Limits::default() });
        // 1000 prompt tokens cost 0.001; 0.010 left buys 1000 reply tokens.
        let h = m.admit(&scope("a"), 1000, Some(&price), None).unwrap();
        assert_eq!(h.max_tokens, Some(1000));
        let u = usage(1000, 1000);
        m.charge(h, &u, price.cost(&u));
        let e = m.check(&scope("a")).unwrap_err();
        assert!(matches!(&e, LlmError::Budget { what, .. } if what == "usd of problem a"), "{e}");
        let s = m.spent();
        assert!((s.problems["a"].usd - 0.011).abs() < 1e-12);
        // Unpriced models spend no money: a USD limit never binds them.
        let m = Meter::new(Limits { run_usd: Some(0.0001), ..Limits::default() });
        assert_eq!(m.admit(&scope("a"), 1000, None, Some(5)).unwrap().max_tokens, Some(5));
    }

    #[test]
    fn without_limits_nothing_is_clamped() {
        let m = Meter::new(Limits::default());
        assert_eq!(m.admit(&scope("a"), 10, None, None).unwrap().max_tokens, None);
        assert_eq!(m.check(&scope("a")).unwrap(), Allowance::default());
    }
}
