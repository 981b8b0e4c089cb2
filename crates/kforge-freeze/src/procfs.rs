//! Process-group helpers built on `/proc` and `kill(2)`.

use crate::FreezeError;
use std::fs;
use std::io;

/// The scheduler state letter and process group of `pid` (or of thread `tid` when given),
/// read from `/proc/<pid>[/task/<tid>]/stat`. `None` if it vanished or is unreadable.
fn stat(pid: i32, tid: Option<i32>) -> Option<(char, i32)> {
    let path = match tid {
        Some(tid) => format!("/proc/{pid}/task/{tid}/stat"),
        None => format!("/proc/{pid}/stat"),
    };
    let text = fs::read_to_string(path).ok()?;
    // The command name (field 2) is parenthesised and may contain spaces or ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let pgrp = fields.nth(1)?.parse().ok()?;
    Some((state, pgrp))
}

/// Numeric entries of a `/proc` directory (the processes of `/proc`).
fn numeric_entries(dir: &str) -> Vec<i32> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut ids: Vec<i32> = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    ids.sort_unstable();
    ids
}

/// List the pids of process group `pgid` by scanning `/proc` (zombies included).
///
/// Returns an empty list for a group with no members or a non-positive `pgid`. The answer is a
/// snapshot: processes may be created or reaped while or after it is taken.
pub fn pgid_members(pgid: i32) -> Vec<i32> {
    if pgid <= 0 {
        return Vec::new();
    }
    numeric_entries("/proc").into_iter().filter(|&pid| stat(pid, None).is_some_and(|(_, g)| g == pgid)).collect()
}

/// Whether a thread state letter means "will not run": stopped, traced, zombie or dead.
fn is_stopped_state(state: char) -> bool {
    matches!(state, 'T' | 't' | 'Z' | 'X' | 'x')
}

/// Members of `pgid` with at least one thread that is not stopped (zombies count as stopped).
pub(crate) fn running_members(pgid: i32) -> Vec<i32> {
    pgid_members(pgid)
        .into_iter()
        .filter(|&pid| {
            // A single task listing can miss live threads (see kforge_cores::threads).
            kforge_cores::threads(pid)
                .into_iter()
                .any(|tid| stat(pid, Some(tid)).is_some_and(|(s, _)| !is_stopped_state(s)))
        })
        .collect()
}

/// Reject process groups that must never be signalled as a whole: `pgid <= 1` (0 and negative
/// values have special meanings for `kill(2)`, 1 is init's) and the caller's own group.
pub(crate) fn check_pgid(pgid: i32) -> Result<i32, FreezeError> {
    // SAFETY: getpgrp has no preconditions.
    let own = unsafe { libc::getpgrp() };
    if pgid <= 1 || pgid == own {
        return Err(FreezeError::Invalid {
            what: "process group",
            detail: format!("{pgid} (must be > 1 and not the caller's own group {own})"),
        });
    }
    Ok(pgid)
}

/// `kill(-pgid, signal)`; ESRCH becomes [`FreezeError::NoSuchGroup`]. `pgid` must be checked.
pub(crate) fn signal_group(pgid: i32, signal: i32) -> Result<(), FreezeError> {
    // SAFETY: plain syscall; check_pgid guarantees we never target 0/-1 semantics.
    if unsafe { libc::kill(-pgid, signal) } == 0 {
        return Ok(());
    }
    let source = io::Error::last_os_error();
    match source.raw_os_error() {
        Some(libc::ESRCH) => Err(FreezeError::NoSuchGroup { pgid }),
        _ => Err(FreezeError::Signal { target: format!("process group {pgid}"), signal, source }),
    }
}

/// `kill(pid, SIGKILL)` for a pid read from `cgroup.procs`; a vanished process is ignored.
pub(crate) fn kill_pid(pid: i32) {
    if pid > 0 {
        // SAFETY: plain syscall on one positive pid.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Signals-mechanism recovery helper: send SIGCONT then SIGKILL to each process group,
/// ignoring groups that no longer exist (ESRCH) and skipping invalid ones (`<= 1` or the
/// caller's own group). Returns how many groups received SIGKILL.
pub fn recover_pgids(pgids: &[i32]) -> usize {
    pgids
        .iter()
        .filter(|&&pgid| {
            check_pgid(pgid).is_ok() && {
                let _ = signal_group(pgid, libc::SIGCONT);
                signal_group(pgid, libc::SIGKILL).is_ok()
            }
        })
        .count()
}
