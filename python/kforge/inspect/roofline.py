"""Each generated kernel against the device's copy bandwidth (the config agent's and ``kforge
inspect``'s roofline). A pointwise or reduction kernel moves at least its arguments' bytes
(:func:`kernel_traffic`); at the copy bandwidth that takes ``bytes / peak``, so its time over that
is how far it is from its roof, and ``1 / of_peak`` the most any launch configuration can speed it
up (:func:`roofline_row`). torch is imported only to measure the peak (:func:`device_peak`)."""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

from ..bench import copy_bandwidth
from .kernel_source import KernelSpec, kernel_arg_names, kernel_spec


#: The kernels the roofline speaks for: Inductor's pointwise and reduction kernels, bound by
#: device memory at the sizes it matters (a template's roof is its arithmetic, not its bytes).
ROOF_KINDS = ("pointwise", "reduction", "persistent_reduction")
#: A kernel whose least traffic moves at this fraction of the device's copy bandwidth or more is at
#: its roof: no launch configuration makes it more than ``1 / ROOF_SKIP`` (1.053x) faster, and the
#: config agent does not tune it (at the large preset a config step costs about 400 s, and the
#: campaigns' config wins on bandwidth-bound level-1 problems were 1.001-1.015x).
ROOF_SKIP = 0.95
#: Above this fraction of the copy bandwidth the traffic estimate does not hold (data served from
#: L2, a buffer read in part): the kernel gets no roofline.
ROOF_TRUST_MAX = 1.25
#: A kernel's least traffic must be this many times the device's L2 for its roofline to hold (a
#: smaller one may never reach device memory).
ROOF_MIN_L2 = 4
#: fp32 elements of the copy that measures the peak: 256 MiB each way, far past any L2.
ROOF_COPY_ELEMENTS = 1 << 26


def iterations(spec: KernelSpec, arg_names: Sequence[str], args: Sequence[Any]) -> Optional[int]:
    """A kernel's iteration space: the product of its extents, the body's constants first (static
    shapes), else the ``*numel`` arguments of a launch; ``None`` when it names none."""
    extents = dict(spec.numels)
    for n, v in zip(arg_names, args):
        if n.endswith("numel") and isinstance(v, int) and not isinstance(v, bool):
            extents.setdefault(n[: -len("numel")], v)
    return math.prod(extents.values()) if extents else None


def kernel_traffic(arg_names: Sequence[str], args: Sequence[Any], space: Optional[int]) -> int:
    """The fewest bytes one launch moves to and from device memory: every tensor argument once, an
    ``in_out_ptr`` twice (read, then written), and of each no more elements than the kernel has
    iterations (``space``: a kernel handed a whole buffer of which it reads or writes a slice, as
    Inductor's own estimate caps it). Workspaces and scalars move nothing here."""
    total = 0
    for n, x in zip(arg_names, args):
        if not n.startswith(("in_ptr", "out_ptr", "in_out_ptr")) or not hasattr(x, "element_size"):
            continue
        elements = x.numel() if space is None else min(x.numel(), space)
        total += elements * x.element_size() * (2 if n.startswith("in_out_ptr") else 1)
    return total


def roofline_row(kind: str, traffic: int, launches: float, us: float, peak: Optional[float], l2: int) -> Dict[str, Any]:
    """One kernel against the copy bandwidth ``peak`` (bytes/s): its least traffic per launch
    (``bytes``), the rate that moves it at (``of_peak``: the fraction of ``peak``) and, where the
    estimate holds, its ``ceiling`` (the most any configuration can speed it up, at least 1), else
    ``why`` not."""
    per_launch_us = us / launches if launches > 0 else 0.0
    row: Dict[str, Any] = {"kind": kind, "bytes": traffic, "us_per_launch": round(per_launch_us, 3)}
    if kind not in ROOF_KINDS:
        row["why"] = f"a {kind} kernel: its roof is its arithmetic, not its bytes"
        return row
    if not peak or per_launch_us <= 0 or traffic <= 0:
        row["why"] = "no copy bandwidth measured" if not peak else "no device time or no traffic"
        return row
    row["bytes_per_s"] = traffic / (per_launch_us / 1e6)
    row["of_peak"] = row["bytes_per_s"] / peak
    if traffic < ROOF_MIN_L2 * l2:
        row["why"] = (f"its traffic ({traffic / 1e6:.1f} MB a launch) is within {ROOF_MIN_L2}x the L2 "
                      f"({l2 / 1e6:.0f} MB): it may not reach device memory")
    elif row["of_peak"] > ROOF_TRUST_MAX:
        row["why"] = (f"{row['of_peak']:.0%} of the copy bandwidth: the traffic estimate does not hold "
                      f"(data served from L2, or a buffer read in part)")
    else:
        row["ceiling"] = max(1.0, 1.0 / row["of_peak"])
    return row


def at_roof(row: Dict[str, Any], skip_at: float = ROOF_SKIP) -> Optional[str]:
    """Why a kernel is not tuned because it already runs at its bandwidth roof, or ``None``."""
    if row.get("ceiling") is None or row["of_peak"] < skip_at:
        return None
    return (f"at its bandwidth roof: its least traffic ({row['bytes'] / 1e9:.2f} GB a launch) moves at "
            f"{row['of_peak']:.0%} of the device's copy bandwidth, so no launch configuration makes it more "
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
    copy bandwidth: :func:`roofline_row` on its first launch's arguments and its profile
    (``totals``: launches and device time per call)."""
    rows: Dict[str, Dict[str, Any]] = {}
    for _m, name, _k, src in found:
        t, rec = totals.get(name), recorded.get(name)
        if not t or rec is None or name in rows:
            continue
        try:
            spec, arg_names = kernel_spec(name, src), kernel_arg_names(name, src)
            args = rec["before"]
            traffic = kernel_traffic(arg_names, args, iterations(spec, arg_names, args))
        except Exception as e:  # a roofline is advice: a source it cannot read leaves the kernel without one
            rows[name] = {"why": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        rows[name] = roofline_row(spec.kind, traffic, t["count"], t["us"], peak, l2)
    return rows


def device_peak(dev: Any, region: str = "optimize:copy-bandwidth") -> Tuple[Optional[float], int, Optional[str]]:
    """The device's copy bandwidth (bytes/s, timed in the region ``region``; ``None`` and why when
    it could not be measured) and its L2 size (bytes)."""
    import torch

    l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0))
    peak: Optional[float] = None
    why: Optional[str] = None
    try:
        peak = copy_bandwidth(dev, ROOF_COPY_ELEMENTS, region)
    except Exception as e:  # out of memory beside a large problem: no roofline, nothing skipped
        why = f"{type(e).__name__}: {str(e)[:200]}"
    torch.cuda.empty_cache()  # the copy's 512 MiB back to the device, not held in torch's cache beside siblings
    return peak, l2, why


def roofline_summary(us: Dict[str, float], names: Sequence[str], rows: Dict[str, Dict[str, Any]],
                     peak: Optional[float], l2: int, why: Optional[str]) -> Dict[str, Any]:
    """A result's ``roofline``: the peak it was measured against, the L2, the kernels' rows and
    the model's ceiling (``None`` when unknown or unbounded: JSON has no infinity, and the reports
    read a number or nothing)."""
    ceiling = roofline_ceiling(us, names, rows) if peak else None
    out: Dict[str, Any] = {"copy_bytes_per_s": peak, "l2_bytes": l2, "kernels": rows,
                           "ceiling": ceiling if ceiling is not None and math.isfinite(ceiling) else None}
    if why:
        out["why"] = f"no copy bandwidth measured: {why}"
    return out
