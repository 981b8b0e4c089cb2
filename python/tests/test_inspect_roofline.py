"""The roofline (python/kforge/inspect/roofline.py): each generated kernel's least traffic against
the device's copy bandwidth, on the H200 fixtures' kernel sources; no GPU."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, Tuple

import pytest

from kforge.inspect import inductor
from kforge.inspect import kernel_source as K
from kforge.inspect import roofline as R

H200 = Path(__file__).resolve().parents[2] / "crates/kforge-inductor/tests/fixtures/h200"


def one(fixture: str, prefix: str) -> Tuple[str, str]:
    cap = json.loads((H200 / f"{fixture}.capture.json").read_text())
    out: Dict[str, str] = {}
    for w in cap["wrappers"]:
        out.update(inductor.kernel_sources(w))
    return next((n, s) for n, s in out.items() if n.startswith(prefix))


GB = 1e9


def test_a_kernels_least_traffic_counts_each_buffer_once_an_in_out_buffer_twice_capped_by_its_iterations() -> None:
    import torch

    n, s = one("default_009_layernorm_fp32", "triton_red_")  # x 8192 rows of r0_ 4096
    names = K.kernel_arg_names(n, s)
    assert names == ["in_ptr0", "in_ptr1", "in_ptr2", "out_ptr2", "xnumel", "r0_numel"]
    x, w, b, out = torch.empty(8192, 4096), torch.empty(4096), torch.empty(4096), torch.empty(8192, 4096)
    args = [x, w, b, out, 8192, 4096]
    space = R.iterations(K.kernel_spec(n, s), names, args)
    assert space == 8192 * 4096
    assert R.kernel_traffic(names, args, space) == (2 * 8192 * 4096 + 2 * 4096) * 4
    n, s = one("default_002_multihead_attention_bf16", "triton_per_")  # softmax in place
    names = K.kernel_arg_names(n, s)
    buf = torch.empty(131072, 1024, dtype=torch.bfloat16)
    assert R.kernel_traffic(names, [buf, 131072, 1024], 131072 * 1024) == 2 * 131072 * 1024 * 2  # read, then written
    # A kernel handed a whole buffer of which its 1,000 iterations touch a slice: no more than 1,000 elements.
    assert R.kernel_traffic(["in_ptr0", "out_ptr0", "ws_ptr", "xnumel"],
                            [torch.empty(10_000), torch.empty(1000), torch.empty(50), 1000], 1000) == 2 * 1000 * 4
    assert R.kernel_traffic(["in_ptr0"], [torch.empty(10)], None) == 40  # no extent named: the whole tensor


def test_the_iteration_space_takes_the_bodys_constants_then_the_launchs_numel_arguments() -> None:
    spec = K.KernelSpec("k", "pointwise", {"x": 1024}, ("XBLOCK",), {})
    assert R.iterations(spec, ["in_ptr0", "out_ptr0", "xnumel"], [None, None, 1000]) == 1000
    assert R.iterations(spec, ["in_ptr0", "out_ptr0", "xnumel"], [None, None, True]) is None  # not an extent
    fixed = K.KernelSpec("k", "reduction", None, ("XBLOCK", "R0_BLOCK"), {"x": 64, "r0_": 3000})
    assert R.iterations(fixed, ["in_ptr0", "xnumel", "r0_numel"], [None, 7, 7]) == 64 * 3000


PEAK = 3.0e12  # bytes/s
L2 = 50 * 1_000_000


# Session 33 on an H100 at the large preset (bench/results/roofline/): the device-to-device copy
# moved 2.958 TB/s; the kernels, their least traffic and time per launch, and what a search found.
H100_COPY = 2.9579e12


@pytest.mark.parametrize("kernel, traffic, us, at_roof", [
    ("silu (nothing beat it)", 6_442_450_944, 2108.366, True),         # 1.022x the copy's rate
    ("softmax (nothing beat it)", 8_589_934_592, 2796.272, True),      # 1.031x
    ("rmsnorm (tuned 1.017x faster)", 4_294_975_488, 1435.676, False),  # 0.999x
])
def test_a_kernel_at_its_bandwidth_roof_is_left_untuned_with_its_ceiling_named(kernel: str, traffic: int, us: float,
                                                                                at_roof: bool) -> None:
    """The roof stands ROOF_MARGIN (5 %) above the measured bandwidth: a kernel moving its least
    traffic (all but one L2's worth) at 1.02x that or more can gain at most 1.029x and is not
    tuned; the RMSNorm kernel at 0.999x was tuned 1.017x faster, and its ceiling says 1.051x."""
    l2 = 52_428_800
    row = R.roofline_row("reduction", traffic, 2.0, 2 * us, H100_COPY, l2)  # two launches
    rate = (traffic - l2) / (us / 1e6)
    assert row["us_per_launch"] == pytest.approx(us) and row["bytes"] == traffic
    assert row["bytes_per_s"] == pytest.approx(rate) and row["of_peak"] == pytest.approx(rate / H100_COPY)
    assert row["ceiling"] == pytest.approx(max(1.0, R.ROOF_MARGIN * H100_COPY / rate))
    why = R.at_roof(row)
    assert (why is not None) == at_roof, (kernel, row)
    assert R.at_roof(row, R.ROOF_TRUST_MAX + 1) is None  # --roof-skip above the trusted rate: every kernel is tuned
    if why:
        assert f"{rate / H100_COPY:.0%} of the device's bandwidth" in why and f"{row['ceiling']:.3f}x" in why
    else:
        assert row["ceiling"] > 1.017  # what the search found stays under the ceiling


def test_the_roofline_holds_only_for_memory_bound_kinds_past_the_l2_and_below_an_implausible_rate() -> None:
    tem = R.roofline_row("template", int(3 * GB), 1.0, 1000.0, PEAK, L2)
    assert "ceiling" not in tem and "arithmetic" in tem["why"] and R.at_roof(tem) is None
    small = R.roofline_row("pointwise", 100 * 1_000_000, 1.0, 30.0, PEAK, L2)  # 100 MB: within 4x a 50 MB L2
    assert "ceiling" not in small and "within 4x the L2" in small["why"] and R.at_roof(small) is None
    fast = R.roofline_row("reduction", int(4 * GB), 1.0, 1000.0, PEAK, L2)  # 3.95 TB/s against 3 TB/s
    assert "ceiling" not in fast and "does not hold" in fast["why"] and R.at_roof(fast) is None
    over = R.roofline_row("reduction", int(3.35 * GB), 1.0, 1000.0, PEAK, L2)  # 110 %: within the trusted 125 %
    assert over["ceiling"] == 1.0 and R.at_roof(over) is not None  # past the roof's margin: no gain left
    assert R.roofline_row("pointwise", int(GB), 1.0, 1000.0, None, L2)["why"] == "no bandwidth measured"
    assert R.roofline_row("pointwise", 0, 1.0, 1000.0, PEAK, L2)["why"] == "no device time or no traffic"


def test_the_models_roofline_ceiling_keeps_vendor_time_and_frees_kernels_without_a_roofline() -> None:
    us = {"nvjet_gemm": 600.0, "triton_poi_a": 300.0, "triton_red_b": 100.0}
    rows = {"triton_poi_a": {"ceiling": 1.5}, "triton_red_b": {"why": "within 4x the L2"}}
    # 1000 us -> 600 + 300 / 1.5 + 0 = 800 us
    assert R.roofline_ceiling(us, ["triton_poi_a", "triton_red_b"], rows) == pytest.approx(1.25)
    assert R.roofline_ceiling(us, ["triton_poi_a", "triton_poi_a"], rows) == pytest.approx(1000 / 900)  # once each
    assert R.roofline_ceiling({"triton_poi_a": 5.0}, ["triton_poi_a"], {}) == math.inf
    assert R.roofline_ceiling({}, [], {}) is None


def test_the_roofline_rows_come_from_each_kernels_first_launch_and_its_profile() -> None:
    import torch

    n, s = one("default_002_multihead_attention_bf16", "triton_poi_")  # in_ptr0, out_ptr0, xnumel = 8388608
    x = torch.empty(8388608, dtype=torch.bfloat16)
    found = [(None, n, None, s), (None, n, None, s), (None, "triton_poi_unrecorded", None, s), (None, "triton_x", None, "def (")]
    recorded = {n: {"before": [x, torch.empty_like(x), 8388608]}, "triton_x": {"before": []}}
    totals = {n: {"count": 2.0, "us": 30.0}, "triton_x": {"count": 1.0, "us": 1.0}}
    rows = R.roofline(found, recorded, totals, PEAK, 1_000_000)  # a 1 MB L2
    assert set(rows) == {n, "triton_x"}  # the unrecorded kernel has no row
    assert rows[n]["bytes"] == 2 * 8388608 * 2 and rows[n]["us_per_launch"] == 15.0
    assert rows[n]["of_peak"] == pytest.approx((2 * 8388608 * 2 - 1_000_000) / 15e-6 / PEAK)
    assert "does not parse" in rows["triton_x"]["why"]
    rates = {"copy_bytes_per_s": 2.5e12, "read_bytes_per_s": PEAK}  # held against the larger
    summary = R.roofline_summary({n: 30.0, "nvjet": 30.0}, [n], rows, rates, 1_000_000, None)
    assert summary["peak_bytes_per_s"] == PEAK and summary["copy_bytes_per_s"] == 2.5e12 and "skip_at" not in summary
    assert summary["ceiling"] == pytest.approx(60 / (30 + 30 / rows[n]["ceiling"]))
    assert R.peak_of(rates) == PEAK and R.peak_of({}) is None
    assert R.roofline_summary({}, [], {}, {}, 0, "OutOfMemoryError: x")["why"].startswith("no bandwidth measured")
    unbounded = R.roofline_summary({n: 30.0}, [n], {}, rates, 1_000_000, None)  # every microsecond free: no number
    assert unbounded["ceiling"] is None and json.loads(json.dumps(unbounded, allow_nan=False))["ceiling"] is None


def test_the_capture_sets_every_recorded_kernel_against_the_devices_bandwidth(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an H200 capture's wrapper: the kernel whose launch was recorded gets its row (its least
    traffic from the recorded arguments, its time from the profile's totals), the others none;
    the model's ceiling counts the vendor time as it is. A failure is the roofline's why."""
    import torch

    from kforge.inspect import capture

    cap = json.loads((H200 / "default_002_multihead_attention_bf16.capture.json").read_text())
    n, _s = one("default_002_multihead_attention_bf16", "triton_poi_")  # in_ptr0, out_ptr0, xnumel = 8388608
    x = torch.empty(8388608, dtype=torch.bfloat16)
    recorded = {n: {"before": [x, torch.empty_like(x), 8388608]}}
    totals = {n: {"count": 1.0, "us": 20.0}, "nvjet_gemm": {"count": 2.0, "us": 80.0}}
    regions = []
    rates = {"copy_bytes_per_s": 3.0e12, "read_bytes_per_s": 2.9e12}
    monkeypatch.setattr(capture, "device_peak", lambda dev, region: regions.append(region) or (rates, 1_000_000, None))
    r = capture.capture_roofline(cap["wrappers"], recorded, totals, "cuda")
    assert regions == ["inspect:bandwidth"]
    assert list(r["kernels"]) == [n] and r["peak_bytes_per_s"] == 3.0e12
    row = r["kernels"][n]
    assert row["bytes"] == 2 * 8388608 * 2 and row["of_peak"] == pytest.approx((2 * 8388608 * 2 - 1_000_000) / 20e-6 / 3.0e12)
    # The other generated kernels have no row: no time of theirs is in totals, so the ceiling is 100 / (80 + 20 / c).
    assert r["ceiling"] == pytest.approx(100 / (80 + 20 / row["ceiling"]))
    assert json.loads(json.dumps(r, allow_nan=False)) == r

    def boom(dev: object, region: str) -> object:
        raise RuntimeError("no device")

    monkeypatch.setattr(capture, "device_peak", boom)
    failed = capture.capture_roofline(cap["wrappers"], recorded, totals, "cuda")
    assert failed["peak_bytes_per_s"] is None and failed["why"] == "the roofline failed: RuntimeError: no device"


def test_a_buffer_counts_as_often_as_the_body_loads_and_stores_it() -> None:
    """A reused buffer handed as an in_out_ptr that the kernel only stores to moves once (the
    layer norm + GELU of level2/006: 16384 x 2048 fp32, 134 MB, not 268 MB); one it loads and
    stores, twice; one it loads twice (two passes), once: a lower bound."""
    import torch

    n, s = one("default_006_layernorm_gelu_residual_fp32", "triton_red_fused_add_gelu_native_layer_norm")
    names = K.kernel_arg_names(n, s)
    assert names[0] == "in_out_ptr0"
    moves = R.pointer_moves(names, K.kernel_body(n, s))
    assert moves == {"in_out_ptr0": 1, "in_ptr0": 1, "in_ptr1": 1, "in_ptr2": 1}, moves
    big, row = torch.empty(16384, 2048), torch.empty(2048)
    args = [big, torch.empty(16384, 2048), row, row, 16384, 2048]
    space = R.iterations(K.kernel_spec(n, s), names, args)
    assert R.kernel_traffic(names, args, space, moves) == (2 * 16384 * 2048 + 2 * 2048) * 4
    assert R.kernel_traffic(names, args, space) == (3 * 16384 * 2048 + 2 * 2048) * 4  # by prefix alone: 1.5x
    n, s = one("default_002_multihead_attention_bf16", "triton_per_")  # softmax in place: loads and stores
    assert R.pointer_moves(K.kernel_arg_names(n, s), K.kernel_body(n, s)) == {"in_out_ptr0": 2}
    body = "    x = tl.atomic_add(out_ptr0 + x0, 1.0)\n    p = tl.make_block_ptr(in_out_ptr1, ...)\n"
    assert R.pointer_moves(["out_ptr0", "in_out_ptr1", "in_ptr2", "xnumel"], body) == {"out_ptr0": 1, "in_out_ptr1": 2, "in_ptr2": 0}
    assert "def " not in K.kernel_body(n, s) and "@triton" not in K.kernel_body(n, s)


def test_a_name_two_different_kernels_share_gets_no_ceiling() -> None:
    """Two wrapper modules may each define a kernel of one name: the profile adds their times and
    the recorded launch is the first one's, so neither source's traffic can be set against them."""
    import torch

    n, s = one("default_002_multihead_attention_bf16", "triton_poi_")
    other = s.replace("xnumel = 8388608", "xnumel = 4096")
    x = torch.empty(8388608, dtype=torch.bfloat16)
    rows = R.roofline([(None, n, None, s), (None, n, None, other)], {n: {"before": [x, torch.empty_like(x), 8388608]}},
                      {n: {"count": 2.0, "us": 30.0}}, PEAK, 1_000_000)
    assert "ceiling" not in rows[n] and "2 different kernels have this name" in rows[n]["why"]


def test_every_pointwise_and_reduction_launch_passes_what_its_kernel_names() -> None:
    """A cheap guard on the argument names against the wrappers: each `.run(...)` of a pointwise or
    reduction kernel in the H200 captures passes as many positional arguments as the kernel has
    runtime parameters (what the recorded launch is zipped with)."""
    import ast

    checked = 0
    for path in sorted(H200.glob("*.capture.json")):
        for w in json.loads(path.read_text())["wrappers"]:
            sources = inductor.kernel_sources(w)
            for node in ast.walk(ast.parse(w)):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id in sources):
                    continue
                name = node.func.value.id
                if K.kernel_spec(name, sources[name]).kind not in R.ROOF_KINDS:
                    continue
                assert len(node.args) == len(K.kernel_arg_names(name, sources[name])), (path.name, name)
                checked += 1
    assert checked >= 30, checked
