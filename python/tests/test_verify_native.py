"""Native candidates' accounting (kforge.verify.native) on the CPU, without a compiler: a fake
extension module (a module object whose file is a shared library outside the installed
packages) holding builtin functions — bound methods of private tensors, which are
``builtin_function_or_method`` objects like pybind11's functions. The corpus'
``vector_add/native_*.py`` candidates run the same code on real ``load_inline`` builds."""

from __future__ import annotations

import math
import operator
import types
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

from kforge.verify import native, runner  # noqa: E402


def fake_extension(tmp_path: Any, name: str, **fns: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__file__ = str(tmp_path / f"{name}.so")
    for k, f in fns.items():
        setattr(m, k, f)
    return m


def candidate_with(**values: Any) -> types.ModuleType:
    c = types.ModuleType("kforge_verify_candidate")

    class ModelNew(torch.nn.Module):  # type: ignore[misc]
        pass

    ModelNew.__module__ = c.__name__
    c.ModelNew = ModelNew  # type: ignore[attr-defined]
    for k, v in values.items():
        setattr(c, k, v)
    return c


def test_extension_modules_held_by_the_candidate_are_found_installed_ones_are_not(tmp_path: Any) -> None:
    base = torch.ones(4)
    ext = fake_extension(tmp_path, "ext_global", vector_add=base.add, _private=base.mul)
    held = fake_extension(tmp_path, "ext_attr", scale=base.mul)
    cand = candidate_with(ext=ext, torch=torch, C=torch._C, math=math)
    model = cand.ModelNew()
    model.kernels = held  # a ModelNew attribute (KernelBench's `self.elementwise_add = elementwise_add`)
    names = [n for n, _ in native.native_functions(cand, model)]
    # torch._C (a shared library inside the installed packages) and math are the environment's.
    assert names == ["ext_global.vector_add", "ext_attr.scale"]
    assert native.native_functions(candidate_with(torch=torch), torch.nn.Module()) == []


def test_calls_are_counted_through_any_reference(tmp_path: Any) -> None:
    base = torch.ones(4)
    ext = fake_extension(tmp_path, "ext_count", vector_add=base.add)
    fns = native.native_functions(candidate_with(ext=ext), torch.nn.Module())
    direct = ext.vector_add

    def via_closure(y: Any) -> Any:
        return direct(y)

    with native.NativeCounter(fns) as nc:
        ext.vector_add(torch.ones(4))
        via_closure(torch.ones(4))
        (direct,)[0](torch.ones(4))
    assert nc.calls == {"ext_count.vector_add": 3} and nc.count == 3
    ext.vector_add(torch.ones(4))  # not counted once exited
    assert nc.count == 3


def test_ghost_returns_nan_outputs_of_the_real_shapes_and_leaves_the_arguments(tmp_path: Any) -> None:
    base = torch.arange(4.0)
    out = torch.zeros(4)
    ext = fake_extension(tmp_path, "ext_ghost", vector_add=base.add, write_into=operator.setitem, count=base.numel)
    fns = native.native_functions(candidate_with(ext=ext), torch.nn.Module())
    f = ext.vector_add
    held: Callable[[Any], Any] = lambda y: f(y)  # noqa: E731  (a closure cell)
    in_list = [ext.write_into]
    with native.NativeCounter(fns, ghost=True) as g:
        r1 = ext.vector_add(torch.ones(4))
        r2 = held(torch.ones(4))
        # A write into an argument (an output buffer), returning nothing: a no-op now. (setitem is
        # shared with the operator module: replaced there too while entered, then restored.)
        in_list[0](out, slice(None), 7.0)
        n = ext.count()
    assert r1.shape == (4,) and bool(torch.isnan(r1).all()) and bool(torch.isnan(r2).all())
    assert torch.equal(out, torch.zeros(4)), "the ghost ran the real function on copies only"
    assert n == 4, "non-tensor results are returned as they are"
    assert g.calls == {"ext_ghost.count": 1, "ext_ghost.vector_add": 2, "ext_ghost.write_into": 1} and g.bypassed == 0
    # Every replaced reference is restored.
    assert ext.vector_add is f and in_list[0] is operator.setitem and ext.write_into is operator.setitem and torch.equal(held(torch.ones(4)), base + 1)


def test_ghost_counts_calls_it_could_not_replace(tmp_path: Any) -> None:
    base = torch.ones(2)
    ext = fake_extension(tmp_path, "ext_bypass", vector_add=base.add)
    fns = native.native_functions(candidate_with(ext=ext), torch.nn.Module())
    hidden = (ext.vector_add,)  # a tuple cannot be rewritten
    with native.NativeCounter(fns, ghost=True) as g:
        real = hidden[0](torch.ones(2))
    assert g.bypassed == 1 and torch.equal(real, torch.full((2,), 2.0))


def test_nan_like_keeps_structure_shapes_and_dtypes() -> None:
    x = (torch.ones(2, 3), [torch.arange(3), torch.ones(1, dtype=torch.bool)], 5)
    y = native.nan_like(x)
    assert isinstance(y, tuple) and isinstance(y[1], list) and y[2] == 5
    assert y[0].shape == (2, 3) and bool(torch.isnan(y[0]).all())
    assert y[1][0].dtype == torch.int64 and int(y[1][0][0]) == torch.iinfo(torch.int64).max
    assert y[1][1].dtype == torch.bool and not bool(y[1][1].any())


def test_missing_build_tools_are_the_environments(tmp_path: Any) -> None:
    cand = tmp_path / "cand.py"
    cand.write_text("raise RuntimeError('Ninja is required to load C++ extensions (pip install ninja to get it)')\n")
    with pytest.raises(runner.RunnerError) as e:
        runner.load_module(str(cand), "candidate")
    assert e.value.fix == "pip install ninja" and "cannot be built here" in str(e.value)
    # A compile error in the candidate's own source is its failure.
    cand.write_text("raise RuntimeError('Error building extension kforge_x: error: expected ;')\n")
    with pytest.raises(runner.CandidateImportError):
        runner.load_module(str(cand), "candidate")


def test_kernels_off_the_current_stream_are_named_from_the_profilers_trace() -> None:
    # As torch.profiler exported it on the H200: the marker (torch.cuda._sleep) on the current
    # stream 7, the kernel of a stream created in C++ on 13.
    spin = {"cat": "kernel", "name": "at::cuda::(anonymous namespace)::spin_kernel(long)", "ts": 1.0, "args": {"stream": 7}}
    own = {"cat": "kernel", "name": "k(float const*, float const*, float*, long)", "ts": 2.0, "args": {"stream": 7}}
    side = dict(own, ts=3.0, args={"stream": 13})
    cpu = {"cat": "cpu_op", "name": "aten::empty_like", "ts": 1.5, "args": {}}
    honest = native.streams_of({"traceEvents": [own, cpu, spin]})
    assert honest["current_stream"] == 7 and honest["off_stream"] == [] and [k["stream"] for k in honest["kernels"]] == [7]
    cheat = native.streams_of({"traceEvents": [spin, own, side]})
    assert cheat["off_stream"] == [{"name": side["name"], "stream": 13}]
    assert "error" in native.streams_of({"traceEvents": [own]}), "no marker: the profiler cannot tell"
    assert "error" in native.kernel_streams(lambda: None) or torch.cuda.is_available()


class AddModel(torch.nn.Module):  # type: ignore[misc]
    def forward(self, x: Any, y: Any) -> Any:
        return x + y


def native_candidate(tmp_path: Any, numpy_output: bool) -> types.ModuleType:
    """A candidate whose extension is built lazily in its first forward (held as a ModelNew
    attribute); its function is ``operator.add`` (a builtin). ``numpy_output``: the extension
    is called but the output is made by NumPy (the native code never matters)."""
    cand = candidate_with()
    tmp = tmp_path

    class ModelNew(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.ext: Any = None

        def forward(self, x: Any, y: Any) -> Any:
            if self.ext is None:
                self.ext = fake_extension(tmp, "ext_lazy", vector_add=operator.add)
            out = self.ext.vector_add(x, y)
            return torch.from_numpy(x.numpy() + y.numpy()) if numpy_output else out

    ModelNew.__module__ = cand.__name__
    cand.ModelNew = ModelNew  # type: ignore[attr-defined]
    return cand


@pytest.mark.parametrize("numpy_output", [False, True])
def test_run_checks_counts_and_ghosts_a_lazily_built_extension(tmp_path: Any, numpy_output: bool) -> None:
    import threading

    from kforge.verify import cascade, checks

    prob = types.SimpleNamespace(Model=AddModel, get_inputs=lambda: [torch.randn(64), torch.randn(64)], get_init_inputs=lambda: [])
    timers0, threads0 = checks.timer_identities(), set(threading.enumerate())
    res = cascade.run_checks(prob, native_candidate(tmp_path, numpy_output), {}, torch.device("cpu"), False, timers0, threads0)
    by = {f"{c['gate']}:{c['name']}": c for c in res["checks"]}
    ghost, ran = by["exploits:ghost-replay"], by["exploits:kernels-ran"]
    assert ghost["evidence"]["native_functions"] == ["ext_lazy.vector_add"], ghost
    assert ghost["ok"] is (not numpy_output), "with the native function a no-op, NumPy's output is unchanged"
    assert ran["ok"] is True and ran["evidence"]["native_calls"] == {"ext_lazy.vector_add": 1}, ran
    assert by["exploits:determinism"]["ok"] and by["correctness:seed-0-normal"]["ok"]
