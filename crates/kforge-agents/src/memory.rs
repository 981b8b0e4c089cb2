//! What the search remembers between iterations: the experience memory (a FIFO of lessons from
//! attempts that moved the speed enough to matter) and the strategy tracker (tries and successes
//! per strategy; strategies that keep failing are listed to the planner as "avoid").

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// One lesson from one attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Experience {
    /// The candidate it is about.
    pub candidate: String,
    pub iteration: u32,
    pub strategy: String,
    pub lesson: String,
    pub speedup: Option<f64>,
}

/// When a lesson is kept and how many.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemoryConfig {
    /// Items kept; the oldest goes first (8).
    pub capacity: usize,
    /// Kept when the speedup is at least this (1.05).
    pub store_speedup: f64,
    /// Kept when the slowdown (1 / speedup) is at least this (1.20).
    pub store_slowdown: f64,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig { capacity: 8, store_speedup: 1.05, store_slowdown: 1.20 }
    }
}

/// The experience memory: a FIFO of at most `capacity` lessons, each from a timed attempt whose
/// speedup was ≥ `store_speedup` or ≤ 1 / `store_slowdown`. Untimed attempts (the CPU) and
/// rejections are never stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Memory {
    config: MemoryConfig,
    items: VecDeque<Experience>,
}

impl Memory {
    /// An empty memory.
    pub fn new(config: MemoryConfig) -> Memory {
        Memory { config, items: VecDeque::new() }
    }

    /// Whether an attempt with this speedup is worth remembering.
    pub fn worth_storing(&self, speedup: Option<f64>) -> bool {
        match speedup {
            Some(s) if s > 0.0 => s >= self.config.store_speedup || 1.0 / s >= self.config.store_slowdown,
            _ => false,
        }
    }

    /// Stores `item` when [`Memory::worth_storing`]; returns whether it did.
    pub fn offer(&mut self, item: Experience) -> bool {
        if !self.worth_storing(item.speedup) || self.config.capacity == 0 {
            return false;
        }
        if self.items.len() == self.config.capacity {
            self.items.pop_front();
        }
        self.items.push_back(item);
        true
    }

    /// The items, oldest first.
    pub fn items(&self) -> Vec<Experience> {
        self.items.iter().cloned().collect()
    }

    /// The items matching any word of `query` (case-insensitive, in strategy or lesson); all of
    /// them when none matches. Newest first.
    pub fn search(&self, query: &str) -> Vec<&Experience> {
        let words: Vec<String> = query.split_whitespace().map(|w| w.to_lowercase()).collect();
        let hit = |e: &Experience| {
            let text = format!("{} {}", e.strategy, e.lesson).to_lowercase();
            words.iter().any(|w| text.contains(w.as_str()))
        };
        let matching: Vec<&Experience> = self.items.iter().rev().filter(|e| hit(e)).collect();
        if matching.is_empty() {
            self.items.iter().rev().collect()
        } else {
            matching
        }
    }

    /// How the memory is described in the planner's prompt.
    pub fn summary(&self) -> String {
        if self.items.is_empty() {
            return "empty".into();
        }
        let mut strategies: Vec<&str> = self.items.iter().map(|e| e.strategy.as_str()).collect();
        strategies.sort();
        strategies.dedup();
        format!(
            "{} lessons (strategies: {}); read them with search_memory{{query}}",
            self.items.len(),
            strategies.join(", ")
        )
    }
}

/// When a strategy is avoided.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrackerConfig {
    /// Tries before a strategy can be avoided (3).
    pub min_tries: u32,
    /// Avoided below this share of successes (0.30).
    pub min_success: f64,
}

impl Default for TrackerConfig {
    fn default() -> Self {
        TrackerConfig { min_tries: 3, min_success: 0.30 }
    }
}

/// Tries and successes per strategy. A try is one plan; it succeeds when one of its attempts
/// was accepted and not slower than the baseline (an untimed acceptance counts: the tracker
/// is about strategies that keep failing).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tracker {
    config: TrackerConfig,
    counts: BTreeMap<String, (u32, u32)>,
}

impl Tracker {
    /// A tracker that has counted nothing.
    pub fn new(config: TrackerConfig) -> Tracker {
        Tracker { config, counts: BTreeMap::new() }
    }

    /// Counts one try of `strategy`.
    pub fn record(&mut self, strategy: &str, success: bool) {
        let entry = self.counts.entry(strategy.to_string()).or_default();
        entry.0 += 1;
        entry.1 += u32::from(success);
    }

    /// Strategies with fewer than `min_success` successes after at least `min_tries` tries,
    /// sorted by name.
    pub fn avoided(&self) -> Vec<String> {
        self.counts
            .iter()
            .filter(|(_, (tries, wins))| {
                *tries >= self.config.min_tries && f64::from(*wins) < self.config.min_success * f64::from(*tries)
            })
            .map(|(s, _)| s.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(n: u32, speedup: Option<f64>) -> Experience {
        Experience {
            candidate: format!("c{n}"),
            iteration: 1,
            strategy: "s".into(),
            lesson: format!("lesson {n}"),
            speedup,
        }
    }

    #[test]
    fn only_big_enough_changes_are_stored() {
        let mut m = Memory::new(MemoryConfig::default());
        assert!(m.offer(item(0, Some(1.05))));
        assert!(!m.offer(item(1, Some(1.04))));
        assert!(!m.offer(item(2, Some(0.9))));
        assert!(m.offer(item(3, Some(1.0 / 1.2))));
        assert!(!m.offer(item(4, None)));
        let kept: Vec<String> = m.items().into_iter().map(|e| e.candidate).collect();
        assert_eq!(kept, ["c0", "c3"]);
    }

    #[test]
    fn the_oldest_item_goes_first() {
        let mut m = Memory::new(MemoryConfig { capacity: 8, ..MemoryConfig::default() });
        for n in 0..10 {
            m.offer(item(n, Some(2.0)));
        }
        let kept: Vec<String> = m.items().into_iter().map(|e| e.candidate).collect();
        assert_eq!(kept, (2..10).map(|n| format!("c{n}")).collect::<Vec<_>>());
    }

    #[test]
    fn thresholds_are_configurable() {
        let m = Memory::new(MemoryConfig { capacity: 8, store_speedup: 1.5, store_slowdown: 2.0 });
        assert!(!m.worth_storing(Some(1.4)));
        assert!(m.worth_storing(Some(1.5)));
        assert!(!m.worth_storing(Some(0.6)));
        assert!(m.worth_storing(Some(0.5)));
    }

    #[test]
    fn strategies_that_keep_failing_are_avoided() {
        let mut t = Tracker::new(TrackerConfig::default());
        t.record("a", false);
        t.record("a", false);
        assert!(t.avoided().is_empty(), "two tries are not enough");
        t.record("a", false);
        t.record("b", true);
        t.record("b", false);
        t.record("b", false);
        for _ in 0..3 {
            t.record("c", false);
        }
        t.record("c", true);
        t.record("c", true);
        assert_eq!(t.avoided(), ["a"], "b has 1/3 = 33 %, c 2/5 = 40 %");
    }
}
