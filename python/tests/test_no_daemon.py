"""Without a daemon: regions are no-ops with one warning, do_bench times on the CPU."""

from __future__ import annotations

import math
import os
import time
import warnings
from typing import Any, Callable, Dict, List, Optional

import pytest

import kforge
from kforge import bench


def _busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def test_region_is_noop_with_exactly_one_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with kforge.region(name="a") as r:
            ran = True
        with kforge.region("b", lease_s=2.0):
            pass
        assert kforge.report_measurement("m", [1.0, 2.0]) is None
        kforge.do_bench(lambda: None, warmup=0.1, rep=0.5, device="cpu")
    assert ran
    mine = [w for w in caught if issubclass(w.category, kforge.KforgeWarning)]
    assert len(mine) == 1
    text = str(mine[0].message)
    assert "kforge: no daemon at" in text and "regions are not exclusive" in text
    assert os.environ["XDG_RUNTIME_DIR"] in text
    assert r.region is None and r.grant is None and r.exclusive is False
    assert r.valid is None and r.revoked is False and r.tainted is False
    assert r.held_ms is not None and r.held_ms >= 0


def test_no_daemon_warning_names_the_first_caller_outside_the_package() -> None:
    """Frames of kforge's own modules, subpackages included, are skipped: the warning points at
    the code that called into kforge (here a caller whose frame lies in a subpackage of kforge
    calls the region for this test)."""
    inner = os.path.join(os.path.dirname(kforge.__file__), "verify", "caller_in_a_subpackage.py")
    ns: Dict[str, Any] = {"kforge": kforge}
    exec(compile("def enter():\n    with kforge.region('x'):\n        pass\n", inner, "exec"), ns)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ns["enter"]()
    mine = [w for w in caught if issubclass(w.category, kforge.KforgeWarning)]
    assert len(mine) == 1
    assert mine[0].filename == __file__


def test_unreachable_socket_is_noop(monkeypatch: pytest.MonkeyPatch, clean_env: str) -> None:
    monkeypatch.setenv("KFORGE_SOCKET", os.path.join(clean_env, "missing.sock"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with kforge.region("x"):
            pass
        with kforge.region("y"):
            pass
    mine = [w for w in caught if issubclass(w.category, kforge.KforgeWarning)]
    assert len(mine) == 1
    assert "missing.sock" in str(mine[0].message) and "cannot connect" in str(mine[0].message)


def test_nested_region_rejected_without_daemon() -> None:
    with pytest.warns(kforge.KforgeWarning):
        with kforge.region("outer"):
            with pytest.raises(kforge.KforgeError, match="not re-entrant"):
                with kforge.region("inner"):
                    pass
    with kforge.region("again"):  # the outer one was left properly
        pass


def test_region_argument_validation() -> None:
    with pytest.raises(ValueError, match="name"):
        kforge.region("")
    with pytest.raises(ValueError, match="lease_s"):
        kforge.region("x", lease_s=0)
    with pytest.raises(ValueError, match="lease_s"):
        kforge.region("x", lease_s=float("inf"))


def test_report_measurement_validation() -> None:
    with pytest.raises(ValueError, match="finite"):
        kforge.report_measurement("m", [1.0, float("nan")])
    with pytest.raises(ValueError, match="name"):
        kforge.report_measurement("", [1.0])
    with pytest.raises(ValueError, match="region"):
        kforge.report_measurement("m", [1.0], region="5")  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore::kforge.KforgeWarning")
@pytest.mark.parametrize("mode", ["min", "max", "mean", "median"])
def test_do_bench_cpu_scalar_modes(mode: str) -> None:
    v = kforge.do_bench(lambda: _busy(0.05), warmup=1, rep=3, return_mode=mode, device="cpu")
    assert isinstance(v, float)
    assert 0.05 <= v < 50  # at least the busy time, in milliseconds


@pytest.mark.filterwarnings("ignore::kforge.KforgeWarning")
def test_do_bench_cpu_counts_follow_the_estimate() -> None:
    calls: List[int] = []

    def fn() -> None:
        calls.append(1)
        _busy(0.2)

    samples = kforge.do_bench(fn, warmup=2, rep=4, return_mode="all", device="cpu")
    assert isinstance(samples, list) and all(isinstance(s, float) for s in samples)
    # estimate >= 0.2 ms -> at most 20 timed calls; warm-up: batches of >= 5 calls until 2 ms ran
    assert 1 <= len(samples) <= 20
    assert all(s >= 0.2 for s in samples)
    n_warmup = len(calls) - 1 - len(samples)
    assert 5 <= n_warmup <= 15


def test_estimate_follows_the_warm_up() -> None:
    # A function slow for its first 8 calls (a GPU ramping up its clock), then steady at 0.5 ms.
    made: List[int] = []

    def batch(n: int) -> float:
        ms = sum(2.0 if len(made) + i < 8 else 0.5 for i in range(n))
        made.extend([1] * n)
        return ms

    est = bench.warm_up_and_estimate(batch, warmup=25.0)
    assert est == 0.5  # the steady state, not the slow start (Triton's 5-call estimate: 2.0)
    # batches of 5 (10 ms), 8 (3*2 + 5*0.5 = 8.5 ms), 7 (3.5 ms) and 6 calls (3 ms): 25 ms
    assert len(made) == 26
    assert bench.timed_calls(est, 100.0) == 200


def test_timed_calls_follow_their_own_time_not_the_warm_up() -> None:
    """A cold process ends its warm-up slow (estimate 2 ms) although a call takes 0.5 ms: the
    calls are timed until their samples add up to rep — 200 of them, as for a warm process —
    not rep / estimate = 50."""
    chunks: List[int] = []

    def chunk(k: int) -> List[float]:
        chunks.append(k)
        return [0.5] * k

    assert len(bench.timed_samples(chunk, 2.0, 100.0)) == 200
    assert chunks == [13, 187]  # a quarter of the 50 the estimate predicted, then the rest
    chunks.clear()
    assert len(bench.timed_samples(chunk, 0.5, 100.0)) == 200 and chunks == [50, 150]
    # A warm-up that ended fast (estimate 0.1 ms): the first chunk already covers rep.
    chunks.clear()
    assert len(bench.timed_samples(chunk, 0.1, 100.0)) == 250 and chunks == [250]
    # At least one call; calls that report no time stop at the bound; an empty chunk ends.
    assert bench.timed_samples(lambda k: [500.0] * k, 500.0, 100.0) == [500.0]
    many = bench.timed_samples(lambda k: [0.0] * k, 0.0, 1e9)
    assert len(many) == bench.MAX_TIMED_CALLS
    assert bench.timed_samples(lambda k: [], 1.0, 100.0) == []
    # A NaN sample counts as the floor (no crash in the chunk arithmetic).
    assert len(bench.timed_samples(lambda k: [float("nan")] + [1.0] * (k - 1), 1.0, 10.0)) >= 10


def test_warm_up_without_warmup_time_is_one_batch() -> None:
    sizes: List[int] = []
    assert bench.warm_up_and_estimate(lambda n: sizes.append(n) or 3.0 * n, warmup=0.0) == 3.0
    assert sizes == [5]
    # A function reporting no time at all still ends (estimate floored) and times >= 1 call.
    assert bench.warm_up_and_estimate(lambda n: 0.0, warmup=0.0) > 0
    assert bench.timed_calls(0.0, 1.0) >= 1
    assert bench.timed_calls(1e9, 1.0) == 1


@pytest.mark.filterwarnings("ignore::kforge.KforgeWarning")
def test_do_bench_cpu_quantiles_and_modes_agree() -> None:
    qs = kforge.do_bench(lambda: _busy(0.02), warmup=0.5, rep=2, quantiles=[0.0, 0.2, 0.5, 0.8, 1.0], device="cpu")
    assert isinstance(qs, list) and len(qs) == 5
    assert qs == sorted(qs) and qs[0] >= 0.02
    one = kforge.do_bench(lambda: _busy(0.02), warmup=0.5, rep=2, quantiles=[0.5], device="cpu")
    assert isinstance(one, float)


@pytest.mark.filterwarnings("ignore::kforge.KforgeWarning")
def test_do_bench_resets_grads_before_each_timed_call() -> None:
    class T:
        grad: Optional[int] = 1

    t = T()
    seen: List[Optional[int]] = []

    def fn() -> None:
        seen.append(t.grad)
        t.grad = 1

    samples = kforge.do_bench(fn, warmup=0.1, rep=0.3, grad_to_none=[t], return_mode="all", device="cpu")
    assert isinstance(samples, list)
    assert seen[-len(samples):] == [None] * len(samples)
    assert seen[0] == 1  # not reset outside the timed calls


def test_summarize_matches_triton_semantics() -> None:
    s = [4.0, 1.0, 3.0, 2.0]
    assert bench.summarize(s, None, "min") == 1.0
    assert bench.summarize(s, None, "max") == 4.0
    assert bench.summarize(s, None, "mean") == 2.5
    assert bench.summarize(s, None, "median") == 2.5
    assert bench.summarize(s, None, "all") == s
    assert bench.summarize(s, [0.25, 0.5, 1.0], "mean") == [1.75, 2.5, 4.0]
    assert bench.summarize(s, [0.1], "max") == pytest.approx(1.3)
    assert bench.quantile([7.0], 0.9) == 7.0
    assert bench.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(fn=42), TypeError, "callable"),
        (dict(warmup=-1), ValueError, "warmup"),
        (dict(warmup=math.nan), ValueError, "warmup"),
        (dict(rep=0), ValueError, "rep"),
        (dict(rep="100"), ValueError, "rep"),
        (dict(return_mode="avg"), ValueError, "return_mode"),
        (dict(quantiles=[0.5, 1.5]), ValueError, r"\[0, 1\]"),
        (dict(quantiles=[]), ValueError, "empty"),
        (dict(quantiles="0.5"), ValueError, "quantiles"),
        (dict(quantiles=[True]), ValueError, "quantiles"),
        (dict(grad_to_none=3), ValueError, "grad_to_none"),
        (dict(device="tpu"), ValueError, "device"),
    ],
)
def test_do_bench_validation(kwargs: Any, exc: type, match: str) -> None:
    called: List[int] = []
    args: Any = dict(fn=lambda: called.append(1), warmup=1, rep=1, device="cpu")
    args.update(kwargs)
    fn = args.pop("fn")
    with pytest.raises(exc, match=match):
        kforge.do_bench(fn, **args)
    assert called == []  # validated before anything runs


def test_resolve_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "_torch_cuda_available", lambda: False)
    assert bench.resolve_device(None) == "cpu"
    assert bench.resolve_device("auto") == "cpu"
    monkeypatch.setattr(bench, "_torch_cuda_available", lambda: True)
    assert bench.resolve_device(None) == "cuda"
    monkeypatch.setenv("KFORGE_DEVICE", "cpu")
    assert bench.resolve_device(None) == "cpu"
    assert bench.resolve_device("cuda:1") == "cuda:1"
    monkeypatch.setenv("KFORGE_DEVICE", "3")
    assert bench.resolve_device(None) == "cuda:3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert bench.resolve_device(None) == "cuda:0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert bench.resolve_device("3") == "cuda:1"
    with pytest.raises(ValueError, match="GPU 2 is not visible"):
        bench.resolve_device("2")
    # The daemon pins a job to its GPU by UUID (what it does on the H200 machines).
    monkeypatch.setenv("KFORGE_DEVICE", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-23428e6f-d24c-8571-1fa8-9c266707ef92")
    assert bench.resolve_device(None) == "cuda:0"


def test_subsample_fits_a_frame() -> None:
    times = [float(i) for i in range(100_000)]
    sub = bench._subsample(times, bench.MAX_REPORTED_SAMPLES)
    assert len(sub) == bench.MAX_REPORTED_SAMPLES and sub[0] == 0.0 and sub == sorted(sub)
    frame = kforge.encode_frame({"type": "measurement", "region": 2**40, "job": 2**40, "name": "n" * 200,
                                 "samples_ms": [1.2345678901234567e-05] * len(sub)})
    assert len(frame) <= kforge.MAX_FRAME + 4
    assert bench._subsample(times[:10], 32) == times[:10]


@pytest.mark.filterwarnings("ignore::kforge.KforgeWarning")
def test_before_each_runs_before_every_timed_call_only() -> None:
    events: List[str] = []
    samples = kforge.do_bench(lambda: events.append("call"), warmup=0.0, rep=0.5, return_mode="all",
                              device="cpu", before_each=lambda: events.append("before"))
    assert isinstance(samples, list)
    n = len(samples)
    assert events.count("before") == n
    # Every timed call follows its own before_each; warm-up calls (first 1 + 5) have none.
    timed = events[6:]
    assert timed == ["before", "call"] * n
    with pytest.raises(ValueError, match="before_each must be callable"):
        kforge.do_bench(lambda: None, device="cpu", before_each=3)  # type: ignore[arg-type]


def test_count_host_spin_and_samples() -> None:
    # The spin covers three medians of the probes' host time (one slow probe does not count).
    assert bench.spin_length_us([10.0, 12.0, 11.0, 900.0, 10.0]) == 3 * 11.0 + 50.0
    assert bench.spin_length_us([1e6] * 5) == bench.MAX_SPIN_US
    # Launch-bound call: its host time is the sample; GPU-bound: the device time.
    assert bench.host_counted_sample(0.010, 0.030, 100.0) == 0.030
    assert bench.host_counted_sample(0.500, 0.030, 100.0) == 0.500
    # A call that waited for the GPU (host time reached the spin): device time alone.
    assert bench.host_counted_sample(0.200, 0.350, 100.0) == 0.200
    # A launch-bound forward of 3 ms of host time a call (2 ms on the GPU): its spin covers three
    # such calls, so one that takes 5.5 ms (a slower host) is still sampled by its host time,
    # not taken for a call that waited (a 5 ms spin did that, and its rounds' medians jumped).
    spin = bench.spin_length_us([3000.0] * 5)
    assert spin == 9050.0 and bench.host_counted_sample(2.0, 5.5, spin) == 5.5


def test_interleaved_bench_calls_in_turn(monkeypatch: pytest.MonkeyPatch, clean_env: str) -> None:
    monkeypatch.setenv("KFORGE_SOCKET", os.path.join(clean_env, "missing.sock"))
    log: List[str] = []

    def f(tag: str) -> Callable[[], None]:
        return lambda: log.append(tag)

    with warnings.catch_warnings():  # no daemon: the region is not exclusive (a KforgeWarning)
        warnings.simplefilter("ignore", kforge.KforgeWarning)
        a, b, c = kforge.do_bench_interleaved([f("a"), f("b"), f("c")], warmup=0.1, rep=0.5, device="cpu",
                                              before_each=lambda: log.append("-"))
    assert len(a) == len(b) == len(c) >= 1 and all(x >= 0 for x in a + b + c)
    timed = log[len(log) - 6 * len(a):]  # the timed part: before_each, then each function in turn
    assert timed[:6] == ["-", "a", "-", "b", "-", "c"]
    assert timed == ["-", "a", "-", "b", "-", "c"] * len(a)
    with pytest.raises(ValueError, match="non-empty sequence of callables"):
        kforge.do_bench_interleaved([], device="cpu")
    with pytest.raises(ValueError, match="rep > 0"):
        kforge.do_bench_interleaved([f("a")], rep=0, device="cpu")


def test_interleaved_bench_prepares_each_function_before_its_calls(monkeypatch: pytest.MonkeyPatch,
                                                                   clean_env: str) -> None:
    """``prepare_each[i]`` runs before every call of function i, then ``before_each``, both outside
    the timed interval (the round trip's untimed call that switches a model's kernels)."""
    monkeypatch.setenv("KFORGE_SOCKET", os.path.join(clean_env, "missing.sock"))
    log: List[str] = []

    def f(tag: str) -> Callable[[], None]:
        return lambda: log.append(tag)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kforge.KforgeWarning)
        a, b = kforge.do_bench_interleaved([f("a"), f("b")], warmup=0.1, rep=0.5, device="cpu",
                                           before_each=f("-"), prepare_each=[f("pa"), f("pb")])
    assert len(a) == len(b) >= 1
    timed = log[len(log) - 6 * len(a):]
    assert timed == ["pa", "-", "a", "pb", "-", "b"] * len(a)  # the untimed call, fresh inputs, the timed call
    with pytest.raises(ValueError, match="one callable per function"):
        kforge.do_bench_interleaved([f("a"), f("b")], device="cpu", prepare_each=[f("pa")])


def test_interleaved_bench_times_at_least_min_calls_of_slow_functions(monkeypatch: pytest.MonkeyPatch,
                                                                     clean_env: str) -> None:
    """Calls that together take longer than ``rep`` get one timed call each, unless ``min_calls``
    asks for more (a round's median of one sample is that call's jitter)."""
    monkeypatch.setenv("KFORGE_SOCKET", os.path.join(clean_env, "missing.sock"))

    def slow() -> None:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.002:  # 2 ms per call, rep 1 ms: one call by rep alone
            pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kforge.KforgeWarning)
        a, b = kforge.do_bench_interleaved([slow, slow], warmup=0.1, rep=1.0, device="cpu")
        assert len(a) == len(b) == 1
        a, b = kforge.do_bench_interleaved([slow, slow], warmup=0.1, rep=1.0, device="cpu", min_calls=7)
        assert len(a) == len(b) == 7
        for bad in (0, -1, 2.5, True):
            with pytest.raises(ValueError, match="min_calls"):
                kforge.do_bench_interleaved([slow], device="cpu", min_calls=bad)  # type: ignore[arg-type]


def test_host_counted_calls_cap_what_rep_asks_not_what_min_calls_asks() -> None:
    from kforge import bench

    cap = bench.MAX_HOST_COUNTED_CALLS // 3
    assert bench.host_counted_calls(1, 10 * cap, 3) == cap  # rep's ask, capped
    assert bench.host_counted_calls(15, 40, 3) == 40
    assert bench.host_counted_calls(2 * cap, 40, 3) == 2 * cap  # the round trip's planned calls
    assert bench.host_counted_calls(1, 5, 10 * bench.MAX_HOST_COUNTED_CALLS) == 1


def test_shuffled_turns_call_each_function_once_a_turn_in_new_orders(monkeypatch: pytest.MonkeyPatch,
                                                                     clean_env: str) -> None:
    """``shuffle``: every turn calls each function once, the orders change from turn to turn (the
    same orders every time), and sample i of each function comes from turn i."""
    monkeypatch.setenv("KFORGE_SOCKET", os.path.join(clean_env, "missing.sock"))
    log: List[int] = []

    def f(i: int) -> Callable[[], None]:
        return lambda: log.append(i)

    def timed_turns(shuffle: bool) -> List[List[int]]:
        log.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kforge.KforgeWarning)
            samples = kforge.do_bench_interleaved([f(0), f(1), f(2)], warmup=0.1, rep=0.5, device="cpu",
                                                  min_calls=12, shuffle=shuffle)
        n = len(samples[0])
        assert all(len(s) == n for s in samples) and n >= 12
        timed = log[len(log) - 3 * n:]
        return [timed[3 * t:3 * t + 3] for t in range(n)]

    fixed = timed_turns(False)
    assert all(turn == [0, 1, 2] for turn in fixed)
    shuffled = timed_turns(True)
    assert all(sorted(turn) == [0, 1, 2] for turn in shuffled)
    assert len({tuple(turn) for turn in shuffled}) > 1
    from kforge import bench

    orders = bench.turn_orders(3, True)
    assert [next(orders) for _ in range(len(shuffled))] == shuffled  # seeded: the same orders every time
