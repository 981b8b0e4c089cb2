//! Test driver for the kforge-shim integration tests. Not part of the shim:
//! it is run with `LD_PRELOAD=libkforge_shim.so` and `LD_LIBRARY_PATH`
//! pointing at a directory where the fake `libcuda.so.1` lives, and
//! exercises one interception path per mode, printing `key=value` lines.
//!
//! Modes: `dlsym-handle`, `procaddr`, `procaddr-self`, `direct`, `table`,
//! `other`, `loop <max> <interval_us> <stopfile>`.
//! Env: `KFORGE_TEST_SHIM` = path of the shim (to find its wrappers).

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::io::Write;

#[allow(dead_code, unused_macros)]
#[macro_use]
mod symbols {
    include!("../symbols.rs");
}
use symbols::*;

type LaunchFn = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    PPtr,
    PPtr,
) -> CUresult;
type LaunchExFn = unsafe extern "C" fn(CPtr, Handle, PPtr, PPtr) -> CUresult;
type GraphFn = unsafe extern "C" fn(Handle, Handle) -> CUresult;
type HtoDAsyncFn = unsafe extern "C" fn(CUdeviceptr, CPtr, usize, Handle) -> CUresult;
type MemsetD32Fn = unsafe extern "C" fn(CUdeviceptr, c_uint, usize) -> CUresult;
type ExportTableFn = unsafe extern "C" fn(*mut CPtr, CPtr) -> CUresult;
type Gpa1Fn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
type Gpa2Fn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
type RetainFn = unsafe extern "C" fn(*mut Handle, c_int) -> CUresult;
type SetCurFn = unsafe extern "C" fn(Handle) -> CUresult;
type FakeCallsFn = unsafe extern "C" fn(*const c_char) -> u64;
type FakeAddrFn = unsafe extern "C" fn(*const c_char) -> usize;
type FakeGpaFn = unsafe extern "C" fn(*const c_char, c_int, u64) -> usize;

macro_rules! names_list {
    ($($name:ident => $base:ident, $kind:ident, ($($arg:ident : $ty:ty),* $(,)?);)*) => {
        &[$((stringify!($name), stringify!($base))),*]
    };
}
const GATED: &[(&str, &str)] = gated_symbols!(names_list);
const OBSERVED: &[(&str, &str)] = observed_symbols!(names_list);

fn all_hooks() -> impl Iterator<Item = (&'static str, &'static str)> {
    GATED.iter().chain(OBSERVED.iter()).copied()
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

unsafe fn sym(h: *mut c_void, name: &str) -> *mut c_void {
    unsafe { libc::dlsym(h, c(name).as_ptr()) }
}

fn die(msg: &str) -> ! {
    eprintln!("driver: {msg}");
    std::process::exit(3)
}

fn open_cuda(flags: c_int) -> *mut c_void {
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), flags) };
    if h.is_null() {
        die("dlopen libcuda.so.1 failed");
    }
    h
}

fn shim_handle() -> *mut c_void {
    let Ok(p) = std::env::var("KFORGE_TEST_SHIM") else { return std::ptr::null_mut() };
    unsafe { libc::dlopen(c(&p).as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) }
}

struct Ctx {
    cuda: *mut c_void,
    shim: *mut c_void,
}

impl Ctx {
    fn new(flags: c_int) -> Ctx {
        Ctx { cuda: open_cuda(flags), shim: shim_handle() }
    }
    fn fake_calls(&self, name: &str) -> u64 {
        let f = unsafe { sym(self.cuda, "fake_calls") };
        if f.is_null() {
            die("fake_calls missing");
        }
        let f: FakeCallsFn = unsafe { std::mem::transmute(f) };
        unsafe { f(c(name).as_ptr()) }
    }
    fn fake_addr(&self, name: &str) -> usize {
        let f: FakeAddrFn = unsafe { std::mem::transmute(sym(self.cuda, "fake_addr")) };
        unsafe { f(c(name).as_ptr()) }
    }
    fn shim_addr(&self, name: &str) -> usize {
        if self.shim.is_null() {
            return 0;
        }
        unsafe { sym(self.shim, name) as usize }
    }
    /// "shim:<name>", "fake:<name>", "null" or "unknown".
    fn identify(&self, p: usize) -> String {
        if p == 0 {
            return "null".into();
        }
        let known = all_hooks().map(|(n, _)| n).chain(["cuInit", "cuGetExportTable", "cuCtxSynchronize"]);
        for n in known {
            if self.shim_addr(n) == p {
                return format!("shim:{n}");
            }
            if self.fake_addr(n) == p {
                return format!("fake:{n}");
            }
        }
        "unknown".into()
    }
    fn print_fake(&self, names: &[&str]) {
        for n in names {
            println!("fake.{n}={}", self.fake_calls(n));
        }
    }
}

unsafe fn launch(p: *mut c_void) -> CUresult {
    let f: LaunchFn = unsafe { std::mem::transmute(p) };
    unsafe {
        f(std::ptr::null_mut(), 1, 1, 1, 32, 1, 1, 0, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut())
    }
}

fn mode_dlsym_handle() {
    let cx = Ctx::new(libc::RTLD_NOW | libc::RTLD_LOCAL);
    unsafe {
        let l = sym(cx.cuda, "cuLaunchKernel");
        println!("cuLaunchKernel={}", cx.identify(l as usize));
        for _ in 0..3 {
            assert_eq!(launch(l), 0);
        }
        let ex = sym(cx.cuda, "cuLaunchKernelEx");
        println!("cuLaunchKernelEx={}", cx.identify(ex as usize));
        let ex: LaunchExFn = std::mem::transmute(ex);
        for _ in 0..2 {
            ex(std::ptr::null(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
        }
        let cp = sym(cx.cuda, "cuMemcpyHtoDAsync_v2");
        println!("cuMemcpyHtoDAsync_v2={}", cx.identify(cp as usize));
        let cp: HtoDAsyncFn = std::mem::transmute(cp);
        cp(0, std::ptr::null(), 0, std::ptr::null_mut());
        let et = sym(cx.cuda, "cuGetExportTable");
        println!("cuGetExportTable={}", cx.identify(et as usize));
        let et: ExportTableFn = std::mem::transmute(et);
        let mut t = std::ptr::null();
        et(&mut t, std::ptr::null());
        // Lookups of names that do not exist stay null.
        println!("missing={}", cx.identify(sym(cx.cuda, "cuLaunchKernel_v9") as usize));
    }
    cx.print_fake(&["cuLaunchKernel", "cuLaunchKernelEx", "cuMemcpyHtoDAsync_v2", "cuGetExportTable"]);
}

fn mode_procaddr() {
    let cx = Ctx::new(libc::RTLD_NOW | libc::RTLD_LOCAL);
    unsafe {
        let g = sym(cx.cuda, "cuGetProcAddress_v2");
        println!("cuGetProcAddress_v2={}", cx.identify(g as usize));
        let g: Gpa2Fn = std::mem::transmute(g);
        for (name, vers) in [
            ("cuLaunchKernel", &[11030, 12000, 13000][..]),
            ("cuMemcpyHtoDAsync", &[1000, 3020, 12000][..]),
            ("cuGraphLaunch", &[12000][..]),
        ] {
            for &v in vers {
                for flags in [0u64, 2] {
                    let mut p = std::ptr::null_mut();
                    let mut st = -1;
                    let rc = g(c(name).as_ptr(), &mut p, v, flags, &mut st);
                    println!("gpa.{name}.{v}.{flags}={} rc={rc} status={st}", cx.identify(p as usize));
                    if name == "cuLaunchKernel" {
                        launch(p);
                    }
                }
            }
        }
        // A symbol the shim does not hook is returned as is.
        let mut p = std::ptr::null_mut();
        g(c"cuInit".as_ptr(), &mut p, 12000, 0, std::ptr::null_mut());
        println!("gpa.cuInit={}", cx.identify(p as usize));
    }
    cx.print_fake(&["cuLaunchKernel", "cuLaunchKernel_ptsz", "cuGetProcAddress_v2"]);
}

fn mode_procaddr_self() {
    let cx = Ctx::new(libc::RTLD_NOW | libc::RTLD_LOCAL);
    unsafe {
        let g: Gpa2Fn = std::mem::transmute(sym(cx.cuda, "cuGetProcAddress_v2"));
        let mut p2 = std::ptr::null_mut();
        g(c"cuGetProcAddress".as_ptr(), &mut p2, 12000, 0, std::ptr::null_mut());
        println!("self.12000={}", cx.identify(p2 as usize));
        let mut p1 = std::ptr::null_mut();
        g(c"cuGetProcAddress".as_ptr(), &mut p1, 11030, 0, std::ptr::null_mut());
        println!("self.11030={}", cx.identify(p1 as usize));
        // Use the wrappers obtained for cuGetProcAddress itself.
        let g2: Gpa2Fn = std::mem::transmute(p2);
        let mut l = std::ptr::null_mut();
        g2(c"cuLaunchKernel".as_ptr(), &mut l, 12000, 2, std::ptr::null_mut());
        println!("via_v2.cuLaunchKernel={}", cx.identify(l as usize));
        launch(l);
        let g1: Gpa1Fn = std::mem::transmute(p1);
        let mut gl = std::ptr::null_mut();
        g1(c"cuGraphLaunch".as_ptr(), &mut gl, 11030, 0);
        println!("via_v1.cuGraphLaunch={}", cx.identify(gl as usize));
        let gl: GraphFn = std::mem::transmute(gl);
        gl(std::ptr::null_mut(), std::ptr::null_mut());
    }
    cx.print_fake(&["cuLaunchKernel_ptsz", "cuGraphLaunch", "cuGetProcAddress", "cuGetProcAddress_v2"]);
}

fn mode_direct() {
    // Load the fake globally, then resolve through the global scope, as the
    // dynamic linker does for a binary linked against libcuda.
    let cx = Ctx::new(libc::RTLD_NOW | libc::RTLD_GLOBAL);
    unsafe {
        let l = sym(libc::RTLD_DEFAULT, "cuLaunchKernel");
        println!("direct.cuLaunchKernel={}", cx.identify(l as usize));
        launch(l);
        launch(l);
        let m = sym(libc::RTLD_DEFAULT, "cuMemsetD32_v2");
        println!("direct.cuMemsetD32_v2={}", cx.identify(m as usize));
        let m: MemsetD32Fn = std::mem::transmute(m);
        m(0, 7, 16);
    }
    cx.print_fake(&["cuLaunchKernel", "cuMemsetD32_v2"]);
}

/// Consistency of the single symbol table with the shim and the fake.
fn mode_table() {
    let cx = Ctx::new(libc::RTLD_NOW | libc::RTLD_LOCAL);
    if cx.shim.is_null() {
        die("shim not loaded (KFORGE_TEST_SHIM / LD_PRELOAD)");
    }
    let fake_gpa: FakeGpaFn = unsafe { std::mem::transmute(sym(cx.cuda, "fake_get_proc_address")) };
    let g: Gpa2Fn = unsafe { std::mem::transmute(sym(cx.cuda, "cuGetProcAddress_v2")) };
    let mut fails = 0;
    let mut fail = |m: String| {
        println!("FAIL {m}");
        fails += 1;
    };
    let mut mapped = std::collections::HashSet::new();
    for (name, base) in all_hooks() {
        let w = cx.shim_addr(name);
        if w == 0 {
            fail(format!("{name}: shim does not export it"));
        }
        let f = cx.fake_addr(name);
        if f == 0 {
            fail(format!("{name}: fake libcuda does not export it"));
        }
        let via = unsafe { sym(cx.cuda, name) } as usize;
        if via != w {
            fail(format!("{name}: dlsym(libcuda) gave {} not the shim wrapper", cx.identify(via)));
        }
        for v in [1000, 3020, 11030, 11040, 12000, 12020, 12050, 13000] {
            for fl in [0u64, 2] {
                let want = unsafe { fake_gpa(c(base).as_ptr(), v, fl) };
                let mut p = std::ptr::null_mut();
                unsafe { g(c(base).as_ptr(), &mut p, v, fl, std::ptr::null_mut()) };
                let want_name = cx.identify(want);
                if std::env::var_os("DRIVER_VERBOSE").is_some() {
                    println!("{base} v{v} f{fl}: fake={want_name} shim={}", cx.identify(p as usize));
                }
                let Some(vn) = want_name.strip_prefix("fake:") else {
                    if p as usize != want {
                        fail(format!(
                            "{base} v{v} f{fl}: fake gave {want_name}, shim gave {}",
                            cx.identify(p as usize)
                        ));
                    }
                    continue;
                };
                if p as usize != cx.shim_addr(vn) {
                    fail(format!("{base} v{v} f{fl}: expected shim:{vn}, got {}", cx.identify(p as usize)));
                } else {
                    mapped.insert(vn.to_string());
                }
            }
        }
    }
    for (name, _) in all_hooks() {
        if !mapped.contains(name) {
            fail(format!("{name}: no (version, flags) maps to it through cuGetProcAddress_v2"));
        }
    }
    println!("table.entries={}", GATED.len() + OBSERVED.len());
    println!("table.gated={}", GATED.len());
    println!("table.fails={fails}");
    if fails > 0 {
        std::process::exit(1);
    }
}

/// Non-cu lookups are forwarded unchanged.
fn mode_other() {
    unsafe {
        let m = sym(libc::RTLD_DEFAULT, "malloc");
        println!("malloc_found={}", !m.is_null());
        let m: unsafe extern "C" fn(usize) -> *mut c_void = std::mem::transmute(m);
        let p = m(64);
        println!("malloc_works={}", !p.is_null());
        libc::free(p);
        // RTLD_NEXT must stay relative to the caller (this executable): the
        // next `dlsym` after it is the preloaded shim's, the same one the
        // global scope finds. A forward that is not a tail call would make
        // it relative to the shim and return libc's.
        let a = sym(libc::RTLD_NEXT, "dlsym");
        let b = sym(libc::RTLD_DEFAULT, "dlsym");
        println!("rtld_next_dlsym_matches={}", a == b);
        let g = sym(libc::RTLD_NEXT, "getpid");
        println!("rtld_next_getpid={}", !g.is_null());
        println!("cuda_runtime_name_null={}", sym(libc::RTLD_DEFAULT, "cudaMalloc").is_null());
        println!("unknown_cu_null={}", sym(libc::RTLD_DEFAULT, "cuNoSuchFunction").is_null());
    }
}

fn file_exists(p: &str) -> bool {
    std::path::Path::new(p).exists()
}

/// Launches up to `max` times, `interval_us` apart, until `stopfile` exists.
fn mode_loop(args: &[String]) {
    let max: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let interval: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let stop = args.get(2).cloned().unwrap_or_default();
    let cx = Ctx::new(libc::RTLD_NOW | libc::RTLD_LOCAL);
    unsafe {
        let retain: RetainFn = std::mem::transmute(sym(cx.cuda, "cuDevicePrimaryCtxRetain"));
        let set: SetCurFn = std::mem::transmute(sym(cx.cuda, "cuCtxSetCurrent"));
        let l = sym(cx.cuda, "cuLaunchKernel");
        let mut ctx = std::ptr::null_mut();
        retain(&mut ctx, 0);
        set(ctx);
        println!("ctx={:#x}", ctx as usize);
        let _ = std::io::stdout().flush();
        let mut n = 0;
        while n < max && !(file_exists(&stop)) {
            launch(l);
            n += 1;
            std::thread::sleep(std::time::Duration::from_micros(interval));
        }
        println!("launched={n}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("dlsym-handle") => mode_dlsym_handle(),
        Some("procaddr") => mode_procaddr(),
        Some("procaddr-self") => mode_procaddr_self(),
        Some("direct") => mode_direct(),
        Some("table") => mode_table(),
        Some("other") => mode_other(),
        Some("loop") => mode_loop(&args[1..]),
        _ => die("usage: kforge-shim-testdriver dlsym-handle|procaddr|procaddr-self|direct|table|other|loop ..."),
    }
}
