//! The decisions file: a campaign's decided problems in one compact JSON file, each problem's report
//! and nothing else (no journal, no result files, no caches), so that a campaign outlives the
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

use crate::Question;
use crate::Report;
use serde::{Deserialize, Serialize};
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
}

/// One decided problem: its report, and when it was decided (seconds since the Unix epoch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub decided_unix_s: u64,
    pub report: Report,
}

/// Every decided problem, one entry per question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decisions {
    pub decisions: u32,
    pub entries: Vec<Entry>,
}

impl Default for Decisions {
    fn default() -> Self {
        Decisions { decisions: DECISIONS_VERSION, entries: Vec::new() }
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

    /// The report decided for exactly this question, unless its LLM search was cut short.
    pub fn answer(&self, q: &Question) -> Option<&Report> {
        self.entries
            .iter()
            .map(|e| &e.report)
            .find(|r| r.question == *q)
            .filter(|r| !r.llm.as_ref().is_some_and(|l| l.cut_short()))
    }

    /// `report` recorded: it replaces an entry of the same question; true when it changed.
    pub fn record(&mut self, report: &Report, now_unix_s: u64) -> bool {
        match self.entries.iter_mut().find(|e| e.report.question == report.question) {
            Some(e) if e.report == *report => false,
            Some(e) => {
                *e = Entry { decided_unix_s: now_unix_s, report: report.clone() };
                true
            }
            None => {
                self.entries.push(Entry { decided_unix_s: now_unix_s, report: report.clone() });
                true
            }
        }
    }

    /// Its text: one entry a line, ordered by problem (compact, and a diff shows which
    /// problems a run decided).
    pub fn text(&self) -> Result<String, serde_json::Error> {
        let mut entries: Vec<&Entry> = self.entries.iter().collect();
        entries.sort_by(|a, b| a.report.question.problem.cmp(&b.report.question.problem));
        let lines = entries.iter().map(serde_json::to_string).collect::<Result<Vec<_>, _>>()?;
        Ok(format!("{{\"decisions\": {},\n\"entries\": [\n{}\n]}}\n", self.decisions, lines.join(",\n")))
    }

    /// The file written whole (a temporary file beside it, then renamed over it: a run killed
    /// while writing leaves the old file).
    pub fn write(&self, path: &Path) -> Result<(), DecisionsError> {
        let shown = path.display().to_string();
        let text = self.text().map_err(|e| DecisionsError::Write { path: shown.clone(), why: e.to_string() })?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            DecisionsError::Write { path: shown, why: e.to_string() }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::report_for;

    #[test]
    fn a_missing_file_is_empty_and_a_written_one_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/decisions.json");
        let mut l = Decisions::read(&path).unwrap();
        assert!(l.entries.is_empty());
        assert!(l.record(&report_for("b.py", "max-autotune"), 7));
        assert!(l.record(&report_for("a.py", "max-autotune"), 8));
        l.write(&path).unwrap();
        let back = Decisions::read(&path).unwrap();
        let problems: Vec<&str> = back.entries.iter().map(|e| e.report.question.problem.as_str()).collect();
        assert_eq!(problems, ["a.py", "b.py"], "ordered by problem");
        assert_eq!(back.entries[0].decided_unix_s, 8);
        assert!(std::fs::read_dir(path.parent().unwrap()).unwrap().count() == 1, "no temporary file left");
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 5, "one entry a line: {text}");
        assert_eq!(Decisions::parse(&Decisions::default().text().unwrap(), "empty").unwrap(), Decisions::default());
    }

    #[test]
    fn an_answer_is_for_the_same_question_only() {
        let mut l = Decisions::default();
        let r = report_for("a.py", "max-autotune");
        l.record(&r, 1);
        assert_eq!(l.answer(&r.question), Some(&r));
        assert_eq!(l.answer(&report_for("a.py", "default").question), None, "another baseline");
        let mut older = r.question.clone();
        older.steps -= 1;
        assert_eq!(l.answer(&older), None, "older steps answer another question");
    }

    #[test]
    fn a_new_decision_replaces_the_old_one_and_the_same_one_changes_nothing() {
        let mut l = Decisions::default();
        let r = report_for("a.py", "max-autotune");
        assert!(l.record(&r, 1));
        assert!(!l.record(&r, 2), "the same report again");
        assert_eq!(l.entries[0].decided_unix_s, 1);
        let mut changed = r.clone();
        changed.policy = "other".into();
        assert!(l.record(&changed, 3));
        assert_eq!(l.entries.len(), 1);
        assert_eq!(l.entries[0].report.policy, "other");
        assert!(l.record(&report_for("a.py", "default"), 4), "another question is another entry");
        assert_eq!(l.entries.len(), 2);
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
