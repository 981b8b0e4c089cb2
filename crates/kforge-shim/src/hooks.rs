//! Wrappers generated from the symbol table, the name tables, real-pointer
//! resolution and the `cuGetProcAddress` hooks.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::symbols::*;
use crate::{dl, state, CUDA_ERROR_NOT_FOUND};

/// What a hooked entry point does (from the table's `kind` column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Kernel or graph launch (counted by [`kforge_shim_launch_count`]).
    Launch,
    /// `cuLaunchHostFunc*`.
    Host,
    /// `cuMemcpy*`.
    Copy,
    /// `cuMemset*`.
    Set,
    /// `cuMemPrefetchAsync*`.
    Prefetch,
    /// Not gated: context observation and `cuGetProcAddress*`.
    Observe,
}

macro_rules! kind {
    (launch) => {
        Kind::Launch
    };
    (host) => {
        Kind::Host
    };
    (copy) => {
        Kind::Copy
    };
    (set) => {
        Kind::Set
    };
    (prefetch) => {
        Kind::Prefetch
    };
    (observe) => {
        Kind::Observe
    };
}

/// One row of the hook table.
#[derive(Debug)]
pub struct HookInfo {
    /// Exported symbol name, NUL-terminated.
    pub name: &'static str,
    /// Base name (what callers pass to `cuGetProcAddress`).
    pub base: &'static str,
    /// Kind.
    pub kind: Kind,
}

impl HookInfo {
    /// The name without its NUL terminator.
    pub fn name(&self) -> &'static str {
        &self.name[..self.name.len() - 1]
    }
    fn cname(&self) -> &'static CStr {
        CStr::from_bytes_with_nul(self.name.as_bytes()).expect("NUL-terminated name")
    }
}

/// A wrapper's address, type-erased.
type AnyFn = unsafe extern "C" fn();

macro_rules! define_gated {
    ($($name:ident => $base:ident, $kind:ident, ($($arg:ident : $ty:ty),* $(,)?);)*) => {
        /// Index of each gated symbol in the hook table.
        #[allow(non_camel_case_types, dead_code, clippy::enum_variant_names)]
        #[repr(usize)]
        #[derive(Clone, Copy, Debug)]
        pub(crate) enum G { $($name,)* }

        /// Number of gated symbols (all variants).
        pub const NG: usize = [$(stringify!($name)),*].len();

        static GATED: [HookInfo; NG] = [$(HookInfo {
            name: concat!(stringify!($name), "\0"),
            base: stringify!($base),
            kind: kind!($kind),
        }),*];

        static GATED_WRAPPERS: [AnyFn; NG] = [$(
            // SAFETY: only erases the signature; callers never call through AnyFn.
            unsafe { std::mem::transmute::<unsafe extern "C" fn($($ty),*) -> CUresult, AnyFn>(
                $name as unsafe extern "C" fn($($ty),*) -> CUresult) }
        ),*];

        $(
            /// Gated wrapper (generated from the symbol table): counts the
            /// call, waits at the gate while another process holds a
            /// region, then calls libcuda's definition.
            #[cfg_attr(not(test), no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                const I: usize = G::$name as usize;
                let f = resolve(I);
                if f == 0 {
                    return CUDA_ERROR_NOT_FOUND;
                }
                COUNTS[I].fetch_add(1, Ordering::Relaxed);
                // SAFETY: f is libcuda's definition of exactly this variant.
                let f = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($ty),*) -> CUresult>(f) };
                match state::get() {
                    Some(st) => {
                        let _guard = st.enter();
                        // SAFETY: forwarded arguments.
                        unsafe { f($($arg),*) }
                    }
                    // SAFETY: forwarded arguments.
                    None => unsafe { f($($arg),*) },
                }
            }
        )*
    };
}

gated_symbols!(define_gated);

macro_rules! define_observed {
    ($($name:ident => $base:ident, $kind:ident, ($($arg:ident : $ty:ty),* $(,)?);)*) => {
        /// Index of each observed symbol (add [`NG`] for the hook index).
        #[allow(non_camel_case_types, dead_code)]
        #[repr(usize)]
        #[derive(Clone, Copy, Debug)]
        pub(crate) enum O { $($name,)* }

        /// Number of observed (not gated) hooked symbols.
        pub const NO: usize = [$(stringify!($name)),*].len();

        static OBSERVED: [HookInfo; NO] = [$(HookInfo {
            name: concat!(stringify!($name), "\0"),
            base: stringify!($base),
            kind: kind!($kind),
        }),*];

        // The casts check the hand-written wrappers against the table's signatures.
        static OBSERVED_WRAPPERS: [AnyFn; NO] = [$(
            // SAFETY: only erases the signature.
            unsafe { std::mem::transmute::<unsafe extern "C" fn($($ty),*) -> CUresult, AnyFn>(
                $name as unsafe extern "C" fn($($ty),*) -> CUresult) }
        ),*];
    };
}

observed_symbols!(define_observed);

/// Total number of hooked symbols (gated + observed).
pub const NH: usize = NG + NO;

/// Per-hook real entry point in libcuda (0 = not resolved yet).
static REAL: [AtomicUsize; NH] = [const { AtomicUsize::new(0) }; NH];
/// Per-hook call counters.
pub(crate) static COUNTS: [AtomicU64; NH] = [const { AtomicU64::new(0) }; NH];
/// Per-hook count of lookups whose result could not be matched to a variant
/// (indexed by the first table entry of the base name).
pub(crate) static UNWRAPPED: [AtomicU64; NH] = [const { AtomicU64::new(0) }; NH];

/// Row `i` of the hook table (gated rows first).
pub fn info(i: usize) -> &'static HookInfo {
    if i < NG {
        &GATED[i]
    } else {
        &OBSERVED[i - NG]
    }
}

/// Address of the shim's wrapper for hook `i`.
pub(crate) fn wrapper_addr(i: usize) -> usize {
    if i < NG {
        GATED_WRAPPERS[i] as usize
    } else {
        OBSERVED_WRAPPERS[i - NG] as usize
    }
}

/// Hook index of an exported name (no allocation).
pub(crate) fn lookup(name: &[u8]) -> Option<usize> {
    (0..NH).find(|&i| info(i).name().as_bytes() == name)
}

/// libcuda's definition of hook `i` (0 if libcuda or the symbol is
/// missing). One atomic load once resolved.
#[inline(always)]
pub(crate) fn resolve(i: usize) -> usize {
    let f = REAL[i].load(Ordering::Acquire);
    if f != 0 {
        return f;
    }
    resolve_slow(i)
}

#[cold]
#[inline(never)]
fn resolve_slow(i: usize) -> usize {
    let p = dl::libcuda_sym(info(i).cname());
    if p == 0 || p == wrapper_addr(i) {
        return 0;
    }
    REAL[i].store(p, Ordering::Release);
    p
}

/// Records a lookup of hook `i`'s base name that could not be wrapped.
#[cold]
pub(crate) fn note_unwrapped(i: usize) {
    let first = (0..NH).find(|&j| info(j).base == info(i).base).unwrap_or(i);
    UNWRAPPED[first].fetch_add(1, Ordering::Relaxed);
    state::debug_unwrapped(info(i).base);
}

/// Sum of the call counters of launch-like hooks (kernel and graph
/// launches), for tests and validation.
#[no_mangle]
pub extern "C" fn kforge_shim_launch_count() -> u64 {
    (0..NG).filter(|&i| info(i).kind == Kind::Launch).map(|i| COUNTS[i].load(Ordering::Relaxed)).sum()
}

// ---------------------------------------------------------------------------
// cuGetProcAddress

/// After a successful real `cuGetProcAddress*`: replaces `*pfn` by the
/// shim's wrapper of exactly the variant the driver returned.
unsafe fn fix_proc_address(symbol: *const c_char, pfn: *mut *mut c_void) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: pfn was just written by the driver.
    let p = unsafe { *pfn } as usize;
    if p == 0 {
        return;
    }
    // SAFETY: the caller passed a C string to the driver, which accepted it.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let mut first = None;
    for i in 0..NH {
        let h = info(i);
        if h.base.as_bytes() != name && h.name().as_bytes() != name {
            continue;
        }
        first.get_or_insert(i);
        if p == wrapper_addr(i) {
            return; // already ours
        }
        if resolve(i) == p {
            // SAFETY: pfn is valid (checked above).
            unsafe { *pfn = wrapper_addr(i) as *mut c_void };
            return;
        }
    }
    if let Some(i) = first {
        note_unwrapped(i);
    }
}

macro_rules! call_real {
    ($idx:expr, fn($($ty:ty),*), $($a:expr),*) => {{
        let i: usize = $idx;
        let f = resolve(i);
        if f == 0 {
            return CUDA_ERROR_NOT_FOUND;
        }
        COUNTS[i].fetch_add(1, Ordering::Relaxed);
        // SAFETY: f is libcuda's definition of this symbol.
        let f = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($ty),*) -> CUresult>(f) };
        // SAFETY: forwarded arguments.
        unsafe { f($($a),*) }
    }};
}

/// `cuGetProcAddress` (CUDA 11.3 ABI, 4 arguments): calls the real one and
/// wraps the result when it is a hooked variant.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    let rc = call_real!(
        NG + O::cuGetProcAddress as usize,
        fn(*const c_char, *mut *mut c_void, c_int, u64),
        symbol,
        pfn,
        cuda_version,
        flags
    );
    if rc == 0 {
        // SAFETY: arguments accepted by the driver.
        unsafe { fix_proc_address(symbol, pfn) };
    }
    rc
}

/// `cuGetProcAddress_v2` (CUDA 12 ABI, with `symbolStatus`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let rc = call_real!(
        NG + O::cuGetProcAddress_v2 as usize,
        fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int),
        symbol,
        pfn,
        cuda_version,
        flags,
        status
    );
    // SAFETY: status, if non-null, was written by the driver.
    if rc == 0 && (status.is_null() || unsafe { *status } == 0) {
        // SAFETY: arguments accepted by the driver.
        unsafe { fix_proc_address(symbol, pfn) };
    }
    rc
}

// ---------------------------------------------------------------------------
// Context observation (not gated)

unsafe fn record_out(rc: CUresult, pctx: *mut Handle) {
    if rc == 0 && !pctx.is_null() {
        // SAFETY: the driver wrote the new context.
        state::record_ctx(unsafe { *pctx } as usize);
    }
}

/// Observed: records the primary context it returns.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: c_int) -> CUresult {
    let rc = call_real!(NG + O::cuDevicePrimaryCtxRetain as usize, fn(*mut Handle, c_int), pctx, dev);
    // SAFETY: see record_out.
    unsafe { record_out(rc, pctx) };
    rc
}

/// Observed: records the created context.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxCreate(pctx: *mut Handle, flags: u32, dev: c_int) -> CUresult {
    let rc = call_real!(NG + O::cuCtxCreate as usize, fn(*mut Handle, u32, c_int), pctx, flags, dev);
    // SAFETY: see record_out.
    unsafe { record_out(rc, pctx) };
    rc
}

/// Observed: records the created context.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(pctx: *mut Handle, flags: u32, dev: c_int) -> CUresult {
    let rc = call_real!(NG + O::cuCtxCreate_v2 as usize, fn(*mut Handle, u32, c_int), pctx, flags, dev);
    // SAFETY: see record_out.
    unsafe { record_out(rc, pctx) };
    rc
}

/// Observed: records the created context.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut Handle,
    params: Handle,
    n: c_int,
    flags: u32,
    dev: c_int,
) -> CUresult {
    let rc = call_real!(
        NG + O::cuCtxCreate_v3 as usize,
        fn(*mut Handle, Handle, c_int, u32, c_int),
        pctx,
        params,
        n,
        flags,
        dev
    );
    // SAFETY: see record_out.
    unsafe { record_out(rc, pctx) };
    rc
}

/// Observed: records the created context.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(pctx: *mut Handle, params: Handle, flags: u32, dev: c_int) -> CUresult {
    let rc = call_real!(NG + O::cuCtxCreate_v4 as usize, fn(*mut Handle, Handle, u32, c_int), pctx, params, flags, dev);
    // SAFETY: see record_out.
    unsafe { record_out(rc, pctx) };
    rc
}

/// Observed: records the context made current.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    state::record_ctx(ctx as usize);
    call_real!(NG + O::cuCtxSetCurrent as usize, fn(Handle), ctx)
}

/// Observed: records the pushed context.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent(ctx: Handle) -> CUresult {
    state::record_ctx(ctx as usize);
    call_real!(NG + O::cuCtxPushCurrent as usize, fn(Handle), ctx)
}

/// Observed: records the pushed context.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: Handle) -> CUresult {
    state::record_ctx(ctx as usize);
    call_real!(NG + O::cuCtxPushCurrent_v2 as usize, fn(Handle), ctx)
}

/// Observed: forgets the destroyed context (before destroying it).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy(ctx: Handle) -> CUresult {
    state::forget_ctx(ctx as usize);
    call_real!(NG + O::cuCtxDestroy as usize, fn(Handle), ctx)
}

/// Observed: forgets the destroyed context (before destroying it).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    state::forget_ctx(ctx as usize);
    call_real!(NG + O::cuCtxDestroy_v2 as usize, fn(Handle), ctx)
}
