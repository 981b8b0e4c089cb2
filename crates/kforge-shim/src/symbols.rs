// The single list of gated CUDA driver entry points.
//
// This file is `include!`d by the shim (wrappers, name tables, dlsym and
// cuGetProcAddress redirection), by the fake libcuda (one recording export
// per entry) and by the shim's test driver and integration tests (the
// consistency test). Keep it free of `use` items and `//!` comments so it can
// be included anywhere.
//
// Each entry: `exported_name => base_name, kind, (arg: Type, ...);`
// * `exported_name` is the ELF symbol exported by libcuda (one ABI variant).
// * `base_name` is the name a caller passes to `cuGetProcAddress`; all
//   entries sharing a base are the variants of that entry point
//   (`X`, `X_v2`, `X_ptsz`, `X_ptds`, `X_v2_ptsz`, `X_v2_ptds`, ...).
// * `kind`: `launch` (a kernel or graph launch: counted by
//   `kforge_shim_launch_count`), `host` (host function enqueue), `copy`,
//   `set`, `prefetch`.
// * The argument list is the exact C signature of that variant; every entry
//   returns `CUresult`.

/// `CUresult` (an `int`-sized enum).
#[allow(non_camel_case_types, dead_code)]
pub type CUresult = ::std::os::raw::c_int;
/// `CUdeviceptr` of the `_v2` ABI (`unsigned long long`).
#[allow(non_camel_case_types, dead_code)]
pub type CUdeviceptr = u64;
/// `CUdeviceptr_v1` (`unsigned int`), used by the pre-3.2 ABI variants.
#[allow(non_camel_case_types, dead_code)]
pub type CUdeviceptr_v1 = ::std::os::raw::c_uint;
/// Any opaque driver handle (`CUstream`, `CUfunction`, `CUarray`,
/// `CUgraphExec`, `CUcontext`) or mutable pointer argument.
#[allow(dead_code)]
pub type Handle = *mut ::std::os::raw::c_void;
/// A `const void *` / `const STRUCT *` argument.
#[allow(dead_code)]
pub type CPtr = *const ::std::os::raw::c_void;
/// `void **` (kernel parameter and `extra` arrays).
#[allow(dead_code)]
pub type PPtr = *mut *mut ::std::os::raw::c_void;
/// `CUmemLocation`, passed by value to `cuMemPrefetchAsync_v2`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[allow(non_camel_case_types, dead_code)]
pub struct CUmemLocation {
    /// `CUmemLocationType`.
    pub type_: ::std::os::raw::c_int,
    /// Device ordinal / NUMA node.
    pub id: ::std::os::raw::c_int,
}

/// Invokes `$cb! { entries }` with the table of gated symbols (see the
/// comment at the top of `symbols.rs` for the entry syntax).
#[allow(unused_macros)]
macro_rules! gated_symbols {
    ($cb:ident) => {
        $cb! {
            // ---- kernel launches ------------------------------------------------
            cuLaunchKernel => cuLaunchKernel, launch, (f: Handle, gx: ::std::os::raw::c_uint, gy: ::std::os::raw::c_uint, gz: ::std::os::raw::c_uint, bx: ::std::os::raw::c_uint, by: ::std::os::raw::c_uint, bz: ::std::os::raw::c_uint, shmem: ::std::os::raw::c_uint, stream: Handle, params: PPtr, extra: PPtr);
            cuLaunchKernel_ptsz => cuLaunchKernel, launch, (f: Handle, gx: ::std::os::raw::c_uint, gy: ::std::os::raw::c_uint, gz: ::std::os::raw::c_uint, bx: ::std::os::raw::c_uint, by: ::std::os::raw::c_uint, bz: ::std::os::raw::c_uint, shmem: ::std::os::raw::c_uint, stream: Handle, params: PPtr, extra: PPtr);
            cuLaunchKernelEx => cuLaunchKernelEx, launch, (config: CPtr, f: Handle, params: PPtr, extra: PPtr);
            cuLaunchKernelEx_ptsz => cuLaunchKernelEx, launch, (config: CPtr, f: Handle, params: PPtr, extra: PPtr);
            cuLaunchCooperativeKernel => cuLaunchCooperativeKernel, launch, (f: Handle, gx: ::std::os::raw::c_uint, gy: ::std::os::raw::c_uint, gz: ::std::os::raw::c_uint, bx: ::std::os::raw::c_uint, by: ::std::os::raw::c_uint, bz: ::std::os::raw::c_uint, shmem: ::std::os::raw::c_uint, stream: Handle, params: PPtr);
            cuLaunchCooperativeKernel_ptsz => cuLaunchCooperativeKernel, launch, (f: Handle, gx: ::std::os::raw::c_uint, gy: ::std::os::raw::c_uint, gz: ::std::os::raw::c_uint, bx: ::std::os::raw::c_uint, by: ::std::os::raw::c_uint, bz: ::std::os::raw::c_uint, shmem: ::std::os::raw::c_uint, stream: Handle, params: PPtr);
            cuLaunchCooperativeKernelMultiDevice => cuLaunchCooperativeKernelMultiDevice, launch, (list: Handle, num_devices: ::std::os::raw::c_uint, flags: ::std::os::raw::c_uint);
            cuLaunch => cuLaunch, launch, (f: Handle);
            cuLaunchGrid => cuLaunchGrid, launch, (f: Handle, w: ::std::os::raw::c_int, h: ::std::os::raw::c_int);
            cuLaunchGridAsync => cuLaunchGridAsync, launch, (f: Handle, w: ::std::os::raw::c_int, h: ::std::os::raw::c_int, stream: Handle);
            cuGraphLaunch => cuGraphLaunch, launch, (exec: Handle, stream: Handle);
            cuGraphLaunch_ptsz => cuGraphLaunch, launch, (exec: Handle, stream: Handle);
            cuLaunchHostFunc => cuLaunchHostFunc, host, (stream: Handle, func: Handle, user: Handle);
            cuLaunchHostFunc_ptsz => cuLaunchHostFunc, host, (stream: Handle, func: Handle, user: Handle);

            // ---- copies: pre-3.2 ABI (32-bit CUdeviceptr_v1, unsigned int sizes)
            cuMemcpyHtoD => cuMemcpyHtoD, copy, (dst: CUdeviceptr_v1, src: CPtr, n: ::std::os::raw::c_uint);
            cuMemcpyDtoH => cuMemcpyDtoH, copy, (dst: Handle, src: CUdeviceptr_v1, n: ::std::os::raw::c_uint);
            cuMemcpyDtoD => cuMemcpyDtoD, copy, (dst: CUdeviceptr_v1, src: CUdeviceptr_v1, n: ::std::os::raw::c_uint);
            cuMemcpyDtoA => cuMemcpyDtoA, copy, (dst: Handle, off: ::std::os::raw::c_uint, src: CUdeviceptr_v1, n: ::std::os::raw::c_uint);
            cuMemcpyAtoD => cuMemcpyAtoD, copy, (dst: CUdeviceptr_v1, src: Handle, off: ::std::os::raw::c_uint, n: ::std::os::raw::c_uint);
            cuMemcpyHtoA => cuMemcpyHtoA, copy, (dst: Handle, off: ::std::os::raw::c_uint, src: CPtr, n: ::std::os::raw::c_uint);
            cuMemcpyAtoH => cuMemcpyAtoH, copy, (dst: Handle, src: Handle, off: ::std::os::raw::c_uint, n: ::std::os::raw::c_uint);
            cuMemcpyAtoA => cuMemcpyAtoA, copy, (dst: Handle, doff: ::std::os::raw::c_uint, src: Handle, soff: ::std::os::raw::c_uint, n: ::std::os::raw::c_uint);
            cuMemcpy2D => cuMemcpy2D, copy, (p: CPtr);
            cuMemcpy2DUnaligned => cuMemcpy2DUnaligned, copy, (p: CPtr);
            cuMemcpy3D => cuMemcpy3D, copy, (p: CPtr);
            cuMemcpyHtoDAsync => cuMemcpyHtoDAsync, copy, (dst: CUdeviceptr_v1, src: CPtr, n: ::std::os::raw::c_uint, stream: Handle);
            cuMemcpyDtoHAsync => cuMemcpyDtoHAsync, copy, (dst: Handle, src: CUdeviceptr_v1, n: ::std::os::raw::c_uint, stream: Handle);
            cuMemcpyDtoDAsync => cuMemcpyDtoDAsync, copy, (dst: CUdeviceptr_v1, src: CUdeviceptr_v1, n: ::std::os::raw::c_uint, stream: Handle);
            cuMemcpyHtoAAsync => cuMemcpyHtoAAsync, copy, (dst: Handle, off: ::std::os::raw::c_uint, src: CPtr, n: ::std::os::raw::c_uint, stream: Handle);
            cuMemcpyAtoHAsync => cuMemcpyAtoHAsync, copy, (dst: Handle, src: Handle, off: ::std::os::raw::c_uint, n: ::std::os::raw::c_uint, stream: Handle);
            cuMemcpy2DAsync => cuMemcpy2DAsync, copy, (p: CPtr, stream: Handle);
            cuMemcpy3DAsync => cuMemcpy3DAsync, copy, (p: CPtr, stream: Handle);

            // ---- copies: _v2 ABI (64-bit CUdeviceptr, size_t) and per-thread forms
            cuMemcpyHtoD_v2 => cuMemcpyHtoD, copy, (dst: CUdeviceptr, src: CPtr, n: usize);
            cuMemcpyHtoD_v2_ptds => cuMemcpyHtoD, copy, (dst: CUdeviceptr, src: CPtr, n: usize);
            cuMemcpyDtoH_v2 => cuMemcpyDtoH, copy, (dst: Handle, src: CUdeviceptr, n: usize);
            cuMemcpyDtoH_v2_ptds => cuMemcpyDtoH, copy, (dst: Handle, src: CUdeviceptr, n: usize);
            cuMemcpyDtoD_v2 => cuMemcpyDtoD, copy, (dst: CUdeviceptr, src: CUdeviceptr, n: usize);
            cuMemcpyDtoD_v2_ptds => cuMemcpyDtoD, copy, (dst: CUdeviceptr, src: CUdeviceptr, n: usize);
            cuMemcpyDtoA_v2 => cuMemcpyDtoA, copy, (dst: Handle, off: usize, src: CUdeviceptr, n: usize);
            cuMemcpyDtoA_v2_ptds => cuMemcpyDtoA, copy, (dst: Handle, off: usize, src: CUdeviceptr, n: usize);
            cuMemcpyAtoD_v2 => cuMemcpyAtoD, copy, (dst: CUdeviceptr, src: Handle, off: usize, n: usize);
            cuMemcpyAtoD_v2_ptds => cuMemcpyAtoD, copy, (dst: CUdeviceptr, src: Handle, off: usize, n: usize);
            cuMemcpyHtoA_v2 => cuMemcpyHtoA, copy, (dst: Handle, off: usize, src: CPtr, n: usize);
            cuMemcpyHtoA_v2_ptds => cuMemcpyHtoA, copy, (dst: Handle, off: usize, src: CPtr, n: usize);
            cuMemcpyAtoH_v2 => cuMemcpyAtoH, copy, (dst: Handle, src: Handle, off: usize, n: usize);
            cuMemcpyAtoH_v2_ptds => cuMemcpyAtoH, copy, (dst: Handle, src: Handle, off: usize, n: usize);
            cuMemcpyAtoA_v2 => cuMemcpyAtoA, copy, (dst: Handle, doff: usize, src: Handle, soff: usize, n: usize);
            cuMemcpyAtoA_v2_ptds => cuMemcpyAtoA, copy, (dst: Handle, doff: usize, src: Handle, soff: usize, n: usize);
            cuMemcpy2D_v2 => cuMemcpy2D, copy, (p: CPtr);
            cuMemcpy2D_v2_ptds => cuMemcpy2D, copy, (p: CPtr);
            cuMemcpy2DUnaligned_v2 => cuMemcpy2DUnaligned, copy, (p: CPtr);
            cuMemcpy2DUnaligned_v2_ptds => cuMemcpy2DUnaligned, copy, (p: CPtr);
            cuMemcpy3D_v2 => cuMemcpy3D, copy, (p: CPtr);
            cuMemcpy3D_v2_ptds => cuMemcpy3D, copy, (p: CPtr);
            cuMemcpyHtoDAsync_v2 => cuMemcpyHtoDAsync, copy, (dst: CUdeviceptr, src: CPtr, n: usize, stream: Handle);
            cuMemcpyHtoDAsync_v2_ptsz => cuMemcpyHtoDAsync, copy, (dst: CUdeviceptr, src: CPtr, n: usize, stream: Handle);
            cuMemcpyDtoHAsync_v2 => cuMemcpyDtoHAsync, copy, (dst: Handle, src: CUdeviceptr, n: usize, stream: Handle);
            cuMemcpyDtoHAsync_v2_ptsz => cuMemcpyDtoHAsync, copy, (dst: Handle, src: CUdeviceptr, n: usize, stream: Handle);
            cuMemcpyDtoDAsync_v2 => cuMemcpyDtoDAsync, copy, (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: Handle);
            cuMemcpyDtoDAsync_v2_ptsz => cuMemcpyDtoDAsync, copy, (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: Handle);
            cuMemcpyHtoAAsync_v2 => cuMemcpyHtoAAsync, copy, (dst: Handle, off: usize, src: CPtr, n: usize, stream: Handle);
            cuMemcpyHtoAAsync_v2_ptsz => cuMemcpyHtoAAsync, copy, (dst: Handle, off: usize, src: CPtr, n: usize, stream: Handle);
            cuMemcpyAtoHAsync_v2 => cuMemcpyAtoHAsync, copy, (dst: Handle, src: Handle, off: usize, n: usize, stream: Handle);
            cuMemcpyAtoHAsync_v2_ptsz => cuMemcpyAtoHAsync, copy, (dst: Handle, src: Handle, off: usize, n: usize, stream: Handle);
            cuMemcpy2DAsync_v2 => cuMemcpy2DAsync, copy, (p: CPtr, stream: Handle);
            cuMemcpy2DAsync_v2_ptsz => cuMemcpy2DAsync, copy, (p: CPtr, stream: Handle);
            cuMemcpy3DAsync_v2 => cuMemcpy3DAsync, copy, (p: CPtr, stream: Handle);
            cuMemcpy3DAsync_v2_ptsz => cuMemcpy3DAsync, copy, (p: CPtr, stream: Handle);

            // ---- copies: unified addressing, peer, batch
            cuMemcpy => cuMemcpy, copy, (dst: CUdeviceptr, src: CUdeviceptr, n: usize);
            cuMemcpy_ptds => cuMemcpy, copy, (dst: CUdeviceptr, src: CUdeviceptr, n: usize);
            cuMemcpyAsync => cuMemcpyAsync, copy, (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: Handle);
            cuMemcpyAsync_ptsz => cuMemcpyAsync, copy, (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: Handle);
            cuMemcpyPeer => cuMemcpyPeer, copy, (dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, n: usize);
            cuMemcpyPeer_ptds => cuMemcpyPeer, copy, (dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, n: usize);
            cuMemcpyPeerAsync => cuMemcpyPeerAsync, copy, (dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, n: usize, stream: Handle);
            cuMemcpyPeerAsync_ptsz => cuMemcpyPeerAsync, copy, (dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, n: usize, stream: Handle);
            cuMemcpy3DPeer => cuMemcpy3DPeer, copy, (p: CPtr);
            cuMemcpy3DPeer_ptds => cuMemcpy3DPeer, copy, (p: CPtr);
            cuMemcpy3DPeerAsync => cuMemcpy3DPeerAsync, copy, (p: CPtr, stream: Handle);
            cuMemcpy3DPeerAsync_ptsz => cuMemcpy3DPeerAsync, copy, (p: CPtr, stream: Handle);
            cuMemcpyBatchAsync => cuMemcpyBatchAsync, copy, (dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: Handle, attrs_idxs: *mut usize, num_attrs: usize, fail_idx: *mut usize, stream: Handle);
            cuMemcpyBatchAsync_ptsz => cuMemcpyBatchAsync, copy, (dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: Handle, attrs_idxs: *mut usize, num_attrs: usize, fail_idx: *mut usize, stream: Handle);
            cuMemcpyBatchAsync_v2 => cuMemcpyBatchAsync, copy, (dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: Handle, attrs_idxs: *mut usize, num_attrs: usize, stream: Handle);
            cuMemcpyBatchAsync_v2_ptsz => cuMemcpyBatchAsync, copy, (dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: Handle, attrs_idxs: *mut usize, num_attrs: usize, stream: Handle);
            cuMemcpy3DBatchAsync => cuMemcpy3DBatchAsync, copy, (num_ops: usize, ops: Handle, fail_idx: *mut usize, flags: u64, stream: Handle);
            cuMemcpy3DBatchAsync_ptsz => cuMemcpy3DBatchAsync, copy, (num_ops: usize, ops: Handle, fail_idx: *mut usize, flags: u64, stream: Handle);
            cuMemcpy3DBatchAsync_v2 => cuMemcpy3DBatchAsync, copy, (num_ops: usize, ops: Handle, flags: u64, stream: Handle);
            cuMemcpy3DBatchAsync_v2_ptsz => cuMemcpy3DBatchAsync, copy, (num_ops: usize, ops: Handle, flags: u64, stream: Handle);

            // ---- memsets: pre-3.2 ABI
            cuMemsetD8 => cuMemsetD8, set, (dst: CUdeviceptr_v1, v: ::std::os::raw::c_uchar, n: ::std::os::raw::c_uint);
            cuMemsetD16 => cuMemsetD16, set, (dst: CUdeviceptr_v1, v: ::std::os::raw::c_ushort, n: ::std::os::raw::c_uint);
            cuMemsetD32 => cuMemsetD32, set, (dst: CUdeviceptr_v1, v: ::std::os::raw::c_uint, n: ::std::os::raw::c_uint);
            cuMemsetD2D8 => cuMemsetD2D8, set, (dst: CUdeviceptr_v1, pitch: ::std::os::raw::c_uint, v: ::std::os::raw::c_uchar, w: ::std::os::raw::c_uint, h: ::std::os::raw::c_uint);
            cuMemsetD2D16 => cuMemsetD2D16, set, (dst: CUdeviceptr_v1, pitch: ::std::os::raw::c_uint, v: ::std::os::raw::c_ushort, w: ::std::os::raw::c_uint, h: ::std::os::raw::c_uint);
            cuMemsetD2D32 => cuMemsetD2D32, set, (dst: CUdeviceptr_v1, pitch: ::std::os::raw::c_uint, v: ::std::os::raw::c_uint, w: ::std::os::raw::c_uint, h: ::std::os::raw::c_uint);
            // ---- memsets: _v2 ABI and per-thread forms
            cuMemsetD8_v2 => cuMemsetD8, set, (dst: CUdeviceptr, v: ::std::os::raw::c_uchar, n: usize);
            cuMemsetD8_v2_ptds => cuMemsetD8, set, (dst: CUdeviceptr, v: ::std::os::raw::c_uchar, n: usize);
            cuMemsetD16_v2 => cuMemsetD16, set, (dst: CUdeviceptr, v: ::std::os::raw::c_ushort, n: usize);
            cuMemsetD16_v2_ptds => cuMemsetD16, set, (dst: CUdeviceptr, v: ::std::os::raw::c_ushort, n: usize);
            cuMemsetD32_v2 => cuMemsetD32, set, (dst: CUdeviceptr, v: ::std::os::raw::c_uint, n: usize);
            cuMemsetD32_v2_ptds => cuMemsetD32, set, (dst: CUdeviceptr, v: ::std::os::raw::c_uint, n: usize);
            cuMemsetD2D8_v2 => cuMemsetD2D8, set, (dst: CUdeviceptr, pitch: usize, v: ::std::os::raw::c_uchar, w: usize, h: usize);
            cuMemsetD2D8_v2_ptds => cuMemsetD2D8, set, (dst: CUdeviceptr, pitch: usize, v: ::std::os::raw::c_uchar, w: usize, h: usize);
            cuMemsetD2D16_v2 => cuMemsetD2D16, set, (dst: CUdeviceptr, pitch: usize, v: ::std::os::raw::c_ushort, w: usize, h: usize);
            cuMemsetD2D16_v2_ptds => cuMemsetD2D16, set, (dst: CUdeviceptr, pitch: usize, v: ::std::os::raw::c_ushort, w: usize, h: usize);
            cuMemsetD2D32_v2 => cuMemsetD2D32, set, (dst: CUdeviceptr, pitch: usize, v: ::std::os::raw::c_uint, w: usize, h: usize);
            cuMemsetD2D32_v2_ptds => cuMemsetD2D32, set, (dst: CUdeviceptr, pitch: usize, v: ::std::os::raw::c_uint, w: usize, h: usize);
            cuMemsetD8Async => cuMemsetD8Async, set, (dst: CUdeviceptr, v: ::std::os::raw::c_uchar, n: usize, stream: Handle);
            cuMemsetD8Async_ptsz => cuMemsetD8Async, set, (dst: CUdeviceptr, v: ::std::os::raw::c_uchar, n: usize, stream: Handle);
            cuMemsetD16Async => cuMemsetD16Async, set, (dst: CUdeviceptr, v: ::std::os::raw::c_ushort, n: usize, stream: Handle);
            cuMemsetD16Async_ptsz => cuMemsetD16Async, set, (dst: CUdeviceptr, v: ::std::os::raw::c_ushort, n: usize, stream: Handle);
            cuMemsetD32Async => cuMemsetD32Async, set, (dst: CUdeviceptr, v: ::std::os::raw::c_uint, n: usize, stream: Handle);
            cuMemsetD32Async_ptsz => cuMemsetD32Async, set, (dst: CUdeviceptr, v: ::std::os::raw::c_uint, n: usize, stream: Handle);
            cuMemsetD2D8Async => cuMemsetD2D8Async, set, (dst: CUdeviceptr, pitch: usize, v: ::std::os::raw::c_uchar, w: usize, h: usize, stream: Handle);
            cuMemsetD2D8Async_ptsz => cuMemsetD2D8Async, set, (dst: CUdeviceptr, pitch: usize, v: ::std::os::raw::c_uchar, w: usize, h: usize, stream: Handle);
            cuMemsetD2D16Async => cuMemsetD2D16Async, set, (dst: CUdeviceptr, pitch: usize, v: ::std::os::raw::c_ushort, w: usize, h: usize, stream: Handle);
            cuMemsetD2D16Async_ptsz => cuMemsetD2D16Async, set, (dst: CUdeviceptr, pitch: usize, v: ::std::os::raw::c_ushort, w: usize, h: usize, stream: Handle);
            cuMemsetD2D32Async => cuMemsetD2D32Async, set, (dst: CUdeviceptr, pitch: usize, v: ::std::os::raw::c_uint, w: usize, h: usize, stream: Handle);
            cuMemsetD2D32Async_ptsz => cuMemsetD2D32Async, set, (dst: CUdeviceptr, pitch: usize, v: ::std::os::raw::c_uint, w: usize, h: usize, stream: Handle);

            // ---- prefetches
            cuMemPrefetchAsync => cuMemPrefetchAsync, prefetch, (dptr: CUdeviceptr, count: usize, dst_device: ::std::os::raw::c_int, stream: Handle);
            cuMemPrefetchAsync_ptsz => cuMemPrefetchAsync, prefetch, (dptr: CUdeviceptr, count: usize, dst_device: ::std::os::raw::c_int, stream: Handle);
            cuMemPrefetchAsync_v2 => cuMemPrefetchAsync, prefetch, (dptr: CUdeviceptr, count: usize, location: CUmemLocation, flags: ::std::os::raw::c_uint, stream: Handle);
            cuMemPrefetchAsync_v2_ptsz => cuMemPrefetchAsync, prefetch, (dptr: CUdeviceptr, count: usize, location: CUmemLocation, flags: ::std::os::raw::c_uint, stream: Handle);
            // CUDA 13 batch prefetch / discard (signatures checked against CUDA 13.0's cuda.h on the H200)
            cuMemPrefetchBatchAsync => cuMemPrefetchBatchAsync, prefetch, (dptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, locs: *mut CUmemLocation, loc_idxs: *mut usize, num_locs: usize, flags: u64, stream: Handle);
            cuMemPrefetchBatchAsync_ptsz => cuMemPrefetchBatchAsync, prefetch, (dptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, locs: *mut CUmemLocation, loc_idxs: *mut usize, num_locs: usize, flags: u64, stream: Handle);
            cuMemDiscardBatchAsync => cuMemDiscardBatchAsync, prefetch, (dptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, flags: u64, stream: Handle);
            cuMemDiscardBatchAsync_ptsz => cuMemDiscardBatchAsync, prefetch, (dptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, flags: u64, stream: Handle);
            cuMemDiscardAndPrefetchBatchAsync => cuMemDiscardAndPrefetchBatchAsync, prefetch, (dptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, locs: *mut CUmemLocation, loc_idxs: *mut usize, num_locs: usize, flags: u64, stream: Handle);
            cuMemDiscardAndPrefetchBatchAsync_ptsz => cuMemDiscardAndPrefetchBatchAsync, prefetch, (dptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, locs: *mut CUmemLocation, loc_idxs: *mut usize, num_locs: usize, flags: u64, stream: Handle);
        }
    };
}

/// Invokes `$cb! { names }` with the list of *observed* (not gated) entry
/// points the shim also wraps and redirects: context creation/selection
/// (recorded for draining) and `cuGetProcAddress` itself. Same syntax as
/// `gated_symbols!` but with the kind `observe`; their wrappers are
/// hand-written in the shim.
#[allow(unused_macros)]
macro_rules! observed_symbols {
    ($cb:ident) => {
        $cb! {
            cuGetProcAddress => cuGetProcAddress, observe, (symbol: *const ::std::os::raw::c_char, pfn: *mut *mut ::std::os::raw::c_void, cuda_version: ::std::os::raw::c_int, flags: u64);
            cuGetProcAddress_v2 => cuGetProcAddress, observe, (symbol: *const ::std::os::raw::c_char, pfn: *mut *mut ::std::os::raw::c_void, cuda_version: ::std::os::raw::c_int, flags: u64, status: *mut ::std::os::raw::c_int);
            cuDevicePrimaryCtxRetain => cuDevicePrimaryCtxRetain, observe, (pctx: *mut Handle, dev: ::std::os::raw::c_int);
            cuCtxCreate => cuCtxCreate, observe, (pctx: *mut Handle, flags: ::std::os::raw::c_uint, dev: ::std::os::raw::c_int);
            cuCtxCreate_v2 => cuCtxCreate, observe, (pctx: *mut Handle, flags: ::std::os::raw::c_uint, dev: ::std::os::raw::c_int);
            cuCtxCreate_v3 => cuCtxCreate, observe, (pctx: *mut Handle, params: Handle, num_params: ::std::os::raw::c_int, flags: ::std::os::raw::c_uint, dev: ::std::os::raw::c_int);
            cuCtxCreate_v4 => cuCtxCreate, observe, (pctx: *mut Handle, params: Handle, flags: ::std::os::raw::c_uint, dev: ::std::os::raw::c_int);
            cuCtxSetCurrent => cuCtxSetCurrent, observe, (ctx: Handle);
            cuCtxPushCurrent => cuCtxPushCurrent, observe, (ctx: Handle);
            cuCtxPushCurrent_v2 => cuCtxPushCurrent, observe, (ctx: Handle);
            cuCtxDestroy => cuCtxDestroy, observe, (ctx: Handle);
            cuCtxDestroy_v2 => cuCtxDestroy, observe, (ctx: Handle);
        }
    };
}

/// Expands to a `&'static [(&str, &str, &str)]` of
/// `(exported_name, base_name, kind)`, in table order.
#[allow(unused_macros)]
macro_rules! symbol_name_table {
    ($($name:ident => $base:ident, $kind:ident, ($($arg:ident : $ty:ty),* $(,)?);)*) => {
        &[$((stringify!($name), stringify!($base), stringify!($kind))),*]
    };
}
