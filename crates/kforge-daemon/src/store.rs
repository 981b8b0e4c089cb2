//! The store thread: the only writer of the SQLite file while the daemon runs.
//!
//! The state machine's store writes ([`StoreWrite`] effects) reach it over a channel and nobody
//! waits for SQLite, so a slow disk cannot stretch a region hand-over. Operations are applied in
//! the order sent.

use crate::effect::{RegionTimeQuery, StoreWrite};
use crate::event::Outgoing;
use kforge_proto::Reply;
use kforge_store::Store;
use std::sync::mpsc::{channel, Sender};
use std::thread::JoinHandle;

pub enum StoreOp {
    /// A write the state machine asked for.
    Write(StoreWrite),
    /// Answer a report request directly on the asking connection.
    Report { label: Option<String>, reply: Sender<Outgoing> },
    /// Answer a region-time request directly on the asking connection.
    RegionTime { query: RegionTimeQuery, reply: Sender<Outgoing> },
}

pub struct StoreHandle {
    pub tx: Sender<StoreOp>,
    thread: Option<JoinHandle<()>>,
}

impl StoreHandle {
    pub fn spawn(store: Store) -> StoreHandle {
        let (tx, rx) = channel::<StoreOp>();
        let thread = std::thread::Builder::new()
            .name("kforge-store".into())
            .spawn(move || {
                for op in rx {
                    if let Err(e) = apply(&store, op) {
                        eprintln!("kforge daemon: store {}: {e}", store.path());
                    }
                }
            })
            .expect("spawn store thread");
        StoreHandle { tx, thread: Some(thread) }
    }

    pub fn send(&self, op: StoreOp) {
        // The store thread only stops when this handle is dropped.
        let _ = self.tx.send(op);
    }

    /// Apply everything sent so far and stop the thread.
    pub fn finish(mut self) {
        let (tx, _) = channel();
        drop(std::mem::replace(&mut self.tx, tx));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn apply(s: &Store, op: StoreOp) -> Result<(), kforge_store::StoreError> {
    match op {
        StoreOp::Write(w) => write(s, w),
        StoreOp::Report { label, reply } => {
            match s.report(label.as_deref()) {
                Ok(r) => {
                    let parts = r.split(kforge_proto::REPORT_PART_BYTES);
                    let last = parts.len() - 1;
                    for (i, part) in parts.into_iter().enumerate() {
                        let report = serde_json::to_value(&part).unwrap_or_default();
                        let _ = reply.send(Outgoing::Msg(Reply::Report { report, more: i < last }));
                    }
                }
                Err(e) => {
                    let msg = Reply::Error { code: kforge_proto::ErrorCode::Internal, message: e.to_string() };
                    let _ = reply.send(Outgoing::Msg(msg));
                }
            }
            Ok(())
        }
        StoreOp::RegionTime { query, reply } => {
            let msg = match s.region_time(&query.label, query.job, query.since_ns) {
                Ok(t) => Reply::RegionTime { jobs: t.jobs, regions: t.regions, seconds: t.seconds },
                Err(e) => Reply::Error { code: kforge_proto::ErrorCode::Internal, message: e.to_string() },
            };
            let _ = reply.send(Outgoing::Msg(msg));
            Ok(())
        }
    }
}

fn write(s: &Store, w: StoreWrite) -> Result<(), kforge_store::StoreError> {
    match w {
        StoreWrite::InsertJob(j) => s.insert_job(&j),
        StoreWrite::JobStarted { id, pid, ns } => s.job_started(id, pid, ns),
        StoreWrite::JobEnded { id, ns, code, signal, reason } => s.job_ended(id, ns, code, signal, reason.as_deref()),
        StoreWrite::InsertRegion(r) => s.insert_region(&r),
        StoreWrite::RegionReleased { id, ns, revoked, tainted, gpu } => {
            s.region_released(id, ns, revoked, tainted, gpu)
        }
        StoreWrite::InsertMeasurement(m) => s.insert_measurement(&m),
        StoreWrite::RegionHost(h) => s.insert_region_host(&h),
        StoreWrite::JobMemory(m) => s.insert_job_memory(&m),
    }
}
