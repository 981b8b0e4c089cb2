"""``kforge.autoregions``: the CUDA-event rule over a fake event class, the wrapped timing entry
points, nesting with kforge's own regions, and the import hook and ``sitecustomize`` chain in
fresh interpreters. Regions go to the fake daemon of ``conftest.py``."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

import kforge
from kforge.autoregions import (
    CONTINUE_WITHIN_LEASE,
    EVENT_REGION,
    HOLD_FRAMES,
    INDUCTOR_LEASE_S,
    LINGER_S,
    LONG_HOLD_SHARE,
    SLOW_ENTRY_S,
    WRAPPED_MARK,
    AutoRegions,
    enabled,
)
from kforge.client import connection
from kforge.region import Region, active_region

from conftest import FakeDaemon

PYTHON_DIR = Path(__file__).resolve().parents[1]


class Log:
    def __init__(self) -> None:
        self.calls: List[str] = []


LOG = Log()


class FakeEvent:
    """Shaped like ``torch.cuda.Event``: ``__new__`` takes ``enable_timing``; each call notes
    whether the thread held a region at that moment."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False) -> "FakeEvent":
        return super().__new__(cls)

    def record(self, stream: Any = None) -> None:
        LOG.calls.append(f"record:{'in' if active_region() is not None else 'out'}")

    def synchronize(self) -> None:
        LOG.calls.append("event-sync")

    def elapsed_time(self, end: "FakeEvent") -> float:
        return 1.0


class FakeStream:
    def synchronize(self) -> None:
        LOG.calls.append("stream-sync")


def fake_cuda() -> types.ModuleType:
    m = types.ModuleType("fake_cuda")

    def synchronize(device: Any = None) -> None:
        LOG.calls.append("sync")

    setattr(m, "synchronize", synchronize)
    setattr(m, "Event", FakeEvent)
    setattr(m, "Stream", FakeStream)
    return m


class Rig:
    def __init__(self, daemon: FakeDaemon) -> None:
        LOG.calls.clear()
        self.daemon = daemon
        self.now = 0.0
        self.warnings: List[str] = []
        # No reaper thread: the test ends grace periods itself (after_grace), deterministically.
        self.auto = AutoRegions(clock=lambda: self.now, warn=self.warnings.append, reaper=False)
        self.cuda = fake_cuda()
        self.auto.patch_event_class(FakeEvent, self.cuda)

    def regions(self) -> List[str]:
        """``enter NAME`` / ``exit`` per region request the daemon saw."""
        out = []
        for m in self.daemon.requests:
            if m["type"] == "region_enter":
                out.append(f"enter {m['name']}")
            elif m["type"] == "region_exit":
                out.append("exit")
        return out

    def after_grace(self) -> None:
        """Let the grace period of a lingering region pass (what the reaper thread does)."""
        self.now += LINGER_S + 0.001
        self.auto.reap()

    def close(self) -> None:
        self.auto.uninstall()


@pytest.fixture
def rig(daemon: FakeDaemon) -> Any:
    r = Rig(daemon)
    yield r
    r.close()
    connection()  # the fake daemon's thread ends with its connection: make sure there was one


def test_start_is_recorded_inside_the_region_and_the_wait_after_the_end_exits(rig: Rig) -> None:
    start, end = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    start.record()
    for _ in range(3):
        pass
    end.record()
    assert active_region() is not None, "still open until the host waited"
    rig.cuda.synchronize()
    o = rig.auto.held_event_region()
    assert o is not None and o.linger_until == pytest.approx(LINGER_S), "the interval ended: it lingers"
    assert start.elapsed_time(end) == 1.0
    assert LOG.calls == ["record:in", "record:in", "sync"]
    assert rig.regions() == [f"enter {EVENT_REGION}"]
    rig.auto.reap()  # before the grace period ended: nothing
    assert rig.regions() == [f"enter {EVENT_REGION}"]
    rig.after_grace()
    assert active_region() is None
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"]
    assert rig.auto.entered == {EVENT_REGION: 1}


def test_a_wait_before_any_end_event_does_not_exit(rig: Rig) -> None:
    start, end = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    start.record()
    rig.cuda.synchronize()
    start.synchronize()
    assert active_region() is not None
    end.record()
    start.synchronize()  # not the end event: the interval may still run
    o = rig.auto.held_event_region()
    assert o is not None and o.linger_until is None
    end.synchronize()
    assert o.linger_until is not None
    rig.after_grace()
    assert active_region() is None
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"]


def test_event_pairs_of_a_loop_waited_for_once_are_one_region(rig: Rig) -> None:
    pairs = [(FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)) for _ in range(5)]
    for s, e in pairs:
        s.record()
        e.record()
    FakeStream().synchronize()
    times = [s.elapsed_time(e) for s, e in pairs]
    assert times == [1.0] * 5
    rig.after_grace()
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"]


def test_kernelbench_style_trials_are_one_region(rig: Rig) -> None:
    # Per trial a fresh event pair, one call, synchronize, elapsed_time: a region per trial made
    # every trial pay the entry right before its start event (and beside competitors, wait for
    # their queued work each time): the trials within the grace period share one region.
    for _ in range(100):
        s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
        s.record()
        e.record()
        rig.cuda.synchronize(device=0)
        s.elapsed_time(e)
        rig.now += 0.0005  # the loop's own time between trials
    assert LOG.calls.count("record:in") == 200
    assert rig.regions() == [f"enter {EVENT_REGION}"]
    assert rig.auto.continued == 99
    rig.after_grace()
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"]


def test_an_interval_after_the_grace_period_enters_a_new_region(rig: Rig) -> None:
    for _ in range(2):
        s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
        s.record()
        e.record()
        rig.cuda.synchronize()
        rig.now += LINGER_S + 0.01  # unrelated work longer than the grace period
    # the next hook call of the thread exits the lingering region (no reaper here)
    FakeEvent().record()
    assert active_region() is None
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"] * 2
    assert rig.auto.continued == 0


def test_a_lingering_region_is_not_continued_past_half_its_lease(rig: Rig) -> None:
    lease_s = 60.0  # the fake daemon's grant
    s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    s.record()
    rig.now += lease_s * CONTINUE_WITHIN_LEASE - 1.0  # a long interval
    e.record()
    rig.cuda.synchronize()
    rig.now += 0.01
    s.record()  # within the grace period and the lease's half: continues
    rig.now += 2.0
    e.record()
    rig.cuda.synchronize()
    rig.now += 0.01
    assert rig.regions() == [f"enter {EVENT_REGION}"] and rig.auto.continued == 1
    s.record()  # the region is older than half its lease now: a new one
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit", f"enter {EVENT_REGION}"]
    assert rig.auto.continued == 1 and not rig.warnings


def test_a_wrapped_call_after_an_event_loop_gets_its_own_region(rig: Rig) -> None:
    tt = fake_triton_testing(record_events=True)
    rig.auto.patch_triton_testing(tt)
    s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    s.record()
    e.record()
    rig.cuda.synchronize()
    tt.do_bench(lambda: None)  # type: ignore[attr-defined]
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit", "enter auto:do_bench", "exit"]
    assert active_region() is None


def test_the_reaper_thread_exits_a_lingering_region_after_the_grace_period(daemon: FakeDaemon) -> None:
    LOG.calls.clear()
    cuda = fake_cuda()
    auto = AutoRegions(warn=lambda _: None)  # the real clock and the reaper thread
    auto.patch_event_class(FakeEvent, cuda)
    try:
        s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
        s.record()
        e.record()
        cuda.synchronize()  # type: ignore[attr-defined]
        o = auto.held_event_region()
        assert o is not None and o.linger_until is not None
        ended = o.linger_until
        assert o.done.wait(timeout=10), "the reaper did not exit the lingering region"
        assert auto.clock() >= ended
        assert active_region() is None and auto.held_event_region() is None
        assert [m["type"] for m in daemon.requests if m["type"].startswith("region")] == ["region_enter", "region_exit"]
        with kforge.region("after") as r:  # the main thread's stale record does not make it join
            assert not r.joined and r.region != o.region.region
        s.record()  # a new interval: a new region
        assert auto.held_event_region() is not None and auto.held_event_region() is not o
    finally:
        auto.uninstall()
    assert [m["type"] for m in daemon.requests if m["type"].startswith("region")] == ["region_enter", "region_exit"] * 3


class SlowRegion(Region):
    """A region whose grant comes only when the test says so."""

    def __init__(self, name: str, waiting: threading.Event, grant: threading.Event) -> None:
        super().__init__(name, joinable=True)
        self.waiting, self.grant_now = waiting, grant

    def __enter__(self) -> "SlowRegion":
        self.waiting_for = "daemon grant"
        self.waiting.set()
        assert self.grant_now.wait(timeout=20)
        self.waiting_for = None
        super().__enter__()
        return self


def test_an_entry_that_waits_long_is_reported_while_it_waits(rig: Rig) -> None:
    waiting, grant = threading.Event(), threading.Event()
    auto = rig.auto
    auto.open_region = lambda name: SlowRegion(name, waiting, grant)
    t = threading.Thread(target=lambda: FakeEvent(enable_timing=True).record())
    t.start()
    assert waiting.wait(timeout=20)
    auto.reap()
    assert rig.warnings == []
    rig.now += SLOW_ENTRY_S + 0.5
    auto.reap()
    assert len(rig.warnings) == 1, rig.warnings
    assert f"region '{EVENT_REGION}'" in rig.warnings[0] and "still waiting after 2.5 s for daemon grant" in \
        rig.warnings[0], rig.warnings
    auto.reap()
    assert len(rig.warnings) == 1, "once per SLOW_ENTRY_S"
    grant.set()
    t.join(timeout=20)
    assert not t.is_alive()
    assert rig.warnings[-1] == f"kforge --auto-regions: region '{EVENT_REGION}' was granted after 2.5 s"
    assert len(rig.warnings) == 2 and rig.auto.entered == {EVENT_REGION: 1}


def test_a_wrapped_call_holding_its_region_long_is_reported_once_with_where_it_is(rig: Rig) -> None:
    """Inductor's benchmark calls of a max-autotune compile held their regions to the lease (the
    daemon revoked them): the report says where the holding thread was before that happens."""
    reaped: List[Optional[float]] = []

    def slow_benchmark() -> str:
        reaped.append(rig.auto.reap())
        rig.now += LONG_HOLD_SHARE * 60.0 + 1.0  # the fake daemon's grant says lease_ms 60000
        reaped.append(rig.auto.reap())
        reaped.append(rig.auto.reap())
        return "timed"

    assert rig.auto.wrap(slow_benchmark, "auto:test.benchmark")() == "timed"
    assert rig.regions() == ["enter auto:test.benchmark", "exit"]
    assert len(rig.warnings) == 1, rig.warnings
    line = rig.warnings[0]
    assert line.startswith("kforge --auto-regions: region 'auto:test.benchmark' (") and \
        "held for 31.0 s of its 60 s lease; thread" in line, line
    assert "slow_benchmark <- " in line and line.count(" <- ") == HOLD_FRAMES - 1, line
    assert reaped[0] == pytest.approx(LONG_HOLD_SHARE * 60.0) and reaped[2] is None, reaped
    assert rig.auto.reap() is None and len(rig.warnings) == 1, "nothing held after the call"


def test_without_a_reaper_a_long_hold_is_reported_when_the_call_returns_with_what_it_timed(rig: Rig) -> None:
    """Inductor's hooks in a kforge step run no reaper thread: a benchmark call that held its
    region past LONG_HOLD_SHARE of the lease is reported as it returns, naming the callable it
    timed (session 21: a depthwise convolution's max-autotune benchmarks held their regions to
    the 60 s lease, unexplained); a short one is not."""

    class Kernel:
        def __repr__(self) -> str:
            return "<CachingAutotuner triton_poi_fused_convolution_0\n XBLOCK=1>"

    def benchmark(kernel: Any, seconds: float) -> str:
        rig.now += seconds
        return "timed"

    wrapped = rig.auto.wrap(benchmark, "auto:inductor.benchmark_gpu")
    assert wrapped(Kernel(), 1.0) == "timed"
    assert rig.warnings == [], "a short hold"
    assert wrapped(Kernel(), LONG_HOLD_SHARE * INDUCTOR_LEASE_S + 2.0) == "timed"
    assert len(rig.warnings) == 1, rig.warnings
    line = rig.warnings[0]
    assert line.startswith("kforge --auto-regions: region 'auto:inductor.benchmark_gpu' (") and line.endswith(
        "held for 9.5 s of its 15 s lease; the call timed: <CachingAutotuner triton_poi_fused_convolution_0 XBLOCK=1>"), line
    # Inductor's benchmarks ask for the shorter lease; other hooks' regions take the daemon's.
    assert rig.auto.wrap(benchmark, "auto:test.benchmark")(Kernel(), 1.0) == "timed"
    leases = [(m["name"], m.get("lease_ms")) for m in rig.daemon.requests if m["type"] == "region_enter"]
    assert leases == [("auto:inductor.benchmark_gpu", INDUCTOR_LEASE_S * 1e3)] * 2 + [("auto:test.benchmark", None)], leases


def test_elapsed_time_exits_when_the_script_waited_some_other_way(rig: Rig) -> None:
    old_s, old_e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    s.record()
    old_s.elapsed_time(old_e)  # an earlier interval's time: this one has no end event yet
    assert active_region() is not None
    e.record()
    o = rig.auto.held_event_region()
    assert o is not None and o.linger_until is None
    s.elapsed_time(e)
    assert o.linger_until is not None
    rig.after_grace()
    assert active_region() is None


def test_events_without_timing_never_open_a_region(rig: Rig) -> None:
    a, b = FakeEvent(), FakeEvent(enable_timing=False)
    a.record()
    b.record()
    rig.cuda.synchronize()
    assert LOG.calls == ["record:out", "record:out", "sync"]
    assert rig.regions() == []


def test_a_region_past_its_lease_is_exited_at_the_next_event_call(rig: Rig) -> None:
    s = FakeEvent(enable_timing=True)
    s.record()
    assert active_region() is not None
    rig.now += 61.0  # the fake daemon's grant says lease_ms 60000
    FakeEvent().record()
    assert active_region() is None
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"]
    assert any("past its lease" in w for w in rig.warnings), rig.warnings


def test_close_all_exits_what_is_open(rig: Rig) -> None:
    FakeEvent(enable_timing=True).record()
    assert active_region() is not None
    rig.auto.close_all()
    assert active_region() is None
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"]


def test_kforge_regions_inside_an_event_region_join_it(rig: Rig) -> None:
    s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    s.record()
    outer = active_region()
    assert outer is not None
    with kforge.region("inner") as inner:
        assert inner.joined and inner.region == outer.region
    assert active_region() is outer, "the outer region is still held"
    e.record()
    rig.cuda.synchronize()
    rig.after_grace()
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"], "nothing double-entered"


def test_no_event_region_inside_a_kforge_region(rig: Rig) -> None:
    with kforge.region("mine"):
        s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
        s.record()
        e.record()
        rig.cuda.synchronize()
        assert active_region() is not None and active_region().name == "mine"  # type: ignore[union-attr]
    assert rig.regions() == ["enter mine", "exit"]


def test_plain_kforge_regions_still_do_not_nest(rig: Rig) -> None:
    with kforge.region("a"):
        with pytest.raises(kforge.KforgeError, match="not re-entrant"):
            with kforge.region("b"):
                pass


def test_uninstall_restores_every_patched_callable() -> None:
    cuda = fake_cuda()
    before: Dict[str, Any] = {k: FakeEvent.__dict__[k] for k in ("__new__", "record", "synchronize", "elapsed_time")}
    sync, stream_sync = cuda.synchronize, FakeStream.__dict__["synchronize"]  # type: ignore[attr-defined]
    auto = AutoRegions(warn=lambda _: None)
    auto.patch_event_class(FakeEvent, cuda)
    assert getattr(FakeEvent.__dict__["record"], WRAPPED_MARK, False)
    auto.patch_event_class(FakeEvent, cuda)  # a second patch is a no-op
    auto.uninstall()
    assert {k: FakeEvent.__dict__[k] for k in before} == before
    assert cuda.synchronize is sync and FakeStream.__dict__["synchronize"] is stream_sync  # type: ignore[attr-defined]
    FakeEvent(enable_timing=True).record()
    assert active_region() is None


def fake_triton_testing(record_events: bool) -> types.ModuleType:
    m = types.ModuleType("fake_triton_testing")

    def do_bench(fn: Callable[[], Any], warmup: int = 1, rep: int = 3) -> float:
        """Triton's do_bench (fake)."""
        for _ in range(3):
            if record_events:
                FakeEvent(enable_timing=True).record()
            LOG.calls.append(f"fn:{'in' if active_region() is not None else 'out'}")
            fn()
        return 0.5

    setattr(m, "do_bench", do_bench)
    return m


def test_each_do_bench_call_is_one_region_and_its_events_open_none(rig: Rig) -> None:
    tt = fake_triton_testing(record_events=True)
    rig.auto.patch_triton_testing(tt)
    assert tt.do_bench.__doc__ == "Triton's do_bench (fake)."  # type: ignore[attr-defined]
    assert tt.do_bench(lambda: None) == 0.5  # type: ignore[attr-defined]
    assert tt.do_bench(lambda: None) == 0.5  # type: ignore[attr-defined]
    assert [c for c in LOG.calls if c.startswith("fn")] == ["fn:in"] * 6
    assert rig.regions() == ["enter auto:do_bench", "exit"] * 2
    assert active_region() is None


def test_do_bench_inside_a_kforge_region_is_not_wrapped_again(rig: Rig) -> None:
    tt = fake_triton_testing(record_events=False)
    rig.auto.patch_triton_testing(tt)
    with kforge.region("mine"):
        tt.do_bench(lambda: None)  # type: ignore[attr-defined]
    assert rig.regions() == ["enter mine", "exit"]


def test_timer_methods_are_wrapped(rig: Rig) -> None:
    class Timer:
        def timeit(self, number: int = 1) -> int:
            return number

        def blocked_autorange(self) -> str:
            return "b"

    rig.auto.patch_timer_class(Timer)
    assert Timer().timeit(3) == 3 and Timer().blocked_autorange() == "b"
    assert rig.regions() == ["enter auto:Timer.timeit", "exit", "enter auto:Timer.blocked_autorange", "exit"]


def test_enabled_needs_the_variable_and_a_socket() -> None:
    assert enabled({"KFORGE_AUTO_REGIONS": "1", "KFORGE_SOCKET": "/x"})
    assert not enabled({"KFORGE_AUTO_REGIONS": "1"})
    assert not enabled({"KFORGE_SOCKET": "/x"})
    assert not enabled({"KFORGE_AUTO_REGIONS": "0", "KFORGE_SOCKET": "/x"})


# -- fresh interpreters: the import hook and the sitecustomize chain ---------------------------

BOOT = "import os\nfrom kforge.autoregions import bootstrap\nbootstrap(os.path.dirname(os.path.abspath(__file__)))\n"
PROBE = textwrap.dedent(
    """
    import sys, kforge.autoregions as ar
    import triton.testing
    from triton.testing import do_bench
    print("wrapped" if getattr(do_bench, ar.WRAPPED_MARK, False) else "plain")
    print("chained" if getattr(sys, "kforge_test_chained", False) else "not-chained")
    print("boot-dir-left" if any(p.endswith("boot") for p in sys.path) else "boot-dir-gone")
    """
)


def fresh(tmp_path: Path, env_extra: Dict[str, str], other_site: bool) -> List[str]:
    tmp_path = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    tmp_path.mkdir()
    boot = tmp_path / "boot"
    boot.mkdir(exist_ok=True)
    (boot / "sitecustomize.py").write_text(BOOT)
    fake = tmp_path / "fake"
    (fake / "triton").mkdir(parents=True, exist_ok=True)
    (fake / "triton" / "__init__.py").write_text("")
    (fake / "triton" / "testing.py").write_text("def do_bench(fn, warmup=1, rep=3):\n    fn()\n    return 1.0\n")
    other = tmp_path / "other"
    other.mkdir(exist_ok=True)
    if other_site:
        (other / "sitecustomize.py").write_text("import sys\nsys.kforge_test_chained = True\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(boot), str(fake), str(other), str(PYTHON_DIR)])
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_hook_wraps_do_bench_on_import_and_chains_the_existing_sitecustomize(tmp_path: Path) -> None:
    env = {"KFORGE_AUTO_REGIONS": "1", "KFORGE_SOCKET": str(tmp_path / "none.sock")}
    assert fresh(tmp_path, env, other_site=True) == ["wrapped", "chained", "boot-dir-gone"]


def test_outside_a_kforge_job_the_hook_does_nothing(tmp_path: Path) -> None:
    assert fresh(tmp_path, {"KFORGE_AUTO_REGIONS": "1"}, other_site=True) == ["plain", "chained", "boot-dir-gone"]
    assert fresh(tmp_path, {}, other_site=False) == ["plain", "not-chained", "boot-dir-gone"]


def test_installing_patches_a_module_imported_before() -> None:
    tt = fake_triton_testing(record_events=False)
    saved: Optional[types.ModuleType] = sys.modules.get("triton.testing")
    sys.modules["triton.testing"] = tt
    auto = AutoRegions(warn=lambda _: None)
    try:
        auto.install()
        assert getattr(tt.do_bench, WRAPPED_MARK, False)  # type: ignore[attr-defined]
    finally:
        auto.uninstall()
        if saved is None:
            del sys.modules["triton.testing"]
        else:
            sys.modules["triton.testing"] = saved
    assert not getattr(tt.do_bench, WRAPPED_MARK, False)  # type: ignore[attr-defined]


def test_a_forked_child_does_not_exit_its_parents_region(rig: Rig) -> None:
    s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    s.record()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its copy of the open region is the parent's, not its own
        os.close(r)
        s.elapsed_time(s)  # would exit an open region of its own
        rig.auto.close_all()
        os.write(w, b"none" if rig.auto.held_event_region() is None else b"held")
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read()
    assert os.waitpid(pid, 0)[1] == 0
    assert said == b"none"
    assert rig.regions() == [f"enter {EVENT_REGION}"], "the child sent nothing on the parent's connection"
    e.record()
    rig.cuda.synchronize()
    rig.after_grace()
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"]


def test_a_joined_regions_own_events_and_waits_do_not_end_the_users_interval(rig: Rig) -> None:
    s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    s.record()
    outer = active_region()
    with kforge.region("kforge.do_bench-like") as inner:
        assert outer is not None and outer.nested == 1 and inner.joined
        a, b = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
        a.record()
        b.record()
        rig.cuda.synchronize()
        b.synchronize()
        a.elapsed_time(b)
        assert active_region() is outer, "the inner timing did not exit the user's region"
    assert outer.nested == 0
    rig.cuda.synchronize()
    assert active_region() is outer, "no end event of the user's own yet"
    e.record()
    rig.cuda.synchronize()
    rig.after_grace()
    assert active_region() is None
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"]


def test_a_wrapped_do_bench_inside_an_event_interval_leaves_it_open(rig: Rig) -> None:
    tt = fake_triton_testing(record_events=True)
    rig.auto.patch_triton_testing(tt)

    def fake_do_bench_with_sync(fn: Callable[[], Any]) -> float:
        tt.do_bench(fn)  # type: ignore[attr-defined]
        rig.cuda.synchronize()
        return 0.0

    wrapped = rig.auto.wrap(fake_do_bench_with_sync, "auto:outer")
    s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    s.record()
    wrapped(lambda: None)
    o = rig.auto.held_event_region()
    assert o is not None and o.linger_until is None
    e.record()
    rig.cuda.synchronize()
    rig.after_grace()
    assert active_region() is None
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"]


def test_a_region_of_another_thread_inside_an_event_interval_joins_it(rig: Rig) -> None:
    s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    s.record()
    outer = active_region()
    seen: List[Any] = []

    def worker() -> None:  # would wait for the region lock for ever: the main thread joins it
        with kforge.region("in-thread") as r:
            seen.append((r.joined, r.region, active_region() is r))
        seen.append(active_region())

    t = threading.Thread(target=worker)
    t.start()
    t.join(timeout=20)
    assert not t.is_alive(), "the thread's region waited for the main thread's"
    assert outer is not None and seen == [(True, outer.region, True), None]
    assert outer.nested == 0
    e.record()
    rig.cuda.synchronize()
    rig.after_grace()
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"]
    with kforge.region("after"):  # the process holds no joinable region any more: a real one
        pass
    assert rig.regions()[-2:] == ["enter after", "exit"]


def test_a_lingering_region_with_a_kforge_region_joined_is_exited_only_after_that_one(rig: Rig) -> None:
    s, e = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    s.record()
    e.record()
    rig.cuda.synchronize()
    outer = active_region()
    with kforge.region("user's kforge.do_bench") as inner:  # joins the lingering region
        assert outer is not None and inner.joined and inner.region == outer.region
        rig.after_grace()
        assert rig.regions() == [f"enter {EVENT_REGION}"], "not exited under a joined region"
        FakeEvent(enable_timing=True).record()  # its own events start no interval of the user's
        assert rig.auto.continued == 0
    rig.auto.reap()
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit"] and active_region() is None


class CachingAutotuner:
    """Shaped like Inductor's, as far as ``compile_choice`` looks: no launcher until compiled."""

    def __init__(self) -> None:
        self.launchers: List[Any] = []
        self.compiled_in: List[Any] = []

    def precompile(self) -> None:
        self.compiled_in.append(active_region())
        self.launchers = [object()]

    def run(self, *args: Any) -> None:
        pass


def test_a_template_choice_is_compiled_outside_a_lingering_event_region(rig: Rig) -> None:
    """A benchmark that comes while the thread's event region lingers (a user's timing loop just
    waited) gets a region of its own: the lingering one is exited first, so the choice is
    compiled outside any region, not inside the new one by its first call."""
    start, end = FakeEvent(enable_timing=True), FakeEvent(enable_timing=True)
    start.record()
    end.record()
    rig.cuda.synchronize()
    assert rig.auto.held_event_region() is not None, "it lingers"
    choice = CachingAutotuner()
    seen: List[Any] = []

    def benchmark_gpu(bench: Any, fn: Any) -> float:
        seen.append(active_region())
        fn()
        return 0.5

    wrapped = rig.auto.wrap(benchmark_gpu, "auto:inductor.benchmark_gpu", compile_choice_first=True)
    assert wrapped(None, functools.partial(choice.run, "x")) == 0.5
    assert choice.compiled_in == [None] and len(choice.launchers) == 1
    assert seen[0] is not None and seen[0].name == "auto:inductor.benchmark_gpu"
    assert rig.regions() == [f"enter {EVENT_REGION}", "exit", "enter auto:inductor.benchmark_gpu", "exit"]
