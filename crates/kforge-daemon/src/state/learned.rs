//! What earlier jobs showed, by command line and by label: the most each used of a quantity (a
//! peak of GPU memory in bytes, a run's length in milliseconds). Admission counts with it where
//! a job declares less or nothing (`memory`: its expected peak; `admission`: the length a
//! backfilled job is expected to run).

use kforge_proto::SubmitSpec;
use kforge_store::LearnedValue;
use std::collections::HashMap;

/// Learned values kept (by command line and by label; the least recently used go). At start the
/// daemon replays those of the most recent jobs of this many in its store.
pub const LEARNED_CAPACITY: usize = 4096;

/// The most seen of one quantity of earlier jobs, by command line and by label.
#[derive(Default)]
pub(super) struct Learned {
    /// Key → (the most seen, when last recorded: a clock of records).
    most: HashMap<String, (u64, u64)>,
    clock: u64,
}

/// The keys a job's values are learned under: its command line without temporary paths (a
/// `--out /tmp/…/result.json` differs from run to run of the same command), and its label.
fn keys(spec: &SubmitSpec) -> impl Iterator<Item = String> + '_ {
    let tmpdir = spec.env.iter().find(|(k, _)| k == "TMPDIR").map(|(_, v)| v.as_str()).filter(|v| !v.is_empty());
    let temporary =
        move |a: &str| a.starts_with("/tmp/") || a.starts_with("/var/tmp/") || tmpdir.is_some_and(|t| a.starts_with(t));
    let argv: Vec<&str> = spec.argv.iter().map(|a| if temporary(a) { "<tmp>" } else { a.as_str() }).collect();
    std::iter::once(format!("argv:{}", argv.join("\u{1f}"))).chain(spec.label.as_ref().map(|l| format!("label:{l}")))
}

/// A spec holding only what `keys` reads (a store row's command line and label).
fn spec_of(argv: &[String], label: Option<&str>) -> SubmitSpec {
    SubmitSpec { argv: argv.to_vec(), label: label.map(str::to_owned), ..SubmitSpec::default() }
}

impl Learned {
    /// The most seen of a command line, else of its label.
    pub fn get(&self, spec: &SubmitSpec) -> Option<u64> {
        keys(spec).find_map(|k| self.most.get(&k).map(|p| p.0))
    }

    /// A job showed `value` (0: nothing seen, not recorded).
    pub fn record(&mut self, spec: &SubmitSpec, value: u64) {
        if value == 0 {
            return;
        }
        for k in keys(spec) {
            self.clock += 1;
            let e = self.most.entry(k).or_insert((0, 0));
            *e = (e.0.max(value), self.clock);
        }
        while self.most.len() > LEARNED_CAPACITY {
            let Some(oldest) = self.most.iter().min_by_key(|(_, v)| v.1).map(|(k, _)| k.clone()) else { break };
            self.most.remove(&oldest);
        }
    }

    /// Learned from values of earlier jobs (the store's rows), oldest first.
    pub fn replayed(seen: &[LearnedValue]) -> Learned {
        let mut l = Learned::default();
        for v in seen {
            l.record(&spec_of(&v.argv, v.label.as_deref()), v.value);
        }
        l
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.most.len()
    }
}
