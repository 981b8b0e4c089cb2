//! # kforge-gate: the per-device GPU submission gate
//!
//! The kforge daemon runs several GPU benchmark commands concurrently. When
//! one command enters a timed *region* on a device, the daemon **closes that
//! device's gate**: every other managed process is held at its next GPU
//! submission, each managed process *drains* the work it already has in
//! flight and *acknowledges*, and only then does the daemon let the region
//! proceed. When the region ends the daemon **opens** the gate again.
//!
//! The gate is a small shared-memory segment, one per device, created by the
//! daemon and mapped by every participant (in practice by an `LD_PRELOAD`
//! shim). This crate owns both sides of it: [`Gate`] (daemon and
//! participant operations), [`spawn_drain_helper`] (the participant's
//! acknowledging thread), [`LaunchTracker`] (closes the check-then-submit
//! race on the participant side) and [`run_test_submitter`] (a fake GPU
//! client that honours the gate exactly the way the shim must).
//!
//! ## Segment layout (ABI, layout version 1)
//!
//! The segment is a regular file, normally under `/dev/shm`, created by the
//! daemon with `O_CREAT | O_EXCL`, mode `0600`, sized with `ftruncate` and
//! mapped `MAP_SHARED`. All integers are native-endian (every participant
//! runs on the same host); all offsets are in bytes.
//!
//! ```text
//! GateHeader (40 bytes, 8-byte aligned) at offset 0
//!   off  size  field          meaning
//!     0     8  magic          b"KFGATE01" read as a little-endian u64
//!                             (0x3130_4554_4147_464B); written last at creation
//!     8     4  layout_version 1
//!    12     4  slots          number of AckSlot entries after the header
//!    16     4  gate           futex word: 0 = open, 1 = closed
//!    20     4  holder_pid     pid allowed to pass while closed, 0 = none
//!    24     8  epoch          incremented by the daemon at every close
//!    32     4  acks           futex word, bumped by every acknowledgement
//!    36     4  _pad           zero
//! AckSlot[slots] (16 bytes each, 8-byte aligned) at offset 40 + 16 * i
//!   off  size  field
//!     0     4  pid            registered participant pid, 0 = free slot
//!     4     4  _pad           zero
//!     8     8  acked_epoch    last epoch this participant acknowledged
//! file size = 40 + 16 * slots
//! ```
//!
//! `magic`, `layout_version` and `slots` are immutable after creation. Every
//! other field is only ever accessed atomically. There are **no locks** in
//! shared memory, so a participant killed at any instruction cannot wedge the
//! daemon or other participants.
//!
//! ## Protocol
//!
//! **Daemon close** ([`Gate::close`]): store `holder_pid`, `epoch += 1`,
//! store `gate = 1` (sequentially consistent, which includes Release), then
//! `FUTEX_WAKE` all waiters on `gate` (this wakes the drain helpers).
//! Returns the new epoch `E`.
//!
//! **Participant drain helper** ([`spawn_drain_helper`]): waits with
//! `FUTEX_WAIT` on `gate` (bounded timeout, to notice shutdown) until the
//! gate is closed with an epoch greater than the last one it acknowledged;
//! runs the caller's drain closure (the shim synchronizes its CUDA contexts
//! there); stores the epoch it observed *before* draining into its slot's
//! `acked_epoch` (Release), increments `acks` and `FUTEX_WAKE`s it; then
//! waits for the gate to reopen or the epoch to change before waiting for
//! the next close. A participant whose pid is `holder_pid` acknowledges too
//! (it simply is not blocked and not waited for). Acknowledging the
//! observed epoch rather than the latest one means a close/open/close that
//! happens during a drain triggers a second drain instead of being covered
//! by a drain that started before the reopen.
//!
//! **Daemon drain wait** ([`Gate::wait_acks`]): returns when every slot with
//! `pid != 0`, `pid != holder_pid` and a live process has
//! `acked_epoch >= E`, or when the timeout expires. Liveness is
//! `kill(pid, 0)` and `/proc/PID/stat` ([`process_alive`]): `ESRCH`, a zombie
//! or an exiting process means dead and the daemon clears the slot (CAS
//! `pid -> 0`). Between scans it `FUTEX_WAIT`s on `acks` with the value read
//! *before* the scan, so an acknowledgement racing with the scan is never
//! lost. A participant that dies mid-drain does not bump `acks`, so each wait
//! is capped at [`LIVENESS_POLL`] to re-check liveness; there is no busy
//! spinning. [`Gate::wait_acks_skipping`] also leaves out the stragglers it
//! is given (a pid and the epoch of an earlier drain that timed out waiting
//! for it) while their `acked_epoch` is still below that epoch: they are
//! still finishing the work that drain waited for.
//!
//! **Daemon open** ([`Gate::open_gate`]): store `gate = 0` (Release), store
//! `holder_pid = 0`, `FUTEX_WAKE` all waiters on `gate`.
//!
//! **Participant gated call** ([`Gate::pass`]): fast path is a single
//! Acquire load of `gate`; if it reads 0 the call returns (no allocation, no
//! syscall). Otherwise, if `holder_pid == my_pid` it returns; otherwise it
//! `FUTEX_WAIT`s on `gate` with expected value 1 until the gate reads 0 (or
//! the holder becomes the caller), retrying on `EINTR`/`EAGAIN`. The futexes
//! are cross-process (no `FUTEX_PRIVATE_FLAG`).
//!
//! **The check-then-submit race.** `pass()` alone cannot guarantee that no
//! submission happens after the drain: a thread may read `gate == 0`, be
//! preempted, and submit after the helper has drained and acknowledged. A
//! participant that needs the guarantee brackets each gated call with a
//! [`LaunchTracker`] (one process-local atomic counter, no locks, no
//! allocation): the launching thread increments the counter *before* its
//! `SeqCst` load of `gate` and decrements it after the submission is issued;
//! the drain closure first waits for the counter to reach zero. Because the
//! daemon's store of `gate = 1`, the launcher's increment and load, and the
//! helper's loads are all `SeqCst`, any launch that saw the gate open is
//! visible to the helper as in progress, and is therefore covered by the
//! drain. [`run_test_submitter`] uses exactly this scheme.
//!
//! **Registration** ([`Gate::register`]): CAS a free slot's `pid` from 0 to
//! the caller's pid, then set `acked_epoch` to the current epoch, then bump
//! `acks` (so a daemon waiting on `acks` re-scans). A newcomer is therefore
//! *not* pending for a close that happened before it registered. This is
//! sound because a participant must register before it issues any GPU work:
//! it has nothing in flight, and its first gated call blocks while the gate
//! is closed. If a close races with registration (epoch read before the
//! increment), the slot shows the older epoch, the daemon waits for it, and
//! the helper — which starts from the slot's `acked_epoch` — sees the newer
//! closed epoch and acknowledges it. [`Gate::unregister`] frees the slot
//! (and also bumps `acks`).
//!
//! **Stale state.** Slots of dead participants are cleared by the daemon's
//! wait; a participant killed while the gate is closed leaves nothing
//! locked. When the owning (daemon) [`Gate`] is dropped it opens the gate
//! before unlinking the file, so participants are never left blocked by an
//! orderly daemon exit. All participants must share the daemon's pid
//! namespace (pids are compared and probed with `kill`).

#![deny(unsafe_op_in_unsafe_fn)]

mod helper;
mod submitter;
mod sys;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use helper::{spawn_drain_helper, spawn_drain_helper_with, DrainHelper, LaunchGuard, LaunchTracker};
pub use submitter::{run_test_submitter, SUBMITTER_MIN_INTERVAL};
pub use sys::{current_pid, monotonic_ns, process_alive};

/// `b"KFGATE01"` interpreted as a little-endian `u64`.
pub const GATE_MAGIC: u64 = u64::from_le_bytes(*b"KFGATE01");
/// The layout version this crate reads and writes.
pub const LAYOUT_VERSION: u32 = 1;
/// Value of [`GateHeader::gate`] when open.
pub const GATE_OPEN: u32 = 0;
/// Value of [`GateHeader::gate`] when closed.
pub const GATE_CLOSED: u32 = 1;
/// Upper bound on the slot count accepted by [`Gate::create`] / [`Gate::open`].
pub const MAX_SLOTS: u32 = 1 << 16;
/// Longest single `FUTEX_WAIT` in [`Gate::wait_acks`]; bounds how late the
/// daemon notices a participant that died without acknowledging.
pub const LIVENESS_POLL: Duration = Duration::from_millis(20);
/// Longest single wait of [`Gate::wait_for_close`] while the gate is closed
/// and the current epoch has already been seen (a re-close without an open
/// does not change the futex word, so this state is polled).
pub const RECLOSE_POLL: Duration = Duration::from_millis(5);

/// Header at offset 0 of the gate segment. See the crate docs for the ABI.
#[repr(C)]
#[derive(Debug)]
pub struct GateHeader {
    /// [`GATE_MAGIC`]; written last when the daemon initializes the segment.
    pub magic: u64,
    /// [`LAYOUT_VERSION`].
    pub layout_version: u32,
    /// Number of [`AckSlot`] entries following the header.
    pub slots: u32,
    /// Futex word: [`GATE_OPEN`] (0) or [`GATE_CLOSED`] (1).
    pub gate: AtomicU32,
    /// Pid allowed to pass while closed (the region holder), 0 = none.
    pub holder_pid: AtomicU32,
    /// Incremented by the daemon at every close.
    pub epoch: AtomicU64,
    /// Futex word bumped by every acknowledgement; the daemon waits on it.
    pub acks: AtomicU32,
    /// Zero.
    pub _pad: u32,
}

/// One participant registration slot (follows the header, 16 bytes each).
#[repr(C)]
#[derive(Debug)]
pub struct AckSlot {
    /// Registered participant pid; 0 = free slot.
    pub pid: AtomicU32,
    /// Zero.
    pub _pad: u32,
    /// Last epoch this participant acknowledged.
    pub acked_epoch: AtomicU64,
}

/// Size of [`GateHeader`] in bytes (offset of the first [`AckSlot`]).
pub const HEADER_SIZE: usize = std::mem::size_of::<GateHeader>();
/// Size of one [`AckSlot`] in bytes.
pub const SLOT_SIZE: usize = std::mem::size_of::<AckSlot>();

// ABI guards: any change here is a layout-version bump.
const _: () = assert!(std::mem::size_of::<GateHeader>() == 40);
const _: () = assert!(std::mem::align_of::<GateHeader>() == 8);
const _: () = assert!(std::mem::size_of::<AckSlot>() == 16);
const _: () = assert!(std::mem::align_of::<AckSlot>() == 8);
const _: () = assert!(std::mem::offset_of!(GateHeader, magic) == 0);
const _: () = assert!(std::mem::offset_of!(GateHeader, layout_version) == 8);
const _: () = assert!(std::mem::offset_of!(GateHeader, slots) == 12);
const _: () = assert!(std::mem::offset_of!(GateHeader, gate) == 16);
const _: () = assert!(std::mem::offset_of!(GateHeader, holder_pid) == 20);
const _: () = assert!(std::mem::offset_of!(GateHeader, epoch) == 24);
const _: () = assert!(std::mem::offset_of!(GateHeader, acks) == 32);
const _: () = assert!(std::mem::offset_of!(GateHeader, _pad) == 36);
const _: () = assert!(std::mem::offset_of!(AckSlot, pid) == 0);
const _: () = assert!(std::mem::offset_of!(AckSlot, _pad) == 4);
const _: () = assert!(std::mem::offset_of!(AckSlot, acked_epoch) == 8);

/// Total segment size in bytes for `slots` acknowledgement slots.
pub const fn segment_size(slots: u32) -> usize {
    HEADER_SIZE + SLOT_SIZE * slots as usize
}

/// Errors from creating, opening or using a gate segment.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// A system call on the segment (or the submitter's log) failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The failing operation (`open`, `ftruncate`, `mmap`, ...).
        op: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// [`Gate::create`] found an existing file at the path.
    #[error("gate segment {0} already exists")]
    AlreadyExists(PathBuf),
    /// [`Gate::open`] found a file that is not a gate segment.
    #[error("gate segment {path}: bad magic {found:#018x}")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The value found at offset 0.
        found: u64,
    },
    /// [`Gate::open`] found an unsupported layout version.
    #[error("gate segment {path}: unsupported layout version {found} (expected {LAYOUT_VERSION})")]
    BadVersion {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// The file is smaller than its header says (or than a header).
    #[error("gate segment {path}: file is {actual} bytes, expected at least {expected}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Minimum size required.
        expected: u64,
        /// Actual file size.
        actual: u64,
    },
    /// A slot count of 0 or above [`MAX_SLOTS`].
    #[error("invalid slot count {0} (must be 1..={MAX_SLOTS})")]
    InvalidSlots(u32),
    /// [`Gate::register`] found no free slot.
    #[error("gate slot table full ({slots} slots)")]
    TableFull {
        /// Number of slots in the table.
        slots: u32,
    },
    /// Pid 0 cannot be registered (0 marks a free slot).
    #[error("pid 0 cannot be registered")]
    InvalidPid,
}

/// Result of [`Gate::wait_acks`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainOutcome {
    /// Number of waited-for participants (live, registered, not the holder)
    /// whose `acked_epoch >= epoch` at the final scan.
    pub acked: u32,
    /// Pids of live, registered, non-holder participants that had not
    /// acknowledged at the final scan (empty unless `timed_out`).
    pub pending_pids: Vec<u32>,
    /// Whether the wait ended because the timeout expired.
    pub timed_out: bool,
    /// Time spent in `wait_acks`.
    pub elapsed: Duration,
    /// Pids of live participants not waited for: named in
    /// [`Gate::wait_acks_skipping`]'s `behind`, and still behind on the
    /// earlier drain it names for them.
    pub skipped_pids: Vec<u32>,
}

/// A participant that had not acknowledged a drain when it timed out: its
/// pid and that drain's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Straggler {
    /// Its process.
    pub pid: u32,
    /// The epoch of the drain that timed out waiting for it.
    pub epoch: u64,
}

/// A mapping of one device's gate segment.
///
/// The daemon [`create`](Gate::create)s it (and is its *owner*: dropping the
/// owner opens the gate, unmaps it and unlinks the file); participants
/// [`open`](Gate::open) it (dropping only unmaps). All methods take `&self`
/// and are safe to call from any thread; `Gate` is `Send + Sync`.
#[derive(Debug)]
pub struct Gate {
    base: *mut u8,
    len: usize,
    slots: u32,
    path: PathBuf,
    owner: bool,
}

// SAFETY: the mapping is only accessed through atomics (or immutable
// fields), it lives until Drop, and the raw pointer is never handed out.
unsafe impl Send for Gate {}
// SAFETY: as above.
unsafe impl Sync for Gate {}

fn io_err(op: &'static str, path: &Path) -> GateError {
    GateError::Io { op, path: path.to_path_buf(), source: std::io::Error::last_os_error() }
}

fn c_path(path: &Path) -> Result<CString, GateError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|e| GateError::Io {
        op: "open",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
    })
}

/// Maps `len` bytes of `fd` shared read/write, then closes `fd`.
fn map_fd(fd: libc::c_int, len: usize, path: &Path) -> Result<*mut u8, GateError> {
    // SAFETY: plain mmap of a file descriptor we own; the result is checked.
    let p =
        unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    let err = if p == libc::MAP_FAILED { Some(io_err("mmap", path)) } else { None };
    // SAFETY: fd is ours; the mapping keeps the file referenced.
    unsafe { libc::close(fd) };
    match err {
        Some(e) => Err(e),
        None => Ok(p as *mut u8),
    }
}

impl Gate {
    /// Daemon side: creates the segment at `path` (`O_CREAT | O_EXCL`, mode
    /// `0600`), sizes it for `slots` participants, maps it and initializes
    /// the header (gate open, epoch 0, all slots free). Fails with
    /// [`GateError::AlreadyExists`] if the file exists. The returned gate is
    /// the owner: dropping it unlinks the file.
    pub fn create(path: &Path, slots: u32) -> Result<Gate, GateError> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(GateError::InvalidSlots(slots));
        }
        let cpath = c_path(path)?;
        let len = segment_size(slots);
        // SAFETY: valid NUL-terminated path.
        let fd = unsafe {
            libc::open(
                cpath.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            if sys::errno() == libc::EEXIST {
                return Err(GateError::AlreadyExists(path.to_path_buf()));
            }
            return Err(io_err("open", path));
        }
        let unlink = || {
            // SAFETY: valid path; we created the file.
            unsafe { libc::unlink(cpath.as_ptr()) };
        };
        // SAFETY: fd is valid.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let e = io_err("ftruncate", path);
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            unlink();
            return Err(e);
        }
        let base = match map_fd(fd, len, path) {
            Ok(b) => b,
            Err(e) => {
                unlink();
                return Err(e);
            }
        };
        let gate = Gate { base, len, slots, path: path.to_path_buf(), owner: true };
        // The file is fresh and zero-filled by ftruncate; fill the immutable
        // fields, then publish the magic last.
        let h = base as *mut GateHeader;
        // SAFETY: `h` points to our exclusive, freshly created mapping of at
        // least HEADER_SIZE bytes, suitably aligned (page aligned).
        unsafe {
            std::ptr::addr_of_mut!((*h).layout_version).write_volatile(LAYOUT_VERSION);
            std::ptr::addr_of_mut!((*h).slots).write_volatile(slots);
            fence(Ordering::Release);
            std::ptr::addr_of_mut!((*h).magic).write_volatile(GATE_MAGIC);
        }
        Ok(gate)
    }

    /// Participant side: opens and maps an existing segment, validating the
    /// magic, the layout version and that the file is large enough for its
    /// slot count. Dropping the result only unmaps.
    pub fn open(path: &Path) -> Result<Gate, GateError> {
        let cpath = c_path(path)?;
        // SAFETY: valid NUL-terminated path.
        let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io_err("open", path));
        }
        // SAFETY: zeroed stat is a valid out buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd valid, st valid.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            let e = io_err("fstat", path);
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let actual = st.st_size as u64;
        let fail = |e: GateError| {
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            Err(e)
        };
        if actual < HEADER_SIZE as u64 {
            return fail(GateError::Truncated { path: path.to_path_buf(), expected: HEADER_SIZE as u64, actual });
        }
        // Read the immutable header fields with pread before mapping
        // everything, so a bogus slot count never sizes a mapping.
        let mut raw = [0u8; 16];
        // SAFETY: valid buffer of 16 bytes.
        let n = unsafe { libc::pread(fd, raw.as_mut_ptr().cast(), raw.len(), 0) };
        if n != raw.len() as isize {
            return fail(io_err("pread", path));
        }
        let magic = u64::from_ne_bytes(raw[0..8].try_into().unwrap());
        let version = u32::from_ne_bytes(raw[8..12].try_into().unwrap());
        let slots = u32::from_ne_bytes(raw[12..16].try_into().unwrap());
        if magic != GATE_MAGIC {
            return fail(GateError::BadMagic { path: path.to_path_buf(), found: magic });
        }
        fence(Ordering::Acquire);
        if version != LAYOUT_VERSION {
            return fail(GateError::BadVersion { path: path.to_path_buf(), found: version });
        }
        if slots == 0 || slots > MAX_SLOTS {
            return fail(GateError::InvalidSlots(slots));
        }
        let len = segment_size(slots);
        if actual < len as u64 {
            return fail(GateError::Truncated { path: path.to_path_buf(), expected: len as u64, actual });
        }
        let base = map_fd(fd, len, path)?;
        Ok(Gate { base, len, slots, path: path.to_path_buf(), owner: false })
    }

    #[inline(always)]
    fn header(&self) -> &GateHeader {
        // SAFETY: the mapping is at least HEADER_SIZE bytes, page aligned,
        // and lives as long as `self`.
        unsafe { &*(self.base as *const GateHeader) }
    }

    #[inline]
    fn slot_ref(&self, slot: usize) -> Option<&AckSlot> {
        if slot >= self.slots as usize {
            return None;
        }
        // SAFETY: slot < slots, and the mapping covers all slots.
        Some(unsafe { &*(self.base.add(HEADER_SIZE + slot * SLOT_SIZE) as *const AckSlot) })
    }

    /// The segment's file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this mapping was created by [`Gate::create`] (the daemon side).
    pub fn is_owner(&self) -> bool {
        self.owner
    }

    /// Number of acknowledgement slots in the segment.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Daemon: closes the gate on behalf of a region held by `holder_pid`
    /// (0 = no process may pass). Stores the holder, increments the epoch,
    /// stores `gate = 1` and wakes every waiter on the gate word (the drain
    /// helpers). Returns the new epoch, to pass to [`Gate::wait_acks`].
    /// Closing an already closed gate starts a new epoch (helpers notice it
    /// within [`RECLOSE_POLL`]).
    pub fn close(&self, holder_pid: u32) -> u64 {
        let h = self.header();
        h.holder_pid.store(holder_pid, Ordering::SeqCst);
        let epoch = h.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        h.gate.store(GATE_CLOSED, Ordering::SeqCst);
        sys::futex_wake_all(&h.gate);
        epoch
    }

    /// Daemon: waits until every registered, live participant other than the
    /// holder has acknowledged `epoch` (or a later one), or `timeout` passes.
    ///
    /// Slots whose process no longer exists (`kill(pid, 0)` fails with
    /// `ESRCH`), is a zombie or is exiting are cleared and ignored. Sleeps with `FUTEX_WAIT` on the
    /// `acks` word between scans (each sleep capped at [`LIVENESS_POLL`] so
    /// participants dying mid-drain are noticed).
    pub fn wait_acks(&self, epoch: u64, timeout: Duration) -> DrainOutcome {
        self.wait_acks_skipping(epoch, timeout, &[])
    }

    /// Daemon: [`Gate::wait_acks`], except that a participant named in
    /// `behind` that has not yet acknowledged the epoch given for it there
    /// (an earlier drain that timed out waiting for it) is not waited for: it
    /// is still finishing the GPU work that drain waited on, so it cannot
    /// acknowledge this one sooner, and waiting would only spend the timeout
    /// again on every region. Such participants are listed in
    /// `skipped_pids`; one that has caught up is waited for as any other.
    pub fn wait_acks_skipping(&self, epoch: u64, timeout: Duration, behind: &[Straggler]) -> DrainOutcome {
        let start = Instant::now();
        let deadline = start.checked_add(timeout);
        let h = self.header();
        let (mut pending, mut skipped) = (Vec::new(), Vec::new());
        loop {
            // Read the futex word before scanning: an ack landing during the
            // scan changes it and makes the FUTEX_WAIT below return at once.
            let seen_acks = h.acks.load(Ordering::SeqCst);
            let holder = h.holder_pid.load(Ordering::SeqCst);
            pending.clear();
            skipped.clear();
            let mut acked = 0u32;
            for i in 0..self.slots as usize {
                let s = self.slot_ref(i).expect("slot in range");
                let pid = s.pid.load(Ordering::Acquire);
                if pid == 0 || pid == holder {
                    continue;
                }
                let acked_epoch = s.acked_epoch.load(Ordering::Acquire);
                if acked_epoch >= epoch {
                    acked += 1;
                    continue;
                }
                if !sys::process_alive(pid) {
                    // Dead participant: free its slot (only if it still holds it).
                    let _ = s.pid.compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed);
                    continue;
                }
                if behind.iter().any(|b| b.pid == pid && acked_epoch < b.epoch) {
                    skipped.push(pid);
                    continue;
                }
                pending.push(pid);
            }
            let now = Instant::now();
            let outcome = |pending_pids: Vec<u32>, timed_out: bool, skipped_pids: Vec<u32>| DrainOutcome {
                acked,
                pending_pids,
                timed_out,
                elapsed: now - start,
                skipped_pids,
            };
            if pending.is_empty() {
                return outcome(Vec::new(), false, skipped);
            }
            let remaining = match deadline {
                Some(d) if now >= d => return outcome(pending, true, skipped),
                Some(d) => d - now,
                None => LIVENESS_POLL,
            };
            sys::futex_wait(&h.acks, seen_acks, Some(remaining.min(LIVENESS_POLL)));
        }
    }

    /// Daemon: opens the gate (`gate = 0`, `holder_pid = 0`) and wakes every
    /// process blocked in [`Gate::pass`] and every drain helper.
    pub fn open_gate(&self) {
        let h = self.header();
        h.gate.store(GATE_OPEN, Ordering::SeqCst);
        h.holder_pid.store(0, Ordering::SeqCst);
        sys::futex_wake_all(&h.gate);
    }

    /// Whether the gate is currently closed.
    pub fn is_closed(&self) -> bool {
        self.header().gate.load(Ordering::Acquire) != GATE_OPEN
    }

    /// The current epoch (number of closes so far).
    pub fn epoch(&self) -> u64 {
        self.header().epoch.load(Ordering::Acquire)
    }

    /// The current holder pid (0 = none).
    pub fn holder(&self) -> u32 {
        self.header().holder_pid.load(Ordering::Acquire)
    }

    /// The current value of the `acks` counter (wraps).
    pub fn ack_count(&self) -> u32 {
        self.header().acks.load(Ordering::Acquire)
    }

    /// Pids of all occupied slots, in slot order.
    pub fn registered_pids(&self) -> Vec<u32> {
        (0..self.slots as usize)
            .filter_map(|i| self.slot_ref(i))
            .map(|s| s.pid.load(Ordering::Acquire))
            .filter(|&p| p != 0)
            .collect()
    }

    /// The pid in `slot` (0 = free; also 0 for an out-of-range slot).
    pub fn slot_pid(&self, slot: usize) -> u32 {
        self.slot_ref(slot).map_or(0, |s| s.pid.load(Ordering::Acquire))
    }

    /// The `acked_epoch` of `slot` (0 for an out-of-range slot).
    pub fn slot_acked_epoch(&self, slot: usize) -> u64 {
        self.slot_ref(slot).map_or(0, |s| s.acked_epoch.load(Ordering::Acquire))
    }

    /// Participant: claims a free slot for `pid` and returns its index.
    ///
    /// The slot's `acked_epoch` is set to the current epoch, so a close that
    /// happened before registration does not wait for this participant (it
    /// must not have issued GPU work yet, and its first gated call blocks
    /// while the gate is closed). Fails with [`GateError::TableFull`] when no
    /// slot is free. Allocation-free.
    pub fn register(&self, pid: u32) -> Result<usize, GateError> {
        if pid == 0 {
            return Err(GateError::InvalidPid);
        }
        let h = self.header();
        for i in 0..self.slots as usize {
            let s = self.slot_ref(i).expect("slot in range");
            if s.pid.load(Ordering::Relaxed) != 0 {
                continue;
            }
            if s.pid.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                s.acked_epoch.store(h.epoch.load(Ordering::SeqCst), Ordering::SeqCst);
                // A daemon may have scanned us with a stale acked_epoch.
                h.acks.fetch_add(1, Ordering::SeqCst);
                sys::futex_wake_all(&h.acks);
                return Ok(i);
            }
        }
        Err(GateError::TableFull { slots: self.slots })
    }

    /// Participant: frees `slot` (out-of-range slots are ignored) and wakes a
    /// daemon waiting for acknowledgements.
    pub fn unregister(&self, slot: usize) {
        if let Some(s) = self.slot_ref(slot) {
            s.pid.store(0, Ordering::Release);
            let h = self.header();
            h.acks.fetch_add(1, Ordering::SeqCst);
            sys::futex_wake_all(&h.acks);
        }
    }

    /// Participant: the gated call. Returns immediately when the gate is open
    /// (a single Acquire load: no allocation, no syscall), or when the gate is
    /// closed but `my_pid` is the region holder; otherwise blocks with
    /// `FUTEX_WAIT` until the gate opens or `my_pid` becomes the holder.
    ///
    /// On its own this does not close the check-then-submit race; see
    /// [`LaunchTracker`].
    #[inline]
    pub fn pass(&self, my_pid: u32) {
        if self.header().gate.load(Ordering::Acquire) == GATE_OPEN {
            return;
        }
        self.pass_slow(my_pid, None);
    }

    /// Like [`Gate::pass`] but gives up after `timeout`. Returns `true` if
    /// the caller may proceed, `false` if the timeout expired while blocked.
    pub fn pass_timeout(&self, my_pid: u32, timeout: Duration) -> bool {
        if self.header().gate.load(Ordering::Acquire) == GATE_OPEN {
            return true;
        }
        self.pass_slow(my_pid, Some(timeout))
    }

    #[cold]
    #[inline(never)]
    fn pass_slow(&self, my_pid: u32, timeout: Option<Duration>) -> bool {
        let h = self.header();
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if h.gate.load(Ordering::SeqCst) == GATE_OPEN {
                return true;
            }
            if my_pid != 0 && h.holder_pid.load(Ordering::SeqCst) == my_pid {
                return true;
            }
            let wait = match (timeout, deadline) {
                (None, _) => None,
                (Some(_), Some(d)) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    Some(d - now)
                }
                (Some(_), None) => None, // timeout too large to represent: wait forever
            };
            // EINTR / EAGAIN / wakeups / timeouts all just re-check.
            sys::futex_wait(&h.gate, GATE_CLOSED, wait);
        }
    }

    /// Participant: records that the process in `slot` has drained for
    /// `epoch` (`acked_epoch = max(acked_epoch, epoch)`, Release), bumps the
    /// `acks` word and wakes the daemon. Out-of-range slots are ignored.
    pub fn ack(&self, slot: usize, epoch: u64) {
        if let Some(s) = self.slot_ref(slot) {
            s.acked_epoch.fetch_max(epoch, Ordering::SeqCst);
            let h = self.header();
            h.acks.fetch_add(1, Ordering::SeqCst);
            sys::futex_wake_all(&h.acks);
        }
    }

    /// Participant: blocks until the gate is closed with an epoch greater
    /// than `last_seen` and returns that epoch, or returns `None` once
    /// `timeout` passes. Waits with `FUTEX_WAIT` on the gate word; while the
    /// gate is closed at an already-seen epoch it polls every
    /// [`RECLOSE_POLL`] (a re-close does not change the word).
    pub fn wait_for_close(&self, last_seen: u64, timeout: Duration) -> Option<u64> {
        let h = self.header();
        let deadline = Instant::now().checked_add(timeout);
        loop {
            // SeqCst so that, in the LaunchTracker argument, this load is
            // ordered after the daemon's SeqCst store of gate = 1.
            let g = h.gate.load(Ordering::SeqCst);
            let e = h.epoch.load(Ordering::SeqCst);
            if g != GATE_OPEN && e > last_seen {
                return Some(e);
            }
            let now = Instant::now();
            let remaining = match deadline {
                Some(d) if now >= d => return None,
                Some(d) => d - now,
                None => Duration::from_secs(3600),
            };
            let wait = if g != GATE_OPEN { remaining.min(RECLOSE_POLL) } else { remaining };
            sys::futex_wait(&h.gate, g, Some(wait));
        }
    }

    /// Wakes every waiter on the gate word without changing it (used to stop
    /// drain helpers promptly; waiters treat it as a spurious wakeup).
    pub(crate) fn poke(&self) {
        sys::futex_wake_all(&self.header().gate);
    }

    #[inline(always)]
    pub(crate) fn gate_word(&self) -> &AtomicU32 {
        &self.header().gate
    }

    #[inline(always)]
    pub(crate) fn holder_word(&self) -> &AtomicU32 {
        &self.header().holder_pid
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if self.owner {
            // Never leave participants blocked behind a vanished daemon.
            self.open_gate();
        }
        // SAFETY: base/len describe our mapping; no references outlive self.
        unsafe { libc::munmap(self.base.cast(), self.len) };
        if self.owner {
            if let Ok(c) = c_path(&self.path) {
                // SAFETY: valid path.
                unsafe { libc::unlink(c.as_ptr()) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn layout_offsets_are_stable() {
        assert_eq!(size_of::<GateHeader>(), 40);
        assert_eq!(align_of::<GateHeader>(), 8);
        assert_eq!(offset_of!(GateHeader, magic), 0);
        assert_eq!(offset_of!(GateHeader, layout_version), 8);
        assert_eq!(offset_of!(GateHeader, slots), 12);
        assert_eq!(offset_of!(GateHeader, gate), 16);
        assert_eq!(offset_of!(GateHeader, holder_pid), 20);
        assert_eq!(offset_of!(GateHeader, epoch), 24);
        assert_eq!(offset_of!(GateHeader, acks), 32);
        assert_eq!(offset_of!(GateHeader, _pad), 36);
        assert_eq!(size_of::<AckSlot>(), 16);
        assert_eq!(align_of::<AckSlot>(), 8);
        assert_eq!(offset_of!(AckSlot, pid), 0);
        assert_eq!(offset_of!(AckSlot, _pad), 4);
        assert_eq!(offset_of!(AckSlot, acked_epoch), 8);
        assert_eq!(segment_size(0), 40);
        assert_eq!(segment_size(64), 40 + 64 * 16);
        assert_eq!(GATE_MAGIC.to_le_bytes(), *b"KFGATE01");
        assert_eq!(GATE_MAGIC, 0x3130_4554_4147_464B);
    }
}
