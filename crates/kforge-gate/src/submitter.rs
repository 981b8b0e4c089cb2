//! A fake GPU client that honours the gate the way the LD_PRELOAD shim must.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::sys::{current_pid, monotonic_ns};
use crate::{spawn_drain_helper_with, Gate, GateError, LaunchTracker};

/// Minimum spacing between two submissions of [`run_test_submitter`], so
/// `in_flight = 0` does not flood the log.
pub const SUBMITTER_MIN_INTERVAL: Duration = Duration::from_micros(200);

fn log_line(log: &File, path: &Path, line: &str) -> Result<(), GateError> {
    // One write(2) per line on an O_APPEND file: lines from the main thread
    // and the helper never interleave.
    let mut f = log;
    f.write_all(line.as_bytes()).map_err(|source| GateError::Io { op: "write", path: path.to_path_buf(), source })
}

/// Runs a test submitter in the calling process (normally a dedicated child
/// process): a stand-in for a GPU application under the shim.
///
/// It opens the gate at `gate_path`, registers its pid, and starts a drain
/// helper whose drain closure waits until no submission is being issued
/// ([`LaunchTracker::wait_idle`]) and the last fake submission has completed
/// (a submission is "in flight" for `in_flight` after it was issued, tracked
/// with an atomic `CLOCK_MONOTONIC` timestamp), then appends
/// `<monotonic ns> ack <epoch>\n` to `log` before acknowledging.
///
/// The main loop, for each of `count` submissions (`0` = forever, until the
/// process is killed): enters the gate through a [`LaunchTracker`] (blocking
/// while the gate is closed and this pid is not the holder), appends
/// `<monotonic ns> submit\n` to `log`, leaves the tracker, and waits until
/// that submission has completed (at least [`SUBMITTER_MIN_INTERVAL`])
/// before issuing the next one. The log is created if missing and appended
/// to. On return the helper is stopped and the slot unregistered.
pub fn run_test_submitter(gate_path: &Path, log: &Path, count: u64, in_flight: Duration) -> Result<(), GateError> {
    let gate = Arc::new(Gate::open(gate_path)?);
    let file = Arc::new(OpenOptions::new().create(true).append(true).open(log).map_err(|source| GateError::Io {
        op: "open",
        path: log.to_path_buf(),
        source,
    })?);
    let pid = current_pid();
    let slot = gate.register(pid)?;

    let tracker = Arc::new(LaunchTracker::new());
    let last_issue = Arc::new(AtomicU64::new(0)); // ns; 0 = nothing issued yet
    let in_flight_ns = in_flight.as_nanos().min(u64::MAX as u128) as u64;

    let helper = {
        let tracker = Arc::clone(&tracker);
        let last_issue = Arc::clone(&last_issue);
        let file = Arc::clone(&file);
        let log = log.to_path_buf();
        spawn_drain_helper_with(Arc::clone(&gate), slot, move |epoch| {
            // 1. No submission may be mid-issue.
            tracker.wait_idle();
            // 2. The last issued submission must have completed.
            let issued = last_issue.load(Ordering::SeqCst);
            if issued != 0 {
                let done = issued.saturating_add(in_flight_ns);
                loop {
                    let now = monotonic_ns();
                    if now >= done {
                        break;
                    }
                    std::thread::sleep(Duration::from_nanos(done - now));
                }
            }
            let _ = log_line(&file, &log, &format!("{} ack {}\n", monotonic_ns(), epoch));
        })
    };

    let interval_ns = in_flight_ns.max(SUBMITTER_MIN_INTERVAL.as_nanos() as u64);
    let mut result = Ok(());
    let mut n = 0u64;
    while count == 0 || n < count {
        let issued = {
            let _guard = tracker.enter(&gate, pid);
            let ts = monotonic_ns();
            last_issue.store(ts, Ordering::SeqCst);
            if let Err(e) = log_line(&file, log, &format!("{ts} submit\n")) {
                result = Err(e);
                break;
            }
            ts
        };
        n += 1;
        // Wait for this submission to complete before issuing the next.
        let next = issued.saturating_add(interval_ns);
        loop {
            let now = monotonic_ns();
            if now >= next {
                break;
            }
            std::thread::sleep(Duration::from_nanos(next - now));
        }
    }

    helper.stop();
    gate.unregister(slot);
    result
}
