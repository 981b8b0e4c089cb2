"""The program ``kforge profile`` runs under Nsight Compute (runs on a GPU).

``python3 -m kforge.inspect.profile SOURCE.py [--mode default] [--size default] [--forwards 1]
[--peaks-out PEAKS.json]``

Compiles the KernelBench-format problem SOURCE with ``torch.compile`` (the mode given; static
shapes, as ``kforge inspect`` does) -- or takes a standalone Triton kernel file's
``kernel_function`` on its ``get_inputs()`` -- runs it three times so that compilation,
autotuning and CUDA-graph recording are done, then runs ``--forwards`` forwards inside the NVTX range
``kforge-profile`` (``kforge_ncu::RANGE``): ncu, started with ``--nvtx-include kforge-profile/``,
profiles only the kernels launched there. The range is also a kforge region
(``profile:forward``), exclusive when the program is a job of the daemon: ncu's replays then
see no other job's kernels. With ``--peaks-out`` it then frees the model and measures the
device's copy bandwidth (a 1 GiB device-to-device copy, in the region ``verify:copy-bandwidth``,
outside the NVTX range) and writes
``{"copy_bytes_per_s": …}`` there (``kforge_ncu::Peaks``): achieved DRAM bandwidth is shown
against it.

Bad input gives one line on stderr naming the file and the cause, and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Optional, Sequence, Tuple

from ..bench import copy_bandwidth
from ..harness import SIZES, to_device
from ..region import region
from .capture import MODES, load_sized
from .inductor import CaptureError
from .restitch import compile_problem

#: The NVTX range the profiled forwards run in (kforge_ncu::RANGE).
RANGE = "kforge-profile"
#: Forwards run before the range: compile, autotune, record CUDA graphs.
WARMUP = 3


def write_peaks(out: str, dev: Any) -> None:
    """The copy peak, measured after the profiled range; a failure is reported, not raised (the
    profile stands without it)."""
    try:
        # copy_bandwidth times inside its own region (verify:copy-bandwidth): regions do not nest.
        peaks = {"copy_bytes_per_s": copy_bandwidth(dev)}
        with open(out, "w") as f:
            json.dump(peaks, f)
    except Exception as e:  # out of memory beside a large problem, an unwritable file
        print(f"kforge profile: no copy peak measured: {type(e).__name__}: {e}", file=sys.stderr)


def problem_forward(path: str, problem: Any, mode: str, dev: Any) -> Tuple[Callable[[], Any], str]:
    """A problem's compiled forward (on inputs drawn once), and what a failure of it is."""
    try:
        _, compiled, inputs = compile_problem(problem, mode, dev)
    except Exception as e:  # the problem's own constructor or inputs, whatever they raise
        raise CaptureError(f"{path}: building the model or its inputs failed: {type(e).__name__}: {e}") from e
    return (lambda: compiled(*inputs)), f"torch.compile(mode={mode!r})"


def triton_forward(path: str, mod: Any, dev: Any) -> Tuple[Callable[[], Any], str]:
    """A standalone Triton kernel file's ``kernel_function`` on its inputs, drawn on the GPU."""
    import torch

    torch.manual_seed(1)
    try:
        with torch.device(dev):
            inputs = [to_device(x, dev) for x in mod.get_inputs()]
    except Exception as e:
        raise CaptureError(f"{path}: get_inputs() failed: {type(e).__name__}: {e}") from e
    return (lambda: mod.kernel_function(*inputs)), "kernel_function"


def profile_forward(path: str, forward: Callable[[], Any], what: str, forwards: int) -> None:
    """Warm-up forwards, then ``forwards`` inside the NVTX range (and the region)."""
    import torch

    with torch.no_grad():
        try:
            for _ in range(WARMUP):
                forward()
            torch.cuda.synchronize()
        except Exception as e:
            raise CaptureError(f"{path}: {what} failed: {type(e).__name__}: {e}") from e
        nvtx: Any = torch.cuda.nvtx  # untyped in torch
        with region("profile:forward"):
            nvtx.range_push(RANGE)
            for _ in range(forwards):
                forward()
            torch.cuda.synchronize()
            nvtx.range_pop()


def profile_source(path: str, kind: str, mod: Any, mode: str, forwards: int, peaks_out: Optional[str] = None) -> None:
    import torch

    if not torch.cuda.is_available():
        raise CaptureError(f"{path}: no CUDA GPU visible (kforge profile runs on a GPU)")
    dev = torch.device("cuda")
    with torch.no_grad():
        forward, what = problem_forward(path, mod, mode, dev) if kind == "problem" else triton_forward(path, mod, dev)
    profile_forward(path, forward, what, forwards)
    if peaks_out:
        # The copy needs 2 GiB beside what the model held: the forward (its closure holds the
        # compiled model and the inputs) is the last reference; Dynamo's caches and a CUDA graph's
        # memory pool go with a reset.
        del forward
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        write_peaks(peaks_out, dev)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kforge.inspect.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("source")
    ap.add_argument("--mode", default="default", choices=MODES)
    ap.add_argument("--size", default="default", choices=SIZES, help="a problem's size preset")
    ap.add_argument("--forwards", type=int, default=1, help="forwards inside the profiled range")
    ap.add_argument("--peaks-out", help="write the measured copy peak here (JSON)")
    a = ap.parse_args(argv)
    try:
        if a.forwards < 1:
            raise CaptureError(f"--forwards must be at least 1, got {a.forwards}")
        kind, mod = load_sized(a.source, a.size)
        if kind != "problem" and (a.size != "default" or a.mode != "default"):
            raise CaptureError(f"{a.source}: --size and --mode apply to a problem, not a Triton kernel file")
        try:
            import torch  # noqa: F401
        except ImportError as e:
            raise CaptureError(f"{a.source}: torch is not importable here ({e})") from e
        profile_source(a.source, kind, mod, a.mode, a.forwards, a.peaks_out)
    except CaptureError as e:
        print(f"kforge profile: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
