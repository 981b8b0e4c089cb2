//! Process state: lazy initialization, the gate, the drain helper, the
//! context table, fork and exit handling, statistics.

// The exit hook is not installed in the unit-test build.
#![cfg_attr(test, allow(dead_code))]

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use kforge_gate::{Gate, LaunchGuard, LaunchTracker};

use crate::dl;
use crate::hooks::{self, info, Kind, COUNTS, NH, UNWRAPPED};

const UNINIT: u8 = 0;
const RUNNING: u8 = 1;
const GATED: u8 = 2;
const PASSTHROUGH: u8 = 3;

/// Initialization state machine: UNINIT -> RUNNING -> GATED | PASSTHROUGH.
static INIT: AtomicU8 = AtomicU8::new(UNINIT);
/// The process state once GATED (leaked, never freed).
static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());
static GATE_WAITS: AtomicU64 = AtomicU64::new(0);
static DRAINS: AtomicU64 = AtomicU64::new(0);
static CTX_OVERFLOW: AtomicU64 = AtomicU64::new(0);
static ATFORK_DONE: AtomicBool = AtomicBool::new(false);
static DEBUG_LINES: AtomicU32 = AtomicU32::new(0);

/// Initialized-process state.
pub(crate) struct State {
    gate: Arc<Gate>,
    tracker: &'static LaunchTracker,
    pid: u32,
    slot: usize,
}

impl State {
    /// Brackets one gated call: blocks while another process holds the
    /// region. Open gate: one Acquire load plus `LaunchTracker::enter`
    /// (atomics only).
    #[inline(always)]
    pub(crate) fn enter(&self) -> LaunchGuard<'static> {
        if self.gate.is_closed() {
            self.note_closed();
        }
        self.tracker.enter(&self.gate, self.pid)
    }

    #[cold]
    #[inline(never)]
    fn note_closed(&self) {
        if self.gate.holder() != self.pid {
            GATE_WAITS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The process state if initialized and gated; initializes on first use.
#[inline(always)]
pub(crate) fn get() -> Option<&'static State> {
    let p = STATE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: STATE only ever holds leaked, never-freed States.
        return Some(unsafe { &*p });
    }
    get_slow()
}

#[cold]
#[inline(never)]
fn get_slow() -> Option<&'static State> {
    loop {
        match INIT.load(Ordering::Acquire) {
            PASSTHROUGH => return None,
            GATED => {
                let p = STATE.load(Ordering::Acquire);
                // SAFETY: as in get().
                return if p.is_null() { None } else { Some(unsafe { &*p }) };
            }
            UNINIT => {
                if INIT.compare_exchange(UNINIT, RUNNING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    let st = init();
                    match st {
                        Some(s) => {
                            STATE.store(s as *const State as *mut State, Ordering::Release);
                            INIT.store(GATED, Ordering::Release);
                        }
                        None => INIT.store(PASSTHROUGH, Ordering::Release),
                    }
                    return st;
                }
            }
            _ => std::thread::yield_now(), // another thread is initializing
        }
    }
}

fn debug_enabled() -> bool {
    std::env::var_os("KFORGE_SHIM_DEBUG").is_some_and(|v| !v.is_empty() && v != "0")
}

fn warn(msg: &str) {
    if debug_enabled() {
        eprintln!("kforge-shim[{}]: {msg}", std::process::id());
    }
}

/// Debug line for an unwrapped lookup (at most 32 per process).
pub(crate) fn debug_unwrapped(base: &str) {
    if debug_enabled() && DEBUG_LINES.fetch_add(1, Ordering::Relaxed) < 32 {
        eprintln!("kforge-shim[{}]: unwrapped lookup of {base}", std::process::id());
    }
}

type PushFn = unsafe extern "C" fn(*mut c_void) -> i32;
type SyncFn = unsafe extern "C" fn() -> i32;
type PopFn = unsafe extern "C" fn(*mut *mut c_void) -> i32;

/// Real drain entry points, resolved before the helper starts.
#[derive(Clone, Copy)]
struct DrainFns {
    push: Option<PushFn>,
    sync: Option<SyncFn>,
    pop: Option<PopFn>,
}

fn sym<T: Copy>(names: &[&std::ffi::CStr]) -> Option<T> {
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<usize>());
    names.iter().map(|n| dl::libcuda_sym(n)).find(|&p| p != 0).map(|p| {
        // SAFETY: T is a fn-pointer type of pointer size; p is libcuda's symbol.
        unsafe { std::mem::transmute_copy::<usize, T>(&p) }
    })
}

/// One-time initialization (first gated call). Returns None = pass-through.
fn init() -> Option<&'static State> {
    register_atfork();
    let Some(path) = std::env::var_os("KFORGE_GATE").filter(|p| !p.is_empty()) else {
        warn("KFORGE_GATE not set; pass-through");
        return None;
    };
    let gate = match Gate::open(std::path::Path::new(&path)) {
        Ok(g) => Arc::new(g),
        Err(e) => {
            warn(&format!("cannot open gate: {e}; pass-through"));
            return None;
        }
    };
    let pid = kforge_gate::current_pid();
    let slot = match gate.register(pid) {
        Ok(s) => s,
        Err(e) => {
            warn(&format!("cannot register in gate: {e}; pass-through"));
            return None;
        }
    };
    let fns = DrainFns {
        push: sym::<PushFn>(&[c"cuCtxPushCurrent_v2", c"cuCtxPushCurrent"]),
        sync: sym::<SyncFn>(&[c"cuCtxSynchronize"]),
        pop: sym::<PopFn>(&[c"cuCtxPopCurrent_v2", c"cuCtxPopCurrent"]),
    };
    let tracker: &'static LaunchTracker = Box::leak(Box::new(LaunchTracker::new()));
    let helper = kforge_gate::spawn_drain_helper_with(Arc::clone(&gate), slot, move |_epoch| {
        tracker.wait_idle();
        drain_contexts(fns);
        DRAINS.fetch_add(1, Ordering::Relaxed);
    });
    // The helper lives as long as the process.
    std::mem::forget(helper);
    Some(Box::leak(Box::new(State { gate, tracker, pid, slot })))
}

/// Synchronizes every recorded context via real driver pointers.
fn drain_contexts(fns: DrainFns) {
    let (Some(push), Some(sync), Some(pop)) = (fns.push, fns.sync, fns.pop) else { return };
    for slot in CTXS.iter().take(CTX_HWM.load(Ordering::Acquire)) {
        let c = slot.load(Ordering::Acquire);
        if c == 0 {
            continue;
        }
        // SAFETY: c was returned by (or passed to) the driver as a CUcontext.
        unsafe {
            if push(c as *mut c_void) == 0 {
                let _ = sync();
                let mut out = std::ptr::null_mut();
                let _ = pop(&mut out);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Context table

const CTX_SLOTS: usize = 64;
static CTXS: [AtomicUsize; CTX_SLOTS] = [const { AtomicUsize::new(0) }; CTX_SLOTS];
/// Number of slots ever used (scan bound).
static CTX_HWM: AtomicUsize = AtomicUsize::new(0);

/// Records a context (lock-free CAS insert; duplicates and null ignored).
pub(crate) fn record_ctx(c: usize) {
    if c == 0 {
        return;
    }
    let hwm = CTX_HWM.load(Ordering::Acquire);
    if CTXS[..hwm].iter().any(|s| s.load(Ordering::Acquire) == c) {
        return;
    }
    for (i, s) in CTXS.iter().enumerate() {
        match s.compare_exchange(0, c, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                CTX_HWM.fetch_max(i + 1, Ordering::AcqRel);
                return;
            }
            Err(v) if v == c => return,
            Err(_) => {}
        }
    }
    CTX_OVERFLOW.fetch_add(1, Ordering::Relaxed);
}

/// Forgets a context (on destroy).
pub(crate) fn forget_ctx(c: usize) {
    if c == 0 {
        return;
    }
    for s in CTXS.iter().take(CTX_HWM.load(Ordering::Acquire)) {
        let _ = s.compare_exchange(c, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// The recorded contexts.
#[allow(dead_code)]
pub(crate) fn contexts() -> Vec<usize> {
    CTXS.iter().map(|s| s.load(Ordering::Acquire)).filter(|&c| c != 0).collect()
}

// ---------------------------------------------------------------------------
// fork and exit

extern "C" fn atfork_child() {
    // The child has no helper thread and a different pid: start over on its
    // first gated call. Contexts do not survive fork.
    STATE.store(std::ptr::null_mut(), Ordering::Release);
    INIT.store(UNINIT, Ordering::Release);
    for s in CTXS.iter() {
        s.store(0, Ordering::Relaxed);
    }
}

fn register_atfork() {
    if !ATFORK_DONE.swap(true, Ordering::AcqRel) {
        // SAFETY: registering a plain extern "C" handler.
        unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
    }
}

/// Exit-time destructor: unregister the slot, write statistics.
extern "C" fn shim_fini() {
    let p = STATE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: leaked State.
        let st = unsafe { &*p };
        if st.pid == kforge_gate::current_pid() {
            st.gate.unregister(st.slot);
        }
    }
    write_stats();
}

#[cfg(not(test))]
#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = shim_fini;

fn used_cuda() -> bool {
    INIT.load(Ordering::Acquire) != UNINIT
        || COUNTS.iter().any(|c| c.load(Ordering::Relaxed) != 0)
        || UNWRAPPED.iter().any(|c| c.load(Ordering::Relaxed) != 0)
}

/// The statistics JSON (see the crate docs).
pub(crate) fn stats_json() -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let state = match INIT.load(Ordering::Acquire) {
        GATED => "gated",
        PASSTHROUGH => "passthrough",
        RUNNING => "initializing",
        _ => "uninit",
    };
    let _ = write!(s, "{{\"pid\":{},\"state\":\"{state}\",\"calls\":{{", kforge_gate::current_pid());
    let mut first = true;
    for (i, c) in COUNTS.iter().enumerate() {
        let n = c.load(Ordering::Relaxed);
        if n != 0 {
            let _ = write!(s, "{}\"{}\":{n}", if first { "" } else { "," }, info(i).name());
            first = false;
        }
    }
    let unwrapped: u64 = UNWRAPPED.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    let _ = write!(
        s,
        "}},\"launches\":{},\"unwrapped\":{unwrapped},\"unwrapped_symbols\":{{",
        hooks::kforge_shim_launch_count()
    );
    first = true;
    for (i, c) in UNWRAPPED.iter().enumerate() {
        let n = c.load(Ordering::Relaxed);
        if n != 0 {
            let _ = write!(s, "{}\"{}\":{n}", if first { "" } else { "," }, info(i).base);
            first = false;
        }
    }
    let by_kind =
        |k: Kind| -> u64 { (0..NH).filter(|&i| info(i).kind == k).map(|i| COUNTS[i].load(Ordering::Relaxed)).sum() };
    let _ = write!(
        s,
        "}},\"copies\":{},\"sets\":{},\"gate_waits\":{},\"drains\":{},\"contexts\":{},\"context_overflow\":{}}}",
        by_kind(Kind::Copy),
        by_kind(Kind::Set),
        GATE_WAITS.load(Ordering::Relaxed),
        DRAINS.load(Ordering::Relaxed),
        CTXS.iter().filter(|c| c.load(Ordering::Relaxed) != 0).count(),
        CTX_OVERFLOW.load(Ordering::Relaxed),
    );
    s
}

fn write_stats() {
    let Some(path) = std::env::var_os("KFORGE_SHIM_STATS").filter(|p| !p.is_empty()) else { return };
    if !used_cuda() {
        return;
    }
    let path = path.to_string_lossy().replace("{pid}", &kforge_gate::current_pid().to_string());
    let json = stats_json();
    // Write to a temporary name, then rename: readers never see half a file.
    let tmp = format!("{path}.tmp{}", kforge_gate::current_pid());
    if std::fs::write(&tmp, json.as_bytes()).is_ok() && std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}
