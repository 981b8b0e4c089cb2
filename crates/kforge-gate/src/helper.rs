//! Participant-side helpers: the drain/acknowledge thread and the launch
//! tracker that closes the check-then-submit race.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{Gate, GATE_OPEN};

/// How long the drain helper sleeps in one [`Gate::wait_for_close`] call
/// before re-checking its stop flag (stopping also wakes it directly).
const HELPER_POLL: Duration = Duration::from_millis(100);

/// Handle to a participant's drain helper thread (see
/// [`spawn_drain_helper`]). Dropping it (or calling [`DrainHelper::stop`])
/// stops the thread and joins it; a drain already in progress is finished
/// first. The slot stays registered: unregister it separately.
#[derive(Debug)]
pub struct DrainHelper {
    stop: Arc<AtomicBool>,
    gate: Arc<Gate>,
    thread: Option<JoinHandle<()>>,
}

impl DrainHelper {
    /// Stops the helper thread and waits for it to exit.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Whether the helper thread is still running (false after it panicked).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.gate.poke();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DrainHelper {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Spawns the participant's drain helper thread for the process registered
/// in `slot`: it loops [`Gate::wait_for_close`] → `drain()` →
/// [`Gate::ack`]`(slot, epoch)`, where `epoch` is the closed epoch observed
/// before draining. It starts from the slot's current `acked_epoch`, so a
/// close that raced with registration is still acknowledged. The thread
/// stops when the returned handle is dropped or stopped. If `drain` panics
/// the thread ends and the daemon will see this participant as pending.
pub fn spawn_drain_helper<F: FnMut() + Send + 'static>(gate: Arc<Gate>, slot: usize, mut drain: F) -> DrainHelper {
    spawn_drain_helper_with(gate, slot, move |_epoch| drain())
}

/// Like [`spawn_drain_helper`], but the drain closure receives the epoch it
/// is draining for (called before the acknowledgement is published).
pub fn spawn_drain_helper_with<F: FnMut(u64) + Send + 'static>(
    gate: Arc<Gate>,
    slot: usize,
    mut drain: F,
) -> DrainHelper {
    let stop = Arc::new(AtomicBool::new(false));
    let start = gate.slot_acked_epoch(slot);
    let thread = {
        let gate = Arc::clone(&gate);
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("kforge-gate-drain".into())
            .spawn(move || {
                let mut last_seen = start;
                while !stop.load(Ordering::SeqCst) {
                    if let Some(epoch) = gate.wait_for_close(last_seen, HELPER_POLL) {
                        drain(epoch);
                        gate.ack(slot, epoch);
                        last_seen = epoch;
                    }
                }
            })
            .expect("spawn kforge-gate drain helper thread")
    };
    DrainHelper { stop, gate, thread: Some(thread) }
}

/// Process-local counter of gated calls in progress; closes the
/// check-then-submit race that [`Gate::pass`] alone leaves open.
///
/// Launching threads wrap each submission in [`LaunchTracker::enter`] (the
/// guard is dropped once the submission has been issued); the drain closure
/// calls [`LaunchTracker::wait_idle`] before synchronizing the device. Any
/// launch that observed the gate open is then either finished issuing (and
/// covered by the device synchronization) or still counted (and waited for);
/// launches that start later observe the gate closed and block.
///
/// Lock- and allocation-free; `const`-constructible so the shim can keep it
/// in a `static`. Cost when the gate is open: one atomic increment, one
/// atomic load, one atomic decrement.
#[derive(Debug, Default)]
pub struct LaunchTracker {
    active: AtomicU32,
}

/// Marks a gated call in progress; dropping it ends the call.
#[derive(Debug)]
#[must_use = "the launch is only tracked while the guard is alive"]
pub struct LaunchGuard<'a> {
    tracker: &'a LaunchTracker,
}

impl Drop for LaunchGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.tracker.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl LaunchTracker {
    /// A tracker with no calls in progress.
    pub const fn new() -> Self {
        LaunchTracker { active: AtomicU32::new(0) }
    }

    /// Begins a gated call: registers it as in progress, then checks the
    /// gate (`SeqCst`). If the gate is closed and `my_pid` is not the holder,
    /// the call is unregistered, blocks in [`Gate::pass`] and retries.
    #[inline]
    pub fn enter<'a>(&'a self, gate: &Gate, my_pid: u32) -> LaunchGuard<'a> {
        loop {
            self.active.fetch_add(1, Ordering::SeqCst);
            if gate.gate_word().load(Ordering::SeqCst) == GATE_OPEN
                || (my_pid != 0 && gate.holder_word().load(Ordering::SeqCst) == my_pid)
            {
                return LaunchGuard { tracker: self };
            }
            self.active.fetch_sub(1, Ordering::SeqCst);
            gate.pass(my_pid);
        }
    }

    /// Number of gated calls currently in progress.
    pub fn active(&self) -> u32 {
        self.active.load(Ordering::SeqCst)
    }

    /// Waits until no gated call is in progress (calls are short: the
    /// submission itself, not the GPU work). Spins briefly, then yields,
    /// then backs off with short sleeps.
    pub fn wait_idle(&self) {
        let mut i = 0u32;
        while self.active.load(Ordering::SeqCst) != 0 {
            if i < 64 {
                std::hint::spin_loop();
            } else if i < 1024 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
            i = i.saturating_add(1);
        }
    }
}
