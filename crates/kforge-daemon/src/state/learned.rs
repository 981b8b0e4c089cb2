//! What earlier jobs showed, by command line and by label: the most their recent runs used of a
//! quantity (a peak of GPU memory in bytes, a run's length in milliseconds). Admission counts
//! with it where a job declares less or nothing (`memory`: its expected peak; `admission`: the
//! length a backfilled job is expected to run).

use kforge_proto::SubmitSpec;
use kforge_store::LearnedValue;
use std::collections::{HashMap, VecDeque};

/// Learned values kept (by command line and by label; the least recently used go). At start the
/// daemon replays those of the most recent jobs of this many in its store.
pub const LEARNED_CAPACITY: usize = 4096;

/// The runs of a key whose values count: the most of the last this many. One outlier (a run
/// that hit its time limit, a peak that once ran away) is forgotten after this many ordinary
/// runs, not held against the command for as long as it stays in the table.
pub const LEARNED_RECENT: usize = 8;

/// The most seen of one quantity in earlier jobs' recent runs, by command line and by label.
#[derive(Default)]
pub(super) struct Learned {
    /// Key → its last [`LEARNED_RECENT`] values, oldest first.
    recent: HashMap<String, Recent>,
    clock: u64,
}

/// One key's last values and when it was last recorded (a clock of records: the least recently
/// recorded key goes first when the table is full).
#[derive(Default)]
struct Recent {
    values: VecDeque<u64>,
    recorded: u64,
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
    /// The most of a command line's recent runs, else of its label's.
    pub fn get(&self, spec: &SubmitSpec) -> Option<u64> {
        keys(spec).find_map(|k| self.recent.get(&k).and_then(|r| r.values.iter().copied().max()))
    }

    /// A job showed `value` (0: nothing seen, not recorded).
    pub fn record(&mut self, spec: &SubmitSpec, value: u64) {
        if value == 0 {
            return;
        }
        for k in keys(spec) {
            self.clock += 1;
            let r = self.recent.entry(k).or_default();
            if r.values.len() == LEARNED_RECENT {
                r.values.pop_front();
            }
            r.values.push_back(value);
            r.recorded = self.clock;
        }
        while self.recent.len() > LEARNED_CAPACITY {
            let Some(oldest) = self.recent.iter().min_by_key(|(_, r)| r.recorded).map(|(k, _)| k.clone()) else {
                break;
            };
            self.recent.remove(&oldest);
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
        self.recent.len()
    }
}
