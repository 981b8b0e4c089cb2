//! Thin wrappers over the Linux syscalls the gate needs: cross-process
//! futexes, `CLOCK_MONOTONIC` and process liveness checks.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Result of one `FUTEX_WAIT` call. Callers always re-check the word, so the
/// distinction only matters for deadline bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitResult {
    /// Woken by `FUTEX_WAKE` (possibly spuriously).
    Woken,
    /// The word did not hold the expected value (`EAGAIN`).
    ValueChanged,
    /// Interrupted by a signal (`EINTR`).
    Interrupted,
    /// The relative timeout expired (`ETIMEDOUT`).
    TimedOut,
}

/// `FUTEX_WAIT` on a word that may live in memory shared between processes
/// (no `FUTEX_PRIVATE_FLAG`). Sleeps while `*word == expected`, at most
/// `timeout` (forever if `None`). Does not allocate.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> WaitResult {
    let ts;
    let ts_ptr: *const libc::timespec = match timeout {
        Some(d) => {
            ts = libc::timespec {
                tv_sec: d.as_secs().min(i64::MAX as u64 / 2) as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            };
            &ts
        }
        None => std::ptr::null(),
    };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call;
    // the kernel only reads it. The timespec (if any) outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr() as *const u32,
            libc::FUTEX_WAIT,
            expected,
            ts_ptr,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if rc == 0 {
        return WaitResult::Woken;
    }
    match errno() {
        libc::EAGAIN => WaitResult::ValueChanged,
        libc::EINTR => WaitResult::Interrupted,
        libc::ETIMEDOUT => WaitResult::TimedOut,
        // EFAULT/EINVAL/ENOSYS cannot happen for a valid mapping; treat as a
        // spurious wakeup so callers re-check rather than hang.
        _ => WaitResult::Woken,
    }
}

/// `FUTEX_WAKE` every waiter (in any process) sleeping on `word`.
pub(crate) fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: see `futex_wait`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr() as *const u32,
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Current `CLOCK_MONOTONIC` time in nanoseconds (the time base of the test
/// submitter's log and of the daemon's region timestamps).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Whether a process with this pid can still acknowledge a drain: it exists (`kill(pid, 0)`:
/// only `ESRCH` counts as gone; `EPERM` means it exists but belongs to someone else) and it is
/// neither a zombie (exited, not yet reaped: `kill` still finds it) nor exiting (its threads,
/// the drain helper among them, are gone or going while the kernel tears it down). A zombie
/// whose parent never reaps it (a job's killed child, orphaned to an init that does not reap)
/// would otherwise make every later drain wait out its timeout. A zombie's pid is not reused
/// before it is reaped, so its slot is safe to clear.
pub fn process_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 performs only the existence/permission check.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if rc != 0 && errno() == libc::ESRCH {
        return false;
    }
    !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| ended(&stat))
}

/// The kernel's `PF_EXITING` task flag: the task has begun to exit.
const PF_EXITING: u64 = 0x4;

/// Whether a `/proc/PID/stat` line is a zombie's, a dead task's or an exiting one's (its state,
/// the first field after the command's closing parenthesis, and its flags, the seventh).
fn ended(stat: &str) -> bool {
    let Some((_, rest)) = stat.rsplit_once(')') else { return false };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first().copied().unwrap_or("");
    let flags = fields.get(6).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0
}

/// The calling process's pid.
pub fn current_pid() -> u32 {
    // SAFETY: getpid never fails.
    unsafe { libc::getpid() as u32 }
}

#[cfg(test)]
mod tests {
    use super::ended;

    #[test]
    fn a_zombie_a_dead_task_and_an_exiting_one_have_ended() {
        // pid (comm) state ppid pgrp session tty tpgid flags ...
        let line = |state: &str, flags: u64| format!("42 (py thon) x) {state} 1 42 42 0 -1 {flags} 0 0");
        assert!(!ended(&line("S", 0x400000)), "sleeping");
        assert!(!ended(&line("R", 0x400040)), "running");
        assert!(ended(&line("Z", 0x400000)), "zombie");
        assert!(ended(&line("X", 0)), "dead");
        assert!(ended(&line("D", 0x400004)), "exiting, in uninterruptible sleep (a GPU context's teardown)");
        assert!(!ended("garbage"), "unreadable: alive");
    }
}
