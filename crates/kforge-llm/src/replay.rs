//! The replay cache: every call's request and reply in SQLite, so a run can be re-run from
//! its recorded replies with zero tokens (`--replay RUN`) or continued after a kill
//! (`--resume`).
//!
//! A call is found by its [`key`] (a hash of model, messages, tools and parameters — not of who
//! asked) and its occurrence (how many times this run already asked that key), so a run that
//! asks the same thing twice gets its two recorded replies in order. Tables `llm_calls` and
//! `llm_failures` live beside whatever else the file holds (the optimize journal). Errors and
//! empty replies are never answers: they go to `llm_failures` only.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::chat::{Reply, Request, Usage};
use crate::{LlmError, Scope};

/// Where answers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mode {
    /// Ask the provider; record every call.
    Record,
    /// Answer only from run `from`'s records (a missing one is [`LlmError::NotRecorded`]);
    /// never ask the provider. Answers are recorded again under this run, marked replayed.
    Replay { from: i64 },
    /// Answer from the records of run `from` or any run before it — the answer as first paid
    /// for, not a replayed copy, so a run killed and resumed twice finds every answer and charges
    /// what it cost — where there is one, else ask the provider and record.
    Resume { from: i64 },
}

/// The key of a request asked by `task`: [`key`] when there is no task, else a SHA-256 of the
/// request's key and the task, so that identical requests of different tasks have their own
/// occurrences.
pub fn task_key(request: &Request, task: &str) -> String {
    let k = key(request);
    if task.is_empty() {
        return k;
    }
    let mut h = Sha256::new();
    h.update(k.as_bytes());
    h.update(b"\n");
    h.update(task.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The stable key of a request: the SHA-256 (hex) of its model, messages, tools and
/// parameters as JSON.
pub fn key(request: &Request) -> String {
    let mut hash = Sha256::new();
    hash.update(b"kforge-llm/1\n");
    // Serializing plain data (strings, numbers, maps) cannot fail.
    hash.update(serde_json::to_vec(request).unwrap_or_default());
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// One row of `llm_calls`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallRow {
    pub id: i64,
    pub run: i64,
    pub problem: String,
    pub role: String,
    pub key: String,
    pub occurrence: u32,
    pub model: String,
    /// The [`Request`] as JSON.
    pub request: String,
    /// The [`Reply`] as JSON.
    pub reply: String,
    /// Tokens this row spent (0 when replayed).
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub estimated: bool,
    pub usd: f64,
    pub attempts: u32,
    pub latency_s: f64,
    pub replayed: bool,
    pub created_ns: i64,
}

impl CallRow {
    /// The recorded reply.
    pub fn reply(&self) -> Result<Reply, String> {
        serde_json::from_str(&self.reply)
            .map_err(|e| format!("call {}: the recorded reply does not read: {e}", self.id))
    }
}

/// One row of `llm_failures`: a call that gave no answer worth keeping.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailureRow {
    pub id: i64,
    pub run: i64,
    pub problem: String,
    pub role: String,
    pub key: String,
    pub occurrence: u32,
    pub error: String,
    /// An empty reply's JSON (`None`: an error).
    pub reply: Option<String>,
    pub created_ns: i64,
}

/// What the cache has for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// Ask the provider.
    Ask,
    /// Answer with this recorded call.
    Recorded(CallRow),
    /// `Replay`: the recorded run failed here (or got an empty reply): do the same.
    Failed(FailureRow),
}

/// A call to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewCall<'a> {
    /// Who asked.
    pub scope: &'a Scope,
    /// The request's [`key`].
    pub key: &'a str,
    /// Its occurrence in this run ([`Cache::next_occurrence`]).
    pub occurrence: u32,
    /// What was asked.
    pub request: &'a Request,
    /// What came back.
    pub reply: &'a Reply,
    /// What it cost.
    pub usd: f64,
    /// HTTP attempts made.
    pub attempts: u32,
    /// Seconds from the first attempt to the reply.
    pub latency_s: f64,
    /// Answered from another run's records.
    pub replayed: bool,
    /// What attempts before the reply used though they gave none (cut off after the server
    /// started answering), estimated: recorded with the call's tokens, so that what a row says
    /// the call cost is what the budget was charged.
    pub wasted: Usage,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS llm_calls (
    id INTEGER PRIMARY KEY,
    run INTEGER NOT NULL,
    problem TEXT NOT NULL,
    role TEXT NOT NULL,
    key TEXT NOT NULL,
    occurrence INTEGER NOT NULL,
    model TEXT NOT NULL,
    request TEXT NOT NULL,
    reply TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    estimated INTEGER NOT NULL,
    usd REAL NOT NULL,
    attempts INTEGER NOT NULL,
    latency_s REAL NOT NULL,
    replayed INTEGER NOT NULL,
    created_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS llm_calls_by_key ON llm_calls (run, key, occurrence);
CREATE TABLE IF NOT EXISTS llm_failures (
    id INTEGER PRIMARY KEY,
    run INTEGER NOT NULL,
    problem TEXT NOT NULL,
    role TEXT NOT NULL,
    key TEXT NOT NULL,
    occurrence INTEGER NOT NULL,
    error TEXT NOT NULL,
    reply TEXT,
    created_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS llm_failures_by_key ON llm_failures (run, key, occurrence);
";

const CALL_COLUMNS: &str = "id, run, problem, role, key, occurrence, model, request, reply, prompt_tokens, \
                            completion_tokens, estimated, usd, attempts, latency_s, replayed, created_ns";

/// The replay cache of one run over a SQLite file. Thread-safe.
#[derive(Debug)]
pub struct Cache {
    path: String,
    run: i64,
    mode: Mode,
    conn: Mutex<Connection>,
    occurrences: Mutex<HashMap<String, u32>>,
}

impl Cache {
    /// Opens (creating the tables if needed) the cache in `path` for run `run`.
    pub fn open(path: &Path, run: i64, mode: Mode) -> Result<Cache, LlmError> {
        let shown = path.display().to_string();
        let fail = |e: rusqlite::Error| LlmError::Cache { path: shown.clone(), problem: e.to_string() };
        let conn = Connection::open(path).map_err(fail)?;
        conn.busy_timeout(Duration::from_secs(10)).map_err(fail)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(fail)?;
        conn.execute_batch(SCHEMA).map_err(fail)?;
        Ok(Cache { path: shown, run, mode, conn: Mutex::new(conn), occurrences: Mutex::new(HashMap::new()) })
    }

    /// The run this cache records under.
    pub fn run(&self) -> i64 {
        self.run
    }

    /// The SQLite file.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Where answers come from.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    fn fail(&self, e: rusqlite::Error) -> LlmError {
        LlmError::Cache { path: self.path.clone(), problem: e.to_string() }
    }

    fn json<T: Serialize>(&self, value: &T) -> Result<String, LlmError> {
        serde_json::to_string(value).map_err(|e| LlmError::Cache { path: self.path.clone(), problem: e.to_string() })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A connection outlives a panicking holder unharmed (each statement is atomic).
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The occurrence of this ask of `key`: how many times this run asked it before.
    pub fn next_occurrence(&self, key: &str) -> u32 {
        let mut counts = self.occurrences.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(key.to_string()).or_insert(0);
        let this = *n;
        *n += 1;
        this
    }

    /// What to do for the `occurrence`-th ask of `key`, per the mode.
    pub fn lookup(&self, key: &str, occurrence: u32, scope: &Scope) -> Result<Lookup, LlmError> {
        let from = match self.mode {
            Mode::Record => return Ok(Lookup::Ask),
            Mode::Replay { from } | Mode::Resume { from } => from,
        };
        if let Mode::Resume { .. } = self.mode {
            return Ok(match self.paid_for(from, key, occurrence)? {
                Some(row) => Lookup::Recorded(row),
                None => Lookup::Ask,
            });
        }
        if let Some(row) = self.recorded(from, key, occurrence)? {
            return Ok(Lookup::Recorded(row));
        }
        match self.failure(from, key, occurrence)? {
            Some(f) => Ok(Lookup::Failed(f)),
            None => Err(LlmError::NotRecorded {
                run: from,
                key: key.to_string(),
                occurrence,
                problem: scope.problem.clone(),
                role: scope.role.clone(),
            }),
        }
    }

    fn recorded(&self, run: i64, key: &str, occurrence: u32) -> Result<Option<CallRow>, LlmError> {
        let sql = format!(
            "SELECT {CALL_COLUMNS} FROM llm_calls WHERE run = ?1 AND key = ?2 AND occurrence = ?3 ORDER BY id LIMIT 1"
        );
        self.conn().query_row(&sql, params![run, key, occurrence], call_row).optional().map_err(|e| self.fail(e))
    }

    /// The latest answer to this ask first paid for (not replayed) in run `run` or before.
    fn paid_for(&self, run: i64, key: &str, occurrence: u32) -> Result<Option<CallRow>, LlmError> {
        let sql = format!(
            "SELECT {CALL_COLUMNS} FROM llm_calls WHERE run <= ?1 AND key = ?2 AND occurrence = ?3 AND replayed = 0 \
             ORDER BY id DESC LIMIT 1"
        );
        self.conn().query_row(&sql, params![run, key, occurrence], call_row).optional().map_err(|e| self.fail(e))
    }

    fn failure(&self, run: i64, key: &str, occurrence: u32) -> Result<Option<FailureRow>, LlmError> {
        let sql = "SELECT id, run, problem, role, key, occurrence, error, reply, created_ns FROM llm_failures \
                   WHERE run = ?1 AND key = ?2 AND occurrence = ?3 ORDER BY id LIMIT 1";
        self.conn().query_row(sql, params![run, key, occurrence], failure_row).optional().map_err(|e| self.fail(e))
    }

    /// Records an answered call under this run; returns its row id. Replayed calls are
    /// recorded with zero tokens and cost (their reply keeps the usage it came with).
    pub fn record(&self, call: &NewCall<'_>) -> Result<i64, LlmError> {
        let request = self.json(call.request)?;
        let reply = self.json(call.reply)?;
        let u = if call.replayed { Default::default() } else { call.reply.usage.plus(&call.wasted) };
        let conn = self.conn();
        conn.execute(
            "INSERT INTO llm_calls (run, problem, role, key, occurrence, model, request, reply, prompt_tokens, \
             completion_tokens, estimated, usd, attempts, latency_s, replayed, created_ns) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            params![
                self.run,
                call.scope.problem,
                call.scope.role,
                call.key,
                call.occurrence,
                call.request.model,
                request,
                reply,
                u.prompt_tokens as i64,
                u.completion_tokens as i64,
                u.estimated,
                if call.replayed { 0.0 } else { call.usd },
                call.attempts,
                call.latency_s,
                call.replayed,
                now_ns()
            ],
        )
        .map_err(|e| self.fail(e))?;
        Ok(conn.last_insert_rowid())
    }

    /// Records a call that gave no answer (`reply`: an empty one it gave) under this run.
    pub fn record_failure(
        &self,
        scope: &Scope,
        key: &str,
        occurrence: u32,
        error: &str,
        reply: Option<&Reply>,
    ) -> Result<i64, LlmError> {
        let reply = match reply {
            Some(r) => Some(self.json(r)?),
            None => None,
        };
        let conn = self.conn();
        conn.execute(
            "INSERT INTO llm_failures (run, problem, role, key, occurrence, error, reply, created_ns) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![self.run, scope.problem, scope.role, key, occurrence, error, reply, now_ns()],
        )
        .map_err(|e| self.fail(e))?;
        Ok(conn.last_insert_rowid())
    }

    /// Run `run`'s answered calls, in order.
    pub fn calls(&self, run: i64) -> Result<Vec<CallRow>, LlmError> {
        let sql = format!("SELECT {CALL_COLUMNS} FROM llm_calls WHERE run = ?1 ORDER BY id");
        let conn = self.conn();
        let mut stmt = conn.prepare(&sql).map_err(|e| self.fail(e))?;
        let rows = stmt.query_map(params![run], call_row).map_err(|e| self.fail(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.fail(e))
    }

    /// Run `run`'s failed calls, in order.
    pub fn failures(&self, run: i64) -> Result<Vec<FailureRow>, LlmError> {
        let sql = "SELECT id, run, problem, role, key, occurrence, error, reply, created_ns FROM llm_failures \
                   WHERE run = ?1 ORDER BY id";
        let conn = self.conn();
        let mut stmt = conn.prepare(sql).map_err(|e| self.fail(e))?;
        let rows = stmt.query_map(params![run], failure_row).map_err(|e| self.fail(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.fail(e))
    }
}

fn call_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CallRow> {
    Ok(CallRow {
        id: r.get(0)?,
        run: r.get(1)?,
        problem: r.get(2)?,
        role: r.get(3)?,
        key: r.get(4)?,
        occurrence: r.get(5)?,
        model: r.get(6)?,
        request: r.get(7)?,
        reply: r.get(8)?,
        prompt_tokens: r.get::<_, i64>(9)?.max(0) as u64,
        completion_tokens: r.get::<_, i64>(10)?.max(0) as u64,
        estimated: r.get(11)?,
        usd: r.get(12)?,
        attempts: r.get(13)?,
        latency_s: r.get(14)?,
        replayed: r.get(15)?,
        created_ns: r.get(16)?,
    })
}

fn failure_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<FailureRow> {
    Ok(FailureRow {
        id: r.get(0)?,
        run: r.get(1)?,
        problem: r.get(2)?,
        role: r.get(3)?,
        key: r.get(4)?,
        occurrence: r.get(5)?,
        error: r.get(6)?,
        reply: r.get(7)?,
        created_ns: r.get(8)?,
    })
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{FinishReason, Message, Params, Usage};

    fn request(text: &str) -> Request {
        Request {
            model: "m".into(),
            messages: vec![Message::user(text)],
            tools: vec![],
            params: Params { temperature: Some(0.0), max_tokens: Some(100), seed: Some(1) },
        }
    }

    fn reply(text: &str) -> Reply {
        Reply {
            content: text.into(),
            tool_calls: vec![],
            finish_reason: FinishReason::Stop,
            usage: Usage { prompt_tokens: 5, completion_tokens: 7, estimated: false },
        }
    }

    fn scope() -> Scope {
        Scope { problem: "p".into(), role: "planner".into(), task: String::new() }
    }

    fn record(cache: &Cache, req: &Request, text: &str) -> i64 {
        let k = key(req);
        let occurrence = cache.next_occurrence(&k);
        let s = scope();
        let r = reply(text);
        let call = NewCall {
            scope: &s,
            key: &k,
            occurrence,
            request: req,
            reply: &r,
            usd: 0.5,
            attempts: 2,
            latency_s: 0.1,
            replayed: false,
            wasted: Usage::default(),
        };
        cache.record(&call).unwrap()
    }

    #[test]
    fn key_is_stable_and_ignores_who_asks() {
        let a = key(&request("hi"));
        assert_eq!(a, key(&request("hi")));
        assert_eq!(a.len(), 64);
        assert_ne!(a, key(&request("hi!")));
        let mut other = request("hi");
        other.params.seed = Some(2);
        assert_ne!(a, key(&other));
        // The golden value (sha256 of "kforge-llm/1\n" + the JSON, checked with Python): a change
        // here breaks the replay of every recorded run.
        assert_eq!(a, "bc4868791b1096db3b177c24aa0e0aede1cb283255cee3cca70a73c56cd2777a");
    }

    #[test]
    fn occurrences_count_per_key() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("j.db"), 1, Mode::Record).unwrap();
        assert_eq!((cache.next_occurrence("a"), cache.next_occurrence("a"), cache.next_occurrence("b")), (0, 1, 0));
    }

    #[test]
    fn replay_answers_in_order_and_misses_name_the_request() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let first = Cache::open(&path, 1, Mode::Record).unwrap();
        let req = request("plan");
        record(&first, &req, "one");
        record(&first, &req, "two");
        let replay = Cache::open(&path, 2, Mode::Replay { from: 1 }).unwrap();
        let k = key(&req);
        for expected in ["one", "two"] {
            let occ = replay.next_occurrence(&k);
            match replay.lookup(&k, occ, &scope()).unwrap() {
                Lookup::Recorded(row) => {
                    assert_eq!(row.reply().unwrap().content, expected);
                    assert_eq!((row.attempts, row.usd, row.prompt_tokens), (2, 0.5, 5));
                }
                other => panic!("{other:?}"),
            }
        }
        let occ = replay.next_occurrence(&k);
        let e = replay.lookup(&k, occ, &scope()).unwrap_err();
        assert!(matches!(&e, LlmError::NotRecorded { run: 1, occurrence: 2, .. }), "{e}");
        let resume = Cache::open(&path, 3, Mode::Resume { from: 1 }).unwrap();
        assert_eq!(resume.lookup(&k, 2, &scope()).unwrap(), Lookup::Ask);
        assert_eq!(Cache::open(&path, 3, Mode::Record).unwrap().lookup(&k, 0, &scope()).unwrap(), Lookup::Ask);
    }

    #[test]
    fn a_second_resume_finds_the_first_runs_answers_as_paid_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let (plan, write) = (request("plan"), request("write"));
        record(&Cache::open(&path, 1, Mode::Record).unwrap(), &plan, "plans");
        // Run 2 resumes run 1, replays the plan and is killed before it asks anything else.
        let second = Cache::open(&path, 2, Mode::Resume { from: 1 }).unwrap();
        let Lookup::Recorded(row) = second.lookup(&key(&plan), 0, &scope()).unwrap() else { panic!("run 1's answer") };
        let (s, k, r) = (scope(), key(&plan), row.reply().unwrap());
        let replayed = NewCall {
            scope: &s,
            key: &k,
            occurrence: 0,
            request: &plan,
            reply: &r,
            usd: 0.5,
            attempts: 0,
            latency_s: 0.0,
            replayed: true,
            wasted: Usage::default(),
        };
        second.record(&replayed).unwrap();
        record(&Cache::open(&path, 2, Mode::Record).unwrap(), &write, "kernel");
        // Run 3 resumes run 2: both answers, each with the tokens it cost when first paid for.
        let third = Cache::open(&path, 3, Mode::Resume { from: 2 }).unwrap();
        for (req, text, run) in [(&plan, "plans", 1), (&write, "kernel", 2)] {
            match third.lookup(&key(req), 0, &scope()).unwrap() {
                Lookup::Recorded(r) => {
                    assert_eq!((r.reply().unwrap().content.as_str(), r.run, r.replayed), (text, run, false));
                    assert_eq!(r.prompt_tokens, 5, "what it cost then");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn failures_are_not_answers_but_replay_repeats_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let first = Cache::open(&path, 1, Mode::Record).unwrap();
        let req = request("x");
        let k = key(&req);
        first.record_failure(&scope(), &k, 0, "HTTP 500", None).unwrap();
        assert!(first.calls(1).unwrap().is_empty());
        assert_eq!(first.failures(1).unwrap()[0].error, "HTTP 500");
        let resume = Cache::open(&path, 2, Mode::Resume { from: 1 }).unwrap();
        assert_eq!(resume.lookup(&k, 0, &scope()).unwrap(), Lookup::Ask, "resume asks again");
        let replay = Cache::open(&path, 2, Mode::Replay { from: 1 }).unwrap();
        assert!(matches!(replay.lookup(&k, 0, &scope()).unwrap(), Lookup::Failed(f) if f.error == "HTTP 500"));
    }

    #[test]
    fn replayed_rows_spend_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("j.db"), 4, Mode::Record).unwrap();
        let (s, req, r) = (scope(), request("y"), reply("z"));
        let call = NewCall {
            scope: &s,
            key: "k",
            occurrence: 0,
            request: &req,
            reply: &r,
            usd: 1.0,
            attempts: 0,
            latency_s: 0.0,
            replayed: true,
            wasted: Usage::default(),
        };
        cache.record(&call).unwrap();
        let row = &cache.calls(4).unwrap()[0];
        assert_eq!((row.prompt_tokens, row.completion_tokens, row.usd, row.replayed), (0, 0, 0.0, true));
        assert_eq!(row.reply().unwrap(), r);
    }

    #[test]
    fn unopenable_file_names_its_path() {
        let e = Cache::open(Path::new("/nonexistent/dir/j.db"), 1, Mode::Record).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/dir/j.db"), "{e}");
    }
}
