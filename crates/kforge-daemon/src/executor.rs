//! The server's side of the state machine: carries out its [`Effect`]s, in order, on the
//! event-loop thread, and holds what the machine does not — connections' writer channels and
//! sockets, warm workers' control sockets, the device threads' channels, the store thread, the
//! ledger, the freezer. An effect whose outcome the machine needs is answered with an [`Event`],
//! handled before the effects that followed it (as if the step had been a call).

use crate::effect::{Effect, JobLaunch, RegionStep, WarmLaunch, WorkerLaunch};
use crate::event::{ConnId, Event, Inbound, Now, Outgoing};
use crate::guardian::Ledger;
use crate::jobs::{self, SpawnSpec};
use crate::state::Daemon;
use crate::store::{StoreHandle, StoreOp};
use crate::warm::{self, WorkerSpawn};
use kforge_freeze::Freezer;
use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::Arc;

pub struct Executor {
    conns: HashMap<ConnId, (Sender<Outgoing>, UnixStream)>,
    /// Warm workers' control sockets.
    controls: HashMap<u64, Arc<OwnedFd>>,
    device_threads: Vec<Sender<RegionStep>>,
    store: StoreHandle,
    ledger: Ledger,
    freezer: Arc<Freezer>,
    events: Sender<Inbound>,
}

impl Executor {
    pub fn new(
        device_threads: Vec<Sender<RegionStep>>,
        store: StoreHandle,
        ledger: Ledger,
        freezer: Arc<Freezer>,
        events: Sender<Inbound>,
    ) -> Executor {
        Executor { conns: HashMap::new(), controls: HashMap::new(), device_threads, store, ledger, freezer, events }
    }

    /// Take what arrived at the event loop to the state machine and carry out what it says.
    pub fn deliver(&mut self, d: &mut Daemon, inbound: Inbound) {
        let ev = match inbound {
            Inbound::Connected { conn, tx, stream } => {
                self.conns.insert(conn, (tx, stream));
                Event::Connected { conn }
            }
            Inbound::Event(ev) => ev,
        };
        let gone = match &ev {
            Event::Hangup { conn } => Gone::Conn(*conn),
            Event::WorkerExited { worker, .. } => Gone::Worker(*worker),
            _ => Gone::Nothing,
        };
        let effects = d.handle(ev, Now::current());
        self.run(d, effects);
        match gone {
            Gone::Conn(c) => drop(self.conns.remove(&c)),
            Gone::Worker(w) => drop(self.controls.remove(&w)),
            Gone::Nothing => {}
        }
    }

    /// Carry out effects in order; an answer's effects go before the rest.
    pub fn run(&mut self, d: &mut Daemon, effects: Vec<Effect>) {
        let mut pending: VecDeque<Effect> = effects.into();
        while let Some(e) = pending.pop_front() {
            if let Some(answer) = self.carry_out(e) {
                for e in d.handle(answer, Now::current()).into_iter().rev() {
                    pending.push_front(e);
                }
            }
        }
    }

    fn carry_out(&mut self, e: Effect) -> Option<Event> {
        match e {
            Effect::Send { conn, reply } => self.to_conn(conn, Outgoing::Msg(reply)),
            Effect::Close { conn } => self.to_conn(conn, Outgoing::Close),
            Effect::Store(w) => self.store.send(StoreOp::Write(w)),
            Effect::Report { conn, label } => {
                if let Some((tx, _)) = self.conns.get(&conn) {
                    self.store.send(StoreOp::Report { label, reply: tx.clone() });
                }
            }
            Effect::RegionTime { conn, query } => {
                if let Some((tx, _)) = self.conns.get(&conn) {
                    self.store.send(StoreOp::RegionTime { query, reply: tx.clone() });
                }
            }
            Effect::Step { device, step } => {
                let _ = self.device_threads[device].send(step);
            }
            Effect::SpawnJob(l) => return Some(self.spawn_job(l)),
            Effect::SpawnWorker(l) => return Some(self.spawn_worker(l)),
            Effect::HandToWorker(l) => return Some(self.hand_to_worker(l)),
            Effect::KillJob(t) => {
                if let Err(e) = self.freezer.kill(&t) {
                    eprintln!("kforge daemon: cancelling job {}: {e}", t.job);
                }
            }
            Effect::KillWorker(t) => {
                let _ = self.freezer.kill(&t);
            }
            Effect::RemoveCgroup { id } => {
                let _ = self.freezer.remove_job(id);
            }
            Effect::WriteLedger(pgids) => {
                if let Err(e) = self.ledger.write(&pgids) {
                    eprintln!("kforge daemon: {e}");
                }
            }
            Effect::Log(line) => eprintln!("kforge daemon: {line}"),
        }
        None
    }

    fn to_conn(&self, conn: ConnId, out: Outgoing) {
        if let Some((tx, _)) = self.conns.get(&conn) {
            let _ = tx.send(out);
        }
    }

    /// Where a job's output goes: its connection, or nowhere.
    fn output_of(&self, conn: Option<ConnId>) -> Sender<Outgoing> {
        conn.and_then(|c| self.conns.get(&c)).map(|c| c.0.clone()).unwrap_or_else(|| std::sync::mpsc::channel().0)
    }

    fn spawn_job(&mut self, l: JobLaunch) -> Event {
        let job = l.job;
        let (procs, cgroup) = match self.freezer.create_job(job) {
            Ok(Some(p)) => {
                let dir = p.parent().map(|d| d.to_path_buf());
                (Some(p), dir)
            }
            Ok(None) => (None, None),
            Err(e) => {
                eprintln!("kforge daemon: job {job}: no cgroup ({e}); freezing falls back to its process group");
                (None, None)
            }
        };
        let out = self.output_of(l.conn);
        let spec = SpawnSpec { job, argv: l.argv, cwd: l.cwd, env: l.env, cgroup_procs: procs, cpus: l.cpus };
        match jobs::spawn(spec, out, self.events.clone(), self.freezer.clone(), cgroup.clone()) {
            Ok(pid) => Event::JobSpawned { job, pid, cgroup },
            Err(e) => Event::JobSpawnFailed { job, error: e.to_string() },
        }
    }

    fn spawn_worker(&mut self, l: WorkerLaunch) -> Event {
        let worker = l.worker;
        let procs = self.freezer.create_job(crate::effect::WORKER_CGROUP_BASE + worker).ok().flatten();
        let cgroup: Option<PathBuf> = procs.as_ref().and_then(|p| p.parent().map(|d| d.to_path_buf()));
        let spec =
            WorkerSpawn { id: worker, python: l.python, env: l.env, cgroup_procs: procs, cpus: l.cpus, log: l.log };
        match warm::spawn(spec, self.events.clone()) {
            Ok(h) => {
                self.controls.insert(worker, h.control);
                Event::WorkerSpawned { worker, pid: h.pid, cgroup }
            }
            Err(e) => Event::WorkerSpawnFailed { worker, error: e.to_string() },
        }
    }

    fn hand_to_worker(&mut self, l: WarmLaunch) -> Event {
        let (worker, job) = (l.worker, l.job);
        let result = match self.controls.get(&worker) {
            Some(control) => {
                let out = self.output_of(l.conn);
                warm::start_job(control, job, &l.argv, &l.cwd, &l.env, out, self.events.clone())
                    .map_err(|e| e.to_string())
            }
            None => Err("its control socket is gone".into()),
        };
        Event::HandedToWorker { worker, job, result }
    }

    /// Close every connection (at the very end of a shutdown) and stop the store thread once it
    /// has applied everything.
    pub fn finish(mut self) {
        for (_, (tx, stream)) in self.conns.drain() {
            let _ = tx.send(Outgoing::Close);
            let _ = stream.shutdown(std::net::Shutdown::Read);
        }
        self.store.finish();
    }
}

enum Gone {
    Conn(ConnId),
    Worker(u64),
    Nothing,
}
