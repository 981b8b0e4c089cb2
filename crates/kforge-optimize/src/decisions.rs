//! The decisions file: a campaign's decided problems in one compact JSON file, each problem's report
//! and its result files' text (no journal, no caches), so that a campaign outlives the
//! machine it ran on. `kforge optimize DIR --resume --decisions FILE` on a fresh machine (a new
//! output folder, an empty journal: a batch job with a time limit on node-local scratch, a
//! lent GPU that goes back after each call) takes every problem the file holds a decision for
//! under the same question, and runs the rest; each new decision is added to the file as it is
//! made, so a run killed halfway keeps what it decided.
//!
//! Entries are matched by the whole question (problem path, size, device, baseline, agents,
//! rounds, beam width, steps' version): one file may hold several campaigns' decisions, and a
//! decision made by older steps or for another baseline answers nothing here. A report whose
//! LLM search was cut short (a budget, the provider) is never taken: its search is continued.
//!
//! Beside the entries, the file carries the undecided problems' step floors ([`StepFloor`]):
//! what a step of theirs ran bounded, or had run when its run was killed, on a machine; a fresh
//! journal there starts such a step bounded at a run's start instead of late. And their finished
//! steps whose output is one JSON file ([`CarriedStep`]: measure, beam, verify, config-verify), with that file's
//! text: a fresh journal there takes them as its own when their inputs hash the same, instead of
//! running them again (in session 28 two problems that had only their verify steps left ran from
//! their measure steps again: the state pack holding their journals was lost with its machine).

use crate::Question;
use crate::Report;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The file format's version; a decisions file of another version is refused, not misread.
pub const DECISIONS_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum DecisionsError {
    #[error("the decisions file {path} cannot be read: {why}")]
    Read { path: String, why: String },
    #[error("the decisions file {path} is not a kforge optimize decisions file: {why}")]
    Format { path: String, why: String },
    #[error("the decisions file {path} is of version {found}; this kforge reads version {DECISIONS_VERSION}")]
    Version { path: String, found: u32 },
    #[error("the decisions file {path} cannot be written: {why}")]
    Write { path: String, why: String },
    #[error("the decisions file {path} holds no decision for these problems under this question (problem paths as given, size, device, baseline, agents, rounds, beam width){}", held.as_ref().map(|h| format!("; it holds some for {h}")).unwrap_or_default())]
    NoDecision { path: String, held: Option<String> },
    #[error(
        "the decisions file {path} has no decision of these problems made on {wanted}; it has some made on: {machines}"
    )]
    NotThatMachine { path: String, wanted: String, machines: String },
    #[error("the decisions file {path} has decisions of these problems made on several machines ({machines}): name one with --machine")]
    SeveralMachines { path: String, machines: String },
}

/// One decided problem: its report, when and where it was decided, and what it was decided on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Seconds since the Unix epoch.
    pub decided_unix_s: u64,
    /// The machine as the run saw it (the GPU's name, or `cpu`, and torch's version): a decision
    /// timed on another GPU or torch is not this machine's.
    pub machine: String,
    /// The problem file's content hash: a problem edited at the same path is another problem.
    pub source_hash: String,
    /// The result file and its policy's content hash (`model_new.py`, `policy.toml`), where they
    /// were written: a folder still holding them keeps them on a restore.
    #[serde(default)]
    pub result_hash: Option<String>,
    /// The result files' text by name (`model_new.py`, `policy.toml`: what `result_hash` hashes),
    /// where the run wrote them: a fresh folder restored from the file gets the decided result
    /// back, not only its report. Without them a winner lived only as long as its folder (in
    /// session 29 two decided problems could not be verified again: their folders had been lost
    /// with a machine).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub result_files: BTreeMap<String, String>,
    pub report: Report,
}

/// What a decisions file says for a question on this machine.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer<'a> {
    /// No entry for the question (or one whose LLM search was cut short: continued, not taken).
    Nothing,
    /// An entry for the question, decided on this machine for this source.
    Taken(&'a Entry),
    /// An entry for the question that does not hold here: why (another machine, an edited problem).
    Stale(String),
}

/// What an undecided problem's step is known to take at least on a machine (it ran that long
/// bounded, or when its run was killed: `Spending::floors_of`), carried to the next machine with
/// the decisions: a fresh journal there would not know it, and would start the step late in a
/// run, where the budget's end cuts it again, instead of bounded at a run's start (session 20
/// lost a call so, redoing two level-3 measure steps the session before had bounded).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepFloor {
    pub machine: String,
    pub question: Question,
    pub step: String,
    pub seconds: f64,
}

/// A finished step of an undecided problem on a machine, with its one output file: what a
/// journal there had done, carried to the next journal of that machine with the decisions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CarriedStep {
    pub machine: String,
    pub question: Question,
    pub step: String,
    /// The content hash of everything that decides the step's output (the journal's).
    pub input_hash: String,
    /// The output file, relative to the run's output folder, and its content hash as journaled.
    pub output: String,
    pub output_hash: String,
    /// The output file's text.
    pub text: String,
    /// Its work's seconds (its wait in the daemon's queue left out), and its device seconds.
    pub seconds: f64,
    #[serde(default)]
    pub gpu_seconds: Option<f64>,
    #[serde(default)]
    pub gpu_seconds_kind: Option<String>,
    /// Its one-word answer (`bounded`, a verdict's outcome), as journaled.
    #[serde(default)]
    pub outcome: Option<String>,
}

/// Every decided problem, one entry per question; and the step floors and finished steps of
/// undecided ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decisions {
    pub decisions: u32,
    pub entries: Vec<Entry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub floors: Vec<StepFloor>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<CarriedStep>,
}

impl Default for Decisions {
    fn default() -> Self {
        Decisions { decisions: DECISIONS_VERSION, entries: Vec::new(), floors: Vec::new(), steps: Vec::new() }
    }
}

impl Decisions {
    /// The decisions file at `path`; an empty one when no file is there yet (a campaign's first run).
    pub fn read(path: &Path) -> Result<Decisions, DecisionsError> {
        let shown = path.display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Decisions::default()),
            Err(e) => return Err(DecisionsError::Read { path: shown, why: e.to_string() }),
        };
        Self::parse(&text, &shown)
    }

    /// A decisions file's text; `shown` names it in errors.
    pub fn parse(text: &str, shown: &str) -> Result<Decisions, DecisionsError> {
        #[derive(Deserialize)]
        struct Head {
            decisions: u32,
        }
        let head: Head = serde_json::from_str(text)
            .map_err(|e| DecisionsError::Format { path: shown.into(), why: e.to_string() })?;
        if head.decisions != DECISIONS_VERSION {
            return Err(DecisionsError::Version { path: shown.into(), found: head.decisions });
        }
        serde_json::from_str(text).map_err(|e| DecisionsError::Format { path: shown.into(), why: e.to_string() })
    }

    /// What the file holds for exactly this question, decided on `machine` for a problem whose
    /// source hashes to `source_hash`. Entries are kept per machine: one of another machine only
    /// says why nothing is taken.
    pub fn answer(&self, q: &Question, machine: &str, source_hash: &str) -> Answer<'_> {
        let of_question = |e: &&Entry| e.report.question == *q;
        let Some(e) = self.entries.iter().filter(of_question).find(|e| e.machine == machine) else {
            return match self.entries.iter().find(of_question) {
                Some(other) => Answer::Stale(format!("decided on {}, this run is on {machine}", other.machine)),
                None => Answer::Nothing,
            };
        };
        if e.report.llm.as_ref().is_some_and(|l| l.cut_short()) {
            return Answer::Nothing;
        }
        if e.source_hash != source_hash {
            return Answer::Stale("decided for another version of the problem file".into());
        }
        Answer::Taken(e)
    }

    /// The machine a summary of `questions` reads: `wanted` when given (it must have decided one
    /// of them), else the only machine that decided any; `shown` names the file in errors.
    pub fn machine_for(
        &self,
        questions: &[Question],
        wanted: Option<&str>,
        shown: &str,
    ) -> Result<String, DecisionsError> {
        let mut machines: Vec<&str> = self
            .entries
            .iter()
            .filter(|e| questions.contains(&e.report.question))
            .map(|e| e.machine.as_str())
            .collect();
        machines.sort_unstable();
        machines.dedup();
        let list = || machines.join("; ");
        match (wanted, machines.as_slice()) {
            (_, []) => {
                let held = self.entries.first().map(|e| {
                    let q = &e.report.question;
                    let agents: Vec<&str> = q.agents.iter().map(|a| a.name()).collect();
                    format!(
                        "{} (--baseline {} --agents {} --size {})",
                        q.problem,
                        q.baseline.mode(),
                        agents.join(","),
                        q.size
                    )
                });
                Err(DecisionsError::NoDecision { path: shown.into(), held })
            }
            (Some(w), _) if machines.contains(&w) => Ok(w.to_string()),
            (Some(w), _) => {
                Err(DecisionsError::NotThatMachine { path: shown.into(), wanted: w.into(), machines: list() })
            }
            (None, [one]) => Ok(one.to_string()),
            (None, _) => Err(DecisionsError::SeveralMachines { path: shown.into(), machines: list() }),
        }
    }

    /// Remove `machine`'s entry of `question` (decided again); how many went (0 or 1).
    pub fn forget(&mut self, machine: &str, question: &Question) -> usize {
        let before = self.entries.len();
        self.entries.retain(|e| e.machine != machine || e.report.question != *question);
        before - self.entries.len()
    }

    /// The step floors of `question` on `machine`, per step name.
    pub fn floors_of(&self, machine: &str, question: &Question) -> BTreeMap<String, f64> {
        self.floors
            .iter()
            .filter(|f| f.machine == machine && f.question == *question)
            .map(|f| (f.step.clone(), f.seconds))
            .collect()
    }

    /// `question`'s step floors on `machine` made `floors` (what the run knows now: the file's
    /// as read at its start, the journal's, its own; a step that ran in full has none); whether
    /// the file changed. A decided question keeps none.
    pub fn set_floors(&mut self, machine: &str, question: &Question, floors: &BTreeMap<String, f64>) -> bool {
        let decided = self.entries.iter().any(|e| e.machine == machine && e.report.question == *question);
        let now: BTreeMap<String, f64> = if decided { BTreeMap::new() } else { floors.clone() };
        if self.floors_of(machine, question) == now {
            return false;
        }
        self.floors.retain(|f| f.machine != machine || f.question != *question);
        self.floors.extend(now.into_iter().map(|(step, seconds)| StepFloor {
            machine: machine.into(),
            question: question.clone(),
            step,
            seconds,
        }));
        true
    }

    /// The finished steps of `question` on `machine` the file carries.
    pub fn steps_of(&self, machine: &str, question: &Question) -> Vec<&CarriedStep> {
        self.steps.iter().filter(|c| c.machine == machine && c.question == *question).collect()
    }

    /// `question`'s carried steps on `machine` made `steps` (what its journal has finished now);
    /// whether the file changed. A decided question keeps none.
    pub fn set_steps(&mut self, machine: &str, question: &Question, steps: Vec<CarriedStep>) -> bool {
        let decided = self.entries.iter().any(|e| e.machine == machine && e.report.question == *question);
        let mine = |c: &CarriedStep| c.machine == machine && c.question == *question;
        let key = |c: &CarriedStep| (c.step.clone(), c.input_hash.clone());
        let mut now: Vec<CarriedStep> = if decided { Vec::new() } else { steps.into_iter().filter(mine).collect() };
        now.sort_by_key(key);
        let mut was = self.steps_of(machine, question);
        was.sort_by_key(|c| key(c));
        if was.into_iter().eq(now.iter()) {
            return false;
        }
        self.steps.retain(|c| !mine(c));
        self.steps.extend(now);
        true
    }

    /// `entry` recorded over its question's entry of its machine (and that question's step
    /// floors and carried steps there dropped: it is decided); whether the file changed.
    pub fn record(&mut self, entry: Entry) -> bool {
        let (floors, steps) = (self.floors.len(), self.steps.len());
        let (machine, question) = (&entry.machine, &entry.report.question);
        self.floors.retain(|f| f.machine != *machine || f.question != *question);
        self.steps.retain(|c| c.machine != *machine || c.question != *question);
        let dropped = self.floors.len() != floors || self.steps.len() != steps;
        self.record_entry(entry) || dropped
    }

    /// `entry` recorded: it replaces the entry of the same question and machine (another machine's
    /// stays); true when that changed the file (the same report, machine, source and result again
    /// change nothing, whenever decided).
    fn record_entry(&mut self, entry: Entry) -> bool {
        let same = |a: &Entry, b: &Entry| {
            (&a.report, &a.machine, &a.source_hash, &a.result_hash, &a.result_files)
                == (&b.report, &b.machine, &b.source_hash, &b.result_hash, &b.result_files)
        };
        match self.entries.iter_mut().find(|e| e.report.question == entry.report.question && e.machine == entry.machine)
        {
            Some(e) if same(e, &entry) => false,
            Some(e) => {
                *e = entry;
                true
            }
            None => {
                self.entries.push(entry);
                true
            }
        }
    }

    /// Its text: one entry a line, ordered by problem (compact, and a diff shows which problems a
    /// run decided).
    pub fn text(&self) -> Result<String, serde_json::Error> {
        let mut entries: Vec<&Entry> = self.entries.iter().collect();
        entries.sort_by(|a, b| (&a.report.question.problem, &a.machine).cmp(&(&b.report.question.problem, &b.machine)));
        let lines = entries.iter().map(serde_json::to_string).collect::<Result<Vec<_>, _>>()?;
        let mut floors: Vec<&StepFloor> = self.floors.iter().collect();
        floors.sort_by(|a, b| {
            (&a.question.problem, &a.machine, &a.step).cmp(&(&b.question.problem, &b.machine, &b.step))
        });
        let floors = floors.iter().map(serde_json::to_string).collect::<Result<Vec<_>, _>>()?;
        let floors =
            if floors.is_empty() { String::new() } else { format!(",\n\"floors\": [\n{}\n]", floors.join(",\n")) };
        let mut steps: Vec<&CarriedStep> = self.steps.iter().collect();
        steps.sort_by(|a, b| carried_order(a).cmp(&carried_order(b)));
        let steps = steps.iter().map(serde_json::to_string).collect::<Result<Vec<_>, _>>()?;
        let steps = if steps.is_empty() { String::new() } else { format!(",\n\"steps\": [\n{}\n]", steps.join(",\n")) };
        Ok(format!("{{\"decisions\": {},\n\"entries\": [\n{}\n]{floors}{steps}}}\n", self.decisions, lines.join(",\n")))
    }

    /// The file written whole: a temporary file beside it, synced, then renamed over it (a run
    /// killed while writing leaves the old file).
    pub fn write(&self, path: &Path) -> Result<(), DecisionsError> {
        let shown = path.display().to_string();
        let text = self.text().map_err(|e| DecisionsError::Write { path: shown.clone(), why: e.to_string() })?;
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = beside(path, &format!("{}.{n}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut f, text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            DecisionsError::Write { path: shown, why: e.to_string() }
        })
    }

    /// Under an exclusive lock of the file (a lock file beside it, so that several runs may share
    /// one decisions file; and a lock of this process, since file locks do not order the threads
    /// of one process everywhere, NFS among them): the file read again, `change` applied, and
    /// written when it changed anything; the file as it now is. The file's folder is created when
    /// missing.
    pub fn update(path: &Path, change: impl FnOnce(&mut Decisions) -> bool) -> Result<Decisions, DecisionsError> {
        static IN_PROCESS: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
        let shown = path.display().to_string();
        let io = |e: std::io::Error| DecisionsError::Write { path: shown.clone(), why: e.to_string() };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(beside(path, "lock"))
            .map_err(io)?;
        lock.lock().map_err(io)?;
        let mut now = Decisions::read(path)?;
        if change(&mut now) || !path.exists() {
            now.write(path)?;
        }
        Ok(now)
    }
}

/// The order the file lists carried steps in: by problem, machine, step and input.
fn carried_order(c: &CarriedStep) -> (&str, &str, &str, &str) {
    (&c.question.problem, &c.machine, &c.step, &c.input_hash)
}

/// `.NAME.WHAT` beside `path`.
fn beside(path: &Path, what: &str) -> std::path::PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{what}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::report_for;

    fn entry(problem: &str, baseline: &str, at: u64) -> Entry {
        Entry {
            decided_unix_s: at,
            machine: "NVIDIA H200, torch 2.11".into(),
            source_hash: "s1".into(),
            result_hash: Some("r1".into()),
            result_files: BTreeMap::new(),
            report: report_for(problem, baseline),
        }
    }

    /// The result files travel with their entry and read back as written; a file written before
    /// they were carried (no `result_files`) still reads, its entries without them.
    #[test]
    fn an_entrys_result_files_read_back_and_older_entries_have_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.json");
        let files: BTreeMap<String, String> = [
            ("model_new.py".to_string(), "class ModelNew:\n    pass\n".to_string()),
            ("policy.toml".into(), "x = 1\n".into()),
        ]
        .into();
        let with = Entry { result_files: files.clone(), ..entry("a.py", "max-autotune", 1) };
        Decisions::update(&path, |d| d.record(with.clone()) | d.record(entry("b.py", "max-autotune", 2))).unwrap();
        let back = Decisions::read(&path).unwrap();
        assert_eq!(back.entries[0].result_files, files);
        assert!(back.entries[1].result_files.is_empty());
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches("\"result_files\"").count(), 1, "left out where there are none: {text}");
        let mut d = back.clone();
        assert!(!d.record(with.clone()), "the same entry again");
        assert!(d.record(Entry { result_files: BTreeMap::new(), ..with }), "its files gone is a change");
        let older = text.replace(
            ",\"result_files\":{\"model_new.py\":\"class ModelNew:\\n    pass\\n\",\"policy.toml\":\"x = 1\\n\"}",
            "",
        );
        assert_ne!(older, text, "the test's own premise: {text}");
        let old = Decisions::parse(&older, "old.json").unwrap();
        assert!(old.entries.iter().all(|e| e.result_files.is_empty()));
    }

    #[test]
    fn a_missing_file_is_empty_and_a_written_one_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/decisions.json");
        let l = Decisions::read(&path).unwrap();
        assert!(l.entries.is_empty());
        let l = Decisions::update(&path, |d| {
            d.record(entry("b.py", "max-autotune", 7)) | d.record(entry("a.py", "max-autotune", 8))
        })
        .unwrap();
        assert_eq!(l.entries.len(), 2);
        let back = Decisions::read(&path).unwrap();
        let problems: Vec<&str> = back.entries.iter().map(|e| e.report.question.problem.as_str()).collect();
        assert_eq!(problems, ["a.py", "b.py"], "written ordered by problem");
        assert_eq!(back.entries[0], entry("a.py", "max-autotune", 8));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 5, "one entry a line: {text}");
        let names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "no temporary file left: {names:?}");
        // Created when missing, even with nothing in it.
        let empty = dir.path().join("empty.json");
        Decisions::update(&empty, |_| false).unwrap();
        assert_eq!(Decisions::read(&empty).unwrap(), Decisions::default());
        assert!(std::fs::read_to_string(&empty).unwrap().starts_with("{\"decisions\": 1,"));
    }

    /// A report read back from the file holds the very figures written (serde_json's
    /// `float_roundtrip`): a campaign summarized from the file elsewhere sums the same seconds.
    /// Without it, one in a few thousand timings came back an ulp off (CI, 2026-12-05: a level's
    /// GPU seconds 39.996724241 against 39.996724240999995).
    #[test]
    fn figures_read_back_from_json_are_the_ones_written() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = (x >> 11) as f64 / (1u64 << 53) as f64 * 100.0;
            let back: f64 = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
            assert_eq!(back.to_bits(), v.to_bits(), "{v:?} came back as {back:?}");
        }
    }

    #[test]
    fn step_floors_are_carried_per_machine_and_question_until_decided() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.json");
        let (h100, h200) = ("NVIDIA H100, torch 2.11", "NVIDIA H200, torch 2.11");
        let a = entry("level3/a.py", "default", 1);
        let q = a.report.question.clone();
        let floors: BTreeMap<String, f64> = [("measure".to_string(), 462.3), ("config".into(), 120.0)].into();
        let mut d = Decisions::default();
        assert!(d.set_floors(h100, &q, &floors) && !d.set_floors(h100, &q, &floors), "the same again: no change");
        assert!(d.set_floors(h200, &q, &[("measure".to_string(), 300.0)].into()));
        d.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\n\"floors\": [\n") && text.lines().filter(|l| l.contains("\"step\"")).count() == 3);
        let back = Decisions::read(&path).unwrap();
        assert_eq!(back, d);
        assert_eq!(back.floors_of(h100, &q), floors);
        let mut other = q.clone();
        other.baseline = crate::Baseline::MaxAutotune;
        assert!(back.floors_of(h100, &other).is_empty(), "another question's");
        // A step that ran in full has none: the set is replaced, not merged.
        let mut d = back;
        assert!(d.set_floors(h100, &q, &[("config".to_string(), 120.0)].into()));
        assert_eq!(d.floors_of(h100, &q).keys().collect::<Vec<_>>(), ["config"]);
        // Decided on the H100: its floors there go, the H200's stay; none is set again there.
        let mut decided = a.clone();
        decided.machine = h100.into();
        assert!(d.record(decided));
        assert!(d.floors_of(h100, &q).is_empty() && d.floors_of(h200, &q).len() == 1);
        assert!(!d.set_floors(h100, &q, &floors), "a decided question keeps none");
        // A file without floors (older runs') reads as none, and is written without the field.
        let plain = Decisions { floors: Vec::new(), ..d.clone() };
        assert!(!plain.text().unwrap().contains("floors"));
    }

    fn carried(machine: &str, q: &Question, step: &str, hash: &str) -> CarriedStep {
        CarriedStep {
            machine: machine.into(),
            question: q.clone(),
            step: step.into(),
            input_hash: hash.into(),
            output: format!("level3/a/{step}.json"),
            output_hash: format!("out-{hash}"),
            text: "{\"modes\": {}}\n".into(),
            seconds: 348.9,
            gpu_seconds: Some(40.5),
            gpu_seconds_kind: Some("region".into()),
            outcome: Some("bounded".into()),
        }
    }

    #[test]
    fn finished_steps_are_carried_per_machine_and_question_until_decided() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.json");
        let (h100, h200) = ("NVIDIA H100, torch 2.11", "NVIDIA H200, torch 2.11");
        let a = entry("level3/a.py", "default", 1);
        let q = a.report.question.clone();
        let mut d = Decisions::default();
        let both = vec![carried(h100, &q, "measure", "m1"), carried(h100, &q, "beam", "b1")];
        assert!(d.set_steps(h100, &q, both.clone()));
        let reversed: Vec<CarriedStep> = both.iter().rev().cloned().collect();
        assert!(!d.set_steps(h100, &q, reversed), "the same steps in another order: no change");
        assert!(d.set_steps(h200, &q, vec![carried(h200, &q, "measure", "m2"), carried(h100, &q, "verify", "v")]));
        assert_eq!(d.steps_of(h200, &q).len(), 1, "a step of another machine is not set as this one's");
        d.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("\n\"steps\": [\n") && text.lines().filter(|l| l.contains("\"input_hash\"")).count() == 3
        );
        let back = Decisions::read(&path).unwrap();
        let mut sorted = d.clone();
        sorted.steps.sort_by(|x, y| (&x.machine, &x.step).cmp(&(&y.machine, &y.step)));
        let mut read = back.clone();
        read.steps.sort_by(|x, y| (&x.machine, &x.step).cmp(&(&y.machine, &y.step)));
        assert_eq!(read, sorted, "written and read back whole");
        // What the journal has now replaces the set: a step it no longer stands by goes.
        let mut d = back;
        assert!(d.set_steps(h100, &q, vec![carried(h100, &q, "measure", "m1")]));
        assert_eq!(d.steps_of(h100, &q).iter().map(|c| c.step.as_str()).collect::<Vec<_>>(), ["measure"]);
        // Decided on the H100: its steps there go, the H200's stay; none is set again there.
        let mut decided = a.clone();
        decided.machine = h100.into();
        assert!(d.record(decided));
        assert!(d.steps_of(h100, &q).is_empty() && d.steps_of(h200, &q).len() == 1);
        assert!(!d.set_steps(h100, &q, vec![carried(h100, &q, "measure", "m1")]), "a decided question keeps none");
        // A file without steps (older runs') reads as none, and is written without the field.
        let plain = Decisions { steps: Vec::new(), ..d.clone() };
        assert!(!plain.text().unwrap().contains("\n\"steps\": ["));
        assert!(Decisions::parse("{\"decisions\": 1, \"entries\": []}", "old.json").unwrap().steps.is_empty());
    }

    #[test]
    fn forget_removes_one_machines_entry_of_one_question() {
        let mut d = Decisions::default();
        let mut other = entry("a.py", "max-autotune", 3);
        other.machine = "NVIDIA H100 80GB HBM3, torch 2.11".into();
        for e in
            [entry("a.py", "max-autotune", 1), entry("a.py", "default", 2), other, entry("b.py", "max-autotune", 4)]
        {
            d.record(e);
        }
        let q = entry("a.py", "max-autotune", 0).report.question;
        assert_eq!(d.forget("NVIDIA H200, torch 2.11", &q), 1);
        let left: Vec<(u64, &str)> = d.entries.iter().map(|e| (e.decided_unix_s, e.machine.as_str())).collect();
        assert_eq!(left.len(), 3, "the other baseline's, the other machine's and b's stay: {left:?}");
        assert!(!left.contains(&(1, "NVIDIA H200, torch 2.11")));
        assert_eq!(d.forget("NVIDIA H200, torch 2.11", &q), 0, "gone already");
    }

    #[test]
    fn a_summary_reads_the_one_machine_or_the_named_one() {
        let mut l = Decisions::default();
        let (a, b) = (entry("a.py", "max-autotune", 1), entry("b.py", "max-autotune", 2));
        let qs = [a.report.question.clone(), b.report.question.clone()];
        let e = l.machine_for(&qs, None, "d.json").unwrap_err();
        assert!(
            matches!(e, DecisionsError::NoDecision { held: None, .. }) && e.to_string().contains("no decision"),
            "{e}"
        );
        l.record(a.clone());
        l.record(entry("c.py", "max-autotune", 3)); // another campaign's problem
        assert_eq!(l.machine_for(&qs, None, "d.json").unwrap(), "NVIDIA H200, torch 2.11");
        let h100 = Entry { machine: "NVIDIA H100, torch 2.11".into(), ..b };
        l.record(h100);
        let e = l.machine_for(&qs, None, "d.json").unwrap_err();
        let both = "NVIDIA H100, torch 2.11; NVIDIA H200, torch 2.11";
        assert_eq!(
            e.to_string(),
            format!("the decisions file d.json has decisions of these problems made on several machines ({both}): name one with --machine")
        );
        assert_eq!(l.machine_for(&qs, Some("NVIDIA H100, torch 2.11"), "d.json").unwrap(), "NVIDIA H100, torch 2.11");
        let e = l.machine_for(&qs, Some("cpu, torch 2.15"), "d.json").unwrap_err();
        assert!(e.to_string().contains(&format!("made on cpu, torch 2.15; it has some made on: {both}")), "{e}");
        let other = [report_for("a.py", "default").question];
        let e = l.machine_for(&other, None, "d.json").unwrap_err();
        assert!(e.to_string().contains("; it holds some for a.py (--baseline max-autotune --agents "), "{e}");
    }

    #[test]
    fn an_answer_is_for_the_same_question_machine_and_source_only() {
        let mut l = Decisions::default();
        let e = entry("a.py", "max-autotune", 1);
        l.record(e.clone());
        let (m, s) = ("NVIDIA H200, torch 2.11", "s1");
        assert_eq!(l.answer(&e.report.question, m, s), Answer::Taken(&e));
        assert_eq!(l.answer(&report_for("a.py", "default").question, m, s), Answer::Nothing, "another baseline");
        let mut older = e.report.question.clone();
        older.steps -= 1;
        assert_eq!(l.answer(&older, m, s), Answer::Nothing, "older steps answer another question");
        let h100 = "NVIDIA H100 80GB HBM3, torch 2.11";
        assert_eq!(
            l.answer(&e.report.question, h100, s),
            Answer::Stale(
                "decided on NVIDIA H200, torch 2.11, this run is on NVIDIA H100 80GB HBM3, torch 2.11".into()
            )
        );
        // Decided again on the H100: both machines' entries are kept, each answers its own.
        let on_h100 = Entry { machine: h100.into(), decided_unix_s: 9, ..e.clone() };
        assert!(l.record(on_h100.clone()));
        assert_eq!(l.entries.len(), 2);
        assert_eq!(l.answer(&e.report.question, h100, s), Answer::Taken(&on_h100));
        assert_eq!(l.answer(&e.report.question, m, s), Answer::Taken(&e));
        assert_eq!(
            l.answer(&e.report.question, m, "s2"),
            Answer::Stale("decided for another version of the problem file".into())
        );
    }

    #[test]
    fn a_new_decision_replaces_the_old_one_and_the_same_one_changes_nothing() {
        let mut l = Decisions::default();
        let e = entry("a.py", "max-autotune", 1);
        assert!(l.record(e.clone()));
        assert!(!l.record(Entry { decided_unix_s: 2, ..e.clone() }), "the same decision again");
        assert_eq!(l.entries[0].decided_unix_s, 1);
        let mut changed = e.clone();
        changed.report.policy = "other".into();
        assert!(l.record(changed));
        assert_eq!(l.entries.len(), 1);
        assert_eq!(l.entries[0].report.policy, "other");
        assert!(l.record(entry("a.py", "default", 4)), "another question is another entry");
        assert_eq!(l.entries.len(), 2);
    }

    #[test]
    fn runs_sharing_a_file_keep_each_others_entries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.json");
        // Two runs read the file at their start (empty), then each records its own decision.
        let threads: Vec<_> = ["a.py", "b.py", "c.py", "d.py"]
            .into_iter()
            .map(|p| {
                let path = path.clone();
                std::thread::spawn(move || Decisions::update(&path, |d| d.record(entry(p, "max-autotune", 1))).unwrap())
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(Decisions::read(&path).unwrap().entries.len(), 4, "no run's write lost another's entry");
    }

    #[test]
    fn bad_files_are_named_with_what_is_wrong() {
        let e = Decisions::parse("{\"decisions\": 2, \"entries\": []}", "l.json").unwrap_err();
        assert_eq!(e.to_string(), "the decisions file l.json is of version 2; this kforge reads version 1");
        let e = Decisions::parse("[1, 2]", "l.json").unwrap_err();
        assert!(
            e.to_string().starts_with("the decisions file l.json is not a kforge optimize decisions file: "),
            "{e}"
        );
        let e = Decisions::parse("{\"decisions\": 1, \"entries\": [{\"report\": 3}]}", "l.json").unwrap_err();
        assert!(e.to_string().contains("not a kforge optimize decisions file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = Decisions::read(dir.path()).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!("the decisions file {} cannot be read: ", dir.path().display())),
            "{e}"
        );
    }
}
