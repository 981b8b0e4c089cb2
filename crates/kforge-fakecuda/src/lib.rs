//! # kforge-fakecuda: a test-only fake `libcuda.so.1`
//!
//! Exports every entry point `kforge-shim` wraps (generated from the shim's
//! single symbol table, `crates/kforge-shim/src/symbols.rs`) plus the few the
//! tests need (`cuInit`, `cuGetExportTable`, context management,
//! `cuCtxSynchronize`). Every call is counted; [`fake_calls`] reads a
//! counter by name. If `FAKECUDA_LOG` names a file, each call appends
//! `<CLOCK_MONOTONIC ns> <symbol>[ 0x<ctx>]` (one `write(2)` per line).
//! `cuCtxSynchronize` sleeps `FAKECUDA_SYNC_US` microseconds (default 0) to
//! model in-flight work. With `FAKECUDA_GPA_FOREIGN` set,
//! `cuGetProcAddress*("cuLaunchKernel")` returns an unexported function (to
//! test the shim's fail-open path).
//!
//! `cuGetProcAddress(_v2)` implements the driver's variant selection: among
//! the exports `X`, `X_vN`, `X_ptsz`, `X_ptds`, `X_vN_ptsz`, ... it keeps
//! those whose minimum CUDA version is at most `cudaVersion` (`_v2`: 3020,
//! `_v3`: 11040, `_v4`: 12050, with per-symbol overrides), prefers the
//! per-thread forms when flag 2 (`CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`)
//! is given and one exists, and returns the highest version.
//!
//! Nothing here is for production; the crate is also an rlib only so that
//! `kforge-shim` can list it as a dev-dependency (which makes cargo build
//! the cdylib before the shim's tests).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

#[allow(dead_code, unused_macros)]
#[macro_use]
mod symbols {
    include!("../../kforge-shim/src/symbols.rs");
}
use symbols::*;

/// Names of the exports that are not in the shim's gated table, in counter
/// order after the gated ones.
const EXTRA: &[&str] = &[
    "cuInit",
    "cuGetExportTable",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuDevicePrimaryCtxRetain",
    "cuCtxCreate",
    "cuCtxCreate_v2",
    "cuCtxCreate_v3",
    "cuCtxCreate_v4",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent",
    "cuCtxPopCurrent_v2",
    "cuCtxSynchronize",
    "cuCtxGetCurrent",
    "cuCtxDestroy",
    "cuCtxDestroy_v2",
];
const NX: usize = 18;
const _: () = assert!(EXTRA.len() == NX);

macro_rules! define_fake {
    ($($name:ident => $base:ident, $kind:ident, ($($arg:ident : $ty:ty),* $(,)?);)*) => {
        #[allow(non_camel_case_types, dead_code)]
        #[repr(usize)]
        enum F { $($name,)* }
        const NG: usize = [$(stringify!($name)),*].len();
        static GATED_NAMES: [&str; NG] = [$(stringify!($name)),*];
        fn gated_addr(i: usize) -> usize {
            let a: [usize; NG] = [$($name as unsafe extern "C" fn($($ty),*) -> CUresult as *const () as usize),*];
            a[i]
        }
        $(
            /// Fake gated entry point: records the call, returns success.
            #[no_mangle]
            #[allow(unused_variables)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                record(F::$name as usize, None);
                0
            }
        )*
    };
}
gated_symbols!(define_fake);

const N: usize = NG + NX;
static CALLS: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];

fn name_of(i: usize) -> &'static str {
    if i < NG {
        GATED_NAMES[i]
    } else {
        EXTRA[i - NG]
    }
}

fn index_of(name: &str) -> Option<usize> {
    (0..N).find(|&i| name_of(i) == name)
}

fn x(name: &str) -> usize {
    NG + EXTRA.iter().position(|&n| n == name).expect("extra name")
}

fn extra_addr(name: &str) -> usize {
    match name {
        "cuInit" => cuInit as *const () as usize,
        "cuGetExportTable" => cuGetExportTable as *const () as usize,
        "cuGetProcAddress" => cuGetProcAddress as *const () as usize,
        "cuGetProcAddress_v2" => cuGetProcAddress_v2 as *const () as usize,
        "cuDevicePrimaryCtxRetain" => cuDevicePrimaryCtxRetain as *const () as usize,
        "cuCtxCreate" => cuCtxCreate as *const () as usize,
        "cuCtxCreate_v2" => cuCtxCreate_v2 as *const () as usize,
        "cuCtxCreate_v3" => cuCtxCreate_v3 as *const () as usize,
        "cuCtxCreate_v4" => cuCtxCreate_v4 as *const () as usize,
        "cuCtxSetCurrent" => cuCtxSetCurrent as *const () as usize,
        "cuCtxPushCurrent" => cuCtxPushCurrent as *const () as usize,
        "cuCtxPushCurrent_v2" => cuCtxPushCurrent_v2 as *const () as usize,
        "cuCtxPopCurrent" => cuCtxPopCurrent as *const () as usize,
        "cuCtxPopCurrent_v2" => cuCtxPopCurrent_v2 as *const () as usize,
        "cuCtxSynchronize" => cuCtxSynchronize as *const () as usize,
        "cuCtxGetCurrent" => cuCtxGetCurrent as *const () as usize,
        "cuCtxDestroy" => cuCtxDestroy as *const () as usize,
        "cuCtxDestroy_v2" => cuCtxDestroy_v2 as *const () as usize,
        _ => 0,
    }
}

fn addr_of(i: usize) -> usize {
    if i < NG {
        gated_addr(i)
    } else {
        extra_addr(EXTRA[i - NG])
    }
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn log_file() -> Option<&'static std::fs::File> {
    static LOG: OnceLock<Option<std::fs::File>> = OnceLock::new();
    LOG.get_or_init(|| {
        let p = std::env::var_os("FAKECUDA_LOG")?;
        std::fs::OpenOptions::new().create(true).append(true).open(p).ok()
    })
    .as_ref()
}

fn record(i: usize, ctx: Option<usize>) {
    CALLS[i].fetch_add(1, Ordering::SeqCst);
    if let Some(mut f) = log_file() {
        let line = match ctx {
            Some(c) => format!("{} {} {:#x}\n", now_ns(), name_of(i), c),
            None => format!("{} {}\n", now_ns(), name_of(i)),
        };
        let _ = f.write_all(line.as_bytes());
    }
}

/// Number of calls of the fake export `name` (0 for unknown names).
#[no_mangle]
pub unsafe extern "C" fn fake_calls(name: *const c_char) -> u64 {
    if name.is_null() {
        return 0;
    }
    // SAFETY: caller passes a C string.
    let n = unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("");
    index_of(n).map_or(0, |i| CALLS[i].load(Ordering::SeqCst))
}

/// Address of the fake's own export `name` (0 if it has none). Not a `cu*`
/// name, so a preloaded shim never redirects its lookup.
#[no_mangle]
pub unsafe extern "C" fn fake_addr(name: *const c_char) -> usize {
    if name.is_null() {
        return 0;
    }
    // SAFETY: caller passes a C string.
    let n = unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("");
    index_of(n).map_or(0, addr_of)
}

/// Name of the fake export at `addr` (null if none); static C string.
#[no_mangle]
pub extern "C" fn fake_name_of(addr: usize) -> *const c_char {
    static CNAMES: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
    let names = CNAMES.get_or_init(|| (0..N).map(|i| std::ffi::CString::new(name_of(i)).unwrap()).collect());
    (0..N).find(|&i| addr_of(i) == addr).map_or(std::ptr::null(), |i| names[i].as_ptr())
}

// ---------------------------------------------------------------------------
// cuGetProcAddress

fn min_version(name: &str, n: u32) -> i32 {
    let stem = name.trim_end_matches("_ptsz").trim_end_matches("_ptds");
    match stem {
        "cuMemPrefetchAsync_v2" => 12020,
        "cuMemcpyBatchAsync_v2" | "cuMemcpy3DBatchAsync_v2" => 13000,
        "cuGetProcAddress_v2" => 12000,
        _ => match n {
            1 => 0,
            2 => 3020,
            3 => 11040,
            _ => 12050,
        },
    }
}

/// Parses `name` as a variant of `base`: Some((version n, per-thread)).
fn variant_of(name: &str, base: &str) -> Option<(u32, bool)> {
    let rest = name.strip_prefix(base)?;
    let (rest, pt) = match rest.strip_suffix("_ptsz").or_else(|| rest.strip_suffix("_ptds")) {
        Some(r) => (r, true),
        None => (rest, false),
    };
    let n = match rest {
        "" => 1,
        "_v2" => 2,
        "_v3" => 3,
        "_v4" => 4,
        _ => return None,
    };
    Some((n, pt))
}

/// The fake driver's variant selection (see the crate docs).
fn proc_lookup(symbol: &str, version: i32, flags: u64) -> Result<usize, c_int> {
    let per_thread = flags & 2 != 0;
    let mut cands: Vec<(usize, u32, bool)> =
        (0..N).filter_map(|i| variant_of(name_of(i), symbol).map(|(n, pt)| (i, n, pt))).collect();
    if cands.is_empty() {
        return Err(1); // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
    }
    cands.retain(|&(i, n, _)| min_version(name_of(i), n) <= version);
    if cands.is_empty() {
        return Err(2); // CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
    }
    let want_pt = per_thread && cands.iter().any(|c| c.2);
    cands.retain(|c| c.2 == want_pt);
    let best = cands.iter().max_by_key(|c| c.1).expect("non-empty");
    Ok(best.0)
}

unsafe fn get_proc(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return 1; // CUDA_ERROR_INVALID_VALUE
    }
    // SAFETY: caller passes a C string.
    let s = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    match proc_lookup(s, version, flags) {
        Ok(i) => {
            let foreign = s == "cuLaunchKernel" && std::env::var_os("FAKECUDA_GPA_FOREIGN").is_some();
            // SAFETY: valid out pointers.
            unsafe {
                *pfn = if foreign { foreign_launch as *const () as *mut c_void } else { addr_of(i) as *mut c_void };
                if !status.is_null() {
                    *status = 0;
                }
            }
            0
        }
        Err(st) => {
            // SAFETY: valid out pointers.
            unsafe {
                *pfn = std::ptr::null_mut();
                if !status.is_null() {
                    *status = st;
                }
            }
            500 // CUDA_ERROR_NOT_FOUND
        }
    }
}

/// With `FAKECUDA_GPA_FOREIGN` set, `cuGetProcAddress*("cuLaunchKernel")`
/// returns this unexported function (a pointer no shim can attribute to a
/// known variant); it counts as `cuLaunchKernel`.
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn foreign_launch(
    _f: Handle,
    _gx: u32,
    _gy: u32,
    _gz: u32,
    _bx: u32,
    _by: u32,
    _bz: u32,
    _shmem: u32,
    _s: Handle,
    _p: PPtr,
    _e: PPtr,
) -> CUresult {
    record(F::cuLaunchKernel as usize, None);
    0
}

/// Test helper: the fake's `cuGetProcAddress_v2` semantics without being a
/// `cu*` export (so a preloaded shim never intercepts it). Returns the
/// selected export's address, 0 if none.
#[no_mangle]
pub unsafe extern "C" fn fake_get_proc_address(symbol: *const c_char, version: c_int, flags: u64) -> usize {
    let mut p = std::ptr::null_mut();
    // SAFETY: forwarded.
    unsafe { get_proc(symbol, &mut p, version, flags, std::ptr::null_mut()) };
    p as usize
}

/// Fake `cuGetProcAddress` (CUDA 11.3 ABI).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    record(x("cuGetProcAddress"), None);
    // SAFETY: forwarded.
    unsafe { get_proc(symbol, pfn, version, flags, std::ptr::null_mut()) }
}

/// Fake `cuGetProcAddress_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    record(x("cuGetProcAddress_v2"), None);
    // SAFETY: forwarded.
    unsafe { get_proc(symbol, pfn, version, flags, status) }
}

// ---------------------------------------------------------------------------
// Init, export table, contexts

/// Fake `cuInit`.
#[no_mangle]
pub extern "C" fn cuInit(_flags: u32) -> CUresult {
    record(x("cuInit"), None);
    0
}

static EXPORT_TABLE: [usize; 4] = [0; 4];

/// Fake `cuGetExportTable`: returns a dummy table.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(table: *mut *const c_void, _uuid: *const c_void) -> CUresult {
    record(x("cuGetExportTable"), None);
    if !table.is_null() {
        // SAFETY: valid out pointer.
        unsafe { *table = EXPORT_TABLE.as_ptr().cast() };
    }
    0
}

/// Context handles are fake addresses: primary contexts 0x1000 + 0x10*dev,
/// created ones 0x2000 + 0x10*n.
static NEXT_CTX: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn new_ctx(pctx: *mut Handle, name: &str) -> CUresult {
    let c = 0x2000 + 0x10 * NEXT_CTX.fetch_add(1, Ordering::SeqCst);
    record(x(name), Some(c));
    if pctx.is_null() {
        return 1;
    }
    // SAFETY: valid out pointer.
    unsafe { *pctx = c as Handle };
    CURRENT.with(|cur| cur.set(c));
    0
}

/// Fake `cuDevicePrimaryCtxRetain`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: c_int) -> CUresult {
    let c = 0x1000 + 0x10 * dev.max(0) as usize;
    record(x("cuDevicePrimaryCtxRetain"), Some(c));
    if pctx.is_null() {
        return 1;
    }
    // SAFETY: valid out pointer.
    unsafe { *pctx = c as Handle };
    0
}

/// Fake `cuCtxCreate`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate(pctx: *mut Handle, _flags: u32, _dev: c_int) -> CUresult {
    new_ctx(pctx, "cuCtxCreate")
}
/// Fake `cuCtxCreate_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut Handle, _flags: u32, _dev: c_int) -> CUresult {
    new_ctx(pctx, "cuCtxCreate_v2")
}
/// Fake `cuCtxCreate_v3`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut Handle,
    _p: Handle,
    _n: c_int,
    _flags: u32,
    _dev: c_int,
) -> CUresult {
    new_ctx(pctx, "cuCtxCreate_v3")
}
/// Fake `cuCtxCreate_v4`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(pctx: *mut Handle, _p: Handle, _flags: u32, _dev: c_int) -> CUresult {
    new_ctx(pctx, "cuCtxCreate_v4")
}

/// Fake `cuCtxSetCurrent`.
#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    record(x("cuCtxSetCurrent"), Some(ctx as usize));
    CURRENT.with(|c| c.set(ctx as usize));
    0
}

fn push(ctx: Handle, name: &str) -> CUresult {
    record(x(name), Some(ctx as usize));
    let prev = CURRENT.with(|c| c.replace(ctx as usize));
    STACK.with(|s| s.borrow_mut().push(prev));
    0
}
/// Fake `cuCtxPushCurrent`.
#[no_mangle]
pub extern "C" fn cuCtxPushCurrent(ctx: Handle) -> CUresult {
    push(ctx, "cuCtxPushCurrent")
}
/// Fake `cuCtxPushCurrent_v2`.
#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: Handle) -> CUresult {
    push(ctx, "cuCtxPushCurrent_v2")
}

fn pop(out: *mut Handle, name: &str) -> CUresult {
    let cur = CURRENT.with(|c| c.get());
    record(x(name), Some(cur));
    let prev = STACK.with(|s| s.borrow_mut().pop()).unwrap_or(0);
    CURRENT.with(|c| c.set(prev));
    if !out.is_null() {
        // SAFETY: valid out pointer.
        unsafe { *out = cur as Handle };
    }
    0
}
/// Fake `cuCtxPopCurrent`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent(out: *mut Handle) -> CUresult {
    pop(out, "cuCtxPopCurrent")
}
/// Fake `cuCtxPopCurrent_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(out: *mut Handle) -> CUresult {
    pop(out, "cuCtxPopCurrent_v2")
}

/// Fake `cuCtxSynchronize`: logs the current context, then sleeps
/// `FAKECUDA_SYNC_US` microseconds.
#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    let cur = CURRENT.with(|c| c.get());
    static SYNC_US: OnceLock<u64> = OnceLock::new();
    let us = *SYNC_US.get_or_init(|| std::env::var("FAKECUDA_SYNC_US").ok().and_then(|v| v.parse().ok()).unwrap_or(0));
    if us > 0 {
        std::thread::sleep(std::time::Duration::from_micros(us));
    }
    // Logged after the modelled work completed.
    record(x("cuCtxSynchronize"), Some(cur));
    0
}

/// Fake `cuCtxGetCurrent`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(out: *mut Handle) -> CUresult {
    let cur = CURRENT.with(|c| c.get());
    record(x("cuCtxGetCurrent"), Some(cur));
    if !out.is_null() {
        // SAFETY: valid out pointer.
        unsafe { *out = cur as Handle };
    }
    0
}

fn destroy(ctx: Handle, name: &str) -> CUresult {
    record(x(name), Some(ctx as usize));
    0
}
/// Fake `cuCtxDestroy`.
#[no_mangle]
pub extern "C" fn cuCtxDestroy(ctx: Handle) -> CUresult {
    destroy(ctx, "cuCtxDestroy")
}
/// Fake `cuCtxDestroy_v2`.
#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    destroy(ctx, "cuCtxDestroy_v2")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(sym: &str, v: i32, f: u64) -> &'static str {
        name_of(proc_lookup(sym, v, f).unwrap())
    }

    #[test]
    fn variant_selection() {
        assert_eq!(pick("cuLaunchKernel", 12000, 0), "cuLaunchKernel");
        assert_eq!(pick("cuLaunchKernel", 12000, 2), "cuLaunchKernel_ptsz");
        assert_eq!(pick("cuMemcpyHtoD", 1000, 0), "cuMemcpyHtoD");
        assert_eq!(pick("cuMemcpyHtoD", 3020, 0), "cuMemcpyHtoD_v2");
        assert_eq!(pick("cuMemcpyHtoD", 3020, 2), "cuMemcpyHtoD_v2_ptds");
        assert_eq!(pick("cuMemcpyHtoD", 1000, 2), "cuMemcpyHtoD");
        assert_eq!(pick("cuMemPrefetchAsync", 12000, 2), "cuMemPrefetchAsync_ptsz");
        assert_eq!(pick("cuMemPrefetchAsync", 12020, 2), "cuMemPrefetchAsync_v2_ptsz");
        assert_eq!(pick("cuCtxCreate", 12050, 0), "cuCtxCreate_v4");
        assert_eq!(pick("cuCtxCreate", 11040, 2), "cuCtxCreate_v3");
        assert_eq!(pick("cuGetProcAddress", 12000, 0), "cuGetProcAddress_v2");
        assert_eq!(pick("cuGetProcAddress", 11030, 0), "cuGetProcAddress");
        assert!(proc_lookup("cuNoSuchThing", 12000, 0).is_err());
        // cuLaunchKernelEx is not a variant of cuLaunchKernel.
        assert_eq!(pick("cuLaunchKernelEx", 12000, 0), "cuLaunchKernelEx");
    }
}
