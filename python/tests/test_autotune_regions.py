"""``kforge.autoregions``' hooks of Inductor's own autotuning: the benchmarker classes of
``torch._inductor.runtime.benchmarking`` (fake ones shaped like them, and the real module on the
CPU), ``do_bench_using_profiling``, the environment of Inductor's subprocesses (the autotune
subprocess gets the bootstrap) and :func:`kforge.autoregions.inductor_regions`. Regions go to
the fake daemon of ``conftest.py``."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

import kforge
import kforge.autoregions as ar
from kforge.autoregions import BOOT_DIR_NAME, ENV, WRAPPED_MARK, AutoRegions, InductorRegions, find_boot_dir
from kforge.region import active_region

from conftest import FakeDaemon

PYTHON_DIR = Path(__file__).resolve().parents[1]


def region_log(daemon: FakeDaemon) -> List[str]:
    out = []
    for m in daemon.requests:
        if m["type"] == "region_enter":
            out.append(f"enter {m['name']}")
        elif m["type"] == "region_exit":
            out.append("exit")
    return out


def fake_benchmarking() -> types.ModuleType:
    """Shaped like ``torch._inductor.runtime.benchmarking``: ``benchmark`` dispatches to
    ``benchmark_gpu``, which calls ``triton.testing.do_bench``-like code (``do_bench`` of the
    module, set by the test) or captures a graph first (``benchmark_gpu_with_cuda_graph``)."""
    m = types.ModuleType("fake_inductor_benchmarking")
    seen: List[str] = []

    class Benchmarker:
        def benchmark(self, fn: Callable[[], Any], device: str = "cuda") -> float:
            return self.benchmark_cpu(fn) if device == "cpu" else self.benchmark_gpu(fn)

        def benchmark_cpu(self, fn: Callable[[], Any]) -> float:
            seen.append(f"cpu:{'in' if active_region() is not None else 'out'}")
            fn()
            return 1.0

        def benchmark_gpu(self, fn: Callable[[], Any]) -> float:
            raise NotImplementedError

        def benchmark_gpu_with_cuda_graph(self, fn: Callable[[], Any]) -> float:
            seen.append(f"capture:{'in' if active_region() is not None else 'out'}")
            return self.benchmark_gpu(fn)

    class InductorBenchmarker(Benchmarker):
        def benchmark_gpu(self, fn: Callable[[], Any]) -> float:
            seen.append(f"gpu:{'in' if active_region() is not None else 'out'}")
            do_bench = getattr(m, "do_bench", None)
            if do_bench is not None:
                return float(do_bench(fn))
            fn()
            return 2.0

    for cls in (Benchmarker, InductorBenchmarker):
        cls.__module__ = m.__name__
    setattr(m, "Benchmarker", Benchmarker)
    setattr(m, "InductorBenchmarker", InductorBenchmarker)
    setattr(m, "benchmarker", InductorBenchmarker())
    setattr(m, "seen", seen)
    return m


@pytest.fixture
def hooks() -> Iterator[AutoRegions]:
    auto = AutoRegions(warn=lambda _: None, reaper=False)
    yield auto
    auto.uninstall()


def test_each_benchmark_call_is_one_region_at_the_outermost_entry(daemon: FakeDaemon, hooks: AutoRegions) -> None:
    m = fake_benchmarking()
    hooks.patch_inductor_benchmarking(m)
    bm = m.benchmarker  # type: ignore[attr-defined]
    assert bm.benchmark(lambda: None) == 2.0
    assert bm.benchmark_gpu(lambda: None) == 2.0
    assert bm.benchmark_gpu_with_cuda_graph(lambda: None) == 2.0
    assert region_log(daemon) == [
        "enter auto:inductor.benchmark", "exit",
        "enter auto:inductor.benchmark_gpu", "exit",
        "enter auto:inductor.benchmark_gpu_with_cuda_graph", "exit",
    ]
    assert m.seen == ["gpu:in", "gpu:in", "capture:in", "gpu:in"]  # type: ignore[attr-defined]
    assert active_region() is None


def test_a_benchmark_timed_in_a_tainted_region_is_timed_again_once(daemon: FakeDaemon) -> None:
    lines: List[str] = []
    hooks = AutoRegions(warn=lines.append, reaper=False)
    try:
        m = fake_benchmarking()
        hooks.patch_inductor_benchmarking(m)
        bm = m.benchmarker  # type: ignore[attr-defined]
        daemon.taint.add(5)  # the first region: its call is timed again, in region 6
        assert bm.benchmark_gpu(lambda: None) == 2.0
        assert region_log(daemon) == ["enter auto:inductor.benchmark_gpu", "exit"] * 2
        assert m.seen == ["gpu:in", "gpu:in"]  # type: ignore[attr-defined]
        assert hooks.retakes == {"retaken": 1, "tainted_again": 0, "kept": 0}
        assert len(lines) == 1 and "(5) was not exclusive (tainted): its benchmark is timed again" in lines[0]
        # A revoked one is kept as timed (it outlived its lease).
        daemon.taint.add(7)
        daemon.revoke.add(7)
        bm.benchmark_gpu(lambda: None)
        assert hooks.retakes["kept"] == 1 and daemon.next_region == 8
        # Retaken and tainted again, INDUCTOR_RETAKE_STREAK times in a row: retakes pause ...
        streak = ar.INDUCTOR_RETAKE_STREAK
        daemon.taint.update(range(8, 8 + 2 * streak + 1))
        for _ in range(streak + 1):
            bm.benchmark_gpu(lambda: None)
        assert hooks.retakes == {"retaken": 1 + streak, "tainted_again": streak, "kept": 2}
        # ... until a region comes back clean.
        first = daemon.next_region
        daemon.taint.difference_update(range(first, first + 1))
        daemon.taint.add(first + 1)
        bm.benchmark_gpu(lambda: None)  # clean: the streak ends
        bm.benchmark_gpu(lambda: None)  # tainted: timed again (clean)
        assert hooks.retakes == {"retaken": 2 + streak, "tainted_again": streak, "kept": 2}
        assert daemon.next_region == first + 3
        # A user's own timing call (not Inductor's) is never timed again.
        tt = types.ModuleType("fake_triton_testing")
        setattr(tt, "do_bench", lambda fn: 3.0)
        hooks.patch_triton_testing(tt)
        daemon.taint.add(daemon.next_region)
        assert tt.do_bench(lambda: None) == 3.0  # type: ignore[attr-defined]
        assert hooks.retakes["retaken"] == 2 + streak
        hooks.report_retakes()
        assert f"{2 + streak} autotuning benchmark(s) timed again after a tainted region ({streak} tainted again); 2 kept" in lines[-1]
    finally:
        hooks.uninstall()


class SlowDevice:
    """A fake clock and device wait for :meth:`AutoRegions.slow_call_first`: each call of
    :meth:`callable` takes the next of ``seconds`` on the clock."""

    def __init__(self, seconds: List[float]) -> None:
        self.now = 0.0
        self.seconds = list(seconds)
        self.calls = 0

    def clock(self) -> float:
        return self.now

    def call(self) -> None:
        self.calls += 1
        self.now += self.seconds.pop(0) if self.seconds else 0.001


@contextlib.contextmanager
def slow_benchmarker(warn: Callable[[str], None]) -> Iterator[Tuple[SlowDevice, AutoRegions, Any]]:
    """A fake Inductor benchmarking module patched by hooks whose clock and device wait are a
    :class:`SlowDevice`'s: the device, the hooks and the module (uninstalled afterwards)."""
    dev = SlowDevice([])
    hooks = AutoRegions(warn=warn, reaper=False, clock=dev.clock)
    hooks.device_sync = lambda: True
    try:
        m = fake_benchmarking()
        hooks.patch_inductor_benchmarking(m)
        yield dev, hooks, m
    finally:
        hooks.uninstall()


def test_a_benchmark_whose_calls_take_over_the_slow_limit_is_timed_by_one_call(
        daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    lines: List[str] = []
    with slow_benchmarker(lines.append) as (dev, hooks, m):
        bm = m.benchmarker
        slow = ar.INDUCTOR_SLOW_CALL_S
        # Quick first call: Inductor's benchmark runs (one more call of its own).
        assert bm.benchmark_gpu(dev.call) == 2.0 and dev.calls == 2
        # Slow first call (a compile), quick second: Inductor's benchmark runs.
        dev.seconds = [slow + 5.0, 0.01]
        assert bm.benchmark_gpu(dev.call) == 2.0 and dev.calls == 5
        # Slow twice: the second call's time is the result, in ms; Inductor's is not run.
        dev.seconds = [slow + 1.0, slow + 2.5]
        assert bm.benchmark_gpu(dev.call) == pytest.approx((slow + 2.5) * 1e3) and dev.calls == 7
        dev.seconds = [slow + 1.0, slow + 1.5]
        assert bm.benchmark_gpu(dev.call, return_mode="all") == [pytest.approx((slow + 1.5) * 1e3)]
        assert m.seen == ["gpu:in", "gpu:in"]  # type: ignore[attr-defined]
        assert region_log(daemon) == ["enter auto:inductor.benchmark_gpu", "exit"] * 4
        assert (hooks.slow_call_count, hooks.slowest_call_s) == (2, pytest.approx(slow + 2.5))
        assert hooks.retakes["retaken"] == 0
        assert len(lines) == 1 and "it is timed by that call alone" in lines[0] and "SlowDevice.call" in lines[0]
        hooks.report_retakes()
        assert f"2 autotuning benchmark(s) timed by one call, each call over {slow:g} s (the slowest {slow + 2.5:.1f} s)" in lines[-1]
        # Timed by a slow call in a tainted region: not timed again (two slow calls more).
        daemon.taint.add(daemon.next_region)
        dev.seconds = [slow + 1.0, slow + 1.0]
        bm.benchmark_gpu(dev.call)
        assert dev.calls == 11 and hooks.retakes["retaken"] == 0
        # A first call that raises: Inductor's benchmark calls it again and handles its error.
        def invalid() -> None:
            dev.calls += 1
            if dev.calls == 12:
                raise RuntimeError("triton: invalid configuration argument")

        assert bm.benchmark_gpu(invalid) == 2.0 and dev.calls == 13
        # In Inductor's deterministic mode nothing is called first.
        monkeypatch.setitem(sys.modules, "torch._inductor.config", types.SimpleNamespace(deterministic=True))
        assert bm.benchmark_gpu(dev.call) == 2.0 and dev.calls == 14
        monkeypatch.setitem(sys.modules, "torch._inductor.config", types.SimpleNamespace(deterministic=False))
        # Without a device to wait for (CUDA not initialized), nothing is called first.
        hooks.device_sync = lambda: False
        before = dev.calls
        assert bm.benchmark_gpu(dev.call) == 2.0 and dev.calls == before + 1


def test_the_slow_call_check_waits_for_cuda_only_once_it_is_initialized(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: List[str] = []
    cuda = types.SimpleNamespace(is_initialized=lambda: False, synchronize=lambda: waits.append("sync"))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert ar.cuda_synchronize() is False and waits == []
    cuda.is_initialized = lambda: True
    assert ar.cuda_synchronize() is True and waits == ["sync"]
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace())
    assert ar.cuda_synchronize() is False


def test_a_bound_method_taken_after_install_is_wrapped(daemon: FakeDaemon, hooks: AutoRegions) -> None:
    # pad_mm and overlap_scheduling take ``benchmarker.benchmark_gpu`` into a functools.partial
    # when they run (after the hooks): patched on the class, the bound method is the wrapper.
    m = fake_benchmarking()
    hooks.patch_inductor_benchmarking(m)
    bench = m.benchmarker.benchmark_gpu  # type: ignore[attr-defined]
    bench(lambda: None)
    assert region_log(daemon) == ["enter auto:inductor.benchmark_gpu", "exit"]


def test_do_bench_inside_a_benchmark_joins_its_region(daemon: FakeDaemon, hooks: AutoRegions) -> None:
    m = fake_benchmarking()
    tt = types.ModuleType("fake_triton_testing")
    inner: List[Any] = []

    def do_bench(fn: Callable[[], Any]) -> float:
        inner.append(active_region())
        with kforge.region("inner kforge.region") as r:  # what kforge.do_bench does inside
            inner.append(r.joined)
        fn()
        return 0.25

    setattr(tt, "do_bench", do_bench)
    hooks.patch_triton_testing(tt)
    setattr(m, "do_bench", tt.do_bench)  # type: ignore[attr-defined]
    hooks.patch_inductor_benchmarking(m)
    assert m.benchmarker.benchmark(lambda: None) == 0.25  # type: ignore[attr-defined]
    assert region_log(daemon) == ["enter auto:inductor.benchmark", "exit"], "nothing double-entered"
    assert inner[0] is not None and inner[0].name == "auto:inductor.benchmark" and inner[1] is True


def test_a_failing_benchmark_exits_its_region_and_raises(daemon: FakeDaemon, hooks: AutoRegions) -> None:
    m = fake_benchmarking()
    hooks.patch_inductor_benchmarking(m)

    def broken() -> None:
        raise RuntimeError("invalid configuration argument")

    with pytest.raises(RuntimeError, match="invalid configuration"):
        m.benchmarker.benchmark_gpu(broken)  # type: ignore[attr-defined]
    assert region_log(daemon) == ["enter auto:inductor.benchmark_gpu", "exit"]
    assert active_region() is None
    m.benchmarker.benchmark_gpu(lambda: None)  # type: ignore[attr-defined]
    assert region_log(daemon)[-2:] == ["enter auto:inductor.benchmark_gpu", "exit"]


def test_a_benchmark_inside_a_kforge_region_enters_none(daemon: FakeDaemon, hooks: AutoRegions) -> None:
    m = fake_benchmarking()
    hooks.patch_inductor_benchmarking(m)
    with kforge.region("step"):
        m.benchmarker.benchmark(lambda: None)  # type: ignore[attr-defined]
    assert region_log(daemon) == ["enter step", "exit"]


def test_patching_is_idempotent_and_uninstall_restores_the_methods(daemon: FakeDaemon) -> None:
    m = fake_benchmarking()
    classes = [m.Benchmarker, m.InductorBenchmarker]  # type: ignore[attr-defined]
    before = [dict(vars(c)) for c in classes]
    auto = AutoRegions(warn=lambda _: None, reaper=False)
    auto.patch_inductor_benchmarking(m)
    auto.patch_inductor_benchmarking(m)
    assert getattr(vars(m.InductorBenchmarker)["benchmark_gpu"], WRAPPED_MARK)  # type: ignore[attr-defined]
    assert not getattr(getattr(vars(m.InductorBenchmarker)["benchmark_gpu"], "__wrapped__"), WRAPPED_MARK, False)  # type: ignore[attr-defined]
    m.benchmarker.benchmark(lambda: None)  # type: ignore[attr-defined]
    assert region_log(daemon) == ["enter auto:inductor.benchmark", "exit"], "one wrapper, one region"
    auto.uninstall()
    assert [dict(vars(c)) for c in classes] == before
    m.benchmarker.benchmark(lambda: None)  # type: ignore[attr-defined]
    assert region_log(daemon) == ["enter auto:inductor.benchmark", "exit"]


def test_classes_imported_into_the_module_are_left_alone(hooks: AutoRegions) -> None:
    m = fake_benchmarking()

    class Elsewhere:
        def benchmark_gpu(self) -> None:
            pass

    setattr(m, "Elsewhere", Elsewhere)
    hooks.patch_inductor_benchmarking(m)
    assert not getattr(vars(Elsewhere)["benchmark_gpu"], WRAPPED_MARK, False)


def fake_inductor_utils(env: Dict[str, str]) -> types.ModuleType:
    m = types.ModuleType("fake_inductor_utils")

    def python_subprocess_env() -> Dict[str, str]:
        return dict(env)

    def do_bench_using_profiling(fn: Callable[[], Any]) -> float:
        fn()
        return 3.0 if active_region() is not None else -1.0

    setattr(m, "python_subprocess_env", python_subprocess_env)
    setattr(m, "do_bench_using_profiling", do_bench_using_profiling)
    return m


def test_do_bench_using_profiling_is_a_region(daemon: FakeDaemon, hooks: AutoRegions) -> None:
    u = fake_inductor_utils({})
    hooks.patch_inductor_utils(u)
    assert u.do_bench_using_profiling(lambda: None) == 3.0  # type: ignore[attr-defined]
    assert region_log(daemon) == ["enter auto:inductor.do_bench_using_profiling", "exit"]


def test_the_subprocess_environment_puts_the_bootstrap_first(hooks: AutoRegions, tmp_path: Path) -> None:
    boot = str(tmp_path / BOOT_DIR_NAME)
    hooks.boot_dir = boot
    u = fake_inductor_utils({"PYTHONPATH": os.pathsep.join(["/torch/root", boot, "/a"]), "X": "1"})
    hooks.patch_inductor_utils(u)
    env = u.python_subprocess_env()  # type: ignore[attr-defined]
    assert env["PYTHONPATH"].split(os.pathsep) == [boot, "/torch/root", "/a"]
    assert env[ENV] == "1" and env["X"] == "1"
    hooks.uninstall()
    assert ENV not in u.python_subprocess_env()  # type: ignore[attr-defined]


def test_without_a_bootstrap_directory_the_environment_is_unchanged(hooks: AutoRegions) -> None:
    hooks.boot_dir = None
    u = fake_inductor_utils({"PYTHONPATH": "/a"})
    hooks.patch_inductor_utils(u)
    assert u.python_subprocess_env() == {"PYTHONPATH": "/a"}  # type: ignore[attr-defined]


def test_find_boot_dir_reads_a_warm_jobs_pythonpath(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ar, "_boot_dir", None)
    boot = tmp_path / BOOT_DIR_NAME
    assert find_boot_dir({"PYTHONPATH": str(boot)}) is None, "no sitecustomize.py in it"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text("")
    assert find_boot_dir({"PYTHONPATH": os.pathsep.join(["/x", str(boot)])}) == os.path.realpath(boot)
    assert find_boot_dir({}) is None
    monkeypatch.setattr(ar, "_boot_dir", "/from/bootstrap")
    assert find_boot_dir({"PYTHONPATH": str(boot)}) == "/from/bootstrap"


def test_inductor_regions_without_a_socket_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ar, "_inductor", None)
    assert ar.inductor_regions({}) is None
    assert ar._inductor is None  # type: ignore[attr-defined]


def test_inductor_regions_installs_only_the_inductor_hooks_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ar, "_inductor", None)
    monkeypatch.setattr(ar, "_process", None)
    auto = ar.inductor_regions({"KFORGE_SOCKET": "/x.sock"})
    try:
        assert isinstance(auto, InductorRegions)
        assert set(auto.hooks()) == {ar.INDUCTOR_BENCHMARKING, ar.INDUCTOR_UTILS}
        assert auto.boot_dir is not None and os.path.basename(auto.boot_dir) == BOOT_DIR_NAME
        assert (Path(auto.boot_dir) / "sitecustomize.py").read_text() == ar.BOOT_SOURCE
        assert ar.inductor_regions({"KFORGE_SOCKET": "/x.sock"}) is auto
    finally:
        if auto is not None:
            auto.uninstall()
    assert auto is not None and auto._finder is None  # type: ignore[attr-defined]
    assert ar.inductor_regions({"KFORGE_SOCKET": "/x.sock"}) is auto and auto._finder is not None  # type: ignore[attr-defined]
    auto.uninstall()


def test_the_bootstrap_source_matches_the_daemons(tmp_path: Path) -> None:
    rust = (PYTHON_DIR.parent / "crates" / "kforge-python" / "src" / "lib.rs").read_text()
    for line in ar.BOOT_SOURCE.splitlines():
        assert line in rust, f"kforge_python::AUTO_REGIONS_SITECUSTOMIZE lacks {line!r}"


# -- the real torch._inductor on the CPU --------------------------------------------------------

torch = pytest.importorskip("torch")


@pytest.fixture
def real(daemon: FakeDaemon) -> Iterator[Any]:
    from torch._inductor.runtime import benchmarking

    auto = AutoRegions(warn=lambda _: None, reaper=False)
    auto.patch_inductor_benchmarking(benchmarking)
    yield benchmarking
    auto.uninstall()


def test_the_real_benchmarkers_cpu_path_is_one_region(daemon: FakeDaemon, real: Any) -> None:
    x = torch.randn(32, 32)
    ms = real.benchmarker.benchmark(torch.mm, (x, x), device="cpu", warmup=1, rep=1)
    assert ms >= 0.0
    real.benchmarker.benchmark_cpu(lambda: torch.mm(x, x), warmup=1, rep=1)
    assert region_log(daemon) == ["enter auto:inductor.benchmark", "exit", "enter auto:inductor.benchmark_cpu", "exit"]
    names = {c.__name__ for c in vars(real).values() if isinstance(c, type) and
             getattr(vars(c).get("benchmark_gpu"), WRAPPED_MARK, False)}
    assert {"TritonBenchmarker", "InductorBenchmarker"} <= names


def test_the_real_benchmarker_exits_the_region_when_the_callable_fails(daemon: FakeDaemon, real: Any) -> None:
    def broken() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        real.benchmarker.benchmark(broken, device="cpu", warmup=1, rep=1)
    assert region_log(daemon) == ["enter auto:inductor.benchmark", "exit"] and active_region() is None


def test_the_real_uninstall_restores_inductors_benchmarker() -> None:
    from torch._inductor.runtime import benchmarking

    before = {c: dict(vars(c)) for c in vars(benchmarking).values() if isinstance(c, type)}
    auto = AutoRegions(warn=lambda _: None, reaper=False)
    auto.patch_inductor_benchmarking(benchmarking)
    auto.uninstall()
    assert {c: dict(vars(c)) for c in before} == before


def test_the_real_subprocess_env_carries_the_bootstrap(hooks: AutoRegions, tmp_path: Path) -> None:
    from torch._inductor import utils

    if not hasattr(utils, "python_subprocess_env"):
        pytest.skip("this torch builds its subprocess environments inline")
    if ar._inductor is not None:  # an earlier test's inductor_regions() (a dispatch step's) wrapped it first
        ar._inductor.uninstall()
    hooks.boot_dir = str(tmp_path / BOOT_DIR_NAME)
    hooks.patch_inductor_utils(utils)
    env = utils.python_subprocess_env()
    assert env["PYTHONPATH"].split(os.pathsep)[0] == hooks.boot_dir and env[ENV] == "1"


CHILD = textwrap.dedent(
    """
    import json, os, sys
    import kforge.autoregions as ar
    from torch._inductor import utils
    from torch._inductor.runtime import benchmarking
    env = utils.python_subprocess_env()
    out = {"wrapped": bool(getattr(benchmarking.InductorBenchmarker.benchmark_gpu, ar.WRAPPED_MARK, False))}
    if "--child" not in sys.argv:
        import subprocess
        # what TuningProcess.start does: a new interpreter with python_subprocess_env()
        child = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
        out["child"] = json.loads(child.stdout or "null") if child.returncode == 0 else child.stderr
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("socket", [True, False])
def test_an_inductor_subprocess_of_an_auto_regions_job_gets_the_hooks(tmp_path: Path, socket: bool) -> None:
    # A fresh interpreter started as the daemon starts an --auto-regions job; without
    # KFORGE_SOCKET (outside a kforge job) neither it nor its Inductor subprocess is patched.
    boot = tmp_path / BOOT_DIR_NAME
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(ar.BOOT_SOURCE)
    script = tmp_path / "probe.py"
    script.write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_")}
    env.update({"PYTHONPATH": os.pathsep.join([str(boot), str(PYTHON_DIR)]), ENV: "1"})
    if socket:
        env["KFORGE_SOCKET"] = str(tmp_path / "none.sock")
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    import json

    assert json.loads(out.stdout.splitlines()[-1]) == {"wrapped": socket, "child": {"wrapped": socket}}


def test_a_real_max_autotune_compile_benchmarks_each_choice_in_one_region(daemon: FakeDaemon, real: Any) -> None:
    # max-autotune's choice selection (select_algorithm's AlgorithmSelectorCache) on the CPU: a
    # frozen Linear has two choices (the C++ GEMM template and the MKL linear), each benchmarked
    # by benchmarker.benchmark_cpu; caches off so that it benchmarks at all.
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = torch.nn.Linear(64, 64).eval()
    with inductor_config.patch(freezing=True, force_disable_caches=True, max_autotune_gemm_backends="CPP,ATEN"):
        compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
        with torch.no_grad():
            out = compiled(torch.randn(32, 64))
    torch._dynamo.reset()
    assert out.shape == (32, 64)
    log = region_log(daemon)
    entered = [e for e in log if e.startswith("enter")]
    assert entered, "the compile benchmarked nothing: no choice was autotuned"
    assert log == [e for name in entered for e in (name, "exit")], "each region exited before the next"
    assert set(entered) <= {"enter auto:inductor.benchmark_cpu", "enter auto:inductor.benchmark"}
    assert len(entered) == counters["inductor"]["benchmarking.InductorBenchmarker.benchmark_cpu"], log
    assert active_region() is None


def test_inductor_regions_patches_again_what_another_hook_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    # A warm worker: the job's --auto-regions hooks patched the benchmarker first (the step's
    # hooks then skipped it) and restored it after the job; the next call patches it again.
    from torch._inductor.runtime import benchmarking

    monkeypatch.setattr(ar, "_inductor", None)
    monkeypatch.setattr(ar, "_process", None)
    job = AutoRegions(warn=lambda _: None, reaper=False)
    job.install()
    step = ar.inductor_regions({"KFORGE_SOCKET": "/x.sock"})
    assert step is not None
    try:
        assert getattr(vars(benchmarking.InductorBenchmarker)["benchmark_gpu"], WRAPPED_MARK, False)
        job.uninstall()
        assert not getattr(vars(benchmarking.InductorBenchmarker)["benchmark_gpu"], WRAPPED_MARK, False)
        assert ar.inductor_regions({"KFORGE_SOCKET": "/x.sock"}) is step
        assert getattr(vars(benchmarking.InductorBenchmarker)["benchmark_gpu"], WRAPPED_MARK, False)
    finally:
        job.uninstall()
        step.uninstall()
    assert not getattr(vars(benchmarking.InductorBenchmarker)["benchmark_gpu"], WRAPPED_MARK, False)


def test_a_module_that_bound_the_functions_by_name_before_gets_the_wrappers(hooks: AutoRegions,
                                                                           tmp_path: Path) -> None:
    # A warm worker preloaded Inductor: autotune_process did `from .utils import
    # python_subprocess_env` before the hooks; its name is rebound too, and restored.
    u = fake_inductor_utils({"PYTHONPATH": "/a"})
    u.__name__ = "fakepkg.utils"
    user = types.ModuleType("fakepkg.autotune_process")
    setattr(user, "python_subprocess_env", u.python_subprocess_env)  # type: ignore[attr-defined]
    original = u.python_subprocess_env  # type: ignore[attr-defined]
    stranger = types.ModuleType("otherpkg.x")
    setattr(stranger, "python_subprocess_env", original)
    sys.modules.update({"fakepkg.utils": u, "fakepkg.autotune_process": user, "otherpkg.x": stranger})
    try:
        hooks.boot_dir = str(tmp_path / BOOT_DIR_NAME)
        hooks.patch_inductor_utils(u)
        assert user.python_subprocess_env()["PYTHONPATH"].split(os.pathsep)[0] == hooks.boot_dir  # type: ignore[attr-defined]
        assert stranger.python_subprocess_env is original, "another package's module is left alone"  # type: ignore[attr-defined]
        hooks.uninstall()
        assert user.python_subprocess_env is original and u.python_subprocess_env is original  # type: ignore[attr-defined]
    finally:
        for k in ("fakepkg.utils", "fakepkg.autotune_process", "otherpkg.x"):
            sys.modules.pop(k, None)


class CachingAutotuner:
    """Shaped like Inductor's: ``run`` launches its kernel (here: the fake device's next call)."""

    def __init__(self, dev: "SlowDevice", launchers: int, kind: str = "TEMPLATE", coordesc_found: bool = False,
                 compiles: bool = True, **meta: Any) -> None:
        self.launcher = types.SimpleNamespace(config=types.SimpleNamespace(found_by_coordesc=coordesc_found))
        self.dev, self.launchers, self.inductor_meta = dev, [self.launcher] * launchers, dict(meta)
        self.heuristic_type = types.SimpleNamespace(name=kind)
        self.compiles, self.compiled_in = compiles, []  # type: Tuple[bool, List[Any]]

    def precompile(self) -> None:
        self.compiled_in.append(active_region())
        if not self.compiles:
            raise RuntimeError("ptxas: out of resources")
        self.launchers = [self.launcher]

    def run(self, *args: Any, stream: int = 0) -> None:
        self.dev.call()


def test_a_slow_choice_that_only_launches_its_kernel_is_timed_by_its_first_call(daemon: FakeDaemon) -> None:
    """A max-autotune template choice (``partial(CachingAutotuner.run, ...)`` with one launcher
    and no tuning left) compiles nothing on its first call: when that call is slow, its time is
    the result, with no second call holding the region as long again. Two launchers (the first
    call tunes), coordinate descent still to do (a pointwise kernel), combo tuning or any other
    callable still take the second call."""
    with slow_benchmarker(lambda _: None) as (dev, _, m):
        bm = m.benchmarker
        slow = ar.INDUCTOR_SLOW_CALL_S
        alone = functools.partial(CachingAutotuner(dev, 1, coordinate_descent_tuning=True).run, "x", stream=0)
        assert ar.launches_its_kernel_alone(alone), "a template: coordinate descent never tunes it"
        for tuned_already in (CachingAutotuner(dev, 1, "POINTWISE", coordesc_found=True, coordinate_descent_tuning=True),
                              CachingAutotuner(dev, 1, "POINTWISE")):
            assert ar.launches_its_kernel_alone(functools.partial(tuned_already.run, "x"))
        dev.seconds = [slow + 4.0, slow + 9.0]
        assert bm.benchmark_gpu(alone) == pytest.approx((slow + 4.0) * 1e3) and dev.calls == 1
        dev.seconds = [slow + 4.0, 0.01]  # quick after all (a cold first launch): Inductor's benchmark runs
        before = dev.calls
        assert bm.benchmark_gpu(functools.partial(CachingAutotuner(dev, 2).run, "x")) == 2.0 and dev.calls == before + 3
        for other in (functools.partial(CachingAutotuner(dev, 2).run, "x"),
                      functools.partial(CachingAutotuner(dev, 1, "POINTWISE", coordinate_descent_tuning=True).run, "x"),
                      functools.partial(CachingAutotuner(dev, 1, combo_tuning_groups=[1]).run, "x"),
                      functools.partial(CachingAutotuner(dev, 0, compiles=False).run, "x"), dev.call):
            assert not ar.launches_its_kernel_alone(other)
            dev.seconds, before = [slow + 1.0, slow + 2.0], dev.calls
            assert bm.benchmark_gpu(other) == pytest.approx((slow + 2.0) * 1e3) and dev.calls == before + 2
        assert region_log(daemon) == ["enter auto:inductor.benchmark_gpu", "exit"] * 7


def test_a_template_choice_not_yet_compiled_is_compiled_outside_its_region(daemon: FakeDaemon) -> None:
    """A template choice that reaches its benchmark with no launcher (its first ``run`` would
    compile it, inside the region) is compiled first, outside any region; its first call then
    only launches it, and a slow one is timed by that call. Through ``benchmark`` (which calls
    ``benchmark_gpu`` inside its own region) it is compiled before that outer region. A compile
    that fails is left to ``run`` (two calls, as any choice that may compile on its first)."""
    with slow_benchmarker(lambda _: None) as (dev, _, m):
        bm = m.benchmarker
        slow = ar.INDUCTOR_SLOW_CALL_S
        fresh = CachingAutotuner(dev, 0)
        dev.seconds = [slow + 3.0, slow + 9.0]
        assert bm.benchmark_gpu(functools.partial(fresh.run, "x")) == pytest.approx((slow + 3.0) * 1e3)
        assert (dev.calls, fresh.compiled_in, len(fresh.launchers)) == (1, [None], 1), "compiled outside, one call"
        nested = CachingAutotuner(dev, 0)
        dev.seconds = [slow + 3.0, slow + 9.0]
        assert bm.benchmark(functools.partial(nested.run, "x")) == pytest.approx((slow + 3.0) * 1e3)
        assert (dev.calls, nested.compiled_in) == (2, [None]), "before benchmark's own region"
        broken = CachingAutotuner(dev, 0, compiles=False)
        assert not ar.compile_choice(functools.partial(broken.run, "x")) and broken.compiled_in == [None]
        assert not ar.compile_choice(functools.partial(CachingAutotuner(dev, 1).run, "x")), "compiled already"
        assert not ar.compile_choice(dev.call), "not an Inductor autotuner's run"
        # Later torch benchmarks a template choice through a closure over the bound run, not a partial.
        closed = CachingAutotuner(dev, 0)
        run_method = closed.run

        def run_fn() -> None:
            run_method("x", stream=0)

        assert ar.benchmarked_autotuner(run_fn) is closed and ar.compile_choice(run_fn)
        assert ar.launches_its_kernel_alone(run_fn), "compiled now: it only launches its kernel"
        assert region_log(daemon) == ["enter auto:inductor.benchmark_gpu", "exit", "enter auto:inductor.benchmark", "exit"]
