//! SIGINT and SIGTERM stop the daemon cleanly: they are blocked in every thread (so no thread is
//! killed by them) and taken by one thread that asks the daemon to shut down.

use crate::server::DaemonHandle;
use crate::state::Event;

/// SIGINT and SIGTERM, blocked in this thread and so in every thread it starts afterwards.
pub struct ShutdownSignals {
    set: libc::sigset_t,
}

impl ShutdownSignals {
    /// Block SIGINT and SIGTERM in the calling thread. Call it before the daemon starts its
    /// threads: they inherit the mask, and only the thread of [`Self::stop_daemon_on_receipt`]
    /// takes the signals.
    pub fn block() -> ShutdownSignals {
        // SAFETY: sigemptyset initializes the set before use; pthread_sigmask only reads it.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            ShutdownSignals { set }
        }
    }

    /// Sleep until SIGINT or SIGTERM arrives (for a process that serves until stopped, such as
    /// `kforge scripted-endpoint`); the signal's number.
    pub fn wait(&self) -> std::io::Result<libc::c_int> {
        let mut sig: libc::c_int = 0;
        // SAFETY: the set is initialized; sigwait writes the signal number.
        match unsafe { libc::sigwait(&self.set, &mut sig) } {
            0 => Ok(sig),
            code => Err(std::io::Error::from_raw_os_error(code)),
        }
    }

    /// Start a thread that waits for either signal and then asks the daemon to stop.
    pub fn stop_daemon_on_receipt(self, daemon: &DaemonHandle) {
        let stopper = daemon.shutdown_sender();
        std::thread::spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: the set is initialized; sigwait writes the signal number.
            if unsafe { libc::sigwait(&self.set, &mut sig) } == 0 {
                let _ = stopper.send(Event::Shutdown.into());
            }
        });
    }
}
