"""``kforge.do_bench``: ``triton.testing.do_bench`` inside an exclusive kforge region."""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Union

from .client import MAX_FRAME
from .region import region as _region
from .region import report_measurement

RETURN_MODES = ("min", "max", "mean", "median", "all")
#: Size of the buffer zeroed before each GPU call to flush the L2 cache (as Triton does).
CACHE_FLUSH_BYTES = 256 * 1024 * 1024
#: Most samples sent in one measurement (JSON floats take up to ~24 bytes; one frame is 1 MiB).
#: Longer runs (sub-microsecond CPU functions) are reported as an evenly strided subsample;
#: the value returned by do_bench always uses every sample.
MAX_REPORTED_SAMPLES = MAX_FRAME // 32
# Lower bound of the per-call estimate, so a too-fast function cannot ask for unbounded calls.
_MIN_ESTIMATE_MS = 1e-4

Result = Union[float, List[float]]


def quantile(samples: Sequence[float], q: float) -> float:
    """The ``q``-quantile of ``samples`` with linear interpolation (as ``torch.quantile``)."""
    if not samples:
        raise ValueError("quantile of an empty sample set")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantiles must lie in [0, 1], got {q!r}")
    s = sorted(samples)
    point = q * (len(s) - 1)
    lo = math.floor(point)
    hi = math.ceil(point)
    t = point - lo
    return (1.0 - t) * s[lo] + t * s[hi]


def summarize(samples: Sequence[float], quantiles: Optional[Sequence[float]], return_mode: str) -> Result:
    """Reduce samples the way ``triton.testing.do_bench`` does.

    ``quantiles`` (if given) wins: a list of quantiles, or a single float for one quantile.
    Otherwise ``return_mode``: ``"min"``, ``"max"``, ``"mean"``, ``"median"`` give a float and
    ``"all"`` the list of samples.
    """
    times = [float(x) for x in samples]
    if quantiles is not None:
        out = [quantile(times, q) for q in quantiles]
        return out[0] if len(out) == 1 else out
    if return_mode == "all":
        return times
    if return_mode == "min":
        return min(times)
    if return_mode == "max":
        return max(times)
    if return_mode == "mean":
        return statistics.fmean(times)
    if return_mode == "median":
        return float(statistics.median(times))
    raise ValueError(f"return_mode must be one of {RETURN_MODES}, got {return_mode!r}")


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _validate(
    fn: object, warmup: object, rep: object, quantiles: object, return_mode: object, grad_to_none: object
) -> Optional[List[float]]:
    if not callable(fn):
        raise TypeError(f"do_bench: fn must be callable, got {fn!r}")
    if not _is_number(warmup) or not math.isfinite(warmup) or warmup < 0:  # type: ignore[arg-type,operator]
        raise ValueError(f"do_bench: warmup must be a finite number of milliseconds >= 0, got {warmup!r}")
    if not _is_number(rep) or not math.isfinite(rep) or rep <= 0:  # type: ignore[arg-type,operator]
        raise ValueError(f"do_bench: rep must be a finite number of milliseconds > 0, got {rep!r}")
    if return_mode not in RETURN_MODES:
        raise ValueError(f"do_bench: return_mode must be one of {RETURN_MODES}, got {return_mode!r}")
    if grad_to_none is not None and not isinstance(grad_to_none, Iterable):
        raise ValueError("do_bench: grad_to_none must be an iterable of tensors or None")
    if quantiles is None:
        return None
    if isinstance(quantiles, (str, bytes)) or not isinstance(quantiles, Iterable):
        raise ValueError(f"do_bench: quantiles must be a list of numbers in [0, 1], got {quantiles!r}")
    qs = list(quantiles)
    if not qs:
        raise ValueError("do_bench: quantiles must not be empty")
    for q in qs:
        if not _is_number(q) or not 0.0 <= q <= 1.0:
            raise ValueError(f"do_bench: quantiles must lie in [0, 1], got {q!r}")
    return [float(q) for q in qs]


def _torch_cuda_available() -> bool:
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def resolve_device(device: Optional[str] = None) -> str:
    """Pick the timing device: ``"cpu"`` or a torch CUDA device string such as ``"cuda:0"``.

    ``device`` argument, else ``$KFORGE_DEVICE``, else ``"cuda"`` if torch sees a GPU, else
    ``"cpu"``. A bare index (kforge's notation, e.g. ``"2"``) names a physical GPU: it is mapped
    through ``$CUDA_VISIBLE_DEVICES`` to the index torch sees.
    """
    dev = str(device) if device is not None else os.environ.get("KFORGE_DEVICE", "")
    dev = dev.strip().lower()
    if dev in ("", "auto"):
        return "cuda" if _torch_cuda_available() else "cpu"
    if dev == "cpu":
        return "cpu"
    if dev.isdigit():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            entries = [e.strip() for e in visible.split(",") if e.strip()]
            if dev in entries:
                return f"cuda:{entries.index(dev)}"
            if len(entries) == 1 and not entries[0].isdigit() and os.environ.get("KFORGE_DEVICE", "").strip() == dev:
                # The daemon pins a job to its GPU by UUID: the one visible GPU is the job's.
                return "cuda:0"
            if entries and all(e.isdigit() for e in entries):
                raise ValueError(f"do_bench: GPU {dev} is not visible (CUDA_VISIBLE_DEVICES={visible})")
        return f"cuda:{dev}"
    if dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit()):
        return dev
    raise ValueError(f"do_bench: device must be 'cpu', 'cuda', 'cuda:N' or a GPU index, got {device!r}")


#: Calls per warm-up batch at least (the last batch gives the per-call estimate).
_BATCH_MIN = 5


def warm_up_and_estimate(run_batch: Callable[[int], float], warmup: float) -> float:
    """Warm up, then estimate the per-call time in milliseconds.

    ``run_batch(n)`` makes ``n`` calls and returns their total run time in milliseconds. Batches
    (5 calls, then up to twice as many as the last, but no more than the warm-up time left needs)
    run until their total reaches ``warmup`` ms; the per-call time of the *last* batch is the
    estimate. Unlike ``triton.testing.do_bench``, which estimates from 5 calls before warming up,
    the estimate is taken at the end of the warm-up: a GPU that was idle starts at a low clock
    (345 MHz on the H200), and an estimate taken there made a cold process time half as many calls
    as a warm one, which changed the median of kernels that slow down under sustained load.
    """
    n = _BATCH_MIN
    elapsed = 0.0
    while True:
        ms = float(run_batch(n))
        per = max(ms / n, _MIN_ESTIMATE_MS)
        elapsed += max(ms, 0.0)
        if elapsed >= warmup:
            return per
        n = max(_BATCH_MIN, min(2 * n, math.ceil((warmup - elapsed) / per)))


def timed_calls(estimate_ms: float, rep: float) -> int:
    """Timed calls for ``rep`` milliseconds of run time at ``estimate_ms`` per call (at least 1)."""
    return max(1, int(rep / max(estimate_ms, _MIN_ESTIMATE_MS)))


#: Most timed calls of one ``do_bench`` (a bound for calls that report almost no time).
MAX_TIMED_CALLS = 100_000


def timed_samples(run_chunk: Callable[[int], List[float]], estimate_ms: float, rep: float) -> List[float]:
    """Samples of timed calls, in chunks (``run_chunk(k)`` times ``k`` calls and returns their
    samples in ms), until the samples add up to ``rep`` ms — at least one call, at most
    ``MAX_TIMED_CALLS``. The warm-up's estimate sizes the first chunk (a quarter of the calls it
    predicts); each next chunk is what the samples so far say is left. The number of timed calls
    follows the calls' own time, not the warm-up's: on the H200 a cold process ended its 25 ms
    warm-up at 2–5× the steady per-call time (clock still ramping up from idle, fresh buffers)
    and, timing ``rep / estimate`` calls, timed a half to a fifth as many as a warm worker — a
    shorter load, less often under the power cap, another median."""
    chunk = max(1, math.ceil(timed_calls(estimate_ms, rep) / 4))
    out: List[float] = []
    total = 0.0
    while True:
        xs = run_chunk(min(chunk, MAX_TIMED_CALLS - len(out)))
        out.extend(xs)
        total += sum(max(x, _MIN_ESTIMATE_MS) if x == x else _MIN_ESTIMATE_MS for x in xs)  # NaN: the floor
        if total >= rep or len(out) >= MAX_TIMED_CALLS or not xs:
            return out
        chunk = max(1, math.ceil((rep - total) / (total / len(out))))


def _bench_cpu(fn: Callable[[], Any], warmup: float, rep: float, grad_to_none: Optional[Iterable[Any]],
               before_each: Optional[Callable[[], Any]] = None) -> List[float]:
    fn()

    def batch(n: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        return (time.perf_counter_ns() - t0) / 1e6

    estimate = warm_up_and_estimate(batch, warmup)
    grads = list(grad_to_none) if grad_to_none is not None else []
    clock = time.perf_counter_ns

    def chunk(k: int) -> List[float]:
        times: List[float] = []
        for _ in range(k):
            for x in grads:
                x.grad = None
            if before_each is not None:
                before_each()
            start = clock()
            fn()
            times.append((clock() - start) / 1e6)
        return times

    return timed_samples(chunk, estimate, rep)


#: GPU spin cycles per microsecond assumed when sizing the spin that covers a call's host time
#: (an H200 runs at up to 1.98 GHz; a slower clock only lengthens the spin).
SPIN_CYCLES_PER_US = 2000
#: Most timed calls with ``count_host`` (each waits for the GPU and a spin) that ``rep`` asks
#: for; a caller's ``min_calls`` may ask for more (the inspect round trip sizes its rounds).
MAX_HOST_COUNTED_CALLS = 1000
#: Longest spin put in front of a timed call, microseconds: covers three medians of a host time of
#: up to about 16.6 ms (the suite's forwards take 1-15 ms). Until session 29 it was 5 ms, less
#: than the spin a launch-bound forward of more than 1.65 ms of host time needs: its calls slower
#: than the spin (a slower host between rounds, a GC pause) were taken for calls that waited for
#: the GPU and sampled by their device time, and a round's median fell anywhere between the two
#: (the unrolled LSTM at the large preset: 2.0 ms of device time, 2.8-4.3 ms of host time a call,
#: medians 3.08-4.13 ms within one round, a noise floor of 1.06 with 3 jobs in flight).
MAX_SPIN_US = 50_000.0


def _bench_cuda(
    fn: Callable[[], Any], warmup: float, rep: float, grad_to_none: Optional[Iterable[Any]], device: str,
    before_each: Optional[Callable[[], Any]] = None, count_host: bool = False,
) -> List[float]:
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError as e:
        raise RuntimeError(f"do_bench: timing on {device!r} needs torch, which is not importable") from e
    grads = list(grad_to_none) if grad_to_none is not None else []
    if count_host:
        return _interleaved_cuda([fn], warmup, rep, device, [before_each], grads)[0]
    dev = torch.device(device)
    with torch.cuda.device(dev):
        fn()
        torch.cuda.synchronize()
        cache = torch.empty(CACHE_FLUSH_BYTES // 4, dtype=torch.int, device=dev)
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

        def batch(n: int) -> float:
            start.record()
            for _ in range(n):
                cache.zero_()
                fn()
            end.record()
            torch.cuda.synchronize()
            return float(start.elapsed_time(end))

        estimate = warm_up_and_estimate(batch, warmup)

        def chunk(k: int) -> List[float]:
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(k)]  # type: ignore[no-untyped-call]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(k)]  # type: ignore[no-untyped-call]
            for i in range(k):
                # fn must not accumulate gradients if it contains a backward pass.
                for x in grads:
                    x.grad = None
                if before_each is not None:
                    before_each()  # outside the timed interval
                cache.zero_()  # flush L2 between calls
                starts[i].record()
                fn()
                ends[i].record()
            torch.cuda.synchronize()
            return [float(s.elapsed_time(e)) for s, e in zip(starts, ends)]

        return timed_samples(chunk, estimate, rep)


def probe_host_us(torch: Any, fn: Callable[[], Any], before_each: Optional[Callable[[], Any]]) -> List[float]:
    """Host time of 5 calls, each made with the GPU idle (microseconds)."""
    probes = []
    for _ in range(5):
        if before_each is not None:
            before_each()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        probes.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return probes


def _one_host_counted(torch: Any, fn: Callable[[], Any], cache: Any, spin_us: float, events: Any,
                      before_each: Optional[Callable[[], Any]], grads: Sequence[Any] = ()) -> float:
    """One ``count_host`` sample: the GPU idle, a spin kernel longer than the call's host time,
    then the call between CUDA events — so the events see its device time alone, whatever the race
    between host and GPU — and the sample is the larger of that and the call's host time (a call
    bound by its launches is timed by them, reproducibly; host-side work cannot hide behind the
    GPU). A call that waits for the GPU itself (``.item()``, a sync) outlasts the spin: its sample
    is the device time alone, which then includes the host work between its kernels."""
    start, end = events
    for x in grads:  # fn must not accumulate gradients if it contains a backward pass
        x.grad = None
    if before_each is not None:
        before_each()
    cache.zero_()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(spin_us * SPIN_CYCLES_PER_US))
    start.record()
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    end.record()
    torch.cuda.synchronize()
    return host_counted_sample(float(start.elapsed_time(end)), (t1 - t0) * 1e3, spin_us)


def spin_length_us(host_us: Sequence[float]) -> float:
    """Spin in front of a timed call: three times the median host time of a call, plus 50 µs, at
    most ``MAX_SPIN_US`` (a median: one slow probe — a GC pause — does not stretch every spin)."""
    return min(MAX_SPIN_US, 3.0 * statistics.median(host_us) + 50.0)


def host_counted_sample(device_ms: float, host_ms: float, spin_us: float) -> float:
    """One ``count_host`` sample: the larger of device and host time — unless the host time
    reached the spin's length, which a call that does not wait for the GPU cannot (the spin is
    three times its median host time): it waited, and its device time is the sample."""
    if host_ms * 1e3 >= spin_us:
        return device_ms
    return max(device_ms, host_ms)


def do_bench_interleaved(
    fns: Sequence[Callable[[], Any]],
    warmup: float = 25,
    rep: float = 100,
    *,
    name: Optional[str] = None,
    device: Optional[str] = None,
    before_each: Optional[Callable[[], Any]] = None,
    prepare_each: Optional[Sequence[Callable[[], Any]]] = None,
    min_calls: int = 1,
    regions: Optional[List[Any]] = None,
    shuffle: bool = False,
) -> List[List[float]]:
    """Time several functions call by call in turn — A, B, C, A, B, C, … — inside one kforge
    region; returns each function's samples in milliseconds. A slow drift of the machine (clocks,
    temperature, host load) falls on all of them alike, so the ratio of two functions' medians is
    steadier than the ratio of two separate ``do_bench`` runs. ``warmup`` ms of warm-up per
    function; about ``rep`` ms of timed calls in all. On a GPU every sample is ``count_host``'s
    (the L2 flushed, device time behind a spin covering host time, the larger of device and host
    time); on the CPU a sample is the call's ``time.perf_counter`` interval. ``before_each`` runs
    before every call, outside the timed interval; before it, ``prepare_each[i]`` (one per
    function, if given) before every call of ``fns[i]`` — e.g. one untimed call of it, so that a
    function that switches state (the kernels a model runs) is timed in that state, not switching
    into it (``before_each`` then still gives the timed call fresh inputs). ``min_calls``: at least
    that many timed calls of each function, however long they take (``rep`` alone gives one call
    each when the calls together take longer than ``rep``: a median of one sample is the call's
    raw jitter). ``regions``: a list the region it timed in is appended to once exited (its
    ``tainted``: not exclusive, a sibling's GPU work may have run beside it). ``shuffle``: each
    turn calls the functions in a new order (a fixed seed: the same orders every time), each
    function's samples still listed turn by turn — so sample i of every function comes from the
    same turn — where a fixed order lets a periodic disturbance of the host (a timer tick, a
    hypervisor's work) that keeps step with the turns fall on one function for a while (session
    31: one position of the inspect round trip ran 25 % slower than another for 25 turns in a row,
    both calling the same function)."""
    if not fns or not all(callable(f) for f in fns):
        raise ValueError("do_bench_interleaved: fns must be a non-empty sequence of callables")
    if warmup < 0 or rep <= 0:
        raise ValueError(f"do_bench_interleaved: warmup must be >= 0 and rep > 0, got {warmup}, {rep}")
    if isinstance(min_calls, bool) or not isinstance(min_calls, int) or min_calls < 1:
        raise ValueError(f"do_bench_interleaved: min_calls must be an integer >= 1, got {min_calls!r}")
    if prepare_each is not None and (len(prepare_each) != len(fns) or not all(callable(p) for p in prepare_each)):
        raise ValueError(f"do_bench_interleaved: prepare_each must hold one callable per function ({len(fns)}),"
                         f" got {len(prepare_each)} entries")
    # The untimed call first, then before_each (fresh inputs, bumped versions): the timed call
    # must not repeat the call just made, which a candidate caching its last result could skip.
    befores = [_then(p, before_each) for p in (prepare_each if prepare_each is not None else [None] * len(fns))]
    dev = resolve_device(device)
    with _region(name or "do_bench_interleaved") as r:
        if dev == "cpu":
            samples = _interleaved_cpu(list(fns), float(warmup), float(rep), befores, min_calls, turn_orders(len(fns), shuffle))
        else:
            samples = _interleaved_cuda(list(fns), float(warmup), float(rep), dev, befores, min_calls=min_calls,
                                        orders=turn_orders(len(fns), shuffle))
        for i, xs in enumerate(samples):
            report_measurement(f"{name or 'do_bench_interleaved'}:{i}", _subsample(xs, MAX_REPORTED_SAMPLES), region=r.region)
    if regions is not None:
        regions.append(r)
    return samples


def _then(first: Optional[Callable[[], Any]], second: Optional[Callable[[], Any]]) -> Optional[Callable[[], Any]]:
    """``first`` then ``second`` as one callable (None when both are)."""
    if first is None or second is None:
        return first if second is None else second

    def both() -> None:
        first()
        second()

    return both


#: The seed of ``do_bench_interleaved(shuffle=True)``'s orders.
SHUFFLE_SEED = 31


def turn_orders(n: int, shuffle: bool) -> Iterator[List[int]]:
    """The order of ``n`` functions' calls in each turn, one list a turn, without end: 0..n-1
    every turn, or with ``shuffle`` a new permutation each turn (seeded: ``SHUFFLE_SEED``)."""
    rng = random.Random(SHUFFLE_SEED)
    order = list(range(n))
    while True:
        if shuffle:
            rng.shuffle(order)
        yield list(order)


def _interleaved_cpu(fns: List[Callable[[], Any]], warmup: float, rep: float,
                     befores: List[Optional[Callable[[], Any]]], min_calls: int = 1,
                     orders: Optional[Iterator[List[int]]] = None) -> List[List[float]]:
    estimates = []
    for fn, before in zip(fns, befores):
        if before is not None:
            before()
        fn()

        def batch(n: int, fn: Callable[[], Any] = fn) -> float:
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            return (time.perf_counter_ns() - t0) / 1e6

        estimates.append(warm_up_and_estimate(batch, warmup))
    rounds = max(min_calls, timed_calls(sum(estimates), rep))
    out: List[List[float]] = [[] for _ in fns]
    turns = orders if orders is not None else turn_orders(len(fns), False)
    for _ in range(rounds):
        for i in next(turns):
            fn, before = fns[i], befores[i]
            if before is not None:
                before()
            t0 = time.perf_counter_ns()
            fn()
            out[i].append((time.perf_counter_ns() - t0) / 1e6)
    return out


def host_counted_calls(min_calls: int, from_rep: int, functions: int) -> int:
    """Timed calls of each of ``functions`` interleaved ``count_host`` functions: the ``from_rep``
    that ``rep`` asks for, with at most ``MAX_HOST_COUNTED_CALLS`` calls in all, but at least
    ``min_calls`` however long they take (a caller's own ask: the inspect round trip's rounds)."""
    return max(min_calls, min(from_rep, max(1, MAX_HOST_COUNTED_CALLS // functions)))


def _interleaved_cuda(fns: List[Callable[[], Any]], warmup: float, rep: float, device: str,
                      befores: List[Optional[Callable[[], Any]]], grads: Sequence[Any] = (),
                      min_calls: int = 1, orders: Optional[Iterator[List[int]]] = None) -> List[List[float]]:
    import torch  # type: ignore[import-not-found, unused-ignore]

    dev = torch.device(device)
    with torch.cuda.device(dev):
        cache = torch.empty(CACHE_FLUSH_BYTES // 4, dtype=torch.int, device=dev)
        events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]
        estimates, spins = [], []
        for fn, before in zip(fns, befores):
            if before is not None:
                before()
            fn()
            torch.cuda.synchronize()

            def batch(n: int, fn: Callable[[], Any] = fn) -> float:
                events[0].record()
                for _ in range(n):
                    cache.zero_()
                    fn()
                events[1].record()
                torch.cuda.synchronize()
                return float(events[0].elapsed_time(events[1]))

            estimates.append(warm_up_and_estimate(batch, warmup))
            spins.append(spin_length_us(probe_host_us(torch, fn, before)))
        rounds = host_counted_calls(min_calls, timed_calls(sum(estimates), rep), len(fns))
        out: List[List[float]] = [[] for _ in fns]
        turns = orders if orders is not None else turn_orders(len(fns), False)
        for _ in range(rounds):
            for i in next(turns):
                out[i].append(_one_host_counted(torch, fns[i], cache, spins[i], events, befores[i], grads))
        return out


def _subsample(times: List[float], limit: int) -> List[float]:
    if len(times) <= limit:
        return times
    step = len(times) / limit
    return [times[int(i * step)] for i in range(limit)]


def do_bench(
    fn: Callable[[], Any],
    warmup: float = 25,
    rep: float = 100,
    grad_to_none: Optional[Iterable[Any]] = None,
    quantiles: Optional[Sequence[float]] = None,
    return_mode: str = "mean",
    *,
    name: Optional[str] = None,
    device: Optional[str] = None,
    before_each: Optional[Callable[[], Any]] = None,
    count_host: bool = False,
) -> Result:
    """Benchmark ``fn`` like ``triton.testing.do_bench``, inside an exclusive kforge region.

    ``warmup`` and ``rep`` are milliseconds of run time: ``fn`` is called once, then in batches
    until ``warmup`` ms have run (at least one batch of 5 calls); then calls are timed until
    their samples add up to ``rep`` ms (at least 1; in chunks, the first sized by the last warm-up
    batch's per-call time — unlike Triton's ``rep / estimate`` calls, the count does not depend on
    how fast the warm-up ended, unless it ended more than 4× too fast: see :func:`timed_samples`
    and :func:`warm_up_and_estimate`; with ``count_host`` it is ``rep / estimate`` calls, at most
    ``MAX_HOST_COUNTED_CALLS``). Returns milliseconds: the ``quantiles``
    of the samples if given (a float for a single quantile, else a list), otherwise per
    ``return_mode`` the ``"min"``, ``"max"``, ``"mean"`` or ``"median"`` sample, or ``"all"``
    samples as a list.

    ``device`` (else ``$KFORGE_DEVICE``, else CUDA if available, else CPU) picks the clock: on
    a GPU each call is timed with CUDA events, a 256 MB buffer is zeroed before each timed call
    to flush the L2 cache and the ``grad_to_none`` tensors' ``.grad`` is reset; on the CPU each
    call is timed with ``time.perf_counter_ns`` (no flush). ``before_each`` (kforge's addition)
    runs before every timed call, outside the timed interval — e.g. to rotate input sets or bump
    version counters so that a candidate caching its last result cannot skip the work.
    ``count_host`` (GPU; kforge's addition) times each call alone behind a GPU spin that covers
    its host-side time: a sample is the larger of the call's device time and its host time. Plain
    event timing of a call shorter than its launch overhead depends on a race between host and
    GPU (bimodal samples); this does not, and host-side work cannot hide. The whole
    measurement runs inside
    ``kforge.region(name)`` (``name`` defaults to ``fn``'s name) and the samples are reported to
    the daemon with the region id; without a daemon both are no-ops.
    """
    qs = _validate(fn, warmup, rep, quantiles, return_mode, grad_to_none)
    if before_each is not None and not callable(before_each):
        raise ValueError(f"do_bench: before_each must be callable or None, got {before_each!r}")
    dev = resolve_device(device)
    label = name or getattr(fn, "__name__", None) or "do_bench"
    if label == "<lambda>":
        label = "do_bench"
    with _region(label) as r:
        if dev == "cpu":
            times = _bench_cpu(fn, float(warmup), float(rep), grad_to_none, before_each)
        else:
            times = _bench_cuda(fn, float(warmup), float(rep), grad_to_none, dev, before_each, count_host)
        report_measurement(label, _subsample(times, MAX_REPORTED_SAMPLES), region=r.region)
    return summarize(times, qs, return_mode)


def median_ms(fn: Callable[[], Any], name: str, **kw: Any) -> float:
    """``do_bench(fn, return_mode="median", name=name, **kw)``: the median sample in milliseconds."""
    v = do_bench(fn, return_mode="median", name=name, **kw)
    assert isinstance(v, float)
    return v


def copy_bandwidth(dev: Any, elements: int = 1 << 28, name: str = "verify:copy-bandwidth") -> float:
    """Bytes per second of a device-to-device copy of ``elements`` fp32 values (1 GiB by default;
    read + write), timed in the region ``name``."""
    import torch

    src = torch.empty(elements, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), name, warmup=10, rep=50)
    return 2 * elements * 4 / (ms / 1e3)
