"""The rewrite rules of ``kforge.optimize.rewrite`` on the CPU: per rule a case where it fires
(the output within the rule's class tolerance, the matched op gone from the graph), cases where
it must not fire, idempotence, the standalone ModelNew text imported in a fresh interpreter, and
a sweep over the problem suite."""

from __future__ import annotations

import ast
import copy
import importlib.util
import inspect
import json
import math
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, List, Sequence, Set, Tuple

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from kforge.harness import apply_size, load_problem  # noqa: E402
from kforge.optimize import rewrite as rw  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "rewrite"
PROBLEMS = sorted((REPO / "problems").glob("level*/*.py"))
CORPUS_DIAG = REPO / "tests" / "candidates" / "problems" / "diag_matmul.py"


def Fn(fn: Callable[..., Any]) -> Any:
    """A model whose forward is ``fn`` (traced through: FX sees the torch calls inside), with
    ``fn``'s parameters as forward's (symbolic_trace needs named arguments, not ``*xs``)."""
    names = list(inspect.signature(fn).parameters)
    ns: dict = {}
    exec(f"def forward(self, {', '.join(names)}):\n    return self.fn({', '.join(names)})\n", ns)

    class FnModel(nn.Module):
        forward = ns["forward"]

        def __init__(self) -> None:
            super().__init__()
            self.fn = fn

    return FnModel()


def calls(gm: Any) -> Set[str]:
    """The ops of the graph's call nodes, by name (``matmul``, ``diag``, ``sum``, ``fc`` ...)."""
    out = set()
    for n in gm.graph.nodes:
        if n.op == "call_function":
            out.add(getattr(n.target, "__name__", str(n.target)))
        elif n.op in ("call_method", "call_module"):
            out.add(str(n.target))
    return out


def matmuls(gm: Any) -> List[Any]:
    return [n for n in gm.graph.nodes if rw.matmul_operands(n) is not None]


def rules_applied(r: rw.RewriteResult) -> List[str]:
    return [a.rule for a in r.applications]


def check_close(model: Any, r: rw.RewriteResult, inputs: Sequence[Any]) -> None:
    """The rewritten module's outputs against the model's within the result's class tolerance;
    for ``reassociates`` in a reduced dtype, where the original's own rounding dominates (a
    cancelling sum), no further from an fp64 evaluation than 10x the original (verify's fp64 rule)."""
    with torch.no_grad():
        check_close_no_grad(model, r, inputs)


def check_close_no_grad(model: Any, r: rw.RewriteResult, inputs: Sequence[Any]) -> None:
    ref, out = model(*inputs), r.module(*inputs)
    refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    assert len(refs) == len(outs)
    exact64: List[Any] = []
    for i, (o, e) in enumerate(zip(outs, refs)):
        assert o.shape == e.shape and o.dtype == e.dtype
        rtol, atol = rw.tolerance(r.exactness, e.dtype)
        if rtol == atol == 0.0:
            assert torch.equal(o, e), (o - e).abs().max()
        elif not torch.allclose(o, e, rtol=rtol, atol=atol):
            assert e.dtype in (torch.float16, torch.bfloat16), (o - e).abs().max()
            if not exact64:
                m64 = copy.deepcopy(model).double()
                got = m64(*[x.double() if x.is_floating_point() else x for x in inputs])
                exact64 = list(got) if isinstance(got, (tuple, list)) else [got]
            d_new = float((o.double() - exact64[i]).abs().max())
            d_ref = float((e.double() - exact64[i]).abs().max())
            assert d_new <= 10 * d_ref, (d_new, d_ref)


def rewrite(fn: Callable[..., Any], *inputs: Any) -> Tuple[Any, rw.RewriteResult]:
    model = Fn(fn)
    r = rw.rewrite_model(model, inputs)
    assert r.skipped is None, r.skipped
    return model, r


def idempotent(r: rw.RewriteResult, inputs: Sequence[Any]) -> None:
    again = rw.rewrite_model(r.module, inputs)
    assert again.applications == [] and again.code == torch.fx.symbolic_trace(r.module).code


def randn(*shape: int, dtype: Any = None) -> Any:
    return torch.randn(*shape, dtype=dtype or torch.float32)


@pytest.fixture(autouse=True)
def seeded() -> None:
    torch.manual_seed(0)


# --- the classes -------------------------------------------------------------------------------


def test_exactness_classes_are_a_closed_set() -> None:
    assert rw.EXACTNESS == ("exact", "reassociates")
    assert {r.exactness for r in rw.RULES} <= set(rw.EXACTNESS)
    assert rw.weakest([]) == "exact" and rw.weakest(["exact", "reassociates"]) == "reassociates"
    assert rw.tolerance("exact", torch.float32) == (0.0, 0.0)
    assert rw.tolerance("reassociates", torch.float32) == (1e-4, 1e-4)
    assert rw.tolerance("reassociates", torch.bfloat16) == (1e-2, 1e-2)
    with pytest.raises(ValueError, match="unknown exactness"):
        rw.tolerance("approximately", torch.float32)
    with pytest.raises(ValueError, match="unknown rewrite rule"):
        rw.rule_named("nope")
    assert len({r.name for r in rw.RULES}) == len(rw.RULES)
    with pytest.raises(ValueError, match="unknown exactness"):
        rw.Rule("loose", "a rule outside the classes", "approximately", lambda n, gm: None)


# --- diag-matmul -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_diag_left_and_right_are_exact(dtype: Any) -> None:
    a, b, x = randn(12, dtype=dtype), randn(9, dtype=dtype), randn(12, 9, dtype=dtype)
    model, r = rewrite(lambda a, b, x: (torch.diag(a) @ x, x @ torch.diag(b), torch.mm(torch.diag(a), x)), a, b, x)
    assert rules_applied(r) == ["diag-matmul"] * 3 and r.exactness == "exact"
    assert matmuls(r.module) == [] and "diag" not in calls(r.module)
    check_close(model, r, (a, b, x))
    idempotent(r, (a, b, x))


def test_diag_with_vectors_batches_and_diag_embed() -> None:
    a, v, xb = randn(7), randn(7), randn(4, 7, 5)
    ab, yb = randn(4, 7), randn(4, 6, 7)

    def f(a: Any, v: Any, xb: Any, ab: Any, yb: Any) -> Any:
        return (torch.diag(a) @ v,                   # matrix-vector: a * v
                v @ torch.diag(a),                   # vector-matrix: v * a
                torch.diag(a) @ xb,                  # broadcast over xb's batch
                torch.diag_embed(ab) @ xb,           # one diagonal per batch
                yb @ torch.diag_embed(ab),           # columns scaled per batch
                v @ torch.diag_embed(ab),            # a vector times a batch of diagonals
                torch.matmul(xb.transpose(-2, -1), torch.diag_embed(ab, 0, -2, -1)))

    model, r = rewrite(f, a, v, xb, ab, yb)
    assert rules_applied(r) == ["diag-matmul"] * 7
    assert matmuls(r.module) == [] and not calls(r.module) & {"diag", "diag_embed"}
    check_close(model, r, (a, v, xb, ab, yb))
    idempotent(r, (a, v, xb, ab, yb))


def test_diag_matmul_does_not_fire_without_a_diagonal_matrix() -> None:
    a, m, x = randn(6), randn(6, 6), randn(6, 6)
    ab = randn(2, 6)

    def f(a: Any, m: Any, x: Any, ab: Any) -> Any:
        return (torch.diag(a, 1)[:6, :6] @ x,          # an off-diagonal band
                torch.diag(m) @ x,                     # diag of a matrix is its diagonal vector
                m @ x,                                 # a plain product
                torch.diag_embed(ab, dim1=0, dim2=2).sum(1) @ x,  # not the last two dims
                torch.diag_embed(ab, offset=1)[..., :6, :6] @ x)

    model, r = rewrite(f, a, m, x, ab)
    assert r.applications == []
    assert len(matmuls(r.module)) == 5


def test_diag_matmul_does_not_fire_on_integer_or_mixed_dtypes() -> None:
    ai, xi = torch.arange(4), torch.arange(16).reshape(4, 4)
    _, r = rewrite(lambda a, x: torch.diag(a) @ x, ai, xi)
    assert r.applications == []


# --- diag-of-product ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_diag_of_product(dtype: Any) -> None:
    a, b = randn(20, 33, dtype=dtype), randn(33, 20, dtype=dtype)

    def f(a: Any, b: Any) -> Any:
        return torch.diag(a @ b), torch.diagonal(torch.mm(a, b)), (a @ b).diagonal()

    model, r = rewrite(f, a, b)
    assert rules_applied(r) == ["diag-of-product"] * 3 and r.exactness == "reassociates"
    assert matmuls(r.module) == [] and not calls(r.module) & {"diag", "diagonal"}
    check_close(model, r, (a, b))
    idempotent(r, (a, b))


def test_diag_of_product_batched() -> None:
    a, b = randn(3, 10, 4), randn(3, 4, 10)
    model, r = rewrite(lambda a, b: torch.diagonal(torch.bmm(a, b), dim1=-2, dim2=-1), a, b)
    assert rules_applied(r) == ["diag-of-product"]
    check_close(model, r, (a, b))


def test_diag_of_product_does_not_fire() -> None:
    a, b, bb = randn(8, 5), randn(5, 8), randn(2, 5, 8)
    a3, b6 = randn(3, 8, 5), randn(5, 6)

    def f(a: Any, b: Any, bb: Any, a3: Any, b6: Any) -> Any:
        c = a @ b
        return (torch.diag(a @ b, 1),                           # an off-diagonal
                torch.diagonal(a @ bb, dim1=-2, dim2=-1),       # broadcast batch of the product
                torch.diagonal(a3 @ b, dim1=0, dim2=1),         # not the last two dims
                torch.diag(a @ b6),                             # not square
                torch.diag(c), c)                               # the product is used elsewhere

    model, r = rewrite(f, a, b, bb, a3, b6)
    assert r.applications == []
    assert len(matmuls(r.module)) == 5


# --- linear-sum --------------------------------------------------------------------------------


class Linears(nn.Module):
    def __init__(self, k: int, n: int, bias: bool = True) -> None:
        super().__init__()
        self.fc = nn.Linear(k, n, bias=bias)
        self.w = nn.Parameter(torch.randn(n, k))
        self.b = nn.Parameter(torch.randn(n))

    def forward(self, x: Any, x3: Any, m: Any) -> Any:
        return (self.fc(x).sum(-1),
                self.fc(x3).sum(dim=2, keepdim=True),
                F.linear(x, self.w, self.b).sum(dim=(-1,)),
                torch.sum(F.linear(x, self.w), 1),
                (x @ self.w.t() + self.b).sum(-1),
                torch.sum(self.b + torch.matmul(x, m), dim=-1, keepdim=True),
                self.fc(x[0]).sum(-1),  # one row: a dot product
                self.fc(x3).mean(-1),
                torch.mean(x @ self.w.t() + self.b, dim=-1, keepdim=True))


@pytest.mark.parametrize("bias", [True, False])
def test_linear_sum(bias: bool) -> None:
    model = Linears(24, 40, bias)
    inputs = (randn(5, 24), randn(2, 5, 24), randn(24, 40))
    r = rw.rewrite_model(model, inputs)
    assert rules_applied(r) == ["linear-sum"] * 9 and r.exactness == "reassociates"
    assert matmuls(r.module) and all(len(rw.shape(rhs) or ()) == 1 for _, rhs in map(rw.matmul_operands, matmuls(r.module)))
    assert not calls(r.module) & {"fc", "linear"}
    check_close(model, r, inputs)
    idempotent(r, inputs)


def test_linear_sum_in_bf16() -> None:
    model = Linears(64, 128).to(torch.bfloat16)
    inputs = (randn(8, 64, dtype=torch.bfloat16), randn(2, 8, 64, dtype=torch.bfloat16),
              randn(64, 128, dtype=torch.bfloat16))
    r = rw.rewrite_model(model, inputs)
    assert rules_applied(r) == ["linear-sum"] * 9
    check_close(model, r, inputs)


class NotLinearSums(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 6)

    def forward(self, x: Any, x3: Any, mb: Any, c: Any) -> Any:
        y = self.fc(x)
        return (self.fc(x).sum(0),                      # over the batch, not the features
                self.fc(x3).sum(1),                     # a middle dim
                self.fc(x).sum(),                       # everything
                self.fc(x).sum(-1, dtype=torch.float64),  # a dtype argument
                torch.sigmoid(self.fc(x)).sum(-1),      # a nonlinearity in between
                y.sum(-1), y,                           # the linear output used elsewhere
                torch.matmul(x, mb).sum(-1),            # a batch of matrices (broadcast): not handled
                (self.fc(x) + c).sum(-1),               # a full-shape addend, not a bias
                self.fc(x).amax(-1),                    # not a linear reduction
                self.fc(x).mean(0))                     # a mean over the batch


def test_linear_sum_does_not_fire() -> None:
    model = NotLinearSums()
    inputs = (randn(4, 8), randn(3, 4, 8), randn(2, 8, 6), randn(4, 6))
    r = rw.rewrite_model(model, inputs)
    assert r.applications == [], r.applications
    check_close(model, r, inputs)


def test_linear_sum_does_not_fire_on_a_broadcast_bias() -> None:
    """A scalar or (1,) bias is added to each of the N outputs: its share of the sum is N * b, not b."""
    x, w = randn(3, 4), randn(5, 4)
    model = Fn(lambda x, w, b0, b1: (F.linear(x, w, b0).sum(-1), F.linear(x, w, b1).sum(-1)))
    inputs = (x, w, torch.tensor(1.5), torch.ones(1))
    r = rw.rewrite_model(model, inputs)
    assert r.applications == [], r.applications
    check_close(model, r, inputs)


def test_linear_sum_does_not_bypass_a_hook_or_a_subclass() -> None:
    class Scaled(nn.Linear):
        def forward(self, x: Any) -> Any:
            return super().forward(x) * 2

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hooked, self.scaled = nn.Linear(8, 6), Scaled(8, 6)
            self.hooked.register_forward_hook(lambda mod, args, out: out * 3)

        def forward(self, x: Any) -> Any:
            return self.hooked(x).sum(-1), self.scaled(x).sum(-1)

    model = Two()
    r = rw.rewrite_model(model, (randn(4, 8),))
    # the subclass is traced through (its own forward is inlined): its linear is a plain F.linear
    # whose output is scaled before the sum, so nothing fires there either
    assert r.applications == [], r.applications
    check_close(model, r, (randn(4, 8),))


def test_aten_mutations_are_seen() -> None:
    a, x = randn(5), randn(5, 5)
    r = rw.rewrite_model(Fn(lambda a, x: torch.ops.aten.mul_.Tensor(torch.diag(a) @ x, x)), (a, x))
    assert r.skipped is not None and "in-place" in r.skipped


# --- triangles ---------------------------------------------------------------------------------


def test_redundant_triangle_is_dropped() -> None:
    a, b = randn(9, 9), randn(9, 9)

    def f(a: Any, b: Any) -> Any:
        return (torch.tril(torch.tril(a) @ torch.tril(b, -1)),
                torch.triu(torch.triu(a, 1) @ torch.triu(b), 1),
                torch.tril(torch.tril(a, -1) @ torch.tril(b, -1), -2))

    model, r = rewrite(f, a, b)
    assert rules_applied(r)[:3] == ["redundant-triangle"] * 3
    assert calls(r.module) >= {"tril", "triu"}
    outer = [n for n in r.module.graph.nodes if rw.triangle(n) is not None and rw.triangle(n)[2].op != "placeholder"]
    assert outer == []
    check_close(model, rw.RewriteResult(model, r.module, [a for a in r.applications], r.code), (a, b))
    idempotent(r, (a, b))


def test_redundant_triangle_keeps_what_is_needed() -> None:
    a, b = randn(9, 9), randn(9, 9)

    def f(a: Any, b: Any) -> Any:
        return (torch.tril(torch.tril(a) @ torch.tril(b), -1),  # cuts into the product's triangle
                torch.tril(torch.tril(a) @ torch.triu(b)),       # mixed factors: a full product
                torch.tril(a @ b),                               # nothing known of the factors
                torch.triu(torch.tril(a) @ torch.tril(b)))       # the other triangle

    r = rw.rewrite_model(Fn(f), (a, b))
    assert "redundant-triangle" not in rules_applied(r)
    assert sum(1 for n in r.module.graph.nodes if rw.triangle(n) is not None and rw.triangle(n)[2].op != "placeholder") == 4


@pytest.mark.parametrize("n", [2, 7, 64, 65])
@pytest.mark.parametrize("kind", ["tril", "triu"])
def test_triangular_product_in_blocks(n: int, kind: str) -> None:
    tri = getattr(torch, kind)
    a, b = randn(n, n), randn(n, n)
    model, r = rewrite(lambda a, b: tri(a) @ tri(b), a, b)
    assert rules_applied(r) == ["triangular-product"]
    # four half-size products (one fused into addmm) in place of the full one
    assert len(matmuls(r.module)) == 3 and "addmm" in calls(r.module)
    assert all(rw.triangle(lhs) is None for lhs, _ in map(rw.matmul_operands, matmuls(r.module)))
    check_close(model, r, (a, b))
    out = r.module(a, b)
    assert torch.equal(out, tri(out))  # the known-zero half is exactly zero
    idempotent(r, (a, b))
    # the block sizes are computed at run time: the same module on another size
    a2, b2 = randn(n + 3, n + 3), randn(n + 3, n + 3)
    torch.testing.assert_close(r.module(a2, b2), model(a2, b2), rtol=1e-4, atol=1e-4)


def test_triangular_product_does_not_fire() -> None:
    a, b, r6, c6 = randn(8, 8), randn(8, 8), randn(6, 4), randn(4, 6)
    ab = randn(2, 8, 8)

    def f(a: Any, b: Any, r6: Any, c6: Any, ab: Any) -> Any:
        return (torch.tril(a) @ torch.triu(b),        # mixed: no known-zero block product
                torch.tril(a, 1) @ torch.tril(b),     # a superdiagonal kept: not triangular
                torch.triu(a, -1) @ torch.triu(b),
                torch.tril(r6) @ torch.tril(c6),      # not square
                torch.tril(ab) @ torch.tril(ab),      # batched: not handled
                torch.tril(a) @ b)                    # one factor only

    model, r = rewrite(f, a, b, r6, c6, ab)
    assert r.applications == []
    assert len(matmuls(r.module)) == 6


def test_triangular_product_in_bf16() -> None:
    a, b = randn(40, 40, dtype=torch.bfloat16), randn(40, 40, dtype=torch.bfloat16)
    model, r = rewrite(lambda a, b: torch.tril(torch.tril(a) @ torch.tril(b)), a, b)
    assert rules_applied(r) == ["redundant-triangle", "triangular-product"]
    check_close(model, r, (a, b))


def qkv(b: int = 2, h: int = 3, s: int = 16, d: int = 8, dtype: Any = torch.float32) -> Tuple[Any, Any, Any]:
    return randn(b, h, s, d, dtype=dtype), randn(b, h, s, d, dtype=dtype), randn(b, h, s, d, dtype=dtype)


ATTENTION = {
    # the reduced-precision problems' form: scores in bf16, statistics in fp32, cast back
    "bf16, fp32 statistics": (lambda q, k, v: torch.matmul(torch.softmax((torch.matmul(q, k.transpose(-2, -1))
                                                                          / math.sqrt(8)).float(), dim=-1)
                                                            .to(q.dtype), v), torch.bfloat16),
    "fp32, scale as a product": (lambda q, k, v: F.softmax(q @ k.transpose(-1, -2) * 0.35, dim=-1) @ v, torch.float32),
    "fp32, no scale, softmax method": (lambda q, k, v: (q @ torch.transpose(k, 2, 3)).softmax(-1) @ v, torch.float32),
}


@pytest.mark.parametrize("form", list(ATTENTION))
def test_written_out_attention_is_one_sdpa_call(form: str) -> None:
    fn, dtype = ATTENTION[form]
    inputs = qkv(dtype=dtype)
    model, r = rewrite(fn, *inputs)
    assert rules_applied(r) == ["attention-sdpa"] and r.exactness == rw.REASSOCIATES
    assert "scaled_dot_product_attention" in calls(r.module), r.code
    assert not matmuls(r.module) and "softmax" not in calls(r.module), r.code
    check_close(model, r, inputs)
    idempotent(r, inputs)


def test_masked_attention_passes_the_keys_that_take_part() -> None:
    """A key-padding mask filled with -inf (level-2 007's form, ``~keep``): SDPA's bool mask is
    the keys that take part, so the negation is undone rather than applied twice; a mask set
    where keys are left out (``masked_fill(drop, -inf)``) is negated; before or after the scale."""
    q, k, v = qkv(dtype=torch.bfloat16)
    keep = torch.rand(2, 16) > 0.3
    keep[:, 0] = True  # every row keeps a key (a row of -inf only is NaN in the original)

    def padded(q: Any, k: Any, v: Any, keep: Any) -> Any:
        s = torch.matmul(q, k.transpose(-2, -1)) * 0.35
        s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
        return torch.matmul(torch.softmax(s.float(), dim=-1).to(q.dtype), v)

    model, r = rewrite(padded, q, k, v, keep)
    assert rules_applied(r) == ["attention-sdpa"]
    assert not ({"invert", "logical_not", "masked_fill"} & calls(r.module)), r.code
    check_close(model, r, (q, k, v, keep))
    drop = ~torch.tril(torch.ones(16, 16, dtype=torch.bool))  # causal, built outside the forward

    def causal(q: Any, k: Any, v: Any, drop: Any) -> Any:
        s = (q @ k.transpose(-2, -1)).masked_fill(drop, float("-inf")) / 3.0
        return torch.softmax(s, dim=-1) @ v

    q, k, v = qkv()
    model, r = rewrite(causal, q, k, v, drop)
    assert rules_applied(r) == ["attention-sdpa"] and "logical_not" in calls(r.module), r.code
    check_close(model, r, (q, k, v, drop))
    # A mask over the keys alone (1-D): SDPA reads a mask's last two dims, so it gets a query dim.
    keys = torch.arange(16) % 3 == 1
    model, r = rewrite(lambda q, k, v, m: torch.softmax((q @ k.transpose(-2, -1)).masked_fill(m, float("-inf")), -1) @ v,
                       q, k, v, keys)
    assert rules_applied(r) == ["attention-sdpa"] and "unsqueeze" in calls(r.module), r.code
    check_close(model, r, (q, k, v, keys))


NOT_ATTENTION = {
    "softmax over the queries": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), dim=-2) @ v,
    "k permuted, not transposed": lambda q, k, v: torch.softmax(q @ k.permute(0, 1, 3, 2), -1) @ v,
    "a finite fill": lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1)).masked_fill(k[..., :1] > 0, -1e9), -1) @ v,
    "a negative scale": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) * -0.5, -1) @ v,
    "the scores used again": lambda q, k, v: (lambda s: (torch.softmax(s, -1) @ v) + s[..., :8])(q @ k.transpose(-2, -1)),
    "the probabilities used again": lambda q, k, v: (lambda p: (p @ v) + p[..., :8])(torch.softmax(q @ k.transpose(-2, -1), -1)),
    "a softmax dtype": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1, dtype=torch.float64).float() @ v,
    "a shift before the softmax": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) + 1.0, -1) @ v,
}


@pytest.mark.parametrize("case", list(NOT_ATTENTION))
def test_attention_does_not_fire_where_the_value_would_change(case: str) -> None:
    model, r = rewrite(NOT_ATTENTION[case], *qkv())
    assert rules_applied(r) == [], r.code


def test_attention_does_not_fire_on_broadcast_batches_or_a_half_cast() -> None:
    q, k, v = qkv()
    _, r = rewrite(lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1) @ v, q, k[:1], v[:1])
    assert rules_applied(r) == [], "k and v broadcast over the batch"
    qb, kb, vb = qkv(dtype=torch.bfloat16)
    _, r = rewrite(lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1)).float(), -1).to(q.dtype).float().to(q.dtype) @ v,
                   qb, kb, vb)
    assert rules_applied(r) == [], "a cast chain the rule does not read"
    _, r = rewrite(lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1)), -1).float().to(q.dtype) @ v, qb, kb, vb)
    assert rules_applied(r) == [], "a cast back without the statistics in fp32"


# --- the driver --------------------------------------------------------------------------------


def test_in_place_graphs_are_left_alone() -> None:
    a, x = randn(5), randn(5, 5)

    def scaled(a: Any, x: Any) -> Any:
        d = torch.diag(a)
        a.mul_(2)  # the diagonal matrix holds the old a: a rewrite reading a would see the new one
        return d @ x

    r = rw.rewrite_model(Fn(scaled), (a, x))
    assert r.applications == [] and r.skipped is not None and "in-place" in r.skipped

    class Relu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.ReLU(inplace=True)

        def forward(self, a: Any, x: Any) -> Any:
            return self.act(torch.diag(a) @ x)

    r = rw.rewrite_model(Relu(), (a, x))
    assert r.skipped is not None and "act" in r.skipped
    r = rw.rewrite_model(Fn(lambda a, x: F.relu(torch.diag(a) @ x, inplace=True)), (a, x))
    assert r.skipped is not None and "relu" in r.skipped


def test_untraceable_models_are_reported() -> None:
    def branchy(x: Any) -> Any:
        return torch.diag(x) @ x[:, None] if x.sum() > 0 else x

    r = rw.rewrite_model(Fn(branchy), (randn(4),))
    assert r.module is None and r.skipped is not None and "symbolic_trace" in r.skipped
    assert "traced again with the inputs' shapes fixed" in r.skipped, "the data, not the shapes, decides the branch"
    with pytest.raises(ValueError, match="no rewritten module"):
        rw.module_source(r)


CAUSAL = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Self-attention whose causal mask is made in forward from the input's size (level-3
        004's form): symbolic_trace cannot pass a traced size to torch.ones."""

        def __init__(self, diagonal=1):
            super().__init__()
            self.diagonal = diagonal

        def forward(self, q, k, v):
            s, t = q.shape[-2], k.shape[-2]
            mask = torch.triu(torch.ones(s, t, device=q.device), diagonal=self.diagonal).bool()
            return torch.softmax((q @ k.transpose(-2, -1) / 8.0).masked_fill(mask, float("-inf")), dim=-1) @ v
    ''')
_causal: dict = {}
exec(compile(CAUSAL, "<causal>", "exec"), _causal)
CausalSelfAttention = _causal["Model"]


def test_a_forward_reading_its_sizes_is_traced_with_them_fixed_and_its_causal_mask_is_sdpas() -> None:
    """Traced again with the inputs' shapes fixed (sizes become numbers; the result says so); the
    strict upper triangle of ones as the mask is SDPA's ``is_causal`` (no mask made or read), also
    for more queries than keys (both align top left); another diagonal stays a mask."""
    for s, t in ((16, 16), (12, 16)):
        q, k, v = randn(2, 3, s, 8), randn(2, 3, t, 8), randn(2, 3, t, 4)
        model = CausalSelfAttention()
        r = rw.rewrite_model(model, (q, k, v))
        assert r.skipped is None and r.shapes_fixed and rules_applied(r) == ["attention-sdpa"], r.skipped
        assert "is_causal = True" in r.code and not ({"ones", "triu", "logical_not"} & calls(r.module)), r.code
        check_close(model, r, (q, k, v))
        assert rw.SHAPES_FIXED in rw.module_source(r, CAUSAL)
    q, k, v = qkv()
    model = CausalSelfAttention(diagonal=0)
    r = rw.rewrite_model(model, (q, k, v))
    assert rules_applied(r) == ["attention-sdpa"] and "is_causal" not in r.code and "logical_not" in calls(r.module)


def test_the_model_itself_is_not_changed() -> None:
    model = Fn(lambda a, x: torch.diag(a) @ x)
    a, x = randn(4), randn(4, 3)
    before = torch.fx.symbolic_trace(model).code
    r = rw.rewrite_model(model, (a, x))
    assert r.changed and torch.fx.symbolic_trace(model).code == before


def test_only_the_matched_nodes_are_removed() -> None:
    def f(a: Any, x: Any) -> Any:
        torch.rand_like(x)  # unused, but it draws from the generator: it stays
        return torch.diag(a) @ x

    model, r = rewrite(f, randn(4), randn(4, 3))
    assert "rand_like" in calls(r.module) and not calls(r.module) & {"diag", "matmul"}


def test_applications_are_bounded() -> None:
    a, x = randn(4), randn(4, 4)
    r = rw.rewrite_model(Fn(lambda a, x: (torch.diag(a) @ x, x @ torch.diag(a))), (a, x), max_applications=1)
    assert rules_applied(r) == ["diag-matmul"] and r.skipped == "stopped after 1 applications"


def test_meta_inputs_are_enough() -> None:
    with torch.device("meta"):
        model = Linears(4096, 8192)
        inputs = (randn(4096, 4096), randn(2, 64, 4096), randn(4096, 8192))
    r = rw.rewrite_model(model, inputs)
    assert rules_applied(r) == ["linear-sum"] * 9


def test_a_rule_whose_replacement_changes_the_shape_is_caught() -> None:
    def wrong(n: Any, gm: Any) -> Any:
        if rw.matmul_operands(n) is None:
            return None
        lhs, rhs = rw.matmul_operands(n)
        return rw.Match(n, (n.name,), lambda g: g.call_method("sum", (lhs, -1)))

    bad = rw.Rule("wrong", "a broken rule", rw.EXACT, wrong)
    with pytest.raises(rw.RuleError, match="wrong"):
        rw.rewrite_model(Fn(lambda a, b: a @ b), (randn(3, 4), randn(4, 5)), rules=[bad])


# --- the standalone ModelNew file --------------------------------------------------------------

CHECK = textwrap.dedent("""
    import importlib.util, json, sys
    import torch

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    problem, cand = load("problem", sys.argv[1]), load("candidate", sys.argv[2])
    rtol, atol = float(sys.argv[3]), float(sys.argv[4])
    init = problem.get_init_inputs()
    torch.manual_seed(0)
    ref = problem.Model(*init)
    torch.manual_seed(0)
    new = cand.ModelNew(*init)
    same_init = all(torch.equal(p, new.state_dict()[k]) for k, p in ref.state_dict().items())
    new.load_state_dict(ref.state_dict())  # strict: the same names and shapes
    torch.manual_seed(1)
    inputs = problem.get_inputs()
    out, exp = new(*inputs), ref(*inputs)
    if rtol == atol == 0.0:
        ok = torch.equal(out, exp)
    else:
        ok = torch.allclose(out, exp, rtol=rtol, atol=atol)
    print(json.dumps({"ok": ok, "same_init": same_init, "kforge": any(m.startswith("kforge") for m in sys.modules),
                      "max_abs_diff": float((out - exp).abs().max())}))
""")


def load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def standalone(problem: Path, tmp_path: Path) -> Tuple[rw.RewriteResult, str, Any]:
    mod = load(problem)
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs())
    r = rw.rewrite_model(model, mod.get_inputs())
    text = rw.module_source(r)
    cand = tmp_path / f"{problem.stem}_new.py"
    cand.write_text(text)
    rtol, atol = rw.tolerance(r.exactness, torch.float32)
    done = subprocess.run([sys.executable, "-c", CHECK, str(problem), str(cand), str(rtol), str(atol)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return r, text, json.loads(done.stdout.strip().splitlines()[-1])


FIXTURE_RULES = {
    "row_col_scale": ["diag-matmul", "diag-matmul"],
    "batched_gram_diagonal": ["diag-of-product"],
    "linear_rowsum": ["linear-sum"],
    "tril_product": ["redundant-triangle", "triangular-product"],
    "sigmoid_rowsum": [],
}


@pytest.mark.parametrize("name", sorted(FIXTURE_RULES))
def test_module_source_runs_standalone(name: str, tmp_path: Path) -> None:
    r, text, found = standalone(FIXTURES / f"{name}.py", tmp_path)
    assert rules_applied(r) == FIXTURE_RULES[name]
    assert found == {**found, "ok": True, "same_init": True, "kforge": False}, found
    tree = ast.parse(text)
    imported = {a.name.split(".")[0] for s in ast.walk(tree) if isinstance(s, ast.Import) for a in s.names} | \
        {(s.module or "").split(".")[0] for s in ast.walk(tree) if isinstance(s, ast.ImportFrom)}
    assert imported <= {"torch", "math", "operator"}, imported
    classes = [s.name for s in tree.body if isinstance(s, ast.ClassDef)]
    assert "ModelNew" in classes and "Model" not in classes
    assert not {s.name for s in tree.body if isinstance(s, ast.FunctionDef)} & {"get_inputs", "get_init_inputs"}
    assert "torch._C" not in text
    for rule in set(FIXTURE_RULES[name]):
        assert rule in ast.get_docstring(tree)  # type: ignore[operator]


def test_module_source_keeps_future_imports_first(tmp_path: Path) -> None:
    source = (FIXTURES / "row_col_scale.py").read_text().replace("import torch\n", "from __future__ import annotations\nimport torch\n", 1)
    problem = tmp_path / "row_col_scale_future.py"
    problem.write_text(source)
    r, text, found = standalone(problem, tmp_path)
    assert found["ok"] and rules_applied(r) == ["diag-matmul", "diag-matmul"]
    assert isinstance(ast.parse(text).body[1], ast.ImportFrom) and "__future__" in text.splitlines()[2]


GLOBALS_PROBLEM = '''"""A forward whose printed graph needs FX's globals (a device, inf)."""
import torch
import torch.nn as nn

N = 6


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, x):
        shift = torch.zeros(x.shape[-1], device=torch.device("cpu"))
        return (torch.diag(a) @ x + shift).clamp(max=float("inf"))


def get_inputs():
    return [torch.randn(N), torch.randn(N, N)]


def get_init_inputs():
    return []
'''


def test_module_source_defines_the_globals_fx_prints(tmp_path: Path) -> None:
    problem = tmp_path / "needs_globals.py"
    problem.write_text(GLOBALS_PROBLEM)
    r, text, found = standalone(problem, tmp_path)
    assert rules_applied(r) == ["diag-matmul"] and found["ok"], (found, text)
    assert "device(type='cpu')" in text and "inf" in r.code


def test_candidate_is_plain_data_with_a_dedup_key() -> None:
    mod = load(FIXTURES / "tril_product.py")
    first = rw.candidate(rw.rewrite_model(mod.Model(), mod.get_inputs()))
    again = rw.candidate(rw.rewrite_model(mod.Model(), mod.get_inputs()))
    assert json.loads(json.dumps(first)) == first
    assert first["agent"] == "rewrite" and first["replaces"] == "forward" and first["exactness"] == "reassociates"
    assert [c["rule"] for c in first["changes"]] == ["redundant-triangle", "triangular-product"]
    assert all(c["description"] and c["nodes"] for c in first["changes"])
    assert "class ModelNew" in first["source"] and first["key"] == again["key"]
    other = load(FIXTURES / "row_col_scale.py")
    assert rw.candidate(rw.rewrite_model(other.Model(*other.get_init_inputs()), other.get_inputs()))["key"] != first["key"]


def test_module_source_of_the_corpus_diag_problem(tmp_path: Path) -> None:
    r, text, found = standalone(CORPUS_DIAG, tmp_path)
    assert rules_applied(r) == ["diag-matmul"] and found["ok"] and found["max_abs_diff"] == 0.0
    assert "torch.diag(" not in text and "@" not in text


def test_module_source_refuses_tracing_constants() -> None:
    class Const(nn.Module):
        def __init__(self) -> None:
            super().__init__()

        def forward(self, x: Any) -> Any:
            return torch.diag(torch.tensor([1.0, 2.0, 3.0])) @ x  # made in forward: traced (folded) as a constant

    r = rw.rewrite_model(Const(), (randn(3, 3),))
    assert [str(n.target) for n in r.module.graph.nodes if n.op == "get_attr"] == ["_tensor_constant0"]
    with pytest.raises(ValueError, match="does not make"):
        rw.module_source(r, "class Model: pass\n")


def cli(*args: str) -> "subprocess.CompletedProcess[str]":
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    return subprocess.run([sys.executable, "-m", "kforge.optimize.rewrite", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)


def test_command_line_writes_the_candidate(tmp_path: Path) -> None:
    out = tmp_path / "tril_product_new.py"
    done = cli(str(FIXTURES / "tril_product.py"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["skipped"] is None and found["size"] == "default"
    assert [c["rule"] for c in found["candidate"]["changes"]] == ["redundant-triangle", "triangular-product"]
    assert out.read_text() == found["candidate"]["source"]
    none = json.loads(cli(str(FIXTURES / "sigmoid_rowsum.py")).stdout)
    assert none["candidate"] is None and none["skipped"] is None
    gru = json.loads(cli(str(REPO / "problems/level3/008_gru_unrolled_fp32.py"), "--size", "large").stdout)
    assert gru["candidate"] is None and gru["skipped"] is None, "traced with its shapes fixed; no rule fires"
    d = json.loads(cli(str(REPO / "problems/level3/004_decoder_layer_causal_fp32.py")).stdout)["candidate"]
    assert d["shapes_fixed"] and [c["rule"] for c in d["changes"]] == ["attention-sdpa", "attention-sdpa"], d


def test_command_line_names_bad_input(tmp_path: Path) -> None:
    (tmp_path / "not_a_problem.py").write_text("X = 1\n")
    done = cli(str(tmp_path / "not_a_problem.py"))
    assert done.returncode == 2 and "not a problem file (no Model)" in done.stderr
    done = cli(str(tmp_path / "missing.py"))
    assert done.returncode == 2 and "missing.py" in done.stderr
    done = cli(str(FIXTURES / "tril_product.py"), "--size", "large")
    assert done.returncode == 2 and "no LARGE dict" in done.stderr


# --- the problem suite -------------------------------------------------------------------------


def build_on_meta(path: Path, size: str = "default") -> Tuple[Any, List[Any]]:
    mod = load(path)
    apply_size(mod, size, str(path))
    with torch.device("meta"):
        torch.manual_seed(0)
        return mod.Model(*mod.get_init_inputs()), list(mod.get_inputs())


#: Suite problems symbolic_trace cannot trace (loops over a tensor's size, torch.ones(s, t) with
#: proxies): traced again with their shapes fixed (the meta tracer).
SHAPES_FIXED = {"level3/004_decoder_layer_causal_fp32.py", "level3/008_gru_unrolled_fp32.py",
                "level3/009_lstm_unrolled_bf16.py"}


#: Suite problems a rule fires on: the five whose attention is written out (softmax(Q Kᵀ / √d) V,
#: key-padding masked in level-2 007), the dense mixture of experts, none with a diagonal,
#: triangular or summed linear structure. Each is run on the CPU and compared.
FIRES: dict = {**{k: ["attention-sdpa"] for k in ("level2/007_masked_softmax_attention_bf16.py",
                                                 "level3/002_multihead_attention_bf16.py",
                                                 "level3/003_transformer_encoder_prenorm_bf16.py",
                                                 "level3/011_vit_patch_embed_encoder_fp32.py")},
               # causal self-attention (its mask SDPA's is_causal) and cross-attention
               "level3/004_decoder_layer_causal_fp32.py": ["attention-sdpa", "attention-sdpa"],
               # every expert on every token, masked by the top-2 weights
               "level3/010_moe_top2_bf16.py": ["routed-experts"]}


@pytest.mark.parametrize("size", ["default", "large"])
@pytest.mark.parametrize("path", PROBLEMS, ids=[f"{p.parent.name}/{p.name}" for p in PROBLEMS])
def test_suite_problems_find_nothing_or_stay_equal(path: Path, size: str) -> None:
    """At both presets, built on the meta device (nothing computed); where a rule fires the
    problem is built on the CPU at the default preset and the rewritten module compared with it."""
    model, inputs = build_on_meta(path, size)
    r = rw.rewrite_model(model, inputs)
    key = f"{path.parent.name}/{path.name}"
    assert r.module is not None and r.shapes_fixed == (key in SHAPES_FIXED), r.skipped
    assert rules_applied(r) == FIRES.get(key, [])
    if r.applications:
        mod = load(path)
        torch.manual_seed(0)
        model = mod.Model(*mod.get_init_inputs())
        inputs = mod.get_inputs()
        check_close(model, rw.rewrite_model(model, inputs), inputs)


MOE = REPO / "problems" / "level3" / "010_moe_top2_bf16.py"


def small_moe(**changes: Any) -> Tuple[Any, List[Any]]:
    """Level-3 010's Model at a small size (64 -> 128 -> 64, 8 experts, top 2, 256 tokens, bf16)."""
    mod = load(MOE)
    torch.manual_seed(0)
    model = mod.Model(64, 128, 8, 2).eval()
    return model, [torch.randn(256, 64, dtype=torch.bfloat16)]


def test_a_dense_mixture_of_experts_is_routed_through_grouped_gemms() -> None:
    model, inputs = small_moe()
    r = rw.rewrite_model(model, inputs)
    assert rules_applied(r) == ["routed-experts"] and r.exactness == rw.REASSOCIATES, r.skipped
    assert "_grouped_mm" in calls(r.module) and "einsum" not in calls(r.module), r.code
    assert "scatter" not in calls(r.module) and "zeros_like" not in calls(r.module), "the dense weights are gone"
    with torch.no_grad():
        assert torch.equal(r.module(*inputs), model(*inputs)), "two exact bf16 products summed in fp32: the same"
        other = torch.randn(100, 64, dtype=torch.bfloat16)  # another number of tokens: no size is fixed
        assert torch.equal(r.module(other), model(other))
    # the FLOPs: the grouped GEMMs do k/E of the dense products' work
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as dense:
        model(*inputs)
    experts = 2 * 2 * 256 * 64 * 128  # two layers, 256 tokens, 64 x 128 each
    assert dense.get_total_flops() >= experts * 8, "the reference runs every expert on every token"
    flops = rw.introduced(r, inputs)["analytic_flops"]
    assert experts * 2 <= flops < experts * 2 + 2 * 256 * 64 * 8 + 1, "its top 2 of 8, and the router"


class MoeVariant(torch.nn.Module):
    """Level-3 010's forward with one change (``case``) that the routed form would not compute."""

    def __init__(self, moe: Any, case: str) -> None:
        super().__init__()
        self.moe, self.case = moe, case
        if case == "one-expert":  # parameters of one expert (the router still scores 8)
            self.w1, self.b1 = torch.nn.Parameter(moe.w1[:1].clone()), torch.nn.Parameter(moe.b1[:1].clone())
            self.w2, self.b2 = torch.nn.Parameter(moe.w2[:1].clone()), torch.nn.Parameter(moe.b2[:1].clone())

    def forward(self, x: Any) -> Any:
        import torch.nn.functional as F

        m = self.moe
        logits = m.router(x).float()
        top_vals, top_idx = torch.topk(logits, 2, dim=-1)
        combine = torch.zeros_like(logits).scatter(-1, top_idx, torch.softmax(top_vals, dim=-1))
        if self.case == "dense-weights":  # every expert weighted: nothing to skip
            combine = torch.softmax(logits, dim=-1)
        if self.case == "not-topk":  # indices that may repeat an expert: the scatter writes it once
            combine = torch.zeros_like(logits).scatter(-1, top_idx % 2, torch.softmax(top_vals, dim=-1))
        if self.case == "fp32-bias":  # y and the einsum in fp32: the weights not rounded to bf16
            return torch.einsum("te,etd->td", combine, torch.matmul(F.gelu(torch.matmul(x.unsqueeze(0), m.w1) + m.b1),
                                                                    m.w2) + m.b2.float())
        if self.case == "one-expert":  # the routing's 8 experts, y's 1: einsum broadcasts it
            h1 = F.gelu(torch.matmul(x.unsqueeze(0), self.w1) + self.b1)
            return torch.einsum("te,etd->td", combine.to(x.dtype), torch.matmul(h1, self.w2) + self.b2)
        pre = torch.matmul(x.unsqueeze(0), m.w1) + m.b1
        h = pre if self.case == "no-activation" else F.gelu(pre)
        y = torch.matmul(h, m.w2) + m.b2
        out = torch.einsum("te,etd->td", combine.to(x.dtype), y)
        return out + y.sum(0) if self.case == "y-used-twice" else out


@pytest.mark.parametrize("case", ["fp32", "as-written", "dense-weights", "not-topk", "fp32-bias", "one-expert",
                                  "unaligned", "y-used-twice", "no-activation"])
def test_routing_fires_only_where_it_holds(case: str) -> None:
    moe, inputs = small_moe()
    model: Any = MoeVariant(moe, case)
    if case == "unaligned":  # 100 -> 200: rows the grouped GEMM cannot take (16-byte alignment)
        mod = load(MOE)
        model, inputs = MoeVariant(mod.Model(100, 200, 8, 2).eval(), "as-written"), [torch.randn(64, 100, dtype=torch.bfloat16)]
    if case == "fp32":
        model, inputs = MoeVariant(moe.float(), "as-written"), [inputs[0].float()]  # the grouped GEMM is bf16's
    r = rw.rewrite_model(model, inputs)
    assert r.skipped is None and rules_applied(r) == (["routed-experts"] if case == "as-written" else []), r.code


# --- random programs ---------------------------------------------------------------------------


def random_case(rng: Any) -> Tuple[Callable[..., Any], List[Any]]:
    """One random program around a rule's pattern, valid or not (shapes, dims, offsets, keepdim,
    bias shapes and broadcast batches drawn at random): the matchers must fire only where the
    value stays the same."""
    pick = lambda xs: xs[rng.randrange(len(xs))]  # noqa: E731
    n, k, m, b = (rng.randint(1, 4) for _ in range(4))
    t = lambda *s: torch.randn(*s, dtype=torch.float64)  # noqa: E731
    kind = pick(["diag", "diag-product", "linear", "triangle", "attention"])
    if kind == "attention":
        return random_attention(rng, t)
    if kind == "diag":
        batch = pick([(), (b,), (b, 1), (1, b)])
        v = t(*pick([(n,), (b, n), (1, n)]))
        x = t(*pick([(n,), (n, m), batch + (n, m), (m, n), batch + (m, n)]))
        offset, dims = pick([0, 0, 1, -1]), pick([(-2, -1), (-1, -2), (0, -1)])
        plain = v.dim() == 1 and pick([True, False])
        make = (lambda v: torch.diag(v, offset)) if plain else (lambda v: torch.diag_embed(v, offset, *dims))
        side = pick(["left", "right"])
        return (lambda v, x: make(v) @ x) if side == "left" else (lambda v, x: x @ make(v)), [v, x]
    if kind == "diag-product":
        batch_a, batch_b = pick([((), ()), ((b,), (b,)), ((b,), ()), ((1,), (b,))])
        a_, b_ = t(*batch_a, n, k), t(*batch_b, k, pick([n, m]))
        offset, dims = pick([0, 0, 1]), pick([(-2, -1), (0, 1), (-1, -2)])
        take = pick([lambda c: torch.diag(c, offset), lambda c: torch.diagonal(c, offset, *dims)])
        return (lambda a, bb: take(a @ bb)), [a_, b_]
    if kind == "linear":
        x = t(*pick([(k,), (n, k), (b, n, k)]))
        w = t(m, k)
        bias = pick([None, t(m), t(1), t(()), t(n, m)])
        op = pick(["sum", "mean"])
        dim, keep = pick([-1, 0, 1, 2, (-1,), (0, 1)]), pick([False, True])
        form = pick(["linear", "matmul", "matmul-add", "add-matmul"])
        with_bias = bias is not None and bias.dim() <= 1

        def f(x: Any, w: Any, c: Any) -> Any:
            if form == "linear":
                y = F.linear(x, w, c if with_bias else None)
            elif form == "matmul":
                y = x @ w.t()
            else:
                y = x @ w.t() + c if form == "matmul-add" else c + x @ w.t()
            return getattr(y, op)(dim, keepdim=keep)

        return f, [x, w, bias if bias is not None else t(m)]
    shape_p, shape_q = pick([((n, n), (n, n)), ((n, k), (k, m)), ((b, n, n), (n, n)), ((b, n, n), (b, n, n))])
    tri_p, tri_q, outer = pick(["tril", "triu"]), pick(["tril", "triu"]), pick(["tril", "triu", None])
    k1, k2, k0 = (rng.randint(-2, 2) for _ in range(3))

    def g(p: Any, q: Any) -> Any:
        c = getattr(torch, tri_p)(p, k1) @ getattr(torch, tri_q)(q, k2)
        return c if outer is None else getattr(torch, outer)(c, k0)

    return g, [t(*shape_p), t(*shape_q)]


def random_attention(rng: Any, t: Callable[..., Any]) -> Tuple[Callable[..., Any], List[Any]]:
    """A random softmax(q kᵀ …) v: batch dims of one or two, k and v maybe broadcast over the
    batch, the softmax over either of the last dims, k transposed over its last dims or not, a
    scale (product or quotient, maybe negative), a mask filled with -inf or a finite value,
    before or after the scale (every row keeps a key: a row of -inf only is NaN either way)."""
    pick = lambda xs: xs[rng.randrange(len(xs))]  # noqa: E731
    batch = pick([(2,), (2, 3)])
    s_, e = rng.randint(2, 5), rng.randint(1, 4)
    q, k, v = t(*batch, rng.randint(1, 5), e), t(*pick([batch, (1,) * len(batch)]), s_, e), t(*batch, s_, rng.randint(1, 4))
    drops = [torch.rand(s_) > 0.5 for _ in range(2)]
    for d in drops:
        d[0] = False  # key 0 always takes part
    dims, dim = pick([(-2, -1), (-1, -2), (0, -1)]), pick([-1, -1, -2])
    scale, where, fill = pick([None, ("mul", 0.4), ("div", 3.0), ("mul", -0.5)]), pick(["before", "after"]), \
        pick([float("-inf"), float("-inf"), -1e9])
    drop = pick([None, *drops]) if dim == -1 else None  # over the queries a masked key's column is all -inf
    if scale is not None and scale[1] < 0:
        where = "after"  # -inf times a negative scale is +inf: the original's rows would be NaN

    def scaled(x: Any) -> Any:
        if scale is None:
            return x
        return x * scale[1] if scale[0] == "mul" else x / scale[1]

    def masked(x: Any) -> Any:
        return x if drop is None else x.masked_fill(drop, fill)

    def f(q: Any, k: Any, v: Any) -> Any:
        x = torch.matmul(q, k.transpose(*dims))
        x = scaled(masked(x)) if where == "before" else masked(scaled(x))
        return torch.softmax(x, dim=dim) @ v

    return f, [q, k, v]


def test_random_programs_keep_their_values() -> None:
    rng = random.Random(18)
    fired: Set[str] = set()
    valid = 0
    for _ in range(400):
        fn, inputs = random_case(rng)
        model = Fn(fn)
        try:
            expected = model(*inputs)
        except (RuntimeError, IndexError):  # not a valid program for these shapes
            continue
        valid += 1
        r = rw.rewrite_model(model, inputs)
        assert r.skipped is None, r.skipped
        fired |= set(rules_applied(r))
        got = r.module(*inputs)
        assert got.shape == expected.shape, (r.code, got.shape, expected.shape)
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9, msg=lambda m: f"{m}\n{r.code}")
    # The programs are fp64, compared at 1e-9; routed-experts is bf16's (its grouped GEMM), tested above.
    assert valid > 150 and fired == {r.name for r in rw.RULES} - {"routed-experts"}, (valid, fired)


def test_rules_of_selects_by_class() -> None:
    assert [r.name for r in rw.rules_of(["exact"])] == ["diag-matmul", "redundant-triangle"]
    assert {r.exactness for r in rw.rules_of(["reassociates"])} == {"reassociates"}
    assert rw.rules_of(list(rw.EXACTNESS)) == rw.RULES
    for bad, why in ((["exact", "lossy"], "unknown exactness class 'lossy'"), ([], "no exactness class named")):
        with pytest.raises(ValueError, match=why):
            rw.rules_of(bad)


def test_introduced_names_what_the_rewrite_brings() -> None:
    """The aten ops and torch functions a rewrite adds (for the verify policy), and its FLOPs:
    diag-matmul adds mul (no FLOPs torch counts); the triangular product adds addmm and cat and
    does half the reference's GEMM FLOPs."""
    a, b = torch.randn(8), torch.randn(8, 8)
    diag = rw.rewrite_model(Fn(lambda a, b: torch.relu(torch.diag(a) @ b)), [a, b])
    assert rw.introduced(diag, [a, b]) == {"introduced_ops": ["mul", "unsqueeze"], "introduced_torch_calls": [],
                                           "analytic_flops": 0}
    n = 16
    p, q = torch.randn(n, n), torch.randn(n, n)
    tri = rw.rewrite_model(Fn(lambda p, q: torch.tril(p) @ torch.tril(q)), [p, q])
    got = rw.introduced(tri, [p, q])
    assert {"addmm", "cat"} <= set(got["introduced_ops"]) and "mm" not in got["introduced_ops"], got
    assert got["introduced_torch_calls"] == ["torch.addmm", "torch.cat"]
    assert got["analytic_flops"] == n ** 3  # 4 GEMMs of (n/2)^3 multiply-adds: half of the reference's 2 n^3
    with pytest.raises(ValueError, match="no rewritten module"):
        rw.introduced(rw.RewriteResult(None, None, skipped="did not trace"), [p, q])


def test_module_source_names_its_class_and_docstring(tmp_path: Path) -> None:
    problem = load_problem(str(CORPUS_DIAG), "default", "rewrite-test")
    result = rw.rewrite_problem(problem)
    assert result.changed and rw.code_key(result.code) == rw.candidate(result, CORPUS_DIAG.read_text())["key"]
    text = rw.module_source(result, CORPUS_DIAG.read_text(), "Rewritten", "the header")
    tree = ast.parse(text)
    assert ast.get_docstring(tree) == "the header"
    assert [c.name for c in tree.body if isinstance(c, ast.ClassDef)] == ["Rewritten"]


def test_a_type_as_cast_back_is_read_and_its_operand_kept() -> None:
    """``.type_as(q)`` as the cast back: read from the recorded dtypes; q (an operand, used by
    the product too) is not taken for a cast argument."""
    q, k, v = qkv(dtype=torch.bfloat16)
    model, r = rewrite(lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1)).float() * 0.3, -1).type_as(q) @ v,
                       q, k, v)
    assert rules_applied(r) == ["attention-sdpa"], r.code
    check_close(model, r, (q, k, v))


def test_a_tensor_made_of_plain_numbers_in_a_fixed_shape_trace_is_kept() -> None:
    """A forward that reads a size and makes a tensor from plain numbers (``torch.ones(s, s)``
    without a device): the meta tracer stores it as a constant of the traced twin; the rewritten
    module holds it and computes the same; its file cannot be written (a constant the model's
    ``__init__`` does not make), said, not a crash."""
    class Masked(nn.Module):
        def forward(self, q: Any, k: Any, v: Any) -> Any:
            s = q.shape[-2]
            drop = torch.triu(torch.ones(s, s), diagonal=1).bool()
            return torch.softmax((q @ k.transpose(-2, -1)).masked_fill(drop, float("-inf")), -1) @ v

    q, k, v = qkv()
    model = Masked()
    r = rw.rewrite_model(model, (q, k, v))
    assert r.skipped is None and r.shapes_fixed and rules_applied(r) == ["attention-sdpa"], r.skipped
    check_close(model, r, (q, k, v))
    with pytest.raises(ValueError, match="_tensor_constant"):
        rw.module_source(r, "import torch\nclass Model(torch.nn.Module):\n    pass\n")
