//! Nothing stays frozen when the daemon dies.
//!
//! The daemon keeps a *ledger* (a small JSON file in its state directory) naming its freezer
//! subtree, its gate segments and the process groups of its running jobs, rewritten whenever a
//! job starts or ends. A separate *guardian* process holds the read end of a pipe whose write end
//! only the daemon has; when the daemon dies for any reason (kill -9 included) the pipe closes
//! and the guardian **kills the daemon's jobs**: it thaws and kills every job cgroup, SIGCONTs and
//! SIGKILLs every recorded process group, removes the gate segments and the ledger. Children
//! therefore die with the daemon. If the guardian was killed too, the next daemon started on
//! the same socket finds the stale ledger (its daemon pid is dead) and does the same at start.

use crate::DaemonError;
use kforge_freeze::{Freezer, MechanismKind};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct LedgerData {
    pub daemon_pid: u32,
    pub freezer_kind: String,
    pub freezer_name: String,
    pub gates: Vec<PathBuf>,
    /// (job id, process group id) of running jobs.
    pub jobs: Vec<(u64, i32)>,
}

pub struct Ledger {
    path: PathBuf,
    base: LedgerData,
}

impl Ledger {
    pub fn new(path: PathBuf, daemon_pid: u32, freezer: &Freezer, freezer_name: &str, gates: Vec<PathBuf>) -> Ledger {
        Ledger {
            path,
            base: LedgerData {
                daemon_pid,
                freezer_kind: freezer.kind().as_str().into(),
                freezer_name: freezer_name.into(),
                gates,
                jobs: vec![],
            },
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Atomically replace the ledger with the current running jobs.
    pub fn write(&self, jobs: &[(u64, i32)]) -> Result<(), DaemonError> {
        let mut d = self.base.clone();
        d.jobs = jobs.to_vec();
        let tmp = self.path.with_extension("tmp");
        let body = serde_json::to_vec(&d).expect("ledger serializes");
        std::fs::write(&tmp, body).map_err(|e| DaemonError::io("writing ledger", &tmp, e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| DaemonError::io("renaming ledger", &self.path, e))
    }

    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What a recovery did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovery {
    pub process_groups_killed: usize,
    pub cgroups_removed: usize,
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    pid != 0 && unsafe { libc::kill(pid as i32, 0) } == 0
}

/// Recover from a ledger left by a dead daemon. Returns None when there is no ledger or, unless
/// `daemon_known_dead` (the guardian knows: its pipe closed; a killed daemon may linger as a
/// zombie), when its daemon is still alive.
pub fn recover_stale(ledger: &Path, daemon_known_dead: bool) -> Result<Option<Recovery>, DaemonError> {
    let body = match std::fs::read(ledger) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DaemonError::io("reading ledger", ledger, e)),
    };
    let d: LedgerData = serde_json::from_slice(&body)
        .map_err(|e| DaemonError::Config(format!("ledger {} is corrupt ({e}); remove it by hand", ledger.display())))?;
    if !daemon_known_dead && pid_alive(d.daemon_pid) && d.daemon_pid != std::process::id() {
        return Ok(None);
    }
    let mut rec = Recovery::default();
    if let Some(kind) = MechanismKind::parse(&d.freezer_kind) {
        if kind != MechanismKind::Signals {
            if let Ok(f) = Freezer::detect(&d.freezer_name, Some(kind)) {
                if let Ok(r) = f.recover() {
                    rec.cgroups_removed = r.removed;
                }
            }
        }
    }
    let pgids: Vec<i32> = d.jobs.iter().map(|(_, p)| *p).collect();
    rec.process_groups_killed = kforge_freeze::recover_pgids(&pgids);
    for g in &d.gates {
        let _ = std::fs::remove_file(g);
    }
    let _ = std::fs::remove_file(ledger);
    Ok(Some(rec))
}

/// The guardian's main: block until standard input closes (the daemon is gone), then recover.
pub fn run_guardian(ledger: &Path) -> Result<Recovery, DaemonError> {
    let mut sink = [0u8; 64];
    let mut stdin = std::io::stdin();
    loop {
        match stdin.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    Ok(recover_stale(ledger, true)?.unwrap_or_default())
}
