"""Each generated kernel against the device's bandwidth (the config agent's and ``kforge
inspect``'s roofline). A pointwise or reduction kernel moves at least its arguments' bytes
(:func:`kernel_traffic`, :func:`pointer_moves`); at the device's bandwidth (the larger of a
copy's and a read's rate, :func:`device_peak`) that takes ``bytes / peak``, so its time over that
is how far it is from its roof, and ``ROOF_MARGIN / of_peak`` the most any launch configuration
can speed it up (:func:`roofline_row`). torch is imported only to measure the rates."""

from __future__ import annotations

import math
import re
from typing import Any, Dict, Iterable, Optional, Sequence, Set, Tuple

from ..bench import copy_bandwidth, median_ms
from .kernel_source import KernelSpec, kernel_arg_names, kernel_body, kernel_spec


#: The kernels the roofline speaks for: Inductor's pointwise and reduction kernels, bound by
#: device memory at the sizes it matters (a template's roof is its arithmetic, not its bytes).
ROOF_KINDS = ("pointwise", "reduction", "persistent_reduction")
#: The roof stands this far above the device's measured bandwidth: a device-to-device copy is not
#: the fastest a kernel can move bytes. On an H100 (session 33, large preset) Inductor's SiLU and
#: softmax kernels moved their least traffic at 1.022x and 1.031x a copy's rate, and an RMSNorm
#: kernel at 0.999x of it was tuned 1.017x faster by a launch configuration.
ROOF_MARGIN = 1.05
#: A kernel whose least traffic moves at this fraction of the device's measured bandwidth or more
#: is at its roof: no launch configuration makes it more than ``ROOF_MARGIN / ROOF_SKIP`` (1.029x)
#: faster, and the config agent does not tune it (at the large preset a config step costs about
#: 400 s; the session-33 kernels above: SiLU and softmax skipped, RMSNorm tuned).
ROOF_SKIP = 1.02
#: Above this fraction of the device's bandwidth the traffic estimate does not hold (data served from
#: L2, a buffer read in part): the kernel gets no roofline.
ROOF_TRUST_MAX = 1.25
#: A kernel's least traffic must be this many times the device's L2 for its roofline to hold (a
#: smaller one may never reach device memory).
ROOF_MIN_L2 = 4
#: fp32 elements of the copy and the read that measure the peak: 256 MiB each, far past any L2.
ROOF_COPY_ELEMENTS = 1 << 26
#: The parameters that are device buffers in Inductor's kernels.
POINTER_PREFIXES = ("in_ptr", "out_ptr", "in_out_ptr")


def iterations(spec: KernelSpec, arg_names: Sequence[str], args: Sequence[Any]) -> Optional[int]:
    """A kernel's iteration space: the product of its extents, the body's constants first (static
    shapes), else the ``*numel`` arguments of a launch; ``None`` when it names none."""
    extents = dict(spec.numels)
    for n, v in zip(arg_names, args):
        if n.endswith("numel") and isinstance(v, int) and not isinstance(v, bool):
            extents.setdefault(n[: -len("numel")], v)
    return math.prod(extents.values()) if extents else None


def pointer_moves(arg_names: Sequence[str], body: str) -> Dict[str, int]:
    """How many times each buffer parameter's data crosses to or from device memory at least: 1 if
    the kernel's ``body`` (:func:`kernel_body`) loads it, plus 1 if it stores it
    (``tl.load(in_out_ptr0 + …)`` and ``tl.store(in_out_ptr0 + …)``: 2). Inductor also hands a
    reused buffer as an ``in_out_ptr`` to a kernel that only stores to it (``buf4 = buf3; del buf3
    # reuse``): 1. A buffer the body names otherwise (a block pointer, an atomic) counts by its
    prefix (``in_out_ptr`` 2, the others 1); one it never names, 0."""
    moves: Dict[str, int] = {}
    for n in arg_names:
        if not n.startswith(POINTER_PREFIXES):
            continue
        loads = re.search(rf"tl\.load\(\s*{n}\b", body) is not None
        stores = re.search(rf"tl\.store\(\s*{n}\b", body) is not None
        if loads or stores:
            moves[n] = int(loads) + int(stores)
        elif re.search(rf"\b{n}\b", body):
            moves[n] = 2 if n.startswith("in_out_ptr") else 1
        else:
            moves[n] = 0
    return moves


def kernel_traffic(arg_names: Sequence[str], args: Sequence[Any], space: Optional[int],
                   moves: Optional[Dict[str, int]] = None) -> int:
    """The fewest bytes one launch moves to and from device memory: each buffer argument as many
    times as ``moves`` says (:func:`pointer_moves`; without it once, an ``in_out_ptr`` twice), and
    of each no more elements than the kernel has iterations (``space``: a kernel handed a whole
    buffer of which it reads or writes a slice moves that slice at least, never more of it per
    iteration counted here). Workspaces and scalars move nothing here."""
    total = 0
    for n, x in zip(arg_names, args):
        if not n.startswith(POINTER_PREFIXES) or not hasattr(x, "element_size"):
            continue
        times = moves.get(n, 0) if moves is not None else (2 if n.startswith("in_out_ptr") else 1)
        elements = x.numel() if space is None else min(x.numel(), space)
        total += elements * x.element_size() * times
    return total


def roofline_row(kind: str, traffic: int, launches: float, us: float, peak: Optional[float], l2: int) -> Dict[str, Any]:
    """One kernel against the device's bandwidth ``peak`` (bytes/s, :func:`device_peak`): its least
    traffic per launch (``bytes``), the rate at which what of it surely reached device memory (all
    but one L2's worth) moved (``bytes_per_s``, ``of_peak``: the fraction of ``peak``) and, where
    the estimate holds, its ``ceiling`` (the most any configuration can speed it up, at least 1),
    else ``why`` not."""
    per_launch_us = us / launches if launches > 0 else 0.0
    row: Dict[str, Any] = {"kind": kind, "bytes": traffic, "us_per_launch": round(per_launch_us, 3)}
    if kind not in ROOF_KINDS:
        row["why"] = f"a {kind} kernel: its roof is its arithmetic, not its bytes"
        return row
    if not peak or per_launch_us <= 0 or traffic <= 0:
        row["why"] = "no bandwidth measured" if not peak else "no device time or no traffic"
        return row
    # At most one L2's worth of it may have come from the cache (what the kernel before it left
    # there): only the rest surely crossed to device memory.
    row["bytes_per_s"] = max(traffic - l2, 0) / (per_launch_us / 1e6)
    row["of_peak"] = row["bytes_per_s"] / peak
    if traffic < ROOF_MIN_L2 * l2:
        row["why"] = (f"its traffic ({traffic / 1e6:.1f} MB a launch) is within {ROOF_MIN_L2}x the L2 "
                      f"({l2 / 1e6:.0f} MB): it may not reach device memory")
    elif row["of_peak"] > ROOF_TRUST_MAX:
        row["why"] = (f"{row['of_peak']:.0%} of the device's bandwidth: the traffic estimate does not hold "
                      f"(data served from L2, or a buffer read in part)")
    else:
        row["ceiling"] = max(1.0, ROOF_MARGIN / row["of_peak"])
    return row


def at_roof(row: Dict[str, Any], skip_at: float = ROOF_SKIP) -> Optional[str]:
    """Why a kernel is not tuned because it already runs at its bandwidth roof, or ``None``."""
    if row.get("ceiling") is None or row["of_peak"] < skip_at:
        return None
    return (f"at its bandwidth roof: its least traffic ({row['bytes'] / 1e9:.2f} GB a launch) moves at "
            f"{row['of_peak']:.0%} of the device's bandwidth, so no launch configuration makes it more "
            f"than {row['ceiling']:.3f}x faster")


def roofline_ceiling(device_us: Dict[str, float], triton: Iterable[str], rows: Dict[str, Dict[str, Any]]) -> Optional[float]:
    """The model's speedup if every generated kernel ran at its roof: the vendor calls and other
    device work unchanged, a kernel with a roofline at ``us / ceiling``, one without at no time at
    all (the Amdahl bound). ``None`` without device time; infinite when nothing would be left."""
    total = sum(device_us.values())
    if total <= 0:
        return None
    names = set(triton)
    left = total - sum(device_us.get(n, 0.0) for n in names)
    for n in names:
        ceiling = rows.get(n, {}).get("ceiling")
        if ceiling:
            left += device_us.get(n, 0.0) / ceiling
    return math.inf if left <= 0 else total / left


def roofline(found: Sequence[Tuple[Any, str, Any, str]], recorded: Dict[str, Dict[str, Any]],
             totals: Dict[str, Dict[str, float]], peak: Optional[float], l2: int) -> Dict[str, Dict[str, Any]]:
    """Each recorded Triton kernel of the baseline (``found``: the wrapper kernels) against the
    device's bandwidth: :func:`roofline_row` on its first launch's arguments and its profile
    (``totals``: launches and device time per call). A name that two different kernels share gets
    a row without a ceiling: its time and its recorded launch may be the other's."""
    rows: Dict[str, Dict[str, Any]] = {}
    sources: Dict[str, Set[str]] = {}
    for _m, name, _k, src in found:
        sources.setdefault(name, set()).add(src)
    for name, srcs in sources.items():
        t, rec = totals.get(name), recorded.get(name)
        if not t or rec is None:
            continue
        if len(srcs) > 1:  # the profile's time and the recorded launch may be either kernel's
            rows[name] = {"why": f"{len(srcs)} different kernels have this name (in different wrapper modules)"}
            continue
        src = next(iter(srcs))
        try:
            spec, arg_names = kernel_spec(name, src), kernel_arg_names(name, src)
            args = rec["before"]
            space = iterations(spec, arg_names, args)
            traffic = kernel_traffic(arg_names, args, space, pointer_moves(arg_names, kernel_body(name, src)))
        except Exception as e:  # a roofline is advice: a source it cannot read leaves the kernel without one
            rows[name] = {"why": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        rows[name] = roofline_row(spec.kind, traffic, t["count"], t["us"], peak, l2)
    return rows


def read_bandwidth(dev: Any, elements: int, name: str) -> float:
    """Bytes per second of a sum over ``elements`` fp32 values (a read of them): a read-heavy
    reduction may run faster than a copy, whose writes share the bus with its reads."""
    import torch

    src = torch.ones(elements, dtype=torch.float32, device=dev)
    ms = median_ms(lambda: src.sum(), name, warmup=10, rep=50)
    return elements * 4 / (ms / 1e3)


def device_peak(dev: Any, region: str = "optimize:bandwidth") -> Tuple[Dict[str, float], int, Optional[str]]:
    """The device's bandwidth as two rates (bytes/s), each timed in the region ``region``: a
    device-to-device copy's (``copy_bytes_per_s``, read + write) and a read's
    (``read_bytes_per_s``); none and why when they could not be measured. And its L2 size (bytes).
    A kernel is held against the larger (:func:`peak_of`)."""
    import torch

    l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0))
    rates: Dict[str, float] = {}
    why: Optional[str] = None
    try:
        rates["copy_bytes_per_s"] = copy_bandwidth(dev, ROOF_COPY_ELEMENTS, region)
        rates["read_bytes_per_s"] = read_bandwidth(dev, ROOF_COPY_ELEMENTS, region)
    except Exception as e:  # out of memory beside a large problem: no roofline, nothing skipped
        rates, why = {}, f"{type(e).__name__}: {str(e)[:200]}"
    torch.cuda.empty_cache()  # the measurements' memory back to the device, not held in torch's cache beside siblings
    return rates, l2, why


def peak_of(rates: Dict[str, float]) -> Optional[float]:
    """The bandwidth a kernel is held against: the larger of the measured rates (none measured: None)."""
    return max(rates.values()) if rates else None


def roofline_summary(us: Dict[str, float], names: Sequence[str], rows: Dict[str, Dict[str, Any]],
                     rates: Dict[str, float], l2: int, why: Optional[str]) -> Dict[str, Any]:
    """A result's ``roofline``: the bandwidth the kernels were held against (``peak_bytes_per_s``)
    and the rates it is the larger of, the L2, the kernels' rows and the model's ceiling (``None``
    when unknown or unbounded: JSON has no infinity, and the reports read a number or nothing)."""
    peak = peak_of(rates)
    ceiling = roofline_ceiling(us, names, rows) if peak else None
    out: Dict[str, Any] = {"peak_bytes_per_s": peak, **rates, "l2_bytes": l2, "kernels": rows,
                           "ceiling": ceiling if ceiling is not None and math.isfinite(ceiling) else None}
    if why:
        out["why"] = f"no bandwidth measured: {why}"
    return out
