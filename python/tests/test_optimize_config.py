"""The config agent on the CPU: the configuration space per kernel kind (on real Inductor kernels
the H200 generated, committed captures), both block spellings, the lookup-table pinning against
torch's own hashing and lookup, the kernel selection by time share, the choice from measured
timings (noise floor, excluded configurations), the standalone result file, and a Triton kernel
with several configurations searched end to end in Triton's interpreter."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Tuple

import pytest

from kforge.inspect import inductor
from kforge.inspect.kernel_source import KernelSourceError
from kforge.optimize import config as C
from kforge.optimize import dispatch as D

H200 = Path(__file__).resolve().parents[2] / "crates/kforge-inductor/tests/fixtures/h200"


def sources(name: str) -> Dict[str, str]:
    cap = json.loads((H200 / f"{name}.capture.json").read_text())
    out: Dict[str, str] = {}
    for w in cap["wrappers"]:
        out.update(inductor.kernel_sources(w))
    return out


def one(fixture: str, prefix: str) -> Tuple[str, str]:
    return next((n, s) for n, s in sources(fixture).items() if n.startswith(prefix))


def test_kernel_spec_reads_every_kind_of_the_h200_kernels() -> None:
    n, s = one("default_009_layernorm_fp32", "triton_red_")
    spec = C.kernel_spec(n, s)
    assert (spec.kind, spec.blocks, spec.numels) == ("reduction", ("XBLOCK", "R0_BLOCK"), {"x": 8192, "r0_": 4096})
    n, s = one("default_002_multihead_attention_bf16", "triton_per_")
    spec = C.kernel_spec(n, s)  # R0_BLOCK is fixed in the body: only XBLOCK is a parameter
    assert (spec.kind, spec.blocks, spec.size_hints) == ("persistent_reduction", ("XBLOCK",), {"x": 131072, "r0_": 1024})
    n, s = one("default_002_multihead_attention_bf16", "triton_poi_fused_clone_permute_select_transpose")
    spec = C.kernel_spec(n, s)
    assert (spec.kind, spec.blocks, spec.numels) == ("pointwise", ("YBLOCK", "XBLOCK"), {"y": 8192, "x": 1024})
    n, s = one("max-autotune_007_masked_softmax_attention_bf16", "triton_tem_")
    spec = C.kernel_spec(n, s)
    assert (spec.kind, spec.blocks, spec.size_hints, spec.template_warps, spec.template_stages) == ("template", (), None, 8, 4)
    with pytest.raises(KernelSourceError, match="no function of that name"):
        C.kernel_spec("not_there", s)
    with pytest.raises(KernelSourceError, match="does not parse"):
        C.kernel_spec(n, "def (")


OLD_SPELLING = '''
import triton
import triton.language as tl
from torch._inductor.runtime import triton_heuristics

@triton_heuristics.reduction(
    size_hints={HINTS},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'out_ptr0': '*fp32', 'xnumel': 'i32', 'rnumel': 'i32'}},
)
@triton.jit
def triton_red_fused_sum_0(in_ptr0, out_ptr0, xnumel, rnumel, XBLOCK : tl.constexpr, RBLOCK : tl.constexpr):
    xnumel = 64
    rnumel = 3000
    xoffset = tl.program_id(0) * XBLOCK
'''


@pytest.mark.parametrize("hints", ["{'x': 64, 'r': 4096}", "{'x': 64, 'r0_': 4096}"])
def test_the_older_rblock_spelling_is_a_reduction_block_too(hints: str) -> None:
    src = OLD_SPELLING.replace("{HINTS}", hints)
    spec = C.kernel_spec("triton_red_fused_sum_0", src)
    assert spec.blocks == ("XBLOCK", "RBLOCK")
    assert C.block_choices(spec, "RBLOCK") == [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]  # 3000 -> 4096: the whole row
    space = C.config_space(spec, C.LaunchConfig.make({"XBLOCK": 1, "RBLOCK": 2048}, 8, 1), 500)
    assert {c.block("RBLOCK") for c in space} >= {16, 4096} and {c.block("XBLOCK") for c in space} <= {1, 2, 4, 8, 16, 32, 64}


def test_config_space_original_first_nearest_next_deduplicated_and_capped() -> None:
    n, s = one("default_009_layernorm_fp32", "triton_red_")
    spec = C.kernel_spec(n, s)
    orig = C.LaunchConfig.make({"XBLOCK": 1, "R0_BLOCK": 2048}, 16, 1)
    full = C.config_space(spec, orig, 10_000)
    assert full[0] == orig and len(set(full)) == len(full)
    dists = [C.distance(c, orig) for c in full[1:]]
    assert dists == sorted(dists)
    assert C.config_space(spec, orig, 12) == full[:12]
    assert C.config_space(spec, orig, 1) == [orig]
    with pytest.raises(C.ConfigError, match="at least 1"):
        C.config_space(spec, orig, 0)
    for c in full[1:]:
        x, r = c.block("XBLOCK"), c.block("R0_BLOCK")
        assert x is not None and r is not None and 32 * c.num_warps <= max(x * r, 32) and x * r <= 32 * c.num_warps * 128
        assert r <= 4096 and c.num_stages in (1, 2, 3)


def test_a_looped_reduction_offers_its_persistent_form() -> None:
    n, s = one("default_013_softmax_fp32", "triton_red_")  # r0_numel 8192: beyond a loop's 4096
    spec = C.kernel_spec(n, s)
    assert C.block_choices(spec, "R0_BLOCK")[-1] == 8192
    n, s = one("max-autotune_012_groupnorm_fp32", "triton_red_")  # 25088 -> 32768: too large for one block
    assert C.block_choices(C.kernel_spec(n, s), "R0_BLOCK")[-1] == 4096


def test_persistent_pointwise_2d_and_template_spaces() -> None:
    n, s = one("default_002_multihead_attention_bf16", "triton_per_")
    orig = C.LaunchConfig.make({"XBLOCK": 8}, 8, 1)
    space = C.config_space(C.kernel_spec(n, s), orig, 1000)
    assert all(set(dict(c.kwargs)) == {"XBLOCK"} and c.num_stages == 1 for c in space)
    assert all(c.block("XBLOCK") * 1024 <= 32 * c.num_warps * 128 for c in space[1:])  # type: ignore[operator]

    n, s = one("default_018_conv2d_3x3_fp32", "triton_poi_fused_convolution_1")  # y 8192, x 9
    spec = C.kernel_spec(n, s)
    space = C.config_space(spec, C.LaunchConfig.make({"XBLOCK": 16, "YBLOCK": 64}, 4, 1), 1000)
    assert {c.block("XBLOCK") for c in space} <= {1, 2, 4, 8, 16}  # next power of two of 9
    assert all(math.ceil(8192 / (c.block("YBLOCK") or 1)) <= C.MAX_GRID_YZ for c in space)

    n, s = one("max-autotune_007_masked_softmax_attention_bf16", "triton_tem_")
    orig = C.LaunchConfig.make({}, 8, 4)
    space = C.config_space(C.kernel_spec(n, s), orig, 1000)
    assert space[0] == orig and all(c.kwargs == () for c in space)
    assert {(c.num_warps, c.num_stages) for c in space} == {(w, st) for w in C.TEMPLATE_WARPS for st in C.STAGES["template"]} | {(8, 4)}

    n, s = one("default_025_cross_entropy_fp32", "triton_red_fused__log_softmax")  # xnumel 1
    space = C.config_space(C.kernel_spec(n, s), C.LaunchConfig.make({"XBLOCK": 1, "R0_BLOCK": 1024}, 4, 1), 1000)
    assert {c.block("XBLOCK") for c in space} == {1}


def test_an_unknown_kind_keeps_its_original_alone() -> None:
    src = OLD_SPELLING.replace("{HINTS}", "{'x': 64, 'r': 4096}").replace("triton_heuristics.reduction", "triton_heuristics.split_scan")
    orig = C.LaunchConfig.make({"XBLOCK": 1, "RBLOCK": 1024}, 4, 1)
    assert C.config_space(C.kernel_spec("triton_red_fused_sum_0", src), orig, 50) == [orig]


LOOKUP_CHECK = """
import importlib.util, json, sys
from pathlib import Path
import torch._inductor.config as icfg
import torch._inductor.runtime.triton_heuristics as th
from kforge.inspect import inductor
from kforge.optimize import config as C

h200, where = Path(sys.argv[1]), Path(sys.argv[2])
for fixture, prefix in [("default_009_layernorm_fp32", "triton_red_"), ("default_002_multihead_attention_bf16", "triton_per_"),
                        ("default_001_gemm_bias_relu_fp32", "triton_poi_"),
                        ("max-autotune_007_masked_softmax_attention_bf16", "triton_tem_")]:
    srcs = {}
    for w in json.loads((h200 / (fixture + ".capture.json")).read_text())["wrappers"]:
        srcs.update(inductor.kernel_sources(w))
    name, src = next((n, s) for n, s in srcs.items() if n.startswith(prefix))
    spec = C.kernel_spec(name, src)
    key = C.lookup_hash(src)
    # What AsyncCompile.triton hashes, and what lookup_autotune_config hashes: the JIT function's src.
    assert key == th.generate_lookup_hash_from_source_code(str(spec.size_hints), src.split("@triton.jit\\n")[1])
    assert C.lookup_hash(src.replace(name, "triton_poi_fused_renamed_9")) == key
    path = where / (name + ".py")
    path.write_text("import triton\\nimport triton.language as tl\\n\\n@triton.jit\\n" + src.split("@triton.jit\\n")[1])
    m = importlib.util.spec_from_file_location("k_" + name, path)
    mod = importlib.util.module_from_spec(m)
    m.loader.exec_module(mod)
    fn = getattr(mod, name)
    assert th.generate_lookup_hash_from_source_code(str(spec.size_hints), fn.src) == key
    cfg = C.LaunchConfig.make({b: 4 for b in spec.blocks}, 2, 3)
    icfg.autotune_lookup_table = {key: cfg.entry()}
    try:
        got = th.lookup_autotune_config(spec.size_hints, fn, {}, None)
    except TypeError:  # the torch 2.11 form: (size_hints, fn)
        got = th.lookup_autotune_config(spec.size_hints, fn)
    assert got is not None and C.LaunchConfig.of_triton(got) == cfg, (name, got)
print("ok")
"""


def test_lookup_hash_is_inductors_own_and_name_agnostic(tmp_path: Path) -> None:
    """The table key computed here equals torch's (``generate_lookup_hash_from_source_code`` on
    what ``AsyncCompile.triton`` hashes, and on the JIT function's own ``src``, which
    ``lookup_autotune_config`` hashes), and torch's lookup returns exactly the pinned
    configuration — on the torch installed here, in a fresh interpreter (Triton's JIT functions
    built outside the interpreter would disturb the interpreter tests of this process)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-c", LOOKUP_CHECK, str(H200), str(tmp_path)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_select_kernels_by_time_share_on_a_captured_profile() -> None:
    cap = json.loads((H200 / "default_002_multihead_attention_bf16.capture.json").read_text())
    us: Dict[str, float] = {}
    for k in cap["iterations"][0]:
        us[k["name"]] = us.get(k["name"], 0.0) + k["dur_us"]
    triton = list(sources("default_002_multihead_attention_bf16"))
    picked = C.select_kernels(us, triton, top_k=8, coverage=0.85)
    assert picked[0]["kernel"].startswith("triton_per_fused__softmax")  # 146.6 us of 182.9 us in Triton
    assert picked[1]["us"] == 10.625 and len(picked) == 2  # 80 %, then 86 % covered
    assert all(not p["kernel"].startswith("nvjet") for p in picked)  # cuBLAS is not replaceable
    assert [p["kernel"] for p in C.select_kernels(us, triton, top_k=1)] == [picked[0]["kernel"]]
    assert abs(picked[0]["share"] - 146.622 / sum(us.values())) < 1e-9
    with pytest.raises(C.ConfigError):
        C.select_kernels(us, triton, top_k=0)


def rows(ratio: float, n: int = 5, jitter: float = 0.002) -> List[Tuple[float, float, float]]:
    return [(1.0, ratio * (1 + jitter * ((-1) ** i)), 1.0 + jitter * ((-1) ** (i + 1))) for i in range(n)]


def test_choose_config_needs_the_noise_floor_and_skips_changed_results() -> None:
    chosen = C.choose_config("orig", {"a": rows(0.8), "b": rows(0.9), "c": rows(0.999)}, {})
    assert chosen["winner"] == "a" and not chosen["fallback"]
    assert chosen["modes"]["c"]["beyond_noise"] is False
    # The fastest changes the results: the next one wins.
    assert C.choose_config("orig", {"a": rows(0.8), "b": rows(0.9)}, {"a": "changes the results"})["winner"] == "b"
    # Nothing beyond noise: the original stays.
    within = C.choose_config("orig", {"c": rows(0.999)}, {})
    assert within["winner"] == "orig" and within["fallback"]
    assert C.choose_config("orig", {"a": rows(0.5)}, {"a": "did not compile"})["fallback"]


def test_split_rounds_medians_per_slice() -> None:
    assert C.split_rounds([[1, 2, 3, 10, 11, 12], [5, 5, 5, 5, 5, 5, 5]], 2) == [[2, 11], [5, 5]]
    # The others by their paired ratios to the original within each slice: a host phase that
    # slows both sides' later calls (3x) moves the medians apart (2 against 1.1), not the pairs.
    phased = C.split_rounds([[1, 1, 3, 3], [1.1, 1.1, 1.1, 3.3]], 1)
    assert phased[0] == [2.0] and phased[1] == [pytest.approx(2.2)]


def test_check_outputs_bitwise_then_tolerance() -> None:
    torch = pytest.importorskip("torch")
    a = torch.ones(4)
    assert C.check_outputs([a, 3], [a.clone(), 3])["identical"]
    near = C.check_outputs([a + 1e-6], [a])
    assert near["ok"] and not near["identical"]
    far = C.check_outputs([a + 1e-2], [a])
    assert not far["ok"] and "beyond" in far["why"]


def measured_result(won: bool) -> Dict[str, Any]:
    name, src = one("default_009_layernorm_fp32", "triton_red_")
    key = C.lookup_hash(src)
    cfg = C.LaunchConfig.make({"XBLOCK": 1, "R0_BLOCK": 4096}, 8, 1)
    return {"agent": "config", "baseline": "default", "winner": "config" if won else "default", "fallback": not won,
            "modes": {"config": {"speedup": 1.2, "ci95": [1.1, 1.3], "beyond_noise": True}} if won else {},
            "kernels": {name: {"fallback": False, "new": cfg.as_dict()}},
            "pins": {key: {"kernel": name, **cfg.entry()}},
            "compile_options": {"max_autotune": False, "coordinate_descent_tuning": False, "autotune_local_cache": False},
            "versions": {"torch": "2.11.0+cu130", "triton": "3.6.0"}}


PROBLEM = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.norm = nn.LayerNorm(n)

    def forward(self, x):
        return self.norm(x)

N = 64

def get_inputs():
    return [torch.randn(8, N)]

def get_init_inputs():
    return [N]
'''


@pytest.mark.parametrize("won", [True, False])
def test_the_result_file_is_standalone_and_carries_the_table(tmp_path: Path, won: bool) -> None:
    problem = tmp_path / "problem.py"
    problem.write_text(PROBLEM)
    measured = measured_result(won)
    model_path, policy_path = C.write_result(str(problem), measured, str(tmp_path / "out"))
    text = Path(model_path).read_text()
    assert "kforge" not in text.split('"""', 2)[2]  # no kforge import: the header names it only
    assert "torch 2.11.0+cu130, Triton 3.6.0" in text
    assert ("autotune_lookup_table" in text) == won and ("1.200x" in text) == won
    assert 'torch_policy = "reference-ops"' in Path(policy_path).read_text()
    # Imported in a fresh interpreter: the table is what the agent pinned; eager call for the CPU.
    script = (f"import sys, torch; sys.path.insert(0, {str(tmp_path / 'out')!r}); import model_new as m\n"
              "torch.manual_seed(0); a = m.Reference(64); torch.manual_seed(0); b = m.ModelNew(64)\n"
              "x = torch.randn(8, 64); assert torch.equal(m.Reference.forward(b, x), a(x))\n"
              "print(repr(m.PINNED_CONFIGS)); print(getattr(m, 'COMPILE_OPTIONS', {}).get('coordinate_descent_tuning'))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    table, coordesc = r.stdout.strip().splitlines()
    want = {k: {kk: vv for kk, vv in v.items() if kk != "kernel"} for k, v in measured["pins"].items()} if won else {}
    assert eval(table) == want
    assert coordesc == ("False" if won else "None")


def test_the_result_refuses_an_eager_baseline(tmp_path: Path) -> None:
    problem = tmp_path / "problem.py"
    problem.write_text(PROBLEM)
    with pytest.raises(C.ResultError, match="not a compile mode"):
        C.write_result(str(problem), {**measured_result(True), "baseline": "eager"}, str(tmp_path / "o"))


def test_bad_arguments_are_named_before_anything_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = str(tmp_path / "r.json")
    assert C.main([str(tmp_path / "missing.py"), "--out", out, "--rounds", "1"]) == 2
    assert "--rounds must be at least 2" in capsys.readouterr().err
    assert C.main(["p.py", "--out", out, "--baseline", "eager"]) == 2
    assert "compiled baseline" in capsys.readouterr().err
    assert C.main(["p.py", "--out", out, "--device", "cpu"]) == 2
    assert "need a GPU" in capsys.readouterr().err
    assert C.main(["p.py", "--out", out, "--top-kernels", "0"]) == 2
    assert "--top-kernels" in capsys.readouterr().err
    for beat in ("0", "nan", "-2"):
        assert C.main(["p.py", "--out", out, "--beat", beat]) == 2
        assert "--beat must be a positive speedup" in capsys.readouterr().err
    assert C.main(["p.py", "--out", out, "--tune-until", "2000", "--until", "1000"]) == 2
    assert "--until 1000.000 is before --tune-until 2000.000" in capsys.readouterr().err
    for frac in ("0", "inf", "-0.5"):
        assert C.main(["p.py", "--out", out, "--roof-skip", frac]) == 2
        assert "--roof-skip must be a positive fraction" in capsys.readouterr().err
    pytest.importorskip("torch")
    assert C.main([str(tmp_path / "missing.py"), "--out", out]) == 2  # the problem is named before the GPU is looked for
    assert "missing.py: no such file" in capsys.readouterr().err


def test_the_search_is_pruned_when_its_amdahl_ceiling_cannot_beat_another_family() -> None:
    """Kernels at 40 % of the device time can make the model at most 1/(1-0.4) = 1.667x faster:
    against a verified 2x elsewhere nothing is searched (and the report says why); against 1.5x
    or the baseline alone (1.0) the search runs."""
    assert C.amdahl_ceiling(0.4) == pytest.approx(1 / 0.6) and C.amdahl_ceiling(1.0) == math.inf
    why = C.pruned_why(0.4, 2.0)
    assert why is not None and "1.667x, not above the 2.000x" in why and "40%" in why, why
    assert C.pruned_why(0.4, 1.5) is None and C.pruned_why(0.4, 1.0) is None
    assert C.pruned_why(1.0, 50.0) is None  # every device microsecond in Triton kernels: no ceiling
    assert C.pruned_why(0.0, 1.0) is not None  # no Triton kernel time at all: nothing to gain


def test_a_bounded_step_tunes_a_kernel_only_while_it_and_what_follows_fit_its_deadline() -> None:
    """A 100 s baseline compile with CUDA graphs leaves 240 s to reserve (the re-stitch's second
    compile and the result's check, a fifth more), without them 120 s. Before any kernel was
    tuned one is expected to take FIRST_TUNE_S; after, the longest so far. No deadline: always."""
    graphs = next(iter(C.CUDA_GRAPH_MODES))
    assert C.reserve_s(100.0, graphs) == pytest.approx(240.0)
    assert C.reserve_s(100.0, "max-autotune-no-cudagraphs") == pytest.approx(120.0)
    now, reserve = 1000.0, 240.0
    assert C.next_fits(now, None, reserve, [])
    assert C.next_fits(now, now + reserve + C.FIRST_TUNE_S, reserve, [])
    assert not C.next_fits(now, now + reserve + C.FIRST_TUNE_S - 1, reserve, [])
    assert C.next_fits(now, now + reserve + 5.0, reserve, [2.0, 5.0]), "the longest so far, not the first guess"
    assert not C.next_fits(now, now + reserve + 4.0, reserve, [2.0, 5.0])
    assert C.cut_why([]) == ""
    why = C.cut_why(["triton_red_fused_0", "triton_poi_fused_1"])
    assert "deadline" in why and why.endswith("triton_red_fused_0, triton_poi_fused_1"), why
    assert C.note_not_tuned({"not_tuned": [], "why": "w"})["why"] == "w"
    assert C.note_not_tuned({"not_tuned": ["k"], "why": "w"})["why"] == "w; " + C.cut_why(["k"])
    assert C.note_not_tuned({"not_tuned": ["k"], "winner": "config"})["why"] == C.cut_why(["k"]), "a winner's too"


ROW_SCALE = """
@triton.jit
def row_scale(x_ptr, out_ptr, xnumel, r0_numel, XBLOCK: tl.constexpr, R0_BLOCK: tl.constexpr):
    rows = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    cols = tl.arange(0, R0_BLOCK)[None, :]
    mask = (rows < xnumel) & (cols < r0_numel)
    v = tl.load(x_ptr + rows * r0_numel + cols, mask, other=0.0)
    tl.store(out_ptr + rows * r0_numel + cols, v * 2.0, mask)
"""


@pytest.mark.filterwarnings("ignore::kforge.KforgeWarning")  # no daemon here: regions are not exclusive
def test_a_triton_kernel_searched_end_to_end_in_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row kernel correct only when one block covers the row (no loop: a smaller R0_BLOCK
    leaves columns unwritten), launched per configuration by Triton's interpreter on CPU tensors: the
    configurations that change the results are excluded, the rest timed against the original
    (XBLOCK=1: a program per row, the slowest in the interpreter) and the winner chosen and pinned."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch = pytest.importorskip("torch")
    triton = pytest.importorskip("triton")
    pytest.importorskip("numpy")
    import triton.language as tl

    ns: Dict[str, Any] = {"triton": triton, "tl": tl}
    exec(compile(ROW_SCALE, "<row_scale>", "exec"), ns)
    row_scale = ns["row_scale"]

    spec = C.KernelSpec("row_scale", "persistent_reduction", {"x": 64, "r0_": 32}, ("XBLOCK", "R0_BLOCK"), {"x": 64, "r0_": 32})
    original = C.LaunchConfig.make({"XBLOCK": 1, "R0_BLOCK": 32}, 1, 1)
    space = [original] + [C.LaunchConfig.make({"XBLOCK": x, "R0_BLOCK": r}, 1, 1) for x in (8, 64) for r in (16, 32)]
    torch.manual_seed(0)
    x = torch.randn(64, 32)

    def build(cfg: C.LaunchConfig) -> C.LaunchConfig:
        return cfg

    def launch(cfg: C.LaunchConfig, args: List[Any]) -> None:
        kw = dict(cfg.kwargs)
        row_scale[(triton.cdiv(64, kw["XBLOCK"]),)](*args, **kw)

    def fresh() -> List[Any]:
        return [x.clone(), torch.zeros(64, 32), 64, 32]

    result = C.search(space, build, launch, fresh, original, 5, "cpu", "test:config")  # 5 rounds: a loaded CPU widened 2 rounds past the floor
    assert set(result["excluded"]) == {"R0_BLOCK=16 XBLOCK=8 warps=1 stages=1", "R0_BLOCK=16 XBLOCK=64 warps=1 stages=1"}
    assert all("changes the results" in why for why in result["excluded"].values())
    assert result["pin_reproduces_original"] is True
    assert set(result["configs"]) == {"R0_BLOCK=32 XBLOCK=8 warps=1 stages=1", "R0_BLOCK=32 XBLOCK=64 warps=1 stages=1"}
    assert result["fallback"] is False and result["speedup"] > 1.5  # 8 or 1 programs instead of 64
    winner = C.LaunchConfig.of_dict(result["new"])
    assert winner.block("R0_BLOCK") == 32 and winner.block("XBLOCK") in (8, 64)
    out = fresh()
    launch(winner, out)
    assert torch.equal(out[1], x * 2)
    assert C.config_space(spec, winner, 4)[0] == winner  # the pinned winner is the next search's start


def test_candidates_compile_as_the_result_does_with_the_same_hash() -> None:
    """A candidate's source carries the result's options in its decorator (coordinate descent,
    block scaling and the local autotune cache off) and a first-line tag; its function — and so
    its lookup key and what the configuration space reads — is unchanged."""
    for fixture, prefix in [("max-autotune_007_masked_softmax_attention_bf16", "triton_red_"),
                            ("max-autotune_007_masked_softmax_attention_bf16", "triton_tem_"), ("default_009_layernorm_fp32", "triton_red_")]:
        name, src = one(fixture, prefix)
        out = C.as_the_result_compiles(src, "kforge config XBLOCK=8")
        assert out.startswith("# kforge config XBLOCK=8\n") and out.split("@triton.jit\n")[1] == src.split("@triton.jit\n")[1]
        assert C.lookup_hash(out) == C.lookup_hash(src) and C.kernel_spec(name, out) == C.kernel_spec(name, src)
        head = out.split("@triton.jit\n")[0]
        for key in C.RESULT_OPTIONS:
            if f"'{key}':" in src.split("@triton.jit\n")[0]:
                assert f"'{key}': False" in head and f"'{key}': True" not in head
    assert "'coordinate_descent_tuning': True" in one("max-autotune_007_masked_softmax_attention_bf16", "triton_tem_")[1]


def test_compiled_configs_reads_launchers_then_compile_results_then_configs() -> None:
    
    def cfg(x: int) -> Any:
        return SimpleNamespace(kwargs={"XBLOCK": x}, num_warps=4, num_stages=1)

    want = [C.LaunchConfig.make({"XBLOCK": 8}, 4, 1)]
    assert C.compiled_configs(SimpleNamespace(launchers=[SimpleNamespace(config=cfg(8))], configs=[cfg(1), cfg(2)])) == want
    assert C.compiled_configs(SimpleNamespace(launchers=[], compile_results=[SimpleNamespace(config=cfg(8))], configs=None)) == want
    assert C.compiled_configs(SimpleNamespace(launchers=[], compile_results=[], configs=[cfg(8)])) == want
    assert len(C.compiled_configs(SimpleNamespace(configs=[cfg(1), cfg(2)]))) == 2


def test_recording_keeps_each_kernels_first_launch_and_restores() -> None:
    """The capture step: a wrapper's Triton kernels record the arguments of their first launch
    (copies: the launch may write them), later launches pass through, the originals come back."""
    torch = pytest.importorskip("torch")
    import types

    calls: List[Any] = []

    def run(*args: Any, **kw: Any) -> None:
        calls.append(args)
        args[0].add_(1)  # writes its first argument in place

    mod = types.ModuleType("fake_wrapper")
    kernel = types.SimpleNamespace(run=run, fn=object())
    mod.triton_poi_fused_add_0 = kernel  # type: ignore[attr-defined]
    recorded: Dict[str, Dict[str, Any]] = {}
    restore: List[Tuple[Any, Any]] = []
    C.recording(recorded, restore)(mod)
    x = torch.zeros(2, 3).t()  # a strided view: the copy keeps its strides
    kernel.run(x, 6, stream=7)
    kernel.run(x, 6, stream=7)
    rec = recorded["triton_poi_fused_add_0"]
    assert torch.equal(rec["before"][0], torch.zeros(3, 2)) and rec["before"][0].stride() == x.stride()
    assert rec["before"][1] == 6 and rec["kwargs"] == {"stream": 7} and len(calls) == 2
    for obj, orig in restore:
        obj.run = orig
    assert kernel.run is run


def test_the_re_stitched_models_rounds_past_the_first_two_stop_at_the_steps_end(
        round_clock: Callable[[Any], Any]) -> None:
    clock = round_clock(C)  # each round takes 10 s
    # Two rounds although the end comes during the first; then none would fit.
    assert len(C.model_rounds(lambda: None, lambda: None, 5, end=clock.now + 5.0)) == D.MIN_ROUNDS == 2
    assert len(C.model_rounds(lambda: None, lambda: None, 5, end=clock.now + 40.0)) == 4
    assert len(C.model_rounds(lambda: None, lambda: None, 5)) == 5
    assert D.rounds_cut(4, 5) == "4 of 5 rounds timed: another would have ended past the step's end"
    assert D.rounds_cut(5, 5) is None


@pytest.mark.filterwarnings("ignore::kforge.KforgeWarning")
def test_model_rounds_time_both_sides_per_round() -> None:
    rows_ = C.model_rounds(lambda: sum(range(200)), lambda: sum(range(100)), 2)
    assert len(rows_) == 2 and all(len(r) == 3 and all(t > 0 for t in r) for r in rows_)
    chosen = C.choose("default", {"config": rows_})
    assert set(chosen) >= {"modes", "noise_floor", "winner", "fallback"}


def test_why_nothing_was_tuned_names_the_kernels_at_their_roof() -> None:
    roof = {"triton_poi_a": "at its bandwidth roof: ...", "triton_red_b": "at its bandwidth roof: ..."}
    assert "every generated kernel runs at its bandwidth roof (triton_poi_a, triton_red_b)" in C.nothing_tuned_why(roof, [])
    mixed = {**roof, "triton_poi_c": "not autotuned to one configuration"}
    assert C.nothing_tuned_why(mixed, []) == "no kernel was tuned (2 at their bandwidth roof)"
    # A kernel the deadline deferred was not at its roof: not "every".
    assert C.nothing_tuned_why(roof, ["triton_poi_d"]) == "no kernel was tuned (2 at their bandwidth roof)"
    assert C.nothing_tuned_why({}, []) == "no kernel was tuned"


def test_kernels_at_their_roof_are_skipped_and_marked_unless_skipped_already() -> None:
    at = {"kind": "pointwise", "bytes": 6_000_000_000, "of_peak": 1.03, "ceiling": 1.019}
    below = {"kind": "pointwise", "bytes": 6_000_000_000, "of_peak": 0.999, "ceiling": 1.051}
    rows = {"triton_poi_fused_a": dict(at), "triton_poi_fused_b": below, "triton_poi_c": dict(at)}
    already = {"triton_poi_c": "not *_fused_*: Inductor's lookup table does not apply"}
    out = C.roof_skipped(rows, already, C.ROOF_SKIP)
    assert list(out) == ["triton_poi_fused_a"] and out["triton_poi_fused_a"].startswith("at its bandwidth roof")
    assert rows["triton_poi_fused_a"]["skipped"] is True
    assert "skipped" not in rows["triton_poi_fused_b"] and "skipped" not in rows["triton_poi_c"]  # below; skipped for another reason
    assert C.roof_skipped({"k": dict(at)}, {}, 1.05) == {}  # --roof-skip 1.05


def test_the_search_is_pruned_when_its_roofline_ceiling_cannot_beat_the_result_to_beat() -> None:
    assert C.roof_pruned_why(1.02, 1.05) is not None and "1.020x, not above the 1.050x" in str(C.roof_pruned_why(1.02, 1.05))
    assert C.roof_pruned_why(1.25, 1.0) is None and C.roof_pruned_why(None, 2.0) is None


def test_unsearchable_kernels_are_named_with_the_first_reason_that_applies() -> None:
    """Of a step's wrapper kernels only a pinned, recorded ``*_fused_*`` kernel with a name of its
    own is searched; each other one says why not (the first reason that applies)."""
    pinned = C.LaunchConfig.make({"XBLOCK": 128}, 4, 1)
    found = [(None, "triton_poi_fused_add_0", None, "src0"), (None, "triton_tem_fused_mm_1", None, "src1"),
             (None, "triton_poi_helper_2", None, "src2"), (None, "triton_red_fused_sum_3", None, "src3"),
             (None, "triton_red_fused_sum_3", None, "src3b"), (None, "triton_poi_fused_mul_4", None, "src4")]
    pins = {"src0": pinned, "src1": pinned, "src3": pinned, "src3b": pinned}
    recorded: Dict[str, Dict[str, Any]] = {"triton_poi_fused_add_0": {}, "triton_tem_fused_mm_1": {}, "triton_red_fused_sum_3": {}}
    why = C.unsearchable(found, pins, recorded)
    assert "triton_poi_fused_add_0" not in why and "triton_tem_fused_mm_1" not in why
    assert why["triton_poi_helper_2"].startswith("not *_fused_*")
    assert why["triton_red_fused_sum_3"] == "its name is in more than one wrapper module"
    assert why["triton_poi_fused_mul_4"] == "not autotuned to one configuration"
    del pins["src0"], recorded["triton_tem_fused_mm_1"]
    later = C.unsearchable(found, pins, recorded)
    assert later["triton_poi_fused_add_0"] == "not autotuned to one configuration"
    assert later["triton_tem_fused_mm_1"] == "its launch was not recorded"


def test_tune_selected_keeps_a_failed_kernels_original_and_stops_at_the_deadline() -> None:
    """Kernels are tuned in the selection's order; one whose search raises is a fallback naming
    the error and the next is still tuned; once the next one no longer fits before the deadline
    it and the rest are listed as not tuned (the clock is the test's)."""
    now = [1000.0]

    def tune(name: str) -> Dict[str, Any]:
        now[0] += 50.0
        if name == "b":
            raise RuntimeError("out of resources: shared memory")
        return {"fallback": False, "speedup": 1.1}

    selected = [{"kernel": k, "share": 0.3} for k in ("a", "b", "c", "d")]
    reserve = 100.0
    # Each tuning takes 50 s: after a (at 1050) b fits with 50 s expected; after b (at 1100) c does not.
    until = now[0] + reserve + 125.0
    assert C.FIRST_TUNE_S <= 125.0
    kernels, not_tuned = C.tune_selected(selected, tune, until, reserve, clock=lambda: now[0])
    assert kernels["a"] == {"kernel": "a", "share": 0.3, "fallback": False, "speedup": 1.1}
    assert kernels["b"]["fallback"] is True and kernels["b"]["error"] == "RuntimeError: out of resources: shared memory"
    assert list(kernels) == ["a", "b"] and not_tuned == ["c", "d"], (kernels, not_tuned)
    everything, none_cut = C.tune_selected(selected, tune, None, reserve, clock=lambda: now[0])
    assert list(everything) == ["a", "b", "c", "d"] and none_cut == []


def test_a_result_file_that_misses_a_tuned_kernel_falls_back_with_the_reason() -> None:
    kernels = {"k1": {"fallback": False}, "k2": {"fallback": True}}
    good: Dict[str, Any] = {"kernels": kernels, "winner": "config", "fallback": False,
            "model_new": {"ok": True, "missed": ["k2"], "not_found": []}}  # k2 kept its original anyway
    assert C.unreproduced(good, "max-autotune") is False and good["winner"] == "config"
    missed: Dict[str, Any] = {**good, "model_new": {"ok": True, "missed": [], "not_found": ["k1"]}}
    assert C.unreproduced(missed, "max-autotune") is True
    assert missed["winner"] == "max-autotune" and missed["fallback"] is True and "missed ['k1']" in missed["why"]
    wrong: Dict[str, Any] = {**good, "model_new": {"ok": False, "missed": [], "not_found": []}}
    assert C.unreproduced(wrong, "default") is True and "output ok: False" in wrong["why"] and wrong["winner"] == "default"
