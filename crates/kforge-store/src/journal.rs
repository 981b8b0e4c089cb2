//! The optimize journal: what `kforge optimize` asked, did and decided, row by row, each write
//! in its own transaction (a run killed mid-problem leaves every finished step recorded and the
//! step it was in as `running`). Rows hold plain values; `kforge_optimize::journal` turns them
//! into its types. The tables are added by `CREATE TABLE IF NOT EXISTS` like every other table
//! of the store, so an older store file gains them in place.

use crate::{Store, StoreError};
use rusqlite::{params, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS optimize_runs (
  id INTEGER PRIMARY KEY, problem TEXT NOT NULL, size TEXT NOT NULL, device TEXT NOT NULL,
  baseline TEXT NOT NULL, agents TEXT NOT NULL, rounds INTEGER NOT NULL, budget_gpu_s REAL,
  budget_wall_s REAL, jobs INTEGER NOT NULL, started_ns INTEGER NOT NULL, finished_ns INTEGER, stopped TEXT);
CREATE TABLE IF NOT EXISTS optimize_steps (
  id INTEGER PRIMARY KEY, run INTEGER NOT NULL, problem TEXT NOT NULL, step TEXT NOT NULL,
  input_hash TEXT NOT NULL, status TEXT NOT NULL, started_ns INTEGER NOT NULL, finished_ns INTEGER,
  seconds REAL, gpu_seconds REAL, gpu_seconds_kind TEXT, output TEXT, output_hash TEXT, outcome TEXT,
  error TEXT, reused_from INTEGER);
CREATE TABLE IF NOT EXISTS optimize_candidates (
  id INTEGER PRIMARY KEY, run INTEGER NOT NULL, problem TEXT NOT NULL, agent TEXT NOT NULL,
  variant TEXT NOT NULL, content_hash TEXT NOT NULL, speedup REAL, ci95_lo REAL, ci95_hi REAL,
  beyond_noise INTEGER, verdict TEXT);
CREATE TABLE IF NOT EXISTS optimize_decisions (
  id INTEGER PRIMARY KEY, run INTEGER NOT NULL, problem TEXT NOT NULL, size TEXT NOT NULL,
  device TEXT NOT NULL, baseline TEXT NOT NULL, agents TEXT NOT NULL, rounds INTEGER NOT NULL,
  kind TEXT NOT NULL, agent TEXT, variant TEXT, speedup REAL, ci95_lo REAL, ci95_hi REAL, reason TEXT,
  report TEXT NOT NULL, decided_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS optimize_llm_candidates (
  id INTEGER PRIMARY KEY, run INTEGER NOT NULL, problem TEXT NOT NULL, candidate TEXT NOT NULL,
  iteration INTEGER NOT NULL, chain INTEGER NOT NULL, plan INTEGER NOT NULL, attempt INTEGER NOT NULL,
  strategy TEXT NOT NULL, content_hash TEXT NOT NULL, source TEXT NOT NULL, parent TEXT, duplicate_of TEXT,
  verdict TEXT NOT NULL, gate TEXT, reason TEXT, exploit INTEGER NOT NULL, speedup REAL, feedback TEXT NOT NULL,
  judged_ns INTEGER NOT NULL, judge_hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS optimize_step_jobs (step INTEGER PRIMARY KEY, started_ns INTEGER);
CREATE TABLE IF NOT EXISTS optimize_heartbeats (run INTEGER PRIMARY KEY, alive_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS optimize_step_memory (problem TEXT NOT NULL, step TEXT NOT NULL, peak_bytes INTEGER NOT NULL,
  PRIMARY KEY(problem, step));
CREATE TABLE IF NOT EXISTS optimize_redecided (problem TEXT NOT NULL, run INTEGER NOT NULL, PRIMARY KEY(problem, run));
CREATE INDEX IF NOT EXISTS optimize_llm_candidates_hash ON optimize_llm_candidates(problem, content_hash);
CREATE INDEX IF NOT EXISTS optimize_steps_hash ON optimize_steps(step, input_hash);
CREATE INDEX IF NOT EXISTS optimize_decisions_problem ON optimize_decisions(problem);
";

/// What a run or a problem was asked (`kforge_optimize::Question` as columns; `agents`
/// comma-separated).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuestionRow {
    pub problem: String,
    pub size: String,
    pub device: String,
    pub baseline: String,
    pub agents: String,
    pub rounds: u32,
}

/// One invocation of `kforge optimize` (a problem or a campaign directory).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    pub id: u64,
    pub question: QuestionRow,
    pub budget_gpu_s: Option<f64>,
    pub budget_wall_s: Option<f64>,
    pub jobs: u32,
    pub started_ns: i64,
    pub finished_ns: Option<i64>,
    /// Why it stopped before every problem was reached (`budget`), when it did.
    pub stopped: Option<String>,
}

/// One step of one problem: `running` from its start, then `done`, `failed` or `reused` (its
/// output taken from an earlier step with the same input hash, `reused_from`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRow {
    pub id: u64,
    pub run: u64,
    pub problem: String,
    pub step: String,
    /// A content hash of everything that decides the step's output.
    pub input_hash: String,
    pub status: String,
    pub started_ns: i64,
    pub finished_ns: Option<i64>,
    pub seconds: Option<f64>,
    pub gpu_seconds: Option<f64>,
    /// `region` (time inside the daemon's regions) or `wall` (the step's wall seconds).
    pub gpu_seconds_kind: Option<String>,
    /// The file it wrote and that file's content hash.
    pub output: Option<String>,
    pub output_hash: Option<String>,
    /// What it found, for steps whose answer is a word (verify: the verdict's outcome).
    pub outcome: Option<String>,
    pub error: Option<String>,
    pub reused_from: Option<u64>,
    /// When its work began to run (its daemon job started: a job may wait in the daemon's
    /// queue first).
    #[serde(default)]
    pub work: WorkStart,
}

/// When a step's work began to run, as the journal knows it (`optimize_step_jobs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkStart {
    /// Not recorded: a journal from before the record.
    #[default]
    Unrecorded,
    /// Its work had not begun (its job waited in the daemon's queue).
    Waiting,
    /// It began then (Unix ns).
    Since(i64),
}

/// The step rows' columns, each with its work's start (`WorkStart`).
const STEP_COLUMNS: &str = "s.*, j.step AS job_step, j.started_ns AS job_started_ns
  FROM optimize_steps s LEFT JOIN optimize_step_jobs j ON j.step = s.id";

/// How a step ended (the columns `step_finished` fills in).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepEnd {
    pub status: String,
    pub finished_ns: i64,
    pub seconds: f64,
    pub gpu_seconds: Option<f64>,
    pub gpu_seconds_kind: Option<String>,
    pub output: Option<String>,
    pub output_hash: Option<String>,
    pub outcome: Option<String>,
    pub error: Option<String>,
    pub reused_from: Option<u64>,
}

/// One measured candidate of one problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateRow {
    pub id: u64,
    pub run: u64,
    pub problem: String,
    pub agent: String,
    pub variant: String,
    pub content_hash: String,
    pub speedup: Option<f64>,
    pub ci95: Option<[f64; 2]>,
    pub beyond_noise: Option<bool>,
    /// The verdict's outcome, for the candidate that was verified.
    pub verdict: Option<String>,
}

/// One candidate an LLM agent wrote, as judged: where it sits in the search (iteration, chain,
/// plan, attempt), its source file and hash, and its verdict (`accepted`,
/// `passed-without-performance`, `rejected`, `could-not-run`) with the rejecting gate, why, and
/// whether the rejection was an exploit check's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmCandidateRow {
    pub id: u64,
    pub run: u64,
    pub problem: String,
    /// The candidate's id in its search (`i1-c0-p2-a1`).
    pub candidate: String,
    pub iteration: u32,
    pub chain: u32,
    pub plan: u32,
    pub attempt: u32,
    pub strategy: String,
    pub content_hash: String,
    /// Its source file, saved before it was judged.
    pub source: String,
    pub parent: Option<String>,
    pub duplicate_of: Option<String>,
    pub verdict: String,
    pub gate: Option<String>,
    pub reason: Option<String>,
    pub exploit: bool,
    pub speedup: Option<f64>,
    /// What was fed back to the model about it.
    pub feedback: String,
    pub judged_ns: i64,
    /// A hash of what else decided the verdict (size, device, baseline, the verify policy): a
    /// verdict stands for another run's only under the same.
    pub judge_hash: String,
}

/// A problem's decision for its question: `improved` (agent, variant, speedup) or `fallback`
/// (reason); `report` is the report file written with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRow {
    pub id: u64,
    pub run: u64,
    pub question: QuestionRow,
    pub kind: String,
    pub agent: Option<String>,
    pub variant: Option<String>,
    pub speedup: Option<f64>,
    pub ci95: Option<[f64; 2]>,
    pub reason: Option<String>,
    pub report: String,
    pub decided_ns: i64,
}

/// Everything journaled (all runs, or one).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Journal {
    pub runs: Vec<RunRow>,
    pub steps: Vec<StepRow>,
    pub candidates: Vec<CandidateRow>,
    pub decisions: Vec<DecisionRow>,
    #[serde(default)]
    pub llm_candidates: Vec<LlmCandidateRow>,
}

fn ci(lo: Option<f64>, hi: Option<f64>) -> Option<[f64; 2]> {
    Some([lo?, hi?])
}

fn question(r: &Row) -> rusqlite::Result<QuestionRow> {
    Ok(QuestionRow {
        problem: r.get("problem")?,
        size: r.get("size")?,
        device: r.get("device")?,
        baseline: r.get("baseline")?,
        agents: r.get("agents")?,
        rounds: r.get("rounds")?,
    })
}

fn id(r: &Row, col: &str) -> rusqlite::Result<u64> {
    Ok(r.get::<_, i64>(col)? as u64)
}

fn opt_id(r: &Row, col: &str) -> rusqlite::Result<Option<u64>> {
    Ok(r.get::<_, Option<i64>>(col)?.map(|v| v as u64))
}

fn run_row(r: &Row) -> rusqlite::Result<RunRow> {
    Ok(RunRow {
        id: id(r, "id")?,
        question: question(r)?,
        budget_gpu_s: r.get("budget_gpu_s")?,
        budget_wall_s: r.get("budget_wall_s")?,
        jobs: r.get("jobs")?,
        started_ns: r.get("started_ns")?,
        finished_ns: r.get("finished_ns")?,
        stopped: r.get("stopped")?,
    })
}

fn step_row(r: &Row) -> rusqlite::Result<StepRow> {
    Ok(StepRow {
        id: id(r, "id")?,
        run: id(r, "run")?,
        problem: r.get("problem")?,
        step: r.get("step")?,
        input_hash: r.get("input_hash")?,
        status: r.get("status")?,
        started_ns: r.get("started_ns")?,
        finished_ns: r.get("finished_ns")?,
        seconds: r.get("seconds")?,
        gpu_seconds: r.get("gpu_seconds")?,
        gpu_seconds_kind: r.get("gpu_seconds_kind")?,
        output: r.get("output")?,
        output_hash: r.get("output_hash")?,
        outcome: r.get("outcome")?,
        error: r.get("error")?,
        reused_from: opt_id(r, "reused_from")?,
        work: match (r.get::<_, Option<i64>>("job_step")?, r.get::<_, Option<i64>>("job_started_ns")?) {
            (None, _) => WorkStart::Unrecorded,
            (Some(_), None) => WorkStart::Waiting,
            (Some(_), Some(ns)) => WorkStart::Since(ns),
        },
    })
}

fn candidate_row(r: &Row) -> rusqlite::Result<CandidateRow> {
    Ok(CandidateRow {
        id: id(r, "id")?,
        run: id(r, "run")?,
        problem: r.get("problem")?,
        agent: r.get("agent")?,
        variant: r.get("variant")?,
        content_hash: r.get("content_hash")?,
        speedup: r.get("speedup")?,
        ci95: ci(r.get("ci95_lo")?, r.get("ci95_hi")?),
        beyond_noise: r.get("beyond_noise")?,
        verdict: r.get("verdict")?,
    })
}

fn decision_row(r: &Row) -> rusqlite::Result<DecisionRow> {
    Ok(DecisionRow {
        id: id(r, "id")?,
        run: id(r, "run")?,
        question: question(r)?,
        kind: r.get("kind")?,
        agent: r.get("agent")?,
        variant: r.get("variant")?,
        speedup: r.get("speedup")?,
        ci95: ci(r.get("ci95_lo")?, r.get("ci95_hi")?),
        reason: r.get("reason")?,
        report: r.get("report")?,
        decided_ns: r.get("decided_ns")?,
    })
}

fn llm_candidate_row(r: &Row) -> rusqlite::Result<LlmCandidateRow> {
    Ok(LlmCandidateRow {
        id: id(r, "id")?,
        run: id(r, "run")?,
        problem: r.get("problem")?,
        candidate: r.get("candidate")?,
        iteration: r.get("iteration")?,
        chain: r.get("chain")?,
        plan: r.get("plan")?,
        attempt: r.get("attempt")?,
        strategy: r.get("strategy")?,
        content_hash: r.get("content_hash")?,
        source: r.get("source")?,
        parent: r.get("parent")?,
        duplicate_of: r.get("duplicate_of")?,
        verdict: r.get("verdict")?,
        gate: r.get("gate")?,
        reason: r.get("reason")?,
        exploit: r.get("exploit")?,
        speedup: r.get("speedup")?,
        feedback: r.get("feedback")?,
        judged_ns: r.get("judged_ns")?,
        judge_hash: r.get("judge_hash")?,
    })
}

impl Store {
    /// Record a run's start; its id.
    pub fn insert_run(&self, r: &RunRow) -> Result<u64, StoreError> {
        let q = &r.question;
        self.conn
            .execute(
                "INSERT INTO optimize_runs(problem,size,device,baseline,agents,rounds,budget_gpu_s,budget_wall_s,jobs,
                   started_ns,finished_ns,stopped) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)",
                params![
                    q.problem,
                    q.size,
                    q.device,
                    q.baseline,
                    q.agents,
                    q.rounds,
                    r.budget_gpu_s,
                    r.budget_wall_s,
                    r.jobs,
                    r.started_ns,
                    r.finished_ns,
                    r.stopped
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(self.conn.last_insert_rowid() as u64)
    }

    pub fn run_finished(&self, run: u64, finished_ns: i64, stopped: Option<&str>) -> Result<(), StoreError> {
        self.update(
            "UPDATE optimize_runs SET finished_ns=?2, stopped=?3 WHERE id=?1",
            "run",
            run,
            params![run as i64, finished_ns, stopped],
        )
    }

    /// Record a step's start (its `status` is `running` until `step_finished`); its id.
    pub fn step_started(
        &self,
        run: u64,
        problem: &str,
        step: &str,
        input_hash: &str,
        started_ns: i64,
    ) -> Result<u64, StoreError> {
        self.conn
            .execute(
                "INSERT INTO optimize_steps(run,problem,step,input_hash,status,started_ns) VALUES(?1,?2,?3,?4,'running',?5)",
                params![run as i64, problem, step, input_hash, started_ns],
            )
            .map_err(|e| self.err(e))?;
        let id = self.conn.last_insert_rowid();
        // Its work waits until `step_work_began` says otherwise (a killed run's step that never
        // began says nothing of how long its kind takes).
        self.conn
            .execute("INSERT OR REPLACE INTO optimize_step_jobs(step, started_ns) VALUES(?1, NULL)", params![id])
            .map_err(|e| self.err(e))?;
        Ok(id as u64)
    }

    /// The step's work began at `ns` (its daemon job started); the first start counts (a job
    /// run again alone after an out-of-memory error keeps it).
    pub fn step_work_began(&self, step: u64, ns: i64) -> Result<(), StoreError> {
        self.update(
            "UPDATE optimize_step_jobs SET started_ns = COALESCE(started_ns, ?2) WHERE step=?1",
            "step",
            step,
            params![step as i64, ns],
        )
    }

    pub fn step_finished(&self, step: u64, e: &StepEnd) -> Result<(), StoreError> {
        self.update(
            "UPDATE optimize_steps SET status=?2, finished_ns=?3, seconds=?4, gpu_seconds=?5, gpu_seconds_kind=?6,
               output=?7, output_hash=?8, outcome=?9, error=?10, reused_from=?11 WHERE id=?1",
            "step",
            step,
            params![
                step as i64,
                e.status,
                e.finished_ns,
                e.seconds,
                e.gpu_seconds,
                e.gpu_seconds_kind,
                e.output,
                e.output_hash,
                e.outcome,
                e.error,
                e.reused_from.map(|v| v as i64)
            ],
        )
    }

    /// Record that run `run` was alive at `alive_ns` (its heartbeat: a run killed between two
    /// journaled events still tells when it was last alive).
    pub fn run_alive(&self, run: u64, alive_ns: i64) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO optimize_heartbeats(run, alive_ns) VALUES(?1, ?2)
                   ON CONFLICT(run) DO UPDATE SET alive_ns=max(alive_ns, excluded.alive_ns)",
                params![run as i64, alive_ns],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Each run's last heartbeat (`run_alive`).
    pub fn heartbeats(&self) -> Result<Vec<(u64, i64)>, StoreError> {
        let mut st =
            self.conn.prepare("SELECT run, alive_ns FROM optimize_heartbeats ORDER BY run").map_err(|e| self.err(e))?;
        let rows =
            st.query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)?))).map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    /// The latest step named `step` with this input hash that finished with an output (`done`),
    /// in run `run` or, with `None`, in any run.
    /// The newest finished `step` with `input_hash` (in `run` only, when given) whose outcome is
    /// not `outcome` (a bounded result, for a run that would run the step in full).
    pub fn finished_step_without(
        &self,
        step: &str,
        input_hash: &str,
        run: Option<u64>,
        outcome: &str,
    ) -> Result<Option<StepRow>, StoreError> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {STEP_COLUMNS} WHERE s.step=?1 AND s.input_hash=?2 AND s.status='done'
                       AND (?3 IS NULL OR s.run=?3) AND s.outcome IS NOT ?4 ORDER BY s.id DESC LIMIT 1"
                ),
                params![step, input_hash, run.map(|r| r as i64), outcome],
                step_row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// The latest attempt of `step` on `input_hash` after row `after` that began its work and
    /// ended without a result: failed, or still `running` in a run other than `run_now` (a
    /// killed run's). Reused rows, steps whose job never left the daemon's queue and withdrawn
    /// steps are not attempts: a step is withdrawn as its job starts (it waited in the queue
    /// until the budget could no longer hold it), so its work began and did nothing.
    pub fn unfinished_attempt_after(
        &self,
        step: &str,
        input_hash: &str,
        after: u64,
        run_now: u64,
    ) -> Result<Option<StepRow>, StoreError> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {STEP_COLUMNS} WHERE s.step=?1 AND s.input_hash=?2 AND s.id>?3 AND s.reused_from IS NULL
                       AND (s.status='failed' OR (s.status='running' AND s.run<>?4))
                       AND (j.step IS NULL OR j.started_ns IS NOT NULL) ORDER BY s.id DESC LIMIT 1"
                ),
                params![step, input_hash, after as i64, run_now as i64],
                step_row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// The latest step `step` of `problem` that finished (done, or reused) after the row `after`,
    /// in run `since` or later.
    pub fn finished_after(
        &self,
        problem: &str,
        step: &str,
        after: u64,
        since: u64,
    ) -> Result<Option<StepRow>, StoreError> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {STEP_COLUMNS} WHERE s.problem=?1 AND s.step=?2 AND s.id>?3 AND s.run>=?4
                       AND s.status IN ('done', 'reused') ORDER BY s.id DESC LIMIT 1"
                ),
                params![problem, step, after as i64, since as i64],
                step_row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    pub fn finished_step(&self, step: &str, input_hash: &str, run: Option<u64>) -> Result<Option<StepRow>, StoreError> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {STEP_COLUMNS} WHERE s.step=?1 AND s.input_hash=?2 AND s.status='done'
                       AND (?3 IS NULL OR s.run=?3) ORDER BY s.id DESC LIMIT 1"
                ),
                params![step, input_hash, run.map(|r| r as i64)],
                step_row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    pub fn insert_candidate(&self, c: &CandidateRow) -> Result<u64, StoreError> {
        self.conn
            .execute(
                "INSERT INTO optimize_candidates(run,problem,agent,variant,content_hash,speedup,ci95_lo,ci95_hi,
                   beyond_noise,verdict) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)",
                params![
                    c.run as i64,
                    c.problem,
                    c.agent,
                    c.variant,
                    c.content_hash,
                    c.speedup,
                    c.ci95.map(|c| c[0]),
                    c.ci95.map(|c| c[1]),
                    c.beyond_noise,
                    c.verdict
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(self.conn.last_insert_rowid() as u64)
    }

    pub fn insert_decision(&self, d: &DecisionRow) -> Result<u64, StoreError> {
        let q = &d.question;
        self.conn
            .execute(
                "INSERT INTO optimize_decisions(run,problem,size,device,baseline,agents,rounds,kind,agent,variant,speedup,
                   ci95_lo,ci95_hi,reason,report,decided_ns) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)",
                params![
                    d.run as i64,
                    q.problem,
                    q.size,
                    q.device,
                    q.baseline,
                    q.agents,
                    q.rounds,
                    d.kind,
                    d.agent,
                    d.variant,
                    d.speedup,
                    d.ci95.map(|c| c[0]),
                    d.ci95.map(|c| c[1]),
                    d.reason,
                    d.report,
                    d.decided_ns
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(self.conn.last_insert_rowid() as u64)
    }

    /// The latest decision journaled for exactly this question.
    pub fn decision_for(&self, q: &QuestionRow) -> Result<Option<DecisionRow>, StoreError> {
        self.conn
            .query_row(
                "SELECT * FROM optimize_decisions WHERE problem=?1 AND size=?2 AND device=?3 AND baseline=?4
                   AND agents=?5 AND rounds=?6 ORDER BY id DESC LIMIT 1",
                params![q.problem, q.size, q.device, q.baseline, q.agents, q.rounds],
                decision_row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// A step's daemon job of `problem` used `peak_bytes` of GPU memory at its highest: kept
    /// when above what an earlier one of the same problem and step used.
    pub fn record_step_memory(&self, problem: &str, step: &str, peak_bytes: u64) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO optimize_step_memory(problem, step, peak_bytes) VALUES(?1, ?2, ?3)
                 ON CONFLICT(problem, step) DO UPDATE SET peak_bytes = max(peak_bytes, excluded.peak_bytes)",
                params![problem, step, peak_bytes as i64],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The most GPU memory a daemon job of `problem`'s `step` used in any run of this journal.
    pub fn step_memory(&self, problem: &str, step: &str) -> Result<Option<u64>, StoreError> {
        self.conn
            .query_row(
                "SELECT peak_bytes FROM optimize_step_memory WHERE problem=?1 AND step=?2",
                [problem, step],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map(|p| p.map(|v| v as u64))
            .map_err(|e| self.err(e))
    }

    /// Record that run `run` decides `problem` again (`kforge optimize --redecide`).
    pub fn mark_redecided(&self, run: u64, problem: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT OR IGNORE INTO optimize_redecided(problem, run) VALUES(?1, ?2)",
                params![problem, run as i64],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The latest run that started deciding `problem` again, if one did.
    pub fn redecided(&self, problem: &str) -> Result<Option<u64>, StoreError> {
        self.conn
            .query_row("SELECT max(run) FROM optimize_redecided WHERE problem=?1", [problem], |r| {
                r.get::<_, Option<i64>>(0)
            })
            .map(|r| r.map(|v| v as u64))
            .map_err(|e| self.err(e))
    }

    /// Whether any decision of `problem` is journaled (for whatever question).
    pub fn decided_any(&self, problem: &str) -> Result<bool, StoreError> {
        self.conn
            .query_row("SELECT EXISTS(SELECT 1 FROM optimize_decisions WHERE problem=?1)", [problem], |r| r.get(0))
            .map_err(|e| self.err(e))
    }

    pub fn insert_llm_candidate(&self, c: &LlmCandidateRow) -> Result<u64, StoreError> {
        self.conn
            .execute(
                "INSERT INTO optimize_llm_candidates(run,problem,candidate,iteration,chain,plan,attempt,strategy,
                   content_hash,source,parent,duplicate_of,verdict,gate,reason,exploit,speedup,feedback,judged_ns,judge_hash)
                   VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20)",
                params![
                    c.run as i64,
                    c.problem,
                    c.candidate,
                    c.iteration,
                    c.chain,
                    c.plan,
                    c.attempt,
                    c.strategy,
                    c.content_hash,
                    c.source,
                    c.parent,
                    c.duplicate_of,
                    c.verdict,
                    c.gate,
                    c.reason,
                    c.exploit,
                    c.speedup,
                    c.feedback,
                    c.judged_ns,
                    c.judge_hash
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(self.conn.last_insert_rowid() as u64)
    }

    /// The latest run started before run `run`, if any.
    pub fn run_before(&self, run: u64) -> Result<Option<u64>, StoreError> {
        self.conn
            .query_row("SELECT MAX(id) FROM optimize_runs WHERE id < ?1", [run as i64], |r| r.get::<_, Option<i64>>(0))
            .map(|v| v.map(|v| v as u64))
            .map_err(|e| self.err(e))
    }

    /// The latest judged LLM candidate of `problem` with this content hash, judged under the
    /// same `judge_hash`, in run `run` (or, with `None`, in any run): its verdict reused by a
    /// resumed or replayed search instead of judging it again. A could-not-run verdict is the
    /// environment's, never reused.
    pub fn judged_llm_candidate(
        &self,
        problem: &str,
        content_hash: &str,
        judge_hash: &str,
        run: Option<u64>,
    ) -> Result<Option<LlmCandidateRow>, StoreError> {
        self.conn
            .query_row(
                "SELECT * FROM optimize_llm_candidates WHERE problem=?1 AND content_hash=?2 AND judge_hash=?3
                   AND duplicate_of IS NULL AND verdict <> 'could-not-run' AND (?4 IS NULL OR run=?4)
                   ORDER BY id DESC LIMIT 1",
                params![problem, content_hash, judge_hash, run.map(|r| r as i64)],
                llm_candidate_row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Everything journaled, in id order (of run `run` only, or of all runs).
    pub fn journal(&self, run: Option<u64>) -> Result<Journal, StoreError> {
        let run = run.map(|r| r as i64);
        Ok(Journal {
            runs: self.rows("SELECT * FROM optimize_runs WHERE ?1 IS NULL OR id=?1 ORDER BY id", run, run_row)?,
            steps: self.rows(
                &format!("SELECT {STEP_COLUMNS} WHERE ?1 IS NULL OR s.run=?1 ORDER BY s.id"),
                run,
                step_row,
            )?,
            candidates: self.rows(
                "SELECT * FROM optimize_candidates WHERE ?1 IS NULL OR run=?1 ORDER BY id",
                run,
                candidate_row,
            )?,
            decisions: self.rows(
                "SELECT * FROM optimize_decisions WHERE ?1 IS NULL OR run=?1 ORDER BY id",
                run,
                decision_row,
            )?,
            llm_candidates: self.rows(
                "SELECT * FROM optimize_llm_candidates WHERE ?1 IS NULL OR run=?1 ORDER BY id",
                run,
                llm_candidate_row,
            )?,
        })
    }

    fn rows<T>(
        &self,
        sql: &str,
        run: Option<i64>,
        f: impl FnMut(&Row) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>, StoreError> {
        let mut st = self.conn.prepare(sql).map_err(|e| self.err(e))?;
        let rows = st.query_map([run], f).and_then(|rows| rows.collect::<Result<Vec<_>, _>>()).map_err(|e| self.err(e));
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(problem: &str, rounds: u32) -> QuestionRow {
        QuestionRow {
            problem: problem.into(),
            size: "default".into(),
            device: "cpu".into(),
            baseline: "default".into(),
            agents: "dispatch,inductor".into(),
            rounds,
        }
    }

    fn run(s: &Store) -> u64 {
        s.insert_run(&RunRow {
            id: 0,
            question: q("problems", 3),
            budget_gpu_s: Some(10.0),
            budget_wall_s: None,
            jobs: 2,
            started_ns: 1,
            finished_ns: None,
            stopped: None,
        })
        .unwrap()
    }

    #[test]
    fn a_steps_gpu_memory_is_kept_at_its_highest_per_problem_and_step() {
        let s = Store::open_in_memory().unwrap();
        assert_eq!(s.step_memory("l3/a.py", "measure").unwrap(), None);
        s.record_step_memory("l3/a.py", "measure", 20 << 30).unwrap();
        s.record_step_memory("l3/a.py", "measure", 12 << 30).unwrap(); // a lower run keeps the peak
        s.record_step_memory("l3/a.py", "config", 5 << 30).unwrap();
        assert_eq!(s.step_memory("l3/a.py", "measure").unwrap(), Some(20 << 30));
        assert_eq!(s.step_memory("l3/a.py", "config").unwrap(), Some(5 << 30));
        s.record_step_memory("l3/a.py", "measure", 29 << 30).unwrap();
        assert_eq!(s.step_memory("l3/a.py", "measure").unwrap(), Some(29 << 30));
        assert_eq!(s.step_memory("l3/b.py", "measure").unwrap(), None, "per problem");
    }

    #[test]
    fn a_run_its_steps_candidates_and_decision_read_back() {
        let s = Store::open_in_memory().unwrap();
        let r = run(&s);
        let a = s.step_started(r, "p.py", "measure", "h1", 5).unwrap();
        let end = StepEnd {
            status: "done".into(),
            finished_ns: 9,
            seconds: 4.0,
            gpu_seconds: Some(3.5),
            gpu_seconds_kind: Some("region".into()),
            output: Some("o/dispatch.json".into()),
            output_hash: Some("oh".into()),
            ..StepEnd::default()
        };
        s.step_finished(a, &end).unwrap();
        let b = s.step_started(r, "p.py", "verify", "h2", 10).unwrap(); // killed: stays running
        s.insert_candidate(&CandidateRow {
            id: 0,
            run: r,
            problem: "p.py".into(),
            agent: "dispatch".into(),
            variant: "eager".into(),
            content_hash: "c1".into(),
            speedup: Some(1.5),
            ci95: Some([1.4, 1.6]),
            beyond_noise: Some(true),
            verdict: None,
        })
        .unwrap();
        let d = DecisionRow {
            id: 0,
            run: r,
            question: q("p.py", 3),
            kind: "improved".into(),
            agent: Some("dispatch".into()),
            variant: Some("eager".into()),
            speedup: Some(1.5),
            ci95: Some([1.4, 1.6]),
            reason: None,
            report: "o/report.json".into(),
            decided_ns: 12,
        };
        s.insert_decision(&d).unwrap();
        s.run_finished(r, 20, Some("budget")).unwrap();
        let j = s.journal(Some(r)).unwrap();
        assert_eq!((j.runs.len(), j.steps.len(), j.candidates.len(), j.decisions.len()), (1, 2, 1, 1));
        assert_eq!(j.runs[0].stopped.as_deref(), Some("budget"));
        assert_eq!((j.steps[0].status.as_str(), j.steps[0].gpu_seconds), ("done", Some(3.5)));
        assert_eq!((j.steps[1].id, j.steps[1].status.as_str(), j.steps[1].finished_ns), (b, "running", None));
        assert_eq!(j.candidates[0].ci95, Some([1.4, 1.6]));
        assert_eq!(j.decisions[0], DecisionRow { id: j.decisions[0].id, ..d });
        assert!(s.journal(Some(r + 1)).unwrap().steps.is_empty());
    }

    #[test]
    fn finished_steps_and_decisions_are_found_by_hash_and_question() {
        let s = Store::open_in_memory().unwrap();
        let (r1, r2) = (run(&s), run(&s));
        let a = s.step_started(r1, "p.py", "measure", "h1", 5).unwrap();
        assert_eq!(s.finished_step("measure", "h1", None).unwrap(), None, "a running step is not finished");
        s.step_finished(a, &StepEnd { status: "done".into(), ..StepEnd::default() }).unwrap();
        let f = s.step_started(r1, "p.py", "measure", "h9", 5).unwrap();
        s.step_finished(f, &StepEnd { status: "failed".into(), ..StepEnd::default() }).unwrap();
        assert_eq!(s.finished_step("measure", "h1", None).unwrap().map(|r| r.id), Some(a));
        assert_eq!(s.finished_step("measure", "h1", Some(r2)).unwrap(), None, "only in its own run");
        assert_eq!(s.finished_step("verify", "h1", None).unwrap(), None, "another step");
        assert_eq!(s.finished_step("measure", "h9", None).unwrap(), None, "a failed step is not finished");
        // A newer bounded result: the newest, unless bounded ones are left out (the older full one).
        let bounded = s.step_started(r2, "p.py", "measure", "h1", 6).unwrap();
        let end = StepEnd { status: "done".into(), outcome: Some("bounded".into()), ..StepEnd::default() };
        s.step_finished(bounded, &end).unwrap();
        assert_eq!(s.finished_step("measure", "h1", None).unwrap().map(|r| r.id), Some(bounded));
        assert_eq!(s.finished_step_without("measure", "h1", None, "bounded").unwrap().map(|r| r.id), Some(a));
        assert_eq!(s.finished_step_without("measure", "h1", Some(r2), "bounded").unwrap(), None);
        let d = |run, rounds| DecisionRow {
            id: 0,
            run,
            question: q("p.py", rounds),
            kind: "fallback".into(),
            agent: None,
            variant: None,
            speedup: None,
            ci95: None,
            reason: Some("nothing won".into()),
            report: "r.json".into(),
            decided_ns: 1,
        };
        s.insert_decision(&d(r1, 3)).unwrap();
        let latest = s.insert_decision(&d(r2, 3)).unwrap();
        assert_eq!(s.decision_for(&q("p.py", 3)).unwrap().map(|d| d.id), Some(latest));
        assert_eq!(s.decision_for(&q("p.py", 4)).unwrap(), None, "another question");
        assert!(s.decided_any("p.py").unwrap() && !s.decided_any("q.py").unwrap());
    }

    #[test]
    fn llm_candidates_read_back_and_are_found_by_problem_and_hash() {
        let s = Store::open_in_memory().unwrap();
        let r = run(&s);
        let c = LlmCandidateRow {
            id: 0,
            run: r,
            problem: "p.py".into(),
            candidate: "i1-c0-p0-a0".into(),
            iteration: 1,
            chain: 0,
            plan: 0,
            attempt: 0,
            strategy: "block-size".into(),
            content_hash: "h1".into(),
            source: "o/llm/candidates/i1-c0-p0-a0.py".into(),
            parent: None,
            duplicate_of: None,
            verdict: "rejected".into(),
            gate: Some("exploits:cache".into()),
            reason: Some("stale output".into()),
            exploit: true,
            speedup: None,
            feedback: "rejected by exploits:cache".into(),
            judged_ns: 7,
            judge_hash: "j1".into(),
        };
        let a = s.insert_llm_candidate(&c).unwrap();
        let dup =
            LlmCandidateRow { candidate: "i1-c1-p0-a0".into(), duplicate_of: Some("i1-c0-p0-a0".into()), ..c.clone() };
        s.insert_llm_candidate(&dup).unwrap();
        let j = s.journal(Some(r)).unwrap();
        assert_eq!(j.llm_candidates.len(), 2);
        assert_eq!(j.llm_candidates[0], LlmCandidateRow { id: a, ..c.clone() });
        let found = s.judged_llm_candidate("p.py", "h1", "j1", None).unwrap().unwrap();
        assert_eq!((found.id, found.exploit), (a, true), "a duplicate is not a judgement of its own");
        assert_eq!(s.judged_llm_candidate("q.py", "h1", "j1", None).unwrap(), None, "another problem");
        assert_eq!(s.judged_llm_candidate("p.py", "h1", "j2", None).unwrap(), None, "judged under other settings");
        assert!(s.judged_llm_candidate("p.py", "h1", "j1", Some(r)).unwrap().is_some());
        assert_eq!(s.judged_llm_candidate("p.py", "h1", "j1", Some(r + 1)).unwrap(), None, "another run");
        let env = LlmCandidateRow { content_hash: "h2".into(), verdict: "could-not-run".into(), ..c.clone() };
        s.insert_llm_candidate(&env).unwrap();
        assert_eq!(s.judged_llm_candidate("p.py", "h2", "j1", None).unwrap(), None, "the environment's failure");
        let later = run(&s);
        assert_eq!((s.run_before(later).unwrap(), s.run_before(r).unwrap()), (Some(r), None));
    }

    #[test]
    fn a_steps_work_waits_until_it_began_and_older_rows_say_unrecorded() {
        let s = Store::open_in_memory().unwrap();
        let r = run(&s);
        let (a, b, c) = (
            s.step_started(r, "p.py", "measure", "h1", 5).unwrap(),
            s.step_started(r, "p.py", "config", "h2", 6).unwrap(),
            s.step_started(r, "p.py", "verify", "h3", 7).unwrap(),
        );
        s.step_work_began(a, 50).unwrap();
        s.step_work_began(a, 90).unwrap(); // run again alone: the first start counts
        s.conn.execute("DELETE FROM optimize_step_jobs WHERE step=?1", params![c as i64]).unwrap(); // an older binary's
        let work: Vec<(u64, WorkStart)> = s.journal(Some(r)).unwrap().steps.iter().map(|x| (x.id, x.work)).collect();
        assert_eq!(work, [(a, WorkStart::Since(50)), (b, WorkStart::Waiting), (c, WorkStart::Unrecorded)]);
        let end = StepEnd { status: "done".into(), finished_ns: 99, output: Some("o".into()), ..StepEnd::default() };
        s.step_finished(a, &end).unwrap();
        assert_eq!(s.finished_step("measure", "h1", None).unwrap().map(|x| x.work), Some(WorkStart::Since(50)));
        assert!(s.step_work_began(c + 10, 1).is_err(), "no such step");
    }

    #[test]
    fn an_unfinished_attempt_is_one_whose_work_began_and_that_ended_without_a_result() {
        let s = Store::open_in_memory().unwrap();
        let (r1, r2) = (run(&s), run(&s));
        let ended = |id: u64, status: &str| {
            let end = StepEnd { status: status.into(), finished_ns: 9, ..StepEnd::default() };
            s.step_finished(id, &end).unwrap();
        };
        let bounded = s.step_started(r1, "p.py", "measure", "h", 1).unwrap();
        ended(bounded, "done");
        let waited = s.step_started(r1, "p.py", "measure", "h", 2).unwrap(); // withdrawn as its job started
        s.step_work_began(waited, 2).unwrap();
        ended(waited, "withdrawn");
        let other = s.step_started(r1, "p.py", "measure", "another input", 3).unwrap();
        s.step_work_began(other, 3).unwrap();
        ended(other, "failed");
        let attempt = |now: u64| s.unfinished_attempt_after("measure", "h", bounded, now).unwrap().map(|x| x.id);
        assert_eq!(attempt(r2), None, "withdrawn (no work done), or another input");
        let killed = s.step_started(r1, "p.py", "measure", "h", 4).unwrap();
        s.step_work_began(killed, 4).unwrap();
        assert_eq!(attempt(r2), Some(killed), "still running in a run that is not this one: killed");
        assert_eq!(attempt(r1), None, "running in this run");
        let failed = s.step_started(r2, "p.py", "measure", "h", 5).unwrap();
        s.step_work_began(failed, 5).unwrap();
        ended(failed, "failed");
        assert_eq!(attempt(r2), Some(failed), "the latest");
        assert_eq!(s.unfinished_attempt_after("measure", "h", failed, r2).unwrap(), None, "none after it");
    }

    #[test]
    fn a_store_without_the_journal_gains_it_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("old.db");
        {
            let s = Store::open(&p).unwrap();
            s.conn
                .execute_batch(
                    "DROP TABLE optimize_runs; DROP TABLE optimize_steps; DROP TABLE optimize_candidates;
                     DROP TABLE optimize_decisions;",
                )
                .unwrap();
        }
        let s = Store::open(&p).unwrap();
        let r = run(&s);
        assert_eq!(s.journal(None).unwrap().runs.iter().map(|r| r.id).collect::<Vec<_>>(), [r]);
    }
}
