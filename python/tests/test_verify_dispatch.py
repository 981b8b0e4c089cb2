"""The dispatch record (kforge.verify.dispatch) on the CPU: vendor calls of allowed families,
plumbing, compute however it is spelled, and ops that Triton's own code dispatches."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from kforge.harness import Check  # noqa: E402
from kforge.verify import dispatch  # noqa: E402

GEMM = {"torch_policy": "dispatch-aware", "reference_vendor_calls": [{"family": "gemm", "call": "torch.nn.Linear", "line": 3}]}


def run(policy: Dict[str, Any], fn: Any, *args: Any) -> Dict[str, Any]:
    dispatch.prepare()
    rec = dispatch.DispatchRecord(policy)
    with torch.no_grad():
        with rec:
            fn(*args)
    ck = Check()
    rec.check(ck)
    items: List[Dict[str, Any]] = ck.items
    assert [(c["gate"], c["name"]) for c in items] == [("dispatch", "torch-compute")]
    return {"ok": items[0]["ok"], **items[0]["evidence"]}


def test_allowed_gemm_and_plumbing_pass_and_are_recorded() -> None:
    x, w = torch.randn(4, 8), torch.randn(3, 8)

    def forward(x: Any, w: Any) -> Any:
        y = F.linear(x, w)  # aten::t + aten::mm inside the vendor call
        z = x.view(2, 16).view(4, 8) @ w.t()  # views are plumbing; @ is a GEMM
        out = torch.empty_like(y)
        return out, z

    c = run(GEMM, forward, x, w)
    assert c["ok"] is True, c
    assert c["vendor_calls"]["torch._C._nn.linear"] == 1
    assert c["vendor_ops"]["mm"] >= 2 and c["plumbing_ops"]["empty_like"] == 1
    assert c["allowed_families"] == ["gemm"]


def test_compute_is_found_however_spelled_with_its_site() -> None:
    x = torch.randn(16)
    hidden = torch.nn.Module.__init__.__globals__["torch"]

    def forward(x: Any) -> Any:
        a = x + 1.0  # a Python operator
        b = getattr(torch, "re" + "lu")(a)  # a name built at run time
        return hidden.sigmoid(b)  # an object the static gate cannot see

    c = run(GEMM, forward, x)
    assert c["ok"] is False
    assert set(c["compute_ops"]) == {"add", "relu", "sigmoid"}
    assert all(__file__ in s[0] for s in c["compute_sites"].values()), c["compute_sites"]
    assert "aten::add x1" in c["note"]


def test_strict_no_torch_allows_no_vendor_call() -> None:
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    strict = dict(GEMM, torch_policy="strict-no-torch")
    c = run(strict, F.linear, x, w)
    assert c["ok"] is False and "mm" in c["compute_ops"]
    # allowed_torch_ops names a function that may compute, also at run time.
    c = run(dict(strict, allowed_torch_ops=["torch.nn.functional.linear"]), F.linear, x, w)
    assert c["ok"] is True, c


def test_allowed_aten_ops_allow_the_ops_they_name_however_spelled() -> None:
    """What a rewrite result's policy names (the aten ops the rewrite introduced): those ops
    pass, however the forward spells them; any other computing op is still torch compute."""
    a, b = torch.randn(8), torch.randn(8, 8)
    policy = dict(GEMM, allowed_aten_ops=["mul"])
    for spelled in (lambda a, b: a.unsqueeze(-1) * b, lambda a, b: torch.mul(a.unsqueeze(-1), b),
                    lambda a, b: a.unsqueeze(-1).mul(b)):
        c = run(policy, spelled, a, b)
        assert c["ok"] is True and c["policy_allowed_ops"] == {"mul": 1}, c
    c = run(policy, lambda a, b: torch.addcmul(torch.zeros_like(b), a.unsqueeze(-1), b), a, b)
    assert c["ok"] is False and set(c["compute_ops"]) == {"addcmul"}, c


def test_ops_from_triton_code_are_not_the_candidates(monkeypatch: Any) -> None:
    # Stand-in for Triton's interpreter copying arguments: a frame in Triton's package.
    rec = dispatch.DispatchRecord(GEMM)
    monkeypatch.setattr(rec, "triton_dir", __file__)
    x = torch.randn(8)
    with rec:
        x.exp()
    ck = Check()
    rec.check(ck)
    assert ck.items[0]["ok"] is True and ck.items[0]["evidence"]["triton_ops"] == {"exp": 1}


def test_layout_copies_are_allowed_unless_copies_are_the_references_work() -> None:
    w = torch.randn(8, 3)

    def forward(w: Any) -> Any:
        return w.t().contiguous(), w.clone()  # a transposed weight made contiguous, a copy

    def learned(reference: Any) -> Any:
        dispatch.prepare()
        rec = dispatch.DispatchRecord(GEMM)
        with torch.no_grad():
            with rec.of_reference():
                reference(w)
            with rec:
                forward(w)
        ck = Check()
        rec.check(ck)
        return {"ok": ck.items[0]["ok"], **ck.items[0]["evidence"]}

    c = learned(lambda w: torch.relu(w @ w.t()))  # the reference computes: copies are layout
    assert c["ok"] is True and c["layout_ops"] == {"clone": 2} and c["layout_copies_allowed"] is True, c
    assert c["forward_calls"] == 1 and "relu" in c["reference_ops"]
    c = learned(lambda w: w.t().contiguous())  # a transpose problem: the copy is the work
    assert c["ok"] is False and c["compute_ops"] == {"clone": 2}, c
    # A copy that casts is compute whatever the reference does.
    c = learned(lambda w: torch.relu(w))
    c2 = run(GEMM, lambda w: w.half(), w)
    assert c["ok"] is True and c2["ok"] is False and "_to_copy" in c2["compute_ops"]


def test_reference_ops_allows_the_ops_the_reference_dispatched_and_no_other() -> None:
    """Under ``reference-ops`` (a dispatch result: the reference's forward itself) the ops the
    reference's forward dispatched are allowed; any other op stays compute."""
    x = torch.randn(4, 8)

    def judged(forward: Any, policy: str = "reference-ops") -> Dict[str, Any]:
        dispatch.prepare()
        rec = dispatch.DispatchRecord({"torch_policy": policy})
        with torch.no_grad():
            with rec.of_reference():
                torch.softmax(x, dim=-1).sum(-1)
            with rec:
                forward(x)
        ck = Check()
        rec.check(ck)
        return {"ok": ck.items[0]["ok"], **ck.items[0]["evidence"]}

    c = judged(lambda x: torch.softmax(x, dim=-1).sum(-1))
    assert c["ok"] is True and set(c["reference_allowed_ops"]) >= {"_softmax", "sum"} and c["compute_ops"] == {}, c
    assert c["torch_policy"] == "reference-ops"
    c = judged(lambda x: torch.relu(torch.softmax(x, dim=-1)))
    assert c["ok"] is False and c["compute_ops"] == {"relu": 1}, c
    # The same forward under the default policy: all of it is torch compute.
    c = judged(lambda x: torch.softmax(x, dim=-1).sum(-1), policy="dispatch-aware")
    assert c["ok"] is False and set(c["compute_ops"]) >= {"_softmax", "sum"}, c


def test_a_replacement_kernel_is_not_applicable() -> None:
    rec = dispatch.DispatchRecord(GEMM, applies=False)
    with rec:
        torch.randn(4).exp()
    ck = Check()
    rec.check(ck)
    assert ck.items[0]["ok"] is None
