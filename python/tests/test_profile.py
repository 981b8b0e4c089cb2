"""``python3 -m kforge.inspect.profile``, the program ``kforge profile`` runs under ncu: bad input,
no GPU, and (with torch's CUDA calls stood in for) warm-up outside the NVTX range, the profiled
forwards inside it."""

from __future__ import annotations

import json
from pathlib import Path
import weakref
from typing import Any, List

import pytest

from kforge.inspect import profile

PROBLEM = "class Model:\n    pass\ndef get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n"


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_bad_input_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert profile.main([str(tmp_path / "nope.py")]) == 2
    assert "nope.py: no such file" in capsys.readouterr().err
    tri = write(tmp_path, "k.py", "def kernel_function(*a):\n    return a\ndef get_inputs():\n    return [1]\n")
    assert profile.main([tri, "--mode", "max-autotune"]) == 2
    assert "--size and --mode apply to a problem, not a Triton kernel file" in capsys.readouterr().err
    prob = write(tmp_path, "p.py", PROBLEM)
    assert profile.main([prob, "--forwards", "0"]) == 2
    assert "--forwards must be at least 1" in capsys.readouterr().err
    assert profile.main([prob, "--size", "large"]) == 2
    assert "no LARGE dict" in capsys.readouterr().err


def test_without_a_gpu_it_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert profile.main([write(tmp_path, "p.py", PROBLEM)]) == 2
    assert "p.py: no CUDA GPU visible (kforge profile runs on a GPU)" in capsys.readouterr().err


def test_only_the_profiled_forwards_run_inside_the_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    events: List[str] = []

    def compiled(*inputs: Any) -> None:
        events.append("forward")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: events.append(f"push {name}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: events.append("pop"))
    class Compiled:
        def __call__(self, *inputs: Any) -> None:
            compiled(*inputs)

    made: List[Any] = []

    def compile_problem(problem: Any, mode: str, dev: Any) -> Any:
        c = Compiled()
        made.append(weakref.ref(c))
        return None, c, []

    monkeypatch.setattr(profile, "compile_problem", compile_problem)

    def copy_bandwidth(dev: Any) -> float:
        events.append("peak")
        assert made[0]() is None, "the compiled model is freed before the copy"
        with profile.region("stand-in:copy-bandwidth"):  # as the real one: its own region
            return 4.5e12

    monkeypatch.setattr(profile, "copy_bandwidth", copy_bandwidth)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty"))
    monkeypatch.setattr(torch._dynamo, "reset", lambda: events.append("reset"))
    peaks = tmp_path / "peaks.json"
    argv = [write(tmp_path, "p.py", PROBLEM), "--forwards", "2", "--mode", "max-autotune", "--peaks-out", str(peaks)]
    assert profile.main(argv) == 0
    warm = ["forward"] * profile.WARMUP + ["sync"]
    assert events == warm + ["push kforge-profile", "forward", "forward", "sync", "pop", "reset", "empty", "peak"], events
    assert json.loads(peaks.read_text()) == {"copy_bytes_per_s": 4.5e12}


def test_a_failing_compile_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")

    def compiled(*inputs: Any) -> None:
        raise RuntimeError("inductor exploded")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(profile, "compile_problem", lambda problem, mode, dev: (None, compiled, []))
    assert profile.main([write(tmp_path, "p.py", PROBLEM)]) == 2
    assert "torch.compile(mode='default') failed: RuntimeError: inductor exploded" in capsys.readouterr().err


def test_a_failing_model_build_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")

    def build(problem: Any, mode: str, dev: Any) -> Any:
        raise ValueError("bad init input")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(profile, "compile_problem", build)
    assert profile.main([write(tmp_path, "p.py", PROBLEM)]) == 2
    assert "p.py: building the model or its inputs failed: ValueError: bad init input" in capsys.readouterr().err


def test_a_triton_kernel_file_is_profiled_on_its_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    events: List[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: events.append("push"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: events.append("pop"))
    # The inputs move to the GPU through to_device (the stand-in records it and keeps them).
    monkeypatch.setattr(profile, "to_device", lambda x, dev: events.append(f"to {dev}") or x)
    calls = tmp_path / "calls"
    src = f"def kernel_function(*a):\n    open({str(calls)!r}, 'a').write(repr(a) + '\\n')\ndef get_inputs():\n    return [7]\n"
    assert profile.main([write(tmp_path, "k.py", src), "--forwards", "2"]) == 0
    assert events == ["to cuda", "sync", "push", "sync", "pop"], events
    assert calls.read_text().splitlines() == ["(7,)"] * (profile.WARMUP + 2)
