//! A campaign's budgets: GPU-seconds (what its steps spent on the device) and wall seconds
//! (since it started). When one is spent no new problem or step starts; what was not reached is
//! recorded as such (`not-reached: budget`), not as a failure.

use crate::OptimizeError;
use serde::{Deserialize, Serialize};
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
}

impl Spending {
    pub fn new(budget: Budget) -> Spending {
        Spending { budget, start: Instant::now(), gpu_s: Mutex::new(0.0) }
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
        BudgetStatus {
            gpu_s: self.gpu_s(),
            budget_gpu_s: self.budget.gpu_s,
            wall_s: self.wall_s(),
            budget_wall_s: self.budget.wall_s,
            spent: self.spent().map(String::from),
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
        format!(
            "budget: gpu {:.1}{} s, wall {:.1}{} s{spent}\n",
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
    fn spending_runs_out_by_wall_seconds() {
        let s = Spending::new(Budget::new(None, Some(1e-9)).unwrap());
        let t = Instant::now();
        while t.elapsed().as_nanos() < 10 {} // the clock moves past the budget
        assert_eq!(s.spent(), Some("wall"));
    }
}
