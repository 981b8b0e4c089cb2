"""What an Inductor kernel's source says about it: its heuristic (``@triton_heuristics.KIND``),
size hints, block parameters, the extents its body fixes and its runtime parameters. Read by the
config agent (``kforge.optimize.config``: the configuration space) and the roofline
(:mod:`.roofline`: the kernel's least traffic). No torch import."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple


class KernelSourceError(ValueError):
    """The source is not an Inductor kernel's: it does not parse, has no function of the name, or
    no ``@triton_heuristics`` decorator."""


@dataclass(frozen=True)
class KernelSpec:
    """What a kernel's source says about its configurations: the heuristic (``kind``), the size
    hints, the block sizes a configuration sets (``blocks``: constexpr parameters of the function,
    in the torch 2.11 spelling ``R0_BLOCK`` or the older ``RBLOCK``), the exact extents the body
    fixes (``xnumel = 8192``: static shapes), and a template's own warps and stages."""

    name: str
    kind: str
    size_hints: Optional[Dict[str, int]]
    blocks: Tuple[str, ...]
    numels: Dict[str, int]
    template_warps: Optional[int] = None
    template_stages: Optional[int] = None


def _decorator_call(fn: ast.FunctionDef) -> Optional[ast.Call]:
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and isinstance(d.func.value, ast.Name) \
                and d.func.value.id == "triton_heuristics":
            return d
    return None


def _keyword(call: ast.Call, name: str) -> Optional[ast.expr]:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _kernel_function(source: str, name: str) -> ast.FunctionDef:
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise KernelSourceError(f"kernel {name}: its source does not parse: {e}") from e
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise KernelSourceError(f"kernel {name}: no function of that name in its source")


def kernel_spec(name: str, source: str) -> KernelSpec:
    """The configuration-relevant facts of an Inductor kernel source (``KernelSourceError`` when the
    source is not one: no such function, no ``@triton_heuristics.*`` decorator)."""
    fn = _kernel_function(source, name)
    call = _decorator_call(fn)
    if call is None or not isinstance(call.func, ast.Attribute):
        raise KernelSourceError(f"kernel {name}: no @triton_heuristics decorator")
    kind = call.func.attr
    hints_node = _keyword(call, "size_hints")
    hints: Optional[Dict[str, int]] = None
    if hints_node is not None:
        value = ast.literal_eval(hints_node)
        if isinstance(value, dict):
            hints = {str(k): int(v) for k, v in value.items()}
    params = [a.arg for a in fn.args.args if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)]
    blocks = tuple(p for p in params if p.endswith("BLOCK"))
    numels: Dict[str, int] = {}
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and stmt.targets[0].id.endswith("numel") and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, int):
            numels[stmt.targets[0].id[: -len("numel")]] = stmt.value.value
    warps = _keyword(call, "num_warps")
    stages = _keyword(call, "num_stages")
    return KernelSpec(name, kind, hints, blocks, numels,
                      ast.literal_eval(warps) if warps is not None else None,
                      ast.literal_eval(stages) if stages is not None else None)


def kernel_arg_names(name: str, source: str) -> List[str]:
    """A kernel's runtime parameters in order (its ``tl.constexpr`` blocks left out): what the
    wrapper's ``kernel.run(...)`` passes positionally."""
    fn = _kernel_function(source, name)
    return [a.arg for a in fn.args.args if a.annotation is None or "constexpr" not in ast.unparse(a.annotation)]


def kernel_body(name: str, source: str) -> str:
    """The text of a kernel function's body (its signature and decorators left out)."""
    fn = _kernel_function(source, name)
    lines = source.splitlines()
    return "\n".join(lines[fn.body[0].lineno - 1: fn.end_lineno])
