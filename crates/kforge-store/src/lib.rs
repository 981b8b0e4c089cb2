//! The kforge store: one SQLite file holding jobs, regions and measurements, and the journal of
//! `kforge optimize` runs ([`journal`]).
//!
//! Rows are written as events happen (a job queued, started, ended; a region granted, released;
//! a measurement reported), each in its own transaction, so whatever was recorded before a client
//! or the daemon died stays recorded. The daemon owns one [`Store`] on a dedicated writer thread;
//! nothing else writes the file while the daemon runs.

pub mod journal;

pub use journal::{
    CandidateRow, DecisionRow, Journal, LlmCandidateRow, QuestionRow, RunRow, StepEnd, StepRow, WorkStart,
};
pub use kforge_proto::StepTimings;
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Schema version written to `meta`; opening a file with another version is an error.
pub const SCHEMA_VERSION: i64 = 1;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite error on {path}: {source}")]
    Sqlite { path: String, source: rusqlite::Error },
    #[error("store {path} has schema version {found}, this kforge expects {expected}")]
    SchemaVersion { path: String, found: i64, expected: i64 },
    #[error("no such {what} {id} in the store")]
    Missing { what: &'static str, id: u64 },
}

/// A job as queued.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobRow {
    pub id: u64,
    pub label: Option<String>,
    pub argv: Vec<String>,
    pub cwd: String,
    pub device: String,
    pub policy: String,
    pub queued_ns: i64,
    pub started_ns: Option<i64>,
    pub ended_ns: Option<i64>,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: Option<String>,
}

/// A region as granted (release fields filled in later).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RegionRow {
    pub id: u64,
    pub job: Option<u64>,
    pub device: String,
    pub name: String,
    pub pid: u32,
    pub tid: u32,
    pub policy: String,
    pub exclusive: bool,
    pub requested_ns: i64,
    pub granted_ns: i64,
    pub released_ns: Option<i64>,
    pub wait_ms: f64,
    /// The steps of entering the region (columns `gate_ms`, `drain_ms`, …).
    #[serde(flatten)]
    pub steps: StepTimings,
    /// GPU temperature and SM clock when granted and when released (GPU devices).
    #[serde(default)]
    pub gpu_temp_c_granted: Option<u32>,
    #[serde(default)]
    pub sm_clock_mhz_granted: Option<u32>,
    #[serde(default)]
    pub gpu_temp_c_released: Option<u32>,
    #[serde(default)]
    pub sm_clock_mhz_released: Option<u32>,
    pub core: Option<u32>,
    pub lease_ms: u64,
    pub revoked: bool,
    pub tainted: bool,
}

impl RegionRow {
    /// Measurements taken in a region are valid unless it was revoked.
    pub fn valid(&self) -> bool {
        !self.revoked
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MeasurementRow {
    pub id: u64,
    pub job: Option<u64>,
    pub region: Option<u64>,
    pub name: String,
    pub recorded_ns: i64,
    pub samples_ms: Vec<f64>,
    pub valid: bool,
}

/// A job's GPU memory as the daemon's admission saw it (written when the job ends, on devices
/// with memory samples).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobMemoryRow {
    pub job: u64,
    /// The expected peak admission counted with, bytes.
    pub expected_bytes: Option<u64>,
    /// `declared`, `learned` or `default`.
    pub source: Option<String>,
    /// The highest use seen in the samples while it ran (over both runs of a retried job).
    pub peak_bytes: u64,
    /// The most other processes used on its device in one sample while it ran.
    pub siblings_peak_bytes: u64,
    /// It ran a second time, alone, after a CUDA out-of-memory error beside siblings.
    pub retried: bool,
}

/// What took the cpu away from a region's measuring thread while the region was held (the
/// daemon reads `kforge_cores::host` at grant and release): the hypervisor's steal and the
/// interrupt time of its core (`cpu`; `None`: all cpus, the thread not pinned), and the
/// thread's own run-queue wait. A field Linux does not expose is `None`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RegionHostRow {
    pub region: u64,
    pub cpu: Option<u32>,
    pub steal_ms: Option<f64>,
    pub irq_ms: Option<f64>,
    pub run_delay_ms: Option<f64>,
}

/// A `region_host` row selected as `region, cpu, steal_ms, irq_ms, run_delay_ms`.
fn host_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RegionHostRow> {
    Ok(RegionHostRow {
        region: r.get::<_, i64>(0)? as u64,
        cpu: r.get(1)?,
        steal_ms: r.get(2)?,
        irq_ms: r.get(3)?,
        run_delay_ms: r.get(4)?,
    })
}

/// Everything recorded for a set of jobs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Report {
    pub jobs: Vec<JobRow>,
    pub regions: Vec<RegionRow>,
    pub measurements: Vec<MeasurementRow>,
    /// GPU memory per job (jobs on devices without memory samples have none).
    #[serde(default)]
    pub job_memory: Vec<JobMemoryRow>,
    /// What took the cpu from each released region's measuring thread (regions released by a
    /// daemon from before it recorded them have none).
    #[serde(default)]
    pub region_host: Vec<RegionHostRow>,
}

impl Report {
    /// The report cut into parts of at most about `budget` bytes of JSON each (rows whole, in
    /// order; a row larger than `budget` is a part alone), so that a long campaign's store,
    /// which passes one protocol frame, goes as several. A part holding one row larger than a
    /// frame still does not fit (a measurement of the most samples one request can carry comes
    /// close): the daemon then sends an error in its place. [`Report::merge`] puts them together.
    /// An empty report is one empty part.
    pub fn split(self, budget: usize) -> Vec<Report> {
        let mut parts = Parts { budget, done: Vec::new(), open: Report::default(), size: 0 };
        for r in self.jobs {
            parts.add(r, |p| &mut p.jobs);
        }
        for r in self.regions {
            parts.add(r, |p| &mut p.regions);
        }
        for r in self.measurements {
            parts.add(r, |p| &mut p.measurements);
        }
        for r in self.job_memory {
            parts.add(r, |p| &mut p.job_memory);
        }
        for r in self.region_host {
            parts.add(r, |p| &mut p.region_host);
        }
        parts.done.push(parts.open);
        parts.done
    }

    /// The report whose parts (as the daemon sends them, JSON) are `parts`.
    pub fn from_parts(parts: Vec<serde_json::Value>) -> Result<Report, serde_json::Error> {
        let mut whole = Report::default();
        for p in parts {
            whole.merge(serde_json::from_value(p)?);
        }
        Ok(whole)
    }

    /// `other`'s rows after this report's (the inverse of [`Report::split`]).
    pub fn merge(&mut self, other: Report) {
        self.jobs.extend(other.jobs);
        self.regions.extend(other.regions);
        self.measurements.extend(other.measurements);
        self.job_memory.extend(other.job_memory);
        self.region_host.extend(other.region_host);
    }

    /// Seconds job `job` spent inside released regions (its exclusive GPU time).
    pub fn region_seconds(&self, job: u64) -> f64 {
        self.regions
            .iter()
            .filter(|r| r.job == Some(job))
            .filter_map(|r| r.released_ns.map(|end| (end - r.granted_ns).max(0) as f64 / 1e9))
            .fold(0.0, |t, s| t + s) // (sum() of none is -0.0, shown "-0.0 s")
    }
}

/// [`Report::split`]'s state: the parts done and the one being filled.
struct Parts {
    budget: usize,
    done: Vec<Report>,
    open: Report,
    size: usize,
}

impl Parts {
    fn add<T: Serialize>(&mut self, row: T, rows: fn(&mut Report) -> &mut Vec<T>) {
        let n = serde_json::to_vec(&row).map(|v| v.len() + 1).unwrap_or(0);
        if self.size > 0 && self.size + n > self.budget {
            self.done.push(std::mem::take(&mut self.open));
            self.size = 0;
        }
        self.size += n;
        rows(&mut self.open).push(row);
    }
}

/// The region time of a set of jobs ([`Store::region_time`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegionTime {
    pub jobs: u64,
    pub regions: u64,
    /// Seconds inside released regions (the jobs' exclusive GPU time), as
    /// [`Report::region_seconds`] counts them.
    pub seconds: f64,
}

/// A value seen of an earlier job, for the daemon's learned values: its GPU memory peak in bytes
/// (`Store::learned_peaks`) or its run's length in milliseconds (`Store::learned_lengths`).
#[derive(Debug, Clone, PartialEq)]
pub struct LearnedValue {
    pub argv: Vec<String>,
    pub label: Option<String>,
    pub value: u64,
}

pub struct Store {
    conn: Connection,
    path: String,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
  id INTEGER PRIMARY KEY, label TEXT, argv TEXT NOT NULL, cwd TEXT NOT NULL, device TEXT NOT NULL,
  policy TEXT NOT NULL, queued_ns INTEGER NOT NULL, started_ns INTEGER, ended_ns INTEGER, pid INTEGER,
  exit_code INTEGER, signal INTEGER, reason TEXT);
CREATE TABLE IF NOT EXISTS regions (
  id INTEGER PRIMARY KEY, job INTEGER, device TEXT NOT NULL, name TEXT NOT NULL, pid INTEGER NOT NULL,
  tid INTEGER NOT NULL, policy TEXT NOT NULL, exclusive INTEGER NOT NULL, requested_ns INTEGER NOT NULL,
  granted_ns INTEGER NOT NULL, released_ns INTEGER, wait_ms REAL NOT NULL, gate_ms REAL NOT NULL,
  drain_ms REAL NOT NULL, drain_timed_out INTEGER NOT NULL, freeze_ms REAL NOT NULL,
  frozen_jobs INTEGER NOT NULL, settle_ms REAL NOT NULL DEFAULT 0, settle_timed_out INTEGER NOT NULL DEFAULT 0,
  gpu_temp_c_granted INTEGER, sm_clock_mhz_granted INTEGER, gpu_temp_c_released INTEGER, sm_clock_mhz_released INTEGER,
  isolate_ms REAL NOT NULL, core INTEGER, lease_ms INTEGER NOT NULL,
  revoked INTEGER NOT NULL DEFAULT 0, tainted INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS measurements (
  id INTEGER PRIMARY KEY, job INTEGER, region INTEGER, name TEXT NOT NULL, recorded_ns INTEGER NOT NULL,
  samples_ms TEXT NOT NULL, valid INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS job_memory (
  job INTEGER PRIMARY KEY, expected_bytes INTEGER, source TEXT, peak_bytes INTEGER NOT NULL,
  siblings_peak_bytes INTEGER NOT NULL, retried INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS region_host (
  region INTEGER PRIMARY KEY, cpu INTEGER, steal_ms REAL, irq_ms REAL, run_delay_ms REAL);
CREATE INDEX IF NOT EXISTS regions_job ON regions(job);
CREATE INDEX IF NOT EXISTS measurements_job ON measurements(job);
CREATE INDEX IF NOT EXISTS jobs_label ON jobs(label);
";

impl Store {
    /// Open (creating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let p = path.display().to_string();
        let conn = Connection::open(path).map_err(|source| StoreError::Sqlite { path: p.clone(), source })?;
        Self::init(conn, p)
    }

    /// An in-memory store (tests, `--db :memory:`).
    pub fn open_in_memory() -> Result<Store, StoreError> {
        let conn =
            Connection::open_in_memory().map_err(|source| StoreError::Sqlite { path: ":memory:".into(), source })?;
        Self::init(conn, ":memory:".into())
    }

    fn init(conn: Connection, path: String) -> Result<Store, StoreError> {
        let s = Store { conn, path };
        s.conn
            .execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=5000;")
            .map_err(|e| s.err(e))?;
        s.conn.execute_batch(SCHEMA).map_err(|e| s.err(e))?;
        s.conn.execute_batch(journal::SCHEMA).map_err(|e| s.err(e))?;
        let found: Option<String> = s
            .conn
            .query_row("SELECT value FROM meta WHERE key='schema_version'", [], |r| r.get(0))
            .optional()
            .map_err(|e| s.err(e))?;
        match found {
            None => {
                s.conn
                    .execute("INSERT INTO meta(key, value) VALUES('schema_version', ?1)", [SCHEMA_VERSION.to_string()])
                    .map_err(|e| s.err(e))?;
            }
            Some(v) => {
                let found = v.parse::<i64>().unwrap_or(-1);
                if found != SCHEMA_VERSION {
                    return Err(StoreError::SchemaVersion { path: s.path.clone(), found, expected: SCHEMA_VERSION });
                }
            }
        }
        Ok(s)
    }

    fn err(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite { path: self.path.clone(), source }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Highest job, region and measurement ids in the file (0 when empty), so a restarted
    /// daemon keeps numbering where the last one stopped.
    pub fn max_ids(&self) -> Result<(u64, u64, u64), StoreError> {
        let q = |t: &str| -> Result<u64, StoreError> {
            self.conn
                .query_row(&format!("SELECT COALESCE(MAX(id), 0) FROM {t}"), [], |r| r.get::<_, i64>(0))
                .map(|v| v as u64)
                .map_err(|e| self.err(e))
        };
        Ok((q("jobs")?, q("regions")?, q("measurements")?))
    }

    pub fn insert_job(&self, j: &JobRow) -> Result<(), StoreError> {
        let argv = serde_json::to_string(&j.argv).expect("argv serializes");
        self.conn
            .execute(
                "INSERT INTO jobs(id,label,argv,cwd,device,policy,queued_ns,started_ns,ended_ns,pid,exit_code,signal,reason)
                 VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)",
                params![j.id as i64, j.label, argv, j.cwd, j.device, j.policy, j.queued_ns, j.started_ns, j.ended_ns,
                        j.pid, j.exit_code, j.signal, j.reason],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The job's process runs as `pid` since `started_ns`. A job run again alone (after an
    /// out-of-memory error beside siblings) keeps its first run's start and takes the new pid:
    /// in session 23 a second start at a call's end overwrote the first, and two jobs that had
    /// run for minutes read as queued the whole call.
    pub fn job_started(&self, id: u64, pid: u32, started_ns: i64) -> Result<(), StoreError> {
        self.update(
            "UPDATE jobs SET pid=?2, started_ns=COALESCE(started_ns, ?3) WHERE id=?1",
            "job",
            id,
            params![id as i64, pid, started_ns],
        )
    }

    pub fn job_ended(
        &self,
        id: u64,
        ended_ns: i64,
        exit_code: Option<i32>,
        signal: Option<i32>,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        self.update(
            "UPDATE jobs SET ended_ns=?2, exit_code=?3, signal=?4, reason=?5 WHERE id=?1",
            "job",
            id,
            params![id as i64, ended_ns, exit_code, signal, reason],
        )
    }

    pub fn insert_region(&self, r: &RegionRow) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO regions(id,job,device,name,pid,tid,policy,exclusive,requested_ns,granted_ns,released_ns,
                   wait_ms,gate_ms,drain_ms,drain_timed_out,freeze_ms,frozen_jobs,isolate_ms,core,lease_ms,revoked,tainted,
                   settle_ms,settle_timed_out,gpu_temp_c_granted,sm_clock_mhz_granted)
                 VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23,?24,?25,?26)",
                params![
                    r.id as i64, r.job.map(|j| j as i64), r.device, r.name, r.pid, r.tid, r.policy, r.exclusive,
                    r.requested_ns, r.granted_ns, r.released_ns, r.wait_ms, r.steps.gate_ms, r.steps.drain_ms,
                    r.steps.drain_timed_out, r.steps.freeze_ms, r.steps.frozen_jobs, r.steps.isolate_ms, r.core,
                    r.lease_ms as i64, r.revoked, r.tainted, r.steps.settle_ms, r.steps.settle_timed_out,
                    r.gpu_temp_c_granted, r.sm_clock_mhz_granted
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Record the end of a region; `revoked` also invalidates measurements already tied to it.
    /// `gpu` is (temperature °C, SM clock MHz) read at release, on GPU devices.
    pub fn region_released(
        &self,
        id: u64,
        released_ns: i64,
        revoked: bool,
        tainted: bool,
        gpu: Option<(u32, u32)>,
    ) -> Result<(), StoreError> {
        self.update(
            "UPDATE regions SET released_ns=?2, revoked=?3, tainted=?4, gpu_temp_c_released=?5, sm_clock_mhz_released=?6 WHERE id=?1",
            "region",
            id,
            params![id as i64, released_ns, revoked, tainted, gpu.map(|g| g.0), gpu.map(|g| g.1)],
        )?;
        if revoked {
            self.conn
                .execute("UPDATE measurements SET valid=0 WHERE region=?1", [id as i64])
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Record a job's GPU memory (once, when it ends).
    pub fn insert_job_memory(&self, m: &JobMemoryRow) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO job_memory(job,expected_bytes,source,peak_bytes,siblings_peak_bytes,retried)
                 VALUES(?1,?2,?3,?4,?5,?6)",
                params![
                    m.job as i64,
                    m.expected_bytes.map(|b| b as i64),
                    m.source,
                    m.peak_bytes as i64,
                    m.siblings_peak_bytes as i64,
                    m.retried
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn insert_region_host(&self, h: &RegionHostRow) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO region_host(region,cpu,steal_ms,irq_ms,run_delay_ms) VALUES(?1,?2,?3,?4,?5)",
                params![h.region as i64, h.cpu, h.steal_ms, h.irq_ms, h.run_delay_ms],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The host counters of region `region`, if the daemon recorded them.
    pub fn region_host(&self, region: u64) -> Result<Option<RegionHostRow>, StoreError> {
        self.conn
            .query_row(
                "SELECT region,cpu,steal_ms,irq_ms,run_delay_ms FROM region_host WHERE region=?1",
                [region as i64],
                host_row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// The peaks of the `limit` most recent jobs with a peak, oldest first (so that replaying
    /// them leaves the most recent ones the most recently used).
    pub fn learned_peaks(&self, limit: usize) -> Result<Vec<LearnedValue>, StoreError> {
        self.learned(
            "SELECT j.argv, j.label, m.peak_bytes FROM job_memory m JOIN jobs j ON j.id = m.job
             WHERE m.peak_bytes > 0 ORDER BY m.job DESC LIMIT ?1",
            limit,
        )
    }

    /// How long each of the `limit` most recent ended jobs ran (ms, from its start to its end),
    /// oldest first. A job retried alone is left out: its row's start is its first run's.
    pub fn learned_lengths(&self, limit: usize) -> Result<Vec<LearnedValue>, StoreError> {
        self.learned(
            "SELECT j.argv, j.label, (j.ended_ns - j.started_ns) / 1000000 FROM jobs j
             LEFT JOIN job_memory m ON m.job = j.id
             WHERE j.started_ns IS NOT NULL AND j.ended_ns > j.started_ns AND COALESCE(m.retried, 0) = 0
             ORDER BY j.id DESC LIMIT ?1",
            limit,
        )
    }

    /// Rows of (argv as JSON, label, value) from `sql`, newest first, returned oldest first.
    fn learned(&self, sql: &str, limit: usize) -> Result<Vec<LearnedValue>, StoreError> {
        let mut st = self.conn.prepare(sql).map_err(|e| self.err(e))?;
        let mut rows = st
            .query_map([limit as i64], |r| {
                let argv: String = r.get(0)?;
                Ok(LearnedValue {
                    argv: serde_json::from_str(&argv).unwrap_or_default(),
                    label: r.get(1)?,
                    value: r.get::<_, i64>(2)?.max(0) as u64,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.err(e))?;
        rows.reverse();
        Ok(rows)
    }

    pub fn insert_measurement(&self, m: &MeasurementRow) -> Result<(), StoreError> {
        let samples = serde_json::to_string(&m.samples_ms).expect("samples serialize");
        self.conn
            .execute(
                "INSERT INTO measurements(id,job,region,name,recorded_ns,samples_ms,valid) VALUES(?1,?2,?3,?4,?5,?6,?7)",
                params![m.id as i64, m.job.map(|j| j as i64), m.region.map(|r| r as i64), m.name, m.recorded_ns, samples, m.valid],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn update(&self, sql: &str, what: &'static str, id: u64, p: impl rusqlite::Params) -> Result<(), StoreError> {
        let n = self.conn.execute(sql, p).map_err(|e| self.err(e))?;
        if n == 0 {
            return Err(StoreError::Missing { what, id });
        }
        Ok(())
    }

    /// Jobs (all, or those with `label`), their regions and measurements, in id order.
    pub fn report(&self, label: Option<&str>) -> Result<Report, StoreError> {
        let jobs = self.jobs(label)?;
        let (rsql, msql) = if label.is_some() {
            (
                "SELECT * FROM regions WHERE job IN (SELECT id FROM jobs WHERE label=?1) ORDER BY id",
                "SELECT * FROM measurements WHERE job IN (SELECT id FROM jobs WHERE label=?1) ORDER BY id",
            )
        } else {
            (
                "SELECT * FROM regions WHERE ?1 IS NULL ORDER BY id",
                "SELECT * FROM measurements WHERE ?1 IS NULL ORDER BY id",
            )
        };
        let mut st = self.conn.prepare(rsql).map_err(|e| self.err(e))?;
        let regions = st
            .query_map([label], |r| {
                Ok(RegionRow {
                    id: r.get::<_, i64>("id")? as u64,
                    job: r.get::<_, Option<i64>>("job")?.map(|v| v as u64),
                    device: r.get("device")?,
                    name: r.get("name")?,
                    pid: r.get("pid")?,
                    tid: r.get("tid")?,
                    policy: r.get("policy")?,
                    exclusive: r.get("exclusive")?,
                    requested_ns: r.get("requested_ns")?,
                    granted_ns: r.get("granted_ns")?,
                    released_ns: r.get("released_ns")?,
                    wait_ms: r.get("wait_ms")?,
                    steps: StepTimings {
                        gate_ms: r.get("gate_ms")?,
                        drain_ms: r.get("drain_ms")?,
                        drain_timed_out: r.get("drain_timed_out")?,
                        freeze_ms: r.get("freeze_ms")?,
                        frozen_jobs: r.get("frozen_jobs")?,
                        settle_ms: r.get("settle_ms")?,
                        settle_timed_out: r.get("settle_timed_out")?,
                        isolate_ms: r.get("isolate_ms")?,
                    },
                    gpu_temp_c_granted: r.get("gpu_temp_c_granted")?,
                    sm_clock_mhz_granted: r.get("sm_clock_mhz_granted")?,
                    gpu_temp_c_released: r.get("gpu_temp_c_released")?,
                    sm_clock_mhz_released: r.get("sm_clock_mhz_released")?,
                    core: r.get("core")?,
                    lease_ms: r.get::<_, i64>("lease_ms")? as u64,
                    revoked: r.get("revoked")?,
                    tainted: r.get("tainted")?,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.err(e))?;
        let mut st = self.conn.prepare(msql).map_err(|e| self.err(e))?;
        let measurements = st
            .query_map([label], |r| {
                let s: String = r.get("samples_ms")?;
                Ok(MeasurementRow {
                    id: r.get::<_, i64>("id")? as u64,
                    job: r.get::<_, Option<i64>>("job")?.map(|v| v as u64),
                    region: r.get::<_, Option<i64>>("region")?.map(|v| v as u64),
                    name: r.get("name")?,
                    recorded_ns: r.get("recorded_ns")?,
                    samples_ms: serde_json::from_str(&s).unwrap_or_default(),
                    valid: r.get("valid")?,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.err(e))?;
        let msql = if label.is_some() {
            "SELECT * FROM job_memory WHERE job IN (SELECT id FROM jobs WHERE label=?1) ORDER BY job"
        } else {
            "SELECT * FROM job_memory WHERE ?1 IS NULL ORDER BY job"
        };
        let mut st = self.conn.prepare(msql).map_err(|e| self.err(e))?;
        let job_memory = st
            .query_map([label], |r| {
                Ok(JobMemoryRow {
                    job: r.get::<_, i64>("job")? as u64,
                    expected_bytes: r.get::<_, Option<i64>>("expected_bytes")?.map(|b| b as u64),
                    source: r.get("source")?,
                    peak_bytes: r.get::<_, i64>("peak_bytes")? as u64,
                    siblings_peak_bytes: r.get::<_, i64>("siblings_peak_bytes")? as u64,
                    retried: r.get("retried")?,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.err(e))?;
        let region_host = self.region_hosts(label)?;
        Ok(Report { jobs, regions, measurements, job_memory, region_host })
    }

    /// The host counters of the regions of the jobs labelled `label` (all: None), by region.
    fn region_hosts(&self, label: Option<&str>) -> Result<Vec<RegionHostRow>, StoreError> {
        let sql = "SELECT h.region, h.cpu, h.steal_ms, h.irq_ms, h.run_delay_ms FROM region_host h \
                   LEFT JOIN regions r ON r.id = h.region LEFT JOIN jobs j ON j.id = r.job \
                   WHERE ?1 IS NULL OR j.label = ?1 ORDER BY h.region";
        let mut st = self.conn.prepare(sql).map_err(|e| self.err(e))?;
        st.query_map([label], host_row).and_then(|rows| rows.collect::<Result<Vec<_>, _>>()).map_err(|e| self.err(e))
    }

    /// The region time of the jobs labelled `label` (only job `job`; only those queued at or after
    /// `since_ns`): one aggregate row, however many regions the jobs recorded.
    pub fn region_time(&self, label: &str, job: Option<u64>, since_ns: Option<i64>) -> Result<RegionTime, StoreError> {
        let sql = "SELECT COUNT(DISTINCT j.id), COUNT(r.id), \
                   COALESCE(SUM(MAX(r.released_ns - r.granted_ns, 0)), 0) \
                   FROM jobs j LEFT JOIN regions r ON r.job = j.id AND r.released_ns IS NOT NULL \
                   WHERE j.label = ?1 AND (?2 IS NULL OR j.id = ?2) AND (?3 IS NULL OR j.queued_ns >= ?3)";
        let job = job.map(|j| j as i64);
        self.conn
            .query_row(sql, params![label, job, since_ns], |r| {
                Ok(RegionTime {
                    jobs: r.get::<_, i64>(0)? as u64,
                    regions: r.get::<_, i64>(1)? as u64,
                    seconds: r.get::<_, i64>(2)? as f64 / 1e9,
                })
            })
            .map_err(|e| self.err(e))
    }

    fn jobs(&self, label: Option<&str>) -> Result<Vec<JobRow>, StoreError> {
        let mut st = self
            .conn
            .prepare("SELECT * FROM jobs WHERE (?1 IS NULL OR label = ?1) ORDER BY id")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([label], |r| {
                let argv: String = r.get("argv")?;
                Ok(JobRow {
                    id: r.get::<_, i64>("id")? as u64,
                    label: r.get("label")?,
                    argv: serde_json::from_str(&argv).unwrap_or_default(),
                    cwd: r.get("cwd")?,
                    device: r.get("device")?,
                    policy: r.get("policy")?,
                    queued_ns: r.get("queued_ns")?,
                    started_ns: r.get("started_ns")?,
                    ended_ns: r.get("ended_ns")?,
                    pid: r.get("pid")?,
                    exit_code: r.get("exit_code")?,
                    signal: r.get("signal")?,
                    reason: r.get("reason")?,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.err(e))?;
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, label: Option<&str>) -> JobRow {
        JobRow {
            id,
            label: label.map(String::from),
            argv: vec!["echo".into(), "hi there".into()],
            cwd: "/tmp".into(),
            device: "cpu".into(),
            policy: "region".into(),
            queued_ns: 10,
            started_ns: None,
            ended_ns: None,
            pid: None,
            exit_code: None,
            signal: None,
            reason: None,
        }
    }

    fn region(id: u64, job: u64) -> RegionRow {
        RegionRow {
            id,
            job: Some(job),
            device: "cpu".into(),
            name: "r".into(),
            pid: 1,
            tid: 2,
            policy: "region".into(),
            exclusive: true,
            requested_ns: 100,
            granted_ns: 110,
            released_ns: None,
            wait_ms: 0.01,
            steps: StepTimings { freeze_ms: 0.5, frozen_jobs: 1, isolate_ms: 0.1, ..StepTimings::default() },
            gpu_temp_c_granted: Some(40),
            sm_clock_mhz_granted: Some(1980),
            gpu_temp_c_released: None,
            sm_clock_mhz_released: None,
            core: Some(0),
            lease_ms: 60000,
            revoked: false,
            tainted: false,
        }
    }

    #[test]
    fn job_lifecycle_and_report_filter() {
        let s = Store::open_in_memory().unwrap();
        s.insert_job(&job(1, Some("a"))).unwrap();
        s.insert_job(&job(2, Some("b"))).unwrap();
        s.job_started(1, 41, 20).unwrap();
        s.job_started(1, 42, 25).unwrap(); // run again alone: the first start counts, the pid is the new run's
        s.job_ended(1, 30, Some(3), None, None).unwrap();
        s.insert_region(&region(1, 1)).unwrap();
        s.insert_region(&region(2, 2)).unwrap();
        s.insert_measurement(&MeasurementRow {
            id: 1,
            job: Some(1),
            region: Some(1),
            name: "k".into(),
            recorded_ns: 5,
            samples_ms: vec![1.5, 2.5],
            valid: true,
        })
        .unwrap();
        let r = s.report(Some("a")).unwrap();
        assert_eq!(r.jobs.len(), 1);
        assert_eq!(r.jobs[0].argv, vec!["echo", "hi there"]);
        assert_eq!(r.jobs[0].exit_code, Some(3));
        assert_eq!((r.jobs[0].pid, r.jobs[0].started_ns), (Some(42), Some(20)));
        assert_eq!(r.regions.iter().map(|r| r.id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(r.measurements[0].samples_ms, vec![1.5, 2.5]);
        let all = s.report(None).unwrap();
        assert_eq!((all.jobs.len(), all.regions.len()), (2, 2));
        assert_eq!(s.max_ids().unwrap(), (2, 2, 1));
    }

    #[test]
    fn a_jobs_region_seconds_count_its_released_regions() {
        let done = |id, job, granted_ns, released_ns| RegionRow { granted_ns, released_ns, ..region(id, job) };
        let r = Report {
            regions: vec![
                done(1, 1, 1_000_000_000, Some(3_500_000_000)),
                done(2, 1, 4_000_000_000, Some(4_500_000_000)),
                done(3, 1, 5_000_000_000, None), // still held: not counted
                done(4, 2, 0, Some(9_000_000_000)),
            ],
            ..Report::default()
        };
        assert!((r.region_seconds(1) - 3.0).abs() < 1e-9);
        assert_eq!(r.region_seconds(3), 0.0);
        assert!(r.region_seconds(3).is_sign_positive(), "none is 0.0, not -0.0 (shown \"-0.0 s\")");
    }

    #[test]
    fn a_report_split_into_parts_within_the_budget_merges_back_whole() {
        let measured = |id: u64, n: usize| MeasurementRow {
            id,
            job: Some(1),
            region: None,
            name: "k".into(),
            recorded_ns: 5,
            samples_ms: vec![1.25; n],
            valid: true,
        };
        let r = Report {
            jobs: vec![job(1, Some("a")), job(2, None)],
            regions: (1..=40).map(|i| region(i, 1 + i % 2)).collect(),
            measurements: vec![measured(1, 10), measured(2, 3000), measured(3, 10)],
            job_memory: vec![],
            region_host: (1..=5)
                .map(|i| RegionHostRow {
                    region: i,
                    cpu: Some(0),
                    steal_ms: Some(1.0),
                    irq_ms: None,
                    run_delay_ms: None,
                })
                .collect(),
        };
        let parts = r.clone().split(4096);
        assert!(parts.len() > 3, "{} parts", parts.len());
        for p in &parts {
            let n = serde_json::to_vec(p).unwrap().len();
            let rows = p.jobs.len() + p.regions.len() + p.measurements.len();
            assert!(n <= 4096 + 200 || rows == 1, "a part of {n} bytes with {rows} rows");
        }
        assert!(parts.iter().any(|p| p.measurements.len() == 1 && p.measurements[0].samples_ms.len() == 3000));
        let json: Vec<serde_json::Value> = parts.iter().map(|p| serde_json::to_value(p).unwrap()).collect();
        assert_eq!(Report::from_parts(json).unwrap(), r, "the rows in order, none lost");
        assert_eq!(Report::default().split(4096), vec![Report::default()], "empty: one empty part");
    }

    #[test]
    fn revocation_invalidates_measurements() {
        let s = Store::open_in_memory().unwrap();
        s.insert_job(&job(1, None)).unwrap();
        s.insert_region(&region(7, 1)).unwrap();
        s.insert_measurement(&MeasurementRow {
            id: 1,
            job: Some(1),
            region: Some(7),
            name: "k".into(),
            recorded_ns: 5,
            samples_ms: vec![1.0],
            valid: true,
        })
        .unwrap();
        s.region_released(7, 200, true, false, Some((55, 1755))).unwrap();
        let r = s.report(None).unwrap();
        assert!(r.regions[0].revoked);
        assert_eq!(
            (r.regions[0].gpu_temp_c_granted, r.regions[0].gpu_temp_c_released, r.regions[0].sm_clock_mhz_released),
            (Some(40), Some(55), Some(1755))
        );
        assert!(!r.measurements[0].valid);
    }

    #[test]
    fn updates_of_missing_rows_are_errors() {
        let s = Store::open_in_memory().unwrap();
        assert!(matches!(s.job_started(9, 1, 1), Err(StoreError::Missing { what: "job", id: 9 })));
        assert!(matches!(s.region_released(9, 1, false, false, None), Err(StoreError::Missing { what: "region", .. })));
    }

    #[test]
    fn survives_reopen_and_checks_schema_version() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.db");
        {
            let s = Store::open(&p).unwrap();
            s.insert_job(&job(5, None)).unwrap();
        }
        let s = Store::open(&p).unwrap();
        assert_eq!(s.max_ids().unwrap().0, 5);
        s.conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'", []).unwrap();
        drop(s);
        assert!(matches!(Store::open(&p), Err(StoreError::SchemaVersion { found: 99, .. })));
    }

    #[test]
    fn job_memory_is_reported_and_learned_peaks_come_newest_last() {
        let s = Store::open_in_memory().unwrap();
        for id in 1..=3 {
            s.insert_job(&JobRow { argv: vec![format!("cmd{id}")], ..job(id, Some("a")) }).unwrap();
        }
        let mem = |job, peak| JobMemoryRow {
            job,
            expected_bytes: Some(5),
            source: Some("default".into()),
            peak_bytes: peak,
            siblings_peak_bytes: 7,
            retried: job == 2,
        };
        for (job, peak) in [(1, 10), (2, 20), (3, 0)] {
            s.insert_job_memory(&mem(job, peak)).unwrap();
        }
        let r = s.report(Some("a")).unwrap();
        assert_eq!(r.job_memory, vec![mem(1, 10), mem(2, 20), mem(3, 0)]);
        assert!(s.report(Some("other")).unwrap().job_memory.is_empty());
        let learned = s.learned_peaks(10).unwrap();
        let got: Vec<(String, u64)> = learned.iter().map(|l| (l.argv[0].clone(), l.value)).collect();
        assert_eq!(got, vec![("cmd1".to_string(), 10), ("cmd2".to_string(), 20)], "no zero peaks; newest last");
        assert_eq!(s.learned_peaks(1).unwrap()[0].argv, vec!["cmd2"], "the limit keeps the newest");
    }

    #[test]
    fn learned_lengths_are_the_ended_jobs_runs_newest_last() {
        let s = Store::open_in_memory().unwrap();
        let ms = 1_000_000;
        let rows =
            [(1, Some(5 * ms), Some(9 * ms)), (2, Some(5 * ms), None), (3, None, None), (4, Some(ms), Some(31 * ms))];
        for (id, started, ended) in rows {
            let row =
                JobRow { argv: vec![format!("cmd{id}")], started_ns: started, ended_ns: ended, ..job(id, Some("a")) };
            s.insert_job(&row).unwrap();
        }
        let got: Vec<(String, u64)> =
            s.learned_lengths(10).unwrap().into_iter().map(|l| (l.argv[0].clone(), l.value)).collect();
        assert_eq!(got, vec![("cmd1".to_string(), 4), ("cmd4".to_string(), 30)], "ended jobs only; newest last");
        let retried = JobMemoryRow {
            job: 4,
            expected_bytes: None,
            source: None,
            peak_bytes: 1,
            siblings_peak_bytes: 1,
            retried: true,
        };
        s.insert_job_memory(&retried).unwrap();
        let got: Vec<String> = s.learned_lengths(10).unwrap().into_iter().map(|l| l.argv[0].clone()).collect();
        assert_eq!(got, vec!["cmd1"], "a job retried alone is left out");
        assert_eq!(s.learned_lengths(1).unwrap()[0].label.as_deref(), Some("a"));
    }

    #[test]
    fn a_store_written_before_job_memory_is_migrated_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("old.db");
        {
            // A file as the schema before the job_memory table wrote it.
            let s = Store::open(&p).unwrap();
            s.insert_job(&job(1, None)).unwrap();
            s.conn.execute_batch("DROP TABLE job_memory;").unwrap();
        }
        let s = Store::open(&p).unwrap();
        assert_eq!(s.report(None).unwrap().jobs.len(), 1, "its rows stay");
        s.insert_job_memory(&JobMemoryRow {
            job: 1,
            expected_bytes: None,
            source: None,
            peak_bytes: 3,
            siblings_peak_bytes: 0,
            retried: false,
        })
        .unwrap();
        assert_eq!(s.report(None).unwrap().job_memory.len(), 1);
        // A report JSON without the field (an older daemon's) still reads.
        let old: Report = serde_json::from_str(r#"{"jobs": [], "regions": [], "measurements": []}"#).unwrap();
        assert!(old.job_memory.is_empty());
    }

    #[test]
    fn a_regions_host_counters_read_back_and_an_older_file_gains_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("old.db");
        {
            // A file as the schema before the region_host table wrote it.
            let s = Store::open(&p).unwrap();
            s.conn.execute_batch("DROP TABLE region_host;").unwrap();
        }
        let s = Store::open(&p).unwrap();
        assert_eq!(s.region_host(7).unwrap(), None, "none recorded");
        let row =
            RegionHostRow { region: 7, cpu: Some(0), steal_ms: Some(30.0), irq_ms: None, run_delay_ms: Some(2.5) };
        s.insert_region_host(&row).unwrap();
        assert_eq!(s.region_host(7).unwrap(), Some(row.clone()));
        let unpinned = RegionHostRow { cpu: None, ..row };
        s.insert_region_host(&unpinned).unwrap();
        assert_eq!(s.region_host(7).unwrap(), Some(unpinned.clone()), "recorded again: replaced");
        // In the report: all of them, or those of a label's jobs' regions.
        s.insert_job(&job(1, Some("a"))).unwrap();
        s.insert_region(&region(7, 1)).unwrap();
        s.insert_job(&job(2, Some("b"))).unwrap();
        s.insert_region(&region(8, 2)).unwrap();
        let other = RegionHostRow { region: 8, ..unpinned.clone() };
        s.insert_region_host(&other).unwrap();
        assert_eq!(s.report(None).unwrap().region_host, vec![unpinned.clone(), other]);
        assert_eq!(s.report(Some("a")).unwrap().region_host, vec![unpinned]);
        let old: Report = serde_json::from_str(r#"{"jobs": [], "regions": [], "measurements": []}"#).unwrap();
        assert!(old.region_host.is_empty(), "a report from before the field reads");
    }

    #[test]
    fn garbage_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.db");
        std::fs::write(&p, b"this is not a database at all, not even close................................").unwrap();
        let e = Store::open(&p).err().expect("must fail");
        assert!(e.to_string().contains("bad.db"), "{e}");
    }
}
