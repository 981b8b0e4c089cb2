//! The optimize journal's typed side: a run's question, steps, candidates and decisions
//! written to the store (`kforge_store::journal`) as they happen, and read back to resume a run
//! and to skip work already done (a step with the same input hash, a decision for the same
//! question). Conversion to rows happens here and nowhere else.

use crate::budget::Budget;
use crate::search::Step;
use crate::{Agent, Decision, ModeTiming, Question, Verified};
use kforge_store::{
    CandidateRow, DecisionRow, LlmCandidateRow, QuestionRow, RunRow, StepEnd, StepRow, Store, StoreError, WorkStart,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// A content hash (64-bit FNV-1a over the parts, each length-prefixed), as 16 hex digits: the
/// identity of a step's input or of a candidate, for de-duplication and resumption.
pub fn content_hash(parts: &[&[u8]]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in (part.len() as u64).to_le_bytes().iter().chain(part.iter()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

pub fn question_row(q: &Question) -> QuestionRow {
    QuestionRow {
        problem: q.problem.clone(),
        size: q.size.clone(),
        device: q.device.clone(),
        baseline: q.baseline.mode().into(),
        agents: q.agents.iter().map(|a| a.name()).collect::<Vec<_>>().join(","),
        rounds: q.rounds,
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

/// How a step's output came about.
#[derive(Debug, Clone, PartialEq)]
pub struct StepDone {
    pub seconds: f64,
    /// Device seconds and how they were counted (`region` or `wall`); `None` for a host step.
    pub gpu_seconds: Option<(f64, &'static str)>,
    pub output: String,
    pub output_hash: String,
    pub outcome: Option<String>,
}

/// One run's journal: its rows in the store at `path`. Shared by the problems in flight.
pub struct Journal {
    store: Mutex<Store>,
    run: u64,
    /// Whether earlier runs' finished work counts (`--resume`); without it only this run's does
    /// (identical candidates measured once per run).
    resume: bool,
}

impl Journal {
    /// Open the journal at `path` (created if needed) and record the run's start.
    pub fn open(path: &Path, q: &Question, budget: Budget, jobs: u32, resume: bool) -> Result<Journal, StoreError> {
        let store = Store::open(path)?;
        let run = store.insert_run(&RunRow {
            id: 0,
            question: question_row(q),
            budget_gpu_s: budget.gpu_s,
            budget_wall_s: budget.wall_s,
            jobs,
            started_ns: now_ns(),
            finished_ns: None,
            stopped: None,
        })?;
        Ok(Journal { store: Mutex::new(store), run, resume })
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn run(&self) -> u64 {
        self.run
    }

    /// With `--resume`, the decision an earlier run journaled for exactly this question.
    pub fn decision_for(&self, q: &Question) -> Result<Option<DecisionRow>, StoreError> {
        if !self.resume {
            return Ok(None);
        }
        self.store().decision_for(&question_row(q))
    }

    /// This run decides `problem` again (`--redecide`): from here on, `redecided_since` says so,
    /// in this run and later ones.
    pub fn redecide(&self, problem: &str) -> Result<(), StoreError> {
        self.store().mark_redecided(self.run, problem)
    }

    /// The run from which `problem`'s steps and decision count: the latest that started deciding
    /// it again (`--redecide`); `None` when none did. Earlier runs' steps and decisions of it are
    /// not taken.
    pub fn redecided_since(&self, problem: &str) -> Result<Option<u64>, StoreError> {
        self.store().redecided(problem)
    }

    /// Whether any decision of `problem` is journaled, for whatever question (an output folder
    /// from before the journal has none).
    pub fn decided_any(&self, problem: &str) -> Result<bool, StoreError> {
        self.store().decided_any(problem)
    }

    /// A finished step whose output can stand for this one: the same step and input hash, in
    /// this run (or, with `--resume`, in any run).
    pub fn finished(&self, step: Step, input_hash: &str) -> Result<Option<StepRow>, StoreError> {
        let run = if self.resume { None } else { Some(self.run) };
        self.store().finished_step(step.name(), input_hash, run)
    }

    /// `finished`, leaving out bounded results (`BOUNDED`): an older full one is taken over a
    /// newer stopgap.
    pub fn finished_in_full(&self, step: Step, input_hash: &str) -> Result<Option<StepRow>, StoreError> {
        let run = if self.resume { None } else { Some(self.run) };
        self.store().finished_step_without(step.name(), input_hash, run, BOUNDED)
    }

    /// Whether running `bounded`'s step in full was tried since and came to nothing (failed, or
    /// killed with its run after its work began; a withdrawn step did no work): the attempt, if
    /// so. A bounded result is then taken rather than tried in full again.
    pub fn tried_in_full_since(&self, bounded: &StepRow) -> Result<Option<StepRow>, StoreError> {
        self.store().unfinished_attempt_after(&bounded.step, &bounded.input_hash, bounded.id, self.run)
    }

    /// The problem's verify step that finished after the bounded result `bounded` (in run
    /// `since` or later: a redecision's window), if any: the problem went on from the bounded
    /// result, and it is taken rather than run in full again (`Run::stopgap`).
    pub fn verified_after(&self, bounded: &StepRow, since: u64) -> Result<Option<StepRow>, StoreError> {
        self.store().finished_after(&bounded.problem, Step::Verify.name(), bounded.id, since)
    }

    pub fn started(&self, problem: &str, step: Step, input_hash: &str) -> Result<u64, StoreError> {
        self.store().step_started(self.run, problem, step.name(), input_hash, now_ns())
    }

    pub fn done(&self, id: u64, d: &StepDone) -> Result<(), StoreError> {
        self.store().step_finished(
            id,
            &StepEnd {
                status: "done".into(),
                finished_ns: now_ns(),
                seconds: d.seconds,
                gpu_seconds: d.gpu_seconds.map(|g| g.0),
                gpu_seconds_kind: d.gpu_seconds.map(|g| g.1.to_string()),
                output: Some(d.output.clone()),
                output_hash: Some(d.output_hash.clone()),
                outcome: d.outcome.clone(),
                ..StepEnd::default()
            },
        )
    }

    /// A judged LLM candidate of this run (`row.run` is set here).
    pub fn llm_candidate(&self, row: &LlmCandidateRow) -> Result<u64, StoreError> {
        self.store().insert_llm_candidate(&LlmCandidateRow { run: self.run, ..row.clone() })
    }

    /// The verdict an earlier run journaled for this candidate (problem, content hash, judged
    /// under `judge_hash`): with `--replay RUN` the replayed run's, with `--resume` any run's;
    /// otherwise none (it is judged).
    pub fn judged_llm(
        &self,
        problem: &str,
        content_hash: &str,
        judge_hash: &str,
        replayed: Option<u64>,
    ) -> Result<Option<LlmCandidateRow>, StoreError> {
        match replayed {
            Some(run) => self.store().judged_llm_candidate(problem, content_hash, judge_hash, Some(run)),
            None if self.resume => self.store().judged_llm_candidate(problem, content_hash, judge_hash, None),
            None => Ok(None),
        }
    }

    /// The run before this one (whose recorded LLM answers a resumed search replays).
    pub fn run_before(&self) -> Result<Option<u64>, StoreError> {
        self.store().run_before(self.run)
    }

    /// The step took its output from the finished step `from` (no seconds spent).
    pub fn reused(&self, id: u64, from: &StepRow, output: &str) -> Result<(), StoreError> {
        self.store().step_finished(
            id,
            &StepEnd {
                status: "reused".into(),
                finished_ns: now_ns(),
                output: Some(output.into()),
                output_hash: from.output_hash.clone(),
                outcome: from.outcome.clone(),
                reused_from: Some(from.id),
                ..StepEnd::default()
            },
        )
    }

    /// The step was withdrawn when its job started: the budget's remainder could no longer hold
    /// it (`Spending::no_longer_fits`). Not a failure, and not a step done in full: it sets and
    /// clears no floor, and the next run starts it again.
    pub fn withdrawn(&self, id: u64, seconds: f64, why: &str) -> Result<(), StoreError> {
        let end = StepEnd {
            status: WITHDRAWN.into(),
            finished_ns: now_ns(),
            seconds,
            error: Some(why.into()),
            ..StepEnd::default()
        };
        self.store().step_finished(id, &end)
    }

    /// The step failed with `error`. One that ran with deadlines (`bounded`: started bounded, or
    /// under the safety net of a wall budget) is journaled with that outcome whatever the failure
    /// (a measure step whose baseline's compile outlived the step's end is the case it is for):
    /// like a bounded step that finished, it is not one in full: it clears no floor and sets one
    /// at what it ran (`floor_seconds`), so the next run starts it bounded again instead of in
    /// full, where the run's kill would take its siblings' work.
    pub fn failed(&self, id: u64, seconds: f64, error: &str, bounded: bool) -> Result<(), StoreError> {
        let end = StepEnd {
            status: "failed".into(),
            finished_ns: now_ns(),
            seconds,
            outcome: bounded.then(|| BOUNDED.to_string()),
            error: Some(error.into()),
            ..StepEnd::default()
        };
        self.store().step_finished(id, &end)
    }

    /// Every candidate one measurement timed (`modes`: the dispatch family's, or the config
    /// agent's `config`); `verified` is the verdict of the one verified. A candidate's content
    /// hash is its measurement's input hash and its variant.
    pub fn candidates(
        &self,
        problem: &str,
        modes: &BTreeMap<String, ModeTiming>,
        measure_hash: &str,
        verified: &[(&str, Verified)],
    ) -> Result<(), StoreError> {
        let store = self.store();
        for (variant, t) in modes {
            let verdict = verified.iter().find(|(v, _)| v == variant).map(|(_, o)| verified_name(*o));
            store.insert_candidate(&CandidateRow {
                id: 0,
                run: self.run,
                problem: problem.into(),
                agent: Agent::of_variant(variant).name().into(),
                variant: variant.clone(),
                content_hash: content_hash(&[measure_hash.as_bytes(), variant.as_bytes()]),
                speedup: Some(t.speedup),
                ci95: Some(t.ci95),
                beyond_noise: Some(t.beyond_noise),
                verdict,
            })?;
        }
        Ok(())
    }

    pub fn decided(&self, q: &Question, d: &Decision, report: &Path) -> Result<(), StoreError> {
        let (kind, agent, variant, speedup, ci95, reason) = match d {
            Decision::Improved { agent, mode, speedup, ci95 } => {
                ("improved", Some(agent.name().to_string()), Some(mode.clone()), Some(*speedup), Some(*ci95), None)
            }
            Decision::Fallback { reason } => ("fallback", None, None, None, None, Some(reason.clone())),
        };
        self.store().insert_decision(&DecisionRow {
            id: 0,
            run: self.run,
            question: question_row(q),
            kind: kind.into(),
            agent,
            variant,
            speedup,
            ci95,
            reason,
            report: report.display().to_string(),
            decided_ns: now_ns(),
        })?;
        Ok(())
    }

    /// Record the run's end; `stopped` says why it ended before every problem was reached.
    pub fn finish(&self, stopped: Option<&str>) -> Result<(), StoreError> {
        self.store().run_finished(self.run, now_ns(), stopped)
    }

    /// Each step this journal finished by running it in full (not reused, not bounded): its
    /// problem, name and wall seconds; every run's with `--resume`, else this run's.
    pub fn step_seconds(&self) -> Result<Vec<(String, String, f64)>, StoreError> {
        let rows = self.store().journal(if self.resume { None } else { Some(self.run) })?;
        Ok(rows
            .steps
            .into_iter()
            .filter(|s| s.status == "done" && s.reused_from.is_none() && s.outcome.as_deref() != Some(BOUNDED))
            .filter_map(|s| Some((s.seconds? - waited_s(&s), s.problem, s.step)))
            .map(|(seconds, problem, step)| (problem, step, seconds.max(0.0)))
            .collect())
    }

    /// Per input hash, the measure steps this journal finished (every run's with `--resume`,
    /// else this run's): whether one ran in full (or was reused), and the latest bounded one (a
    /// stopgap a later run may take, `tried_in_full_since`). By input hash, not by problem: a
    /// problem whose source or options changed since is not measured, as its step would not
    /// take the old result.
    pub fn measured(&self) -> Result<BTreeMap<String, Measured>, StoreError> {
        let rows = self.store().journal(if self.resume { None } else { Some(self.run) })?;
        let mut out: BTreeMap<String, Measured> = BTreeMap::new();
        for s in rows.steps.into_iter().filter(|s| s.step == Step::Measure.name() && s.status == "done") {
            let m = out.entry(s.input_hash.clone()).or_default();
            if s.outcome.as_deref() == Some(BOUNDED) && s.reused_from.is_none() {
                m.bounded = Some(s);
            } else {
                m.in_full = true;
            }
        }
        Ok(out)
    }

    /// A daemon job of `problem`'s `step` used `peak_bytes` of GPU memory at its highest
    /// (`JobExit::gpu_memory_peak_bytes`); `step` is what the caller keys it by (`kforge
    /// optimize`: the process and the size preset, `dispatch:large`).
    pub fn record_step_memory(&self, problem: &str, step: &str, peak_bytes: u64) -> Result<(), StoreError> {
        self.store().record_step_memory(problem, step, peak_bytes)
    }

    /// What a daemon job of `problem`'s `step` declares as its peak GPU memory: the most an
    /// earlier one of any run of this journal used, with a margin (`with_margin`); `None` when
    /// none was recorded (the daemon then counts with what it learned, or a default share).
    pub fn step_memory(&self, problem: &str, step: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.store().step_memory(problem, step)?.map(with_margin))
    }

    /// The step's work began now (its daemon job started).
    pub fn work_began(&self, id: u64) -> Result<(), StoreError> {
        self.store().step_work_began(id, now_ns())
    }

    /// Record that this run is alive now (its heartbeat, `floor_seconds`' measure of a
    /// killed run).
    pub fn alive(&self) -> Result<(), StoreError> {
        self.store().run_alive(self.run, now_ns())
    }

    /// Each step of an earlier run that did not run in full, whose problem has not since
    /// finished a step of its kind in full or been decided: its problem, name and a lower bound
    /// of what it takes. A step its run left running (that run was killed) had run from its
    /// start to its run's last sign of life (the latest heartbeat, start, end or decision that
    /// run journaled); a bounded one (`BOUNDED`: its deadlines cut it, or it started bounded),
    /// done or failed, for the seconds its work ran (none whose job never left the daemon's
    /// queue). Without the second, a step the safety net cut would be expected to take what its
    /// folder's others take, run in full by every next run and cut again, its problem never
    /// decided. A decision that `--redecide` set aside (a
    /// later run's mark, or `redeciding` in this run) clears no floor: the problem's steps run
    /// again, and the unfinished step showed what one of them takes. With `--resume` only;
    /// none without it.
    pub fn floor_seconds(&self, redeciding: impl Fn(&str) -> bool) -> Result<Vec<Floor>, StoreError> {
        if !self.resume {
            return Ok(Vec::new());
        }
        let (rows, beats, marks) = {
            let store = self.store();
            let rows = store.journal(None)?;
            let mut marks: BTreeMap<String, Option<u64>> = BTreeMap::new();
            for d in &rows.decisions {
                if !marks.contains_key(&d.question.problem) {
                    marks.insert(d.question.problem.clone(), store.redecided(&d.question.problem)?);
                }
            }
            (rows, store.heartbeats()?, marks)
        };
        let set_aside = |d: &kforge_store::DecisionRow| {
            redeciding(&d.question.problem)
                || marks.get(&d.question.problem).copied().flatten().is_some_and(|m| m > d.run)
        };
        let alive = last_signs_of_life(&rows, beats);
        let since = |s: &kforge_store::StepRow| {
            rows.steps.iter().any(|t| t.id > s.id && t.problem == s.problem && t.step == s.step && ran_in_full(t))
                || rows
                    .decisions
                    .iter()
                    .any(|d| d.question.problem == s.problem && d.decided_ns > s.started_ns && !set_aside(d))
        };
        Ok(rows
            .steps
            .iter()
            .filter(|s| s.run != self.run && !since(s))
            .filter_map(|s| {
                if s.status == "running" {
                    let began = match s.work {
                        WorkStart::Waiting => return None, // queued all along: it says nothing of its kind
                        WorkStart::Since(ns) => ns,
                        WorkStart::Unrecorded => s.started_ns,
                    };
                    let seconds = (alive[&s.run] - began) as f64 / 1e9;
                    return Some(Floor { problem: s.problem.clone(), step: s.step.clone(), seconds, killed: true });
                }
                // A bounded step whose job never left the daemon's queue (it failed waiting)
                // says nothing of its kind either: its seconds are the queue's.
                let bounded = s.outcome.as_deref() == Some(BOUNDED) && s.reused_from.is_none();
                if !bounded || s.work == WorkStart::Waiting {
                    return None;
                }
                let seconds = s.seconds.unwrap_or(0.0) - waited_s(s);
                Some(Floor { problem: s.problem.clone(), step: s.step.clone(), seconds, killed: false })
            })
            .filter(|u| u.seconds > 0.0)
            .collect())
    }

    /// `problem`'s finished steps a decisions file carries to a journal on another machine
    /// (`decisions::CarriedStep`): of [`CARRIED_STEPS`], done, their output a JSON file named
    /// relative to the journal's folder; the latest per step and input hash; none from before
    /// the problem was decided again (`--redecide`). Every run's with `--resume`, else this run's.
    /// Each row's `seconds` are its work's: its wait in the daemon's queue left out.
    pub fn carried_steps(&self, problem: &str) -> Result<Vec<StepRow>, StoreError> {
        let since = self.redecided_since(problem)?;
        let rows = self.store().journal(if self.resume { None } else { Some(self.run) })?;
        let mut latest: BTreeMap<(String, String), StepRow> = BTreeMap::new();
        for s in rows.steps.into_iter().filter(|s| s.problem == problem && carried(s)) {
            if since.is_none_or(|m| s.run >= m) {
                let work = s.seconds.map(|t| (t - waited_s(&s)).max(0.0));
                let s = StepRow { seconds: work, ..s };
                latest.insert((s.step.clone(), s.input_hash.clone()), s); // in id order: the latest stays
            }
        }
        Ok(latest.into_values().collect())
    }

    /// A step carried in from a decisions file, journaled as done in this run, its work as long
    /// as `end` says it took where it ran (no wait in a queue); the caller has written its output.
    pub fn carried_in(&self, problem: &str, step: &str, input_hash: &str, end: &StepEnd) -> Result<u64, StoreError> {
        let store = self.store();
        let now = now_ns();
        let id = store.step_started(self.run, problem, step, input_hash, now)?;
        store.step_work_began(id, now)?;
        store.step_finished(id, &StepEnd { status: "done".into(), finished_ns: now, ..end.clone() })?;
        Ok(id)
    }

    /// Everything this run journaled.
    pub fn rows(&self) -> Result<kforge_store::Journal, StoreError> {
        self.store().journal(Some(self.run))
    }
}

/// A recorded peak with room for the run-to-run spread of the allocator's (a quarter, at most
/// 4 GiB, and 512 MiB for a small job): declared smaller than a job's use, admission would crowd
/// the GPU and the daemon's retry alone after an out-of-memory error would cost the job a second
/// run; declared much larger, a big job (64 GiB on an 80 GiB H100) would run alone for nothing.
pub fn with_margin(peak_bytes: u64) -> u64 {
    peak_bytes.saturating_add((peak_bytes / 4).min(4 << 30)).saturating_add(512 << 20)
}

/// The finished measure steps of one input hash (`Journal::measured`).
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// One ran in full, or was taken from an earlier one.
    pub in_full: bool,
    /// The latest that ran bounded.
    pub bounded: Option<StepRow>,
}

/// The outcome of a step that ran bounded (`budget::Admission::Bounded`, or cut by the safety
/// net's deadlines): its seconds are not what its kind takes in full; it clears no floor and
/// sets its problem's at what it ran (`Journal::floor_seconds`).
pub const BOUNDED: &str = "bounded";

/// The status of a step withdrawn when its job started late (`Journal::withdrawn`).
pub const WITHDRAWN: &str = "withdrawn";

/// The verdict outcome's name as `kforge verify` writes it (`passed-without-performance`).
pub fn verified_name(v: Verified) -> String {
    match v {
        Verified::Accepted => "accepted",
        Verified::PassedWithoutPerformance => "passed-without-performance",
        Verified::Rejected => "rejected",
        Verified::CouldNotRun => "could-not-run",
    }
    .into()
}

/// The outcome named by `verified_name` (a journaled verify step's).
pub fn verified_of(name: &str) -> Option<Verified> {
    [Verified::Accepted, Verified::PassedWithoutPerformance, Verified::Rejected, Verified::CouldNotRun]
        .into_iter()
        .find(|v| verified_name(*v) == name)
}

/// A step of an earlier run that did not run in full (`Journal::floor_seconds`): its problem
/// and kind, and the seconds its work ran, a lower bound of what it takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Floor {
    pub problem: String,
    pub step: String,
    pub seconds: f64,
    /// Its run was killed while it ran; else it ran bounded (`BOUNDED`: it started bounded, or
    /// its deadlines cut it, and it ended, done or failed). A killed one is also a sample of its
    /// kind's length; a bounded one only its own problem's floor, since its deadlines were its
    /// run's budget's (one cut at the budget's end says nothing of its siblings).
    pub killed: bool,
}

/// The steps a decisions file carries (`Journal::carried_steps`): those whose one output is a
/// JSON file. The result and config steps write code besides, which a decisions file does not
/// hold; the result step takes a second, and a config step is run again.
pub const CARRIED_STEPS: [Step; 4] = [Step::Measure, Step::Beam, Step::Verify, Step::ConfigVerify];

/// Whether a journaled step is one a decisions file carries: of [`CARRIED_STEPS`], done, its
/// output a JSON file named relative to the journal's folder, with its hash.
fn carried(s: &StepRow) -> bool {
    let json = s.output.as_deref().is_some_and(|o| o.ends_with(".json") && Path::new(o).is_relative());
    CARRIED_STEPS.iter().any(|c| c.name() == s.step) && s.status == "done" && json && s.output_hash.is_some()
}

/// Whether a journaled step ran in full: finished, not withdrawn and not bounded.
fn ran_in_full(t: &StepRow) -> bool {
    t.status != "running" && t.status != WITHDRAWN && t.outcome.as_deref() != Some(BOUNDED)
}

/// Per run, its last sign of life: the latest start, end or decision it journaled, its end,
/// or its latest heartbeat (`beats`).
fn last_signs_of_life(rows: &kforge_store::Journal, beats: Vec<(u64, i64)>) -> BTreeMap<u64, i64> {
    let mut alive: BTreeMap<u64, i64> = BTreeMap::new();
    let mut mark = |run: u64, ns: i64| {
        let e = alive.entry(run).or_insert(ns);
        *e = (*e).max(ns);
    };
    for s in &rows.steps {
        mark(s.run, s.finished_ns.unwrap_or(s.started_ns).max(s.started_ns));
    }
    for d in &rows.decisions {
        mark(d.run, d.decided_ns);
    }
    for (run, ns) in rows.runs.iter().filter_map(|r| Some((r.id, r.finished_ns?))).chain(beats) {
        mark(run, ns);
    }
    alive
}

/// How long a finished step waited before its work began (its job in the daemon's queue): not
/// part of what its kind takes. Zero when unrecorded.
fn waited_s(s: &StepRow) -> f64 {
    match s.work {
        WorkStart::Since(ns) => ((ns - s.started_ns) as f64 / 1e9).max(0.0),
        WorkStart::Waiting | WorkStart::Unrecorded => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Baseline, ConfigMeasurement, DispatchMeasurement};

    /// A run of the journal at `path` with `--resume` (every earlier run's steps read).
    fn resuming(path: &Path) -> Journal {
        Journal::open(path, &question(3), Budget::default(), 1, true).unwrap()
    }

    fn question(rounds: u32) -> Question {
        Question {
            problem: "p.py".into(),
            size: "default".into(),
            device: "cpu".into(),
            baseline: Baseline::Default,
            agents: vec![Agent::Dispatch, Agent::Inductor],
            rounds,
            beam_width: 0,
            steps: crate::STEPS_VERSION,
        }
    }

    #[test]
    fn a_content_hash_separates_its_parts() {
        assert_eq!(content_hash(&[b"ab", b"c"]), content_hash(&[b"ab", b"c"]));
        assert_ne!(content_hash(&[b"ab", b"c"]), content_hash(&[b"a", b"bc"]));
        assert_ne!(content_hash(&[b"x"]), content_hash(&[b"y"]));
        assert_eq!(content_hash(&[]).len(), 16);
        // Pinned: scripts/analysis/backfill_confirmed.py recomputes result hashes the same way
        // (python/tests/test_backfill_confirmed.py pins the same values).
        assert_eq!(content_hash(&[]), "cbf29ce484222325");
        assert_eq!(content_hash(&[b"model_new.py", b"a", b"policy.toml", b"b"]), "928b427e3a580832");
    }

    #[test]
    fn a_problems_carried_steps_are_its_latest_done_json_steps_and_carry_in_as_done() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let first = resuming(&path);
        let finish = |step: Step, hash: &str, output: &str, outcome: Option<&str>| {
            let id = first.started("p.py", step, hash).unwrap();
            let d = StepDone { outcome: outcome.map(str::to_owned), ..done(output) };
            first.done(id, &d).unwrap();
        };
        finish(Step::Measure, "m", "p/dispatch.json", Some(BOUNDED));
        finish(Step::Measure, "m", "p/dispatch.json", None); // the same input again, in full: the latest
        finish(Step::Result, "r", "p/model_new.py", None); // code: not carried
        finish(Step::Verify, "v", "/abs/p/verdict.json", Some("accepted")); // not relative to the journal
        let failed = first.started("p.py", Step::Beam, "b").unwrap();
        first.failed(failed, 3.0, "boom", false).unwrap();
        let other = first.started("q.py", Step::Measure, "m").unwrap();
        first.done(other, &done("q/dispatch.json")).unwrap();
        let carried = first.carried_steps("p.py").unwrap();
        let names: Vec<(&str, Option<&str>)> =
            carried.iter().map(|s| (s.step.as_str(), s.outcome.as_deref())).collect();
        assert_eq!(names, [("measure", None)], "{carried:?}");
        // Carried into a fresh journal: a finished step of this run there, taken like its own.
        let fresh_path = dir.path().join("fresh.db");
        let fresh = resuming(&fresh_path);
        let end = StepEnd {
            seconds: 348.9,
            gpu_seconds: Some(40.5),
            gpu_seconds_kind: Some("region".into()),
            output: Some("p/dispatch.json".into()),
            output_hash: Some("oh".into()),
            outcome: Some(BOUNDED.into()),
            ..StepEnd::default()
        };
        fresh.carried_in("p.py", "measure", "m", &end).unwrap();
        let row = fresh.finished(Step::Measure, "m").unwrap().expect("carried in");
        assert_eq!((row.status.as_str(), row.seconds, row.output_hash.as_deref()), ("done", Some(348.9), Some("oh")));
        assert_eq!(row.reused_from, None, "its own: a bounded one stays bounded");
        assert!(fresh.measured().unwrap()["m"].bounded.is_some());
        assert_eq!(fresh.carried_steps("p.py").unwrap().len(), 1, "and carried on from there");
    }

    #[test]
    fn verdict_names_round_trip_as_verify_writes_them() {
        for v in [Verified::Accepted, Verified::PassedWithoutPerformance, Verified::Rejected, Verified::CouldNotRun] {
            assert_eq!(serde_json::to_value(v).unwrap(), serde_json::json!(verified_name(v)));
            assert_eq!(verified_of(&verified_name(v)), Some(v));
        }
        assert_eq!(verified_of("maybe"), None);
    }

    fn done(output: &str) -> StepDone {
        StepDone {
            seconds: 2.0,
            gpu_seconds: Some((1.5, "wall")),
            output: output.into(),
            output_hash: "oh".into(),
            outcome: Some("accepted".into()),
        }
    }

    #[test]
    fn finished_work_counts_within_a_run_and_across_runs_only_when_resuming() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let first = Journal::open(&path, &question(3), Budget::default(), 1, false).unwrap();
        let id = first.started("p.py", Step::Measure, "h").unwrap();
        assert_eq!(first.finished(Step::Measure, "h").unwrap(), None, "running is not finished");
        first.done(id, &done("o/dispatch.json")).unwrap();
        assert_eq!(first.finished(Step::Measure, "h").unwrap().unwrap().gpu_seconds_kind.as_deref(), Some("wall"));
        let d = Decision::Fallback { reason: "nothing won".into() };
        first.decided(&question(3), &d, Path::new("o/report.json")).unwrap();
        drop(first);
        // A new run without --resume measures again; with it, takes the step and the decision.
        let fresh = Journal::open(&path, &question(3), Budget::default(), 1, false).unwrap();
        assert_eq!(fresh.finished(Step::Measure, "h").unwrap(), None);
        assert_eq!(fresh.decision_for(&question(3)).unwrap(), None);
        let resumed = resuming(&path);
        let from = resumed.finished(Step::Measure, "h").unwrap().unwrap();
        assert_eq!(resumed.decision_for(&question(3)).unwrap().unwrap().reason.as_deref(), Some("nothing won"));
        assert_eq!(resumed.decision_for(&question(4)).unwrap(), None, "another question is run again");
        let again = resumed.started("p.py", Step::Measure, "h").unwrap();
        resumed.reused(again, &from, "o/dispatch.json").unwrap();
        let rows = resumed.rows().unwrap();
        assert_eq!(rows.steps.len(), 1);
        assert_eq!((rows.steps[0].status.as_str(), rows.steps[0].reused_from), ("reused", Some(from.id)));
        assert_eq!(rows.steps[0].outcome.as_deref(), Some("accepted"));
        resumed.finish(Some("budget")).unwrap();
        assert_eq!(resumed.rows().unwrap().runs[0].stopped.as_deref(), Some("budget"));
    }

    /// Each unfinished step as (problem, step, seconds).
    fn triples(u: Vec<Floor>) -> Vec<(String, String, f64)> {
        u.into_iter().map(|u| (u.problem, u.step, u.seconds)).collect()
    }

    fn began(s: &StepRow) -> i64 {
        match s.work {
            WorkStart::Since(ns) => ns,
            other => panic!("its work began: {other:?}"),
        }
    }

    #[test]
    fn time_in_the_daemons_queue_is_not_what_a_step_takes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let killed = resuming(&path);
        let waited = killed.started("l1/a.py", Step::Measure, "ha").unwrap();
        let queued = killed.started("l1/b.py", Step::Config, "hb").unwrap(); // never left the queue
        let ran = killed.started("l1/c.py", Step::Config, "hc").unwrap();
        killed.work_began(ran).unwrap();
        let (run, store) = (killed.run(), kforge_store::Store::open(&path).unwrap());
        let start = store.journal(None).unwrap().steps[0].started_ns;
        // `waited` began 30 s after it started and finished 10 s later.
        store.step_work_began(waited, start + 30_000_000_000).unwrap();
        killed.done(waited, &StepDone { seconds: 40.0, ..done("o/dispatch.json") }).unwrap();
        store.run_alive(run, began(&store.journal(None).unwrap().steps[2]) + 60_000_000_000).unwrap();
        drop((killed, store));
        let resumed = resuming(&path);
        let took: Vec<(String, f64)> = resumed.step_seconds().unwrap().into_iter().map(|(p, _, s)| (p, s)).collect();
        assert_eq!(took.len(), 1);
        assert!((took[0].1 - 10.0).abs() < 1e-6 && took[0].0 == "l1/a.py", "the 30 s in the queue left out: {took:?}");
        assert_eq!(
            triples(resumed.floor_seconds(|_| false).unwrap()),
            [("l1/c.py".to_string(), "config".to_string(), 60.0)],
            "the step that never left the queue ({queued}) sets no floor; the one that ran, from when it began"
        );
    }

    #[test]
    fn a_withdrawn_step_neither_clears_a_floor_nor_counts_as_what_its_kind_takes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let killed = resuming(&path);
        let a = killed.started("l3/a.py", Step::Measure, "ha").unwrap();
        killed.work_began(a).unwrap();
        killed.alive().unwrap();
        drop(killed);
        let resumed = resuming(&path);
        let floor = triples(resumed.floor_seconds(|_| false).unwrap());
        assert_eq!(floor.len(), 1);
        let again = resumed.started("l3/a.py", Step::Measure, "ha").unwrap();
        resumed.work_began(again).unwrap();
        resumed.withdrawn(again, 0.5, "a measure step takes at least 525 s here").unwrap();
        assert_eq!(triples(resumed.floor_seconds(|_| false).unwrap()), floor, "the floor stays");
        assert_eq!(resumed.step_seconds().unwrap(), [], "nor is 0.5 s what a measure step takes");
        let rows = resumed.rows().unwrap();
        assert_eq!(
            (rows.steps[0].status.as_str(), rows.steps[0].error.as_deref()),
            (WITHDRAWN, Some("a measure step takes at least 525 s here"))
        );
    }

    #[test]
    fn a_later_run_declares_what_a_steps_job_used_with_a_margin() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let first = resuming(&path);
        assert_eq!(first.step_memory("l3/a.py", "dispatch").unwrap(), None);
        first.record_step_memory("l3/a.py", "dispatch", 8 << 30).unwrap();
        drop(first);
        let later = resuming(&path);
        let declared = later.step_memory("l3/a.py", "dispatch").unwrap().unwrap();
        assert_eq!(declared, (10 << 30) + (512 << 20), "8 GiB and a quarter, and 512 MiB");
        assert_eq!(later.step_memory("l3/a.py", "config").unwrap(), None, "per step");
        assert_eq!(with_margin(64 << 30), (68 << 30) + (512 << 20), "a quarter, at most 4 GiB");
    }

    #[test]
    fn a_step_a_killed_run_left_running_is_a_lower_bound_until_one_finishes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let killed = resuming(&path);
        let a = killed.started("l3/a.py", Step::Measure, "ha").unwrap();
        killed.work_began(a).unwrap(); // its job started
        let b = killed.started("l1/b.py", Step::Measure, "hb").unwrap();
        killed.done(b, &done("o/dispatch.json")).unwrap(); // its last sign of life
        assert_eq!(
            triples(killed.floor_seconds(|_| false).unwrap()),
            [],
            "its own running step is in flight, not unfinished"
        );
        drop(killed); // killed: `a` stays running
        let rows = resuming(&path).rows().unwrap();
        assert!(rows.steps.is_empty(), "a new run journals nothing by opening");
        let all = kforge_store::Store::open(&path).unwrap().journal(None).unwrap();
        let (start, alive) = (began(&all.steps[0]), all.steps[1].finished_ns.unwrap());
        let resumed = resuming(&path);
        let u = triples(resumed.floor_seconds(|_| false).unwrap());
        assert!(resumed.floor_seconds(|_| false).unwrap()[0].killed, "left running by a killed run");
        assert_eq!(u, [("l3/a.py".to_string(), "measure".to_string(), (alive - start) as f64 / 1e9)]);
        let fresh = Journal::open(&path, &question(3), Budget::default(), 1, false).unwrap();
        assert_eq!(triples(fresh.floor_seconds(|_| false).unwrap()), [], "without --resume earlier runs are not read");
        let again = resumed.started("l3/a.py", Step::Measure, "ha").unwrap();
        assert_eq!(triples(resumed.floor_seconds(|_| false).unwrap()), u, "until one finishes");
        let bounded = StepDone { outcome: Some(BOUNDED.into()), ..done("o/dispatch.json") };
        resumed.done(again, &bounded).unwrap();
        assert_eq!(
            triples(resumed.floor_seconds(|_| false).unwrap()),
            u,
            "a bounded step is not one in full: the floor stays"
        );
        let failed = resumed.started("l3/a.py", Step::Measure, "ha").unwrap();
        resumed.failed(failed, 400.0, "the baseline 'max-autotune' was not prepared in time", true).unwrap();
        assert_eq!(triples(resumed.floor_seconds(|_| false).unwrap()), u, "nor is a bounded one that failed");
        assert!(
            !resumed.step_seconds().unwrap().iter().any(|(p, step, _)| p == "l3/a.py" && step == "measure"),
            "nor is its time what a step of its kind takes"
        );
        let full = resumed.started("l3/a.py", Step::Measure, "ha").unwrap();
        resumed.done(full, &done("o/dispatch.json")).unwrap();
        assert_eq!(
            triples(resumed.floor_seconds(|_| false).unwrap()),
            [],
            "finished since: its time is the finished one's"
        );
        assert!(a < again);
    }

    #[test]
    fn a_bounded_step_is_a_floor_of_what_its_work_ran_for_later_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let first = resuming(&path);
        let cut = first.started("l3/a.py", Step::Measure, "ha").unwrap();
        first.work_began(cut).unwrap();
        first
            .done(cut, &StepDone { seconds: 217.0, outcome: Some(BOUNDED.into()), ..done("o/dispatch.json") })
            .unwrap();
        let failed = first.started("l3/b.py", Step::Measure, "hb").unwrap();
        first.work_began(failed).unwrap();
        first.failed(failed, 300.0, "the baseline 'max-autotune' was not prepared in time", true).unwrap();
        let queued = first.started("l3/d.py", Step::Measure, "hd").unwrap(); // its job never started
        first.failed(queued, 250.0, "the daemon went away", true).unwrap();
        let full = first.started("l3/c.py", Step::Measure, "hc").unwrap();
        first.done(full, &StepDone { seconds: 90.0, ..done("o/dispatch.json") }).unwrap();
        assert_eq!(triples(first.floor_seconds(|_| false).unwrap()), [], "its own run's steps are no floor of it");
        drop(first);
        let second = resuming(&path);
        let floors = triples(second.floor_seconds(|_| false).unwrap());
        // Less the instant between the step's start and its work's (the test's own calls).
        let of = |p: &str| floors.iter().find(|f| f.0 == p).map(|f| (f.1.as_str(), f.2.round()));
        assert_eq!(of("l3/a.py"), Some(("measure", 217.0)), "cut, done: at least what it ran");
        assert_eq!(of("l3/b.py"), Some(("measure", 300.0)), "bounded, failed: the same");
        assert_eq!(of("l3/c.py"), None, "run in full: its time is an estimate, not a floor");
        assert_eq!(of("l3/d.py"), None, "failed in the daemon's queue: its seconds are the queue's");
        let raw = second.floor_seconds(|_| false).unwrap();
        assert!(raw.iter().all(|u| !u.killed), "bounded, not killed: a floor, not a sample of their kind: {raw:?}");
        let reused = second.started("l3/a.py", Step::Measure, "ha").unwrap();
        let row = second.finished(Step::Measure, "ha").unwrap().unwrap();
        second.reused(reused, &row, "o/dispatch.json").unwrap();
        let again = second.started("l3/b.py", Step::Measure, "hb").unwrap();
        second.done(again, &done("o/dispatch.json")).unwrap();
        drop(second);
        let third = resuming(&path);
        let floors: Vec<(String, String, f64)> =
            triples(third.floor_seconds(|_| false).unwrap()).into_iter().map(|(p, s, f)| (p, s, f.round())).collect();
        assert_eq!(
            floors,
            [("l3/a.py".to_string(), "measure".to_string(), 217.0)],
            "a reuse of the bounded result is no new floor and clears none; b ran in full since"
        );
    }

    #[test]
    fn a_killed_runs_heartbeat_is_its_last_sign_of_life_and_a_decision_clears_its_floor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let killed = resuming(&path);
        let a = killed.started("l3/a.py", Step::Measure, "ha").unwrap();
        killed.work_began(a).unwrap(); // its last journaled event
        assert_eq!(triples(killed.floor_seconds(|_| false).unwrap()), []);
        killed.alive().unwrap();
        let run = killed.run();
        drop(killed);
        let store = kforge_store::Store::open(&path).unwrap();
        let start = began(&store.journal(None).unwrap().steps[0]);
        store.run_alive(run, start + 90_000_000_000).unwrap();
        store.run_alive(run, start + 5_000_000_000).unwrap(); // an older beat does not move it back
        assert_eq!(store.heartbeats().unwrap(), [(run, start + 90_000_000_000)]);
        drop(store);
        let resumed = resuming(&path);
        assert_eq!(
            triples(resumed.floor_seconds(|_| false).unwrap()),
            [("l3/a.py".to_string(), "measure".to_string(), 90.0)]
        );
        let d = Decision::Fallback { reason: "nothing won".into() };
        let q = Question { problem: "l3/a.py".into(), ..question(3) };
        resumed.decided(&q, &d, Path::new("o/report.json")).unwrap();
        assert_eq!(
            triples(resumed.floor_seconds(|_| false).unwrap()),
            [],
            "decided since (a decisions file's report): no floor"
        );
        let floor = [("l3/a.py".to_string(), "measure".to_string(), 90.0)];
        assert_eq!(
            triples(resumed.floor_seconds(|p| p == "l3/a.py").unwrap()),
            floor,
            "decided again in this run: the floor is back"
        );
        drop(resumed);
        let again = resuming(&path);
        again.redecide("l3/a.py").unwrap();
        assert_eq!(
            triples(again.floor_seconds(|_| false).unwrap()),
            floor,
            "a later run's --redecide set the decision aside"
        );
        again.decided(&q, &d, Path::new("o/report.json")).unwrap();
        assert_eq!(triples(again.floor_seconds(|_| false).unwrap()), [], "the redecision's own decision clears it");
    }

    #[test]
    fn candidates_carry_their_agent_hash_and_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.db"), &question(3), Budget::default(), 1, false).unwrap();
        let m = DispatchMeasurement::parse(
            r#"{"baseline": "default", "winner": "default+freezing", "fallback": false,
                "modes": {"eager": {"speedup": 0.9, "ci95": [0.8, 1.0], "beyond_noise": false},
                          "default+freezing": {"speedup": 1.3, "ci95": [1.2, 1.4], "beyond_noise": true}}}"#,
        )
        .unwrap();
        j.candidates("p.py", &m.modes, "mh", &[("default+freezing", Verified::PassedWithoutPerformance)]).unwrap();
        let c = j.rows().unwrap().candidates;
        let got: Vec<(&str, &str, Option<&str>)> =
            c.iter().map(|c| (c.agent.as_str(), c.variant.as_str(), c.verdict.as_deref())).collect();
        assert_eq!(
            got,
            [("inductor", "default+freezing", Some("passed-without-performance")), ("dispatch", "eager", None)]
        );
        assert_ne!(c[0].content_hash, c[1].content_hash);
        assert_eq!(c[0].content_hash, content_hash(&[b"mh", b"default+freezing"]));
        // The config agent's candidate, from its own measurement, with its verdict.
        let config = ConfigMeasurement::parse(include_str!("../testdata/config.json")).unwrap();
        j.candidates("p.py", &config.modes, "ch", &[("config", Verified::Accepted)]).unwrap();
        let rows = j.rows().unwrap().candidates;
        let c = rows.iter().find(|c| c.variant == "config").unwrap();
        assert_eq!((c.agent.as_str(), c.verdict.as_deref(), c.speedup), ("config", Some("accepted"), Some(1.21)));
        assert_eq!(c.content_hash, content_hash(&[b"ch", b"config"]));
    }
}
