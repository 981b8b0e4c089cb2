//! The real `dlsym`, the libcuda handle, and the exported `dlsym` hook.

use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::hooks;

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
static LIBCUDA: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set while this thread is inside the shim's `cu*` lookup path.
    /// Const-initialized `Cell<bool>`: no destructor, no allocation.
    static IN_DLSYM: Cell<bool> = const { Cell::new(false) };
}

/// Address of the real `dlsym` (0 if it cannot be found). Resolved once with
/// `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`, then `"GLIBC_2.2.5"`.
#[inline]
pub(crate) fn real_dlsym_addr() -> usize {
    let p = REAL_DLSYM.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    resolve_real_dlsym()
}

#[cold]
fn resolve_real_dlsym() -> usize {
    let mut p = 0usize;
    for ver in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: dlvsym with valid C strings; RTLD_NEXT is relative to the shim.
        let q = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr()) };
        if !q.is_null() {
            p = q as usize;
            break;
        }
    }
    if p != 0 {
        REAL_DLSYM.store(p, Ordering::Release);
    }
    p
}

/// Calls the real `dlsym` (null if unavailable).
///
/// # Safety
/// `handle` and `name` must be valid arguments for `dlsym`.
pub(crate) unsafe fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let p = real_dlsym_addr();
    if p == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: p is the address of glibc's dlsym.
    let f: DlsymFn = unsafe { std::mem::transmute::<usize, DlsymFn>(p) };
    // SAFETY: forwarded arguments.
    unsafe { f(handle, name) }
}

/// The libcuda handle: `dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)`,
/// falling back to a normal `dlopen`. Null if libcuda cannot be loaded (not
/// cached, so a later call retries).
pub(crate) fn libcuda() -> *mut c_void {
    let h = LIBCUDA.load(Ordering::Acquire);
    if h != 0 {
        return h as *mut c_void;
    }
    open_libcuda()
}

#[cold]
fn open_libcuda() -> *mut c_void {
    // SAFETY: dlopen with a valid C string.
    let mut h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if h.is_null() {
        // SAFETY: as above.
        h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY) };
    }
    if !h.is_null() {
        // A racing thread may store the same handle: dlopen refcounts it.
        LIBCUDA.store(h as usize, Ordering::Release);
    }
    h
}

/// Resolves `name` (NUL-terminated) in libcuda with the real `dlsym`
/// (0 if absent).
pub(crate) fn libcuda_sym(name: &CStr) -> usize {
    let h = libcuda();
    if h.is_null() {
        return 0;
    }
    // SAFETY: valid handle and C string.
    unsafe { real_dlsym(h, name.as_ptr()) as usize }
}

unsafe extern "C" fn null_dlsym(_h: *mut c_void, _n: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// Decides where the exported `dlsym` jumps: the real `dlsym` (every
/// non-hooked name, and re-entrant lookups), [`dlsym_cu`] (hooked `cu*`
/// names), or a stub returning null (no real `dlsym`). Allocation-free; does
/// not touch thread-local storage for non-`cu` names.
extern "C" fn dlsym_route(_handle: *mut c_void, name: *const c_char) -> usize {
    let real = real_dlsym_addr();
    if real == 0 {
        return null_dlsym as *const () as usize;
    }
    if name.is_null() {
        return real;
    }
    // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    if bytes.len() < 3 || bytes[0] != b'c' || bytes[1] != b'u' {
        return real;
    }
    if hooks::lookup(bytes).is_none() {
        return real;
    }
    if IN_DLSYM.with(|f| f.get()) {
        return real;
    }
    dlsym_cu as *const () as usize
}

struct ReentryGuard;
impl ReentryGuard {
    fn new() -> Self {
        IN_DLSYM.with(|f| f.set(true));
        ReentryGuard
    }
}
impl Drop for ReentryGuard {
    fn drop(&mut self) {
        IN_DLSYM.with(|f| f.set(false));
    }
}

/// `dlsym` for hooked `cu*` names: the real lookup with the caller's handle;
/// if it found libcuda's definition, the shim's wrapper is returned instead.
/// A definition from another object is returned unchanged and counted as
/// unwrapped (fail open).
unsafe extern "C" fn dlsym_cu(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let _g = ReentryGuard::new();
    // SAFETY: forwarded arguments.
    let r = unsafe { real_dlsym(handle, name) };
    if r.is_null() {
        return r;
    }
    // SAFETY: route checked that name is a valid C string.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    let Some(i) = hooks::lookup(bytes) else { return r };
    let w = hooks::wrapper_addr(i);
    if r as usize == w {
        return r; // the lookup found the shim's own export
    }
    if hooks::resolve(i) == r as usize {
        return w as *mut c_void;
    }
    hooks::note_unwrapped(i);
    r
}

/// The exported `dlsym` (a naked tail-jump trampoline; see the crate docs).
/// Exported under the C name `dlsym`; this Rust name exists for rustdoc.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[cfg_attr(not(test), export_name = "dlsym")]
pub unsafe extern "C" fn dlsym_hook(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // Entry: rsp = 8 mod 16. Save the two arguments (rsp = 8 mod 16), align
    // (rsp = 0 mod 16), ask the router, restore, and jump to its answer with
    // the caller's return address still on top of the stack.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {route}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        route = sym dlsym_route,
    )
}

/// The exported `dlsym` (aarch64 trampoline; untested on hardware).
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[cfg_attr(not(test), export_name = "dlsym")]
pub unsafe extern "C" fn dlsym_hook(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {route}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "br x16",
        route = sym dlsym_route,
    )
}

/// The exported `dlsym` on other architectures: a plain forward (here
/// `RTLD_NEXT` lookups are resolved relative to the shim, not the caller).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[cfg_attr(not(test), export_name = "dlsym")]
pub unsafe extern "C" fn dlsym_hook(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let f: DlsymFn = unsafe { std::mem::transmute::<usize, DlsymFn>(dlsym_route(handle, symbol)) };
    unsafe { f(handle, symbol) }
}
