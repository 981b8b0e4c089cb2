//! # kforge-shim: the CUDA submission gate (`libkforge_shim.so`)
//!
//! The kforge daemon injects this library with `LD_PRELOAD` into every GPU
//! job and sets `KFORGE_GATE=/dev/shm/...`, the path of the device's gate
//! segment (crate `kforge-gate`). While another process holds a timed region
//! the daemon closes the gate; the shim then holds back this process's GPU
//! submissions, synchronizes every CUDA context the process has used and
//! acknowledges the gate epoch, so the region starts on an idle device.
//!
//! ## Interception design
//!
//! Work reaches the driver through three doors; the shim guards all of them.
//!
//! 1. **`dlsym` itself** ([`dlsym`](crate::dlsym_hook)). The CUDA runtime,
//!    cuBLAS and Triton `dlopen("libcuda.so.1")` and look entry points up
//!    with a handle-scoped `dlsym`, which ignores preloaded libraries. The
//!    shim exports `dlsym`; a lookup whose name is one of the hooked `cu*`
//!    names is answered by calling the real `dlsym` with the caller's handle
//!    and, when the result is libcuda's definition, returning the shim's
//!    wrapper instead. Every other lookup is forwarded *by a tail jump* (a
//!    naked trampoline on x86-64 and aarch64), so the real `dlsym` sees the
//!    caller's return address and `RTLD_NEXT` keeps its meaning for the
//!    caller. The real `dlsym` is found once with
//!    `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")` (falling back to
//!    `"GLIBC_2.2.5"`); a const-initialized thread-local flag guards against
//!    re-entry.
//! 2. **`cuGetProcAddress` / `cuGetProcAddress_v2`**. The shim calls the
//!    real function with the caller's exact arguments (`cudaVersion`, the
//!    per-thread-default-stream flag, ...), then identifies *which variant*
//!    the driver returned by comparing the pointer with libcuda's exports of
//!    every variant of that base name (`X`, `X_v2`, `X_ptsz`, `X_v2_ptds`,
//!    ...), and substitutes the wrapper of exactly that variant. An
//!    unrecognised pointer for a hooked base name is returned unchanged and
//!    counted as `unwrapped` (fail open). Asked for `cuGetProcAddress`
//!    itself, it returns its own wrapper.
//! 3. **Plain exported symbols**. The shim exports every hooked symbol, so
//!    binaries linked against libcuda bind to the wrappers. Each wrapper's
//!    real target is resolved lazily (once) from
//!    `dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)` (falling back to a
//!    normal `dlopen`) and the real `dlsym`.
//!
//! The hooked symbols come from ONE table, `symbols.rs`
//! ([`gated_symbols!`] for gated calls, [`observed_symbols!`] for context
//! observation and `cuGetProcAddress`), from which the wrappers, the name
//! tables, the fake libcuda's exports and the consistency tests are all
//! generated.
//!
//! ## Gate semantics and invariants
//!
//! * **The launch path never allocates, locks or makes a syscall while the
//!   gate is open.** A gated wrapper does: one load of the resolved real
//!   pointer (an `AtomicUsize` filled once), one relaxed `fetch_add` on its
//!   call counter, one load of the process state pointer, then
//!   `LaunchTracker::enter` (an increment, a `SeqCst` load of the gate word,
//!   and a decrement after the real call returns), and the real call.
//! * When the gate is closed and this process is not the region holder, the
//!   calling thread sleeps in `FUTEX_WAIT` on the gate word
//!   ([`kforge_gate::Gate::pass`]) until the gate reopens.
//! * The drain helper thread (`kforge_gate::spawn_drain_helper_with`) wakes
//!   on close, waits until no gated call is mid-submission
//!   (`LaunchTracker::wait_idle`), then for every context the process has
//!   used does `cuCtxPushCurrent; cuCtxSynchronize; cuCtxPopCurrent` through
//!   real driver pointers resolved at initialization (never through the
//!   shim's own wrappers), and acknowledges the epoch it observed.
//! * Contexts are observed (not gated) in `cuDevicePrimaryCtxRetain`,
//!   `cuCtxCreate*`, `cuCtxSetCurrent`, `cuCtxPushCurrent*` and forgotten in
//!   `cuCtxDestroy*`; they live in a fixed table of 64 `AtomicUsize` slots
//!   (CAS insert, duplicates ignored).
//! * **Inert until CUDA is used**: nothing runs at load time. The gate is
//!   opened, the pid registered and the helper started on the first *gated*
//!   call, behind an atomic once-state machine. If `KFORGE_GATE` is unset or
//!   the segment cannot be opened the shim stays pass-through (counts calls,
//!   never blocks) and prints one warning line when `KFORGE_SHIM_DEBUG` is
//!   set. After `fork` the child re-initializes on its own first gated call.
//! * At exit (a `.fini_array` destructor) the slot is unregistered and, if
//!   `KFORGE_SHIM_STATS` names a file (`{pid}` is replaced by the pid), the
//!   non-zero call counters are written as JSON — only if the process used
//!   CUDA through the shim.
//! * Panics never unwind across `extern "C"` (the workspace release profile
//!   uses `panic = "abort"`, and Rust aborts on such unwinds anyway).
//!
//! Known limits: a stream waiting on host-side work that is itself held at
//! the gate makes `cuCtxSynchronize` wait until the daemon's drain timeout;
//! `dlvsym` lookups of `cu*` names and `RTLD_DEEPBIND` libraries are not
//! redirected; between the exit-time unregister and process death the helper
//! may still acknowledge into the freed slot.

#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_snake_case, clippy::missing_safety_doc)]

/// The single table of hooked symbols (also `include!`d by the fake libcuda
/// and the tests).
#[macro_use]
pub mod symbols {
    include!("symbols.rs");
}

mod dl;
mod hooks;
mod state;

pub use dl::dlsym_hook;
pub use hooks::{kforge_shim_launch_count, HookInfo, Kind, NG, NH, NO};

/// `CUDA_ERROR_NOT_FOUND`: returned by a wrapper whose real entry point does
/// not exist in the loaded libcuda.
pub const CUDA_ERROR_NOT_FOUND: symbols::CUresult = 500;

#[cfg(test)]
mod tests {
    use super::hooks::*;

    #[test]
    fn table_is_consistent() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..NH {
            let h = info(i);
            let n = h.name();
            assert!(n.starts_with("cu"), "{n}");
            assert!(h.name.ends_with('\0'));
            assert!(seen.insert(n), "duplicate {n}");
            assert!(n.starts_with(h.base), "{n} not a variant of {}", h.base);
            let suffix = &n[h.base.len()..];
            assert!(
                ["", "_v2", "_v3", "_v4", "_ptsz", "_ptds", "_v2_ptsz", "_v2_ptds"].contains(&suffix),
                "{n}: odd variant suffix {suffix:?}"
            );
            assert_eq!(lookup(n.as_bytes()), Some(i));
            assert_ne!(wrapper_addr(i), 0);
            if i >= NG {
                assert_eq!(h.kind, Kind::Observe);
            } else {
                assert_ne!(h.kind, Kind::Observe);
            }
        }
        assert_eq!(lookup(b"cuInit"), None);
        assert_eq!(lookup(b"cuGetExportTable"), None);
        assert_eq!(lookup(b"malloc"), None);
        // Every gated base has its plain variant or its _v2 variant.
        for i in 0..NG {
            let b = info(i).base;
            assert!((0..NH).any(|j| info(j).name() == b || info(j).name() == format!("{b}_v2")));
        }
    }

    #[test]
    fn ctx_table_dedups_and_forgets() {
        crate::state::record_ctx(0x1234);
        crate::state::record_ctx(0x1234);
        crate::state::record_ctx(0x5678);
        let v = crate::state::contexts();
        assert_eq!(v.iter().filter(|&&c| c == 0x1234).count(), 1);
        assert!(v.contains(&0x5678));
        crate::state::forget_ctx(0x1234);
        assert!(!crate::state::contexts().contains(&0x1234));
    }
}
