"""Pieces of the verify runner on the CPU: input generation, comparison, sentinels, rotation."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from kforge import harness  # noqa: E402
from kforge.verify import checks, perf  # noqa: E402


def problem() -> types.SimpleNamespace:
    return types.SimpleNamespace(get_inputs=lambda: [torch.randn(8, 4), torch.randint(0, 5, (3,)), 7])


def test_inputs_keep_shapes_and_dtypes_and_follow_the_distribution() -> None:
    dev = torch.device("cpu")
    a = harness.make_inputs(problem(), 1, "normal", dev)
    b = harness.make_inputs(problem(), 1, "normal", dev)
    c = harness.make_inputs(problem(), 1, "uniform", dev)
    h = harness.make_inputs(problem(), 1, "heavy", dev)
    assert a[0].shape == (8, 4) and a[0].dtype == torch.float32 and a[1].dtype == torch.int64 and a[2] == 7
    assert torch.equal(a[0], b[0])  # deterministic per seed and distribution
    assert not torch.equal(a[0], c[0])
    assert float(c[0].abs().max()) <= 1.0
    assert float(h[0].abs().max()) <= 50.0


def test_compare_tolerances_nan_and_shapes() -> None:
    ref = torch.ones(4)
    assert harness.compare(ref + 5e-5, ref, {})["ok"]
    bad = harness.compare(ref + 1e-3, ref, {})
    assert not bad["ok"] and "beyond rtol" in bad["why"]
    nan = ref.clone()
    nan[2] = float("nan")
    assert "NaN" in harness.compare(nan, ref, {})["why"]
    assert "shape" in harness.compare(torch.ones(5), ref, {})["why"]
    assert "dtype" in harness.compare(ref.double(), ref, {})["why"]
    assert "raised ValueError" in harness.compare(ValueError("x"), ref, {})["why"]
    # bf16 gets its own (looser) default tolerance; a policy overrides it.
    r16 = ref.bfloat16()
    assert harness.compare(r16 * 1.005, r16, {})["ok"]
    assert not harness.compare(r16 * 1.005, r16, {"rtol": {"bfloat16": 0.0}, "atol": {"bfloat16": 0.0}})["ok"]


def test_rotation_changes_set_and_bumps_versions_not_contents() -> None:
    sets = [[torch.full((3,), float(k)), torch.arange(3)] for k in range(3)]
    rot = perf.Rotation(sets)
    assert rot.current() is sets[0]
    v = sets[1][0]._version
    rot.before()
    assert rot.current() is sets[1]
    assert sets[1][0]._version > v and torch.equal(sets[1][0], torch.full((3,), 1.0))
    rot.before()
    rot.before()
    assert rot.current() is sets[0]


def test_analytic_flops_of_the_reference() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU())
    assert perf.analytic_flops(m, [torch.randn(8, 64)]) == 2 * 8 * 64 * 32
    # Element-wise work is not counted: bandwidth is the bound there.
    assert perf.analytic_flops(torch.nn.ReLU(), [torch.randn(8, 64)]) == 0


def test_sentinels_take_every_cached_block_then_give_back_the_fresh_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, NaN blocks are allocated until the allocator has to reserve new memory (the
    cached free blocks, where a stale correct result may lie, are then all NaN); that last,
    fresh block's segment is given back. Simulated: 3 cached blocks, then fresh memory."""
    state = {"reserved": 100, "allocated": 0, "emptied": 0}

    class FakeCuda:
        @staticmethod
        def memory_reserved(device: object) -> int:
            return state["reserved"]

        @staticmethod
        def empty_cache() -> None:
            state["emptied"] += 1

    class Out:
        is_cuda = True
        device = "cuda:0"

        def is_floating_point(self) -> bool:
            return True

    def full_like(t: object, value: float) -> object:
        state["allocated"] += 1
        if state["allocated"] > 3:
            state["reserved"] += 10
        assert value != value  # NaN
        return object()

    monkeypatch.setattr(torch, "full_like", full_like)
    monkeypatch.setattr(torch, "cuda", FakeCuda)
    monkeypatch.setattr(torch, "Tensor", Out)
    checks.plant_sentinels([Out(), Out()])
    # First output: 3 cached blocks + 1 fresh; second: 1 fresh (the cache is NaN already).
    assert state["allocated"] == 5 and state["emptied"] == 2
