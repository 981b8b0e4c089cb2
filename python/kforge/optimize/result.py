"""The result file of a ``dispatch``, ``inductor`` or ``rewrite`` winner: a standalone
KernelBench-format ``ModelNew`` module (torch alone; no kforge import) and the verify policy it
needs.

The winner is the reference's own forward, eager or compiled in another mode: torch code by
design. So the module carries the problem's source with its ``Model`` renamed ``Reference``, and
``ModelNew`` derives from it (the same parameter names: ``load_state_dict`` of the reference's
weights works) and, for a compile mode, compiles its forward on the first call. The policy
beside it is ``torch_policy = "reference-ops"``, with gate 4's ``baseline_mode`` the baseline the
agent measured against: the candidate may compute with what the reference computes with; correctness, the exploit checks and the performance gate judge it as
any other candidate (``kforge verify PROBLEM model_new.py --policy policy.toml``).

A rewrite winner (``MODE~rewrite``) is the rewritten forward instead, as
:func:`kforge.optimize.rewrite.module_source` writes it (made again from the problem and checked
to be the measured one), with a header naming the rules and their exactness classes; its policy
adds exactly what the rewrite introduced (``allowed_aten_ops``, ``allowed_torch_ops``) and its own
FLOP count (``flops``).

A per-graph winner (``graphs:M0/M1/...``) is the reference as it is, with ``ModelNew``'s forward
compiled on the first call by the per-graph backend (``dispatch.ROUTED_BACKEND``, its text as
measured) for the plan, and the graph breaks named in the header; its policy is a dispatch
winner's.

``python3 -m kforge.optimize.result PROBLEM DISPATCH.json --out DIR`` writes ``DIR/model_new.py``
and ``DIR/policy.toml`` for the winner recorded in ``DISPATCH.json``
(``python3 -m kforge.optimize.dispatch``'s result).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import sys
import tokenize
from typing import Any, Dict, Optional, Sequence, Tuple

from ..harness import load_problem
from .dispatch import GRAPHS, KNOBS, MODES, REWRITE, ROUTED_BACKEND, DispatchError, graph_plan, variant_knobs, variant_options
from .rewrite import SHAPES_FIXED, RewriteResult, applied_rules, code_key, module_source, rewrite_problem, rules_of

#: Baselines a verify policy can name (gate 4 compiles its baseline; eager is no baseline there).
COMPILE_BASELINES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def policy_text(measured: Dict[str, Any]) -> str:
    """The verify policy of a dispatch result: ``reference-ops``, and gate 4 timed against the
    baseline the dispatch agent measured against (when it is a compile mode). For a rewrite
    winner (``MODE~rewrite``) also exactly what the rewrite introduced: the aten ops its forward
    dispatches that the reference's does not (``allowed_aten_ops``), the torch functions it calls
    that the reference does not (``allowed_torch_ops``), and its own FLOP count (``flops``: the
    plausibility check must not hold a shortcut to the reference's)."""
    text = 'torch_policy = "reference-ops"\n'
    baseline = measured.get("baseline")
    if baseline in COMPILE_BASELINES:
        text += f'baseline_mode = "{baseline}"\n'
    if str(measured.get("winner", "")).endswith(REWRITE):
        info = rewrite_info(measured)
        applied = ", ".join(f"{c['rule']} ({c['exactness']})" for c in info["rules"])
        text += (f"# the rewrite rules applied: {applied}\n"
                 f"allowed_aten_ops = {toml_list(info['introduced_ops'])}\n"
                 f"allowed_torch_ops = {toml_list(info['introduced_torch_calls'])}\n"
                 f"flops = {int(info['analytic_flops'])}\n")
    return text


def toml_list(names: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(str(n)) for n in names) + "]"


def rewrite_info(measured: Dict[str, Any]) -> Dict[str, Any]:
    """What the rewrite agent proposed, from the measurement; refused when it proposed nothing."""
    info = measured.get("rewrite")
    if not isinstance(info, dict) or not info.get("fired"):
        raise ResultError("the measurement's winner is a rewrite, but it records no rewrite that fired")
    for key in ("rules", "classes", "key", "introduced_ops", "introduced_torch_calls", "analytic_flops"):
        if key not in info:
            raise ResultError(f"the measurement's rewrite lacks {key!r}")
    return info


class ResultError(Exception):
    """The inputs cannot make a result (exit status 2)."""


def renamed_reference(problem_source: str, path: str) -> str:
    """The problem's source with its class ``Model`` (and every use of the name) renamed
    ``Reference``, its formatting and comments kept (:func:`renamed_in_place`; where that cannot
    be shown to be the same rename, the renamed tree unparsed); refused when the source does not
    parse or has no such class."""
    renamed_tree = renamed_ast(problem_source, path)
    in_place = renamed_in_place(problem_source)
    try:
        same = in_place is not None and ast.dump(ast.parse(in_place)) == ast.dump(renamed_tree)
    except SyntaxError:
        same = False
    return in_place.rstrip("\n") if same and in_place is not None else ast.unparse(renamed_tree)


def renamed_in_place(source: str) -> Optional[str]:
    """``source`` with every name token ``Model`` that is not an attribute (after a ``.``)
    replaced by ``Reference`` where it stands; ``None`` when the source does not tokenize."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return None
    skip = (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)
    code = [t for t in tokens if t.type not in skip]
    at = [t.start for i, t in enumerate(code) if t.type == tokenize.NAME and t.string == "Model"
          and not (i > 0 and code[i - 1].type == tokenize.OP and code[i - 1].string == ".")]
    lines = source.splitlines(keepends=True)
    for row, col in reversed(at):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + "Reference" + line[col + len("Model"):]
    return "".join(lines)


def renamed_ast(problem_source: str, path: str) -> ast.Module:
    """The problem's tree with ``Model`` renamed ``Reference`` (the rename's definition)."""
    try:
        tree = ast.parse(problem_source)
    except SyntaxError as e:
        raise ResultError(f"{path}: does not parse: {e}") from e
    if not any(isinstance(n, ast.ClassDef) and n.name == "Model" for n in tree.body):
        raise ResultError(f"{path}: no class Model")
    if any(isinstance(n, ast.Name) and n.id == "Reference" for n in ast.walk(tree)):
        raise ResultError(f"{path}: already uses the name Reference")

    class Rename(ast.NodeTransformer):
        def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
            if node.name == "Model":
                node.name = "Reference"
            self.generic_visit(node)
            return node

        def visit_Name(self, node: ast.Name) -> ast.Name:
            if node.id == "Model":
                node.id = "Reference"
            return node

    renamed: ast.Module = Rename().visit(tree)
    return renamed


def compiled_subclass(base: str, compile_args: str) -> str:
    """``class ModelNew(base)`` whose forward is ``base``'s compiled on the first call."""
    return f'''

class ModelNew({base}):
    """{base}'s forward, compiled on the first call (static shapes)."""

    def forward(self, *inputs):
        compiled = self.__dict__.get("_compiled_forward")
        if compiled is None:
            compiled = torch.compile(super().forward, {compile_args}, dynamic=False)
            self.__dict__["_compiled_forward"] = compiled
        return compiled(*inputs)
'''


def routed_subclass(plan: Sequence[str]) -> str:
    """``class ModelNew(Reference)`` whose forward is compiled on the first call with the
    per-graph backend (``kforge.optimize.dispatch.ROUTED_BACKEND``, its text as measured) for
    ``plan``."""
    return f'''

#: The mode of each graph Dynamo splits the forward into, in the order it compiles them.
PLAN = {list(plan)!r}
{ROUTED_BACKEND}

class ModelNew(Reference):
    """The reference's forward, each of its graphs dispatched as PLAN says (static shapes)."""

    def forward(self, *inputs):
        compiled = self.__dict__.get("_compiled_forward")
        if compiled is None:
            compiled = torch.compile(super().forward, backend=routed_backend(PLAN), dynamic=False)
            self.__dict__["_compiled_forward"] = compiled
        return compiled(*inputs)
'''


def graphs_source(problem_path: str, problem_source: str, variant: str, measured: Dict[str, Any]) -> str:
    """The standalone module of a per-graph winner ``graphs:M0/M1/...``: the reference as it is,
    its graphs dispatched per the plan (:func:`routed_subclass`), with the graph breaks the
    measurement found named in the header."""
    try:
        plan = graph_plan(variant)
    except DispatchError as e:
        raise ResultError(str(e)) from e
    assert plan is not None
    versions = measured.get("versions", {})
    speedup = measured.get("modes", {}).get(variant, {}).get("speedup")
    breaks = measured.get("graphs", {}).get("breaks", [])
    header = (f'"""kforge optimize result for {os.path.basename(problem_path)} (agent dispatch, per graph): the\n'
              f"reference's forward, of {len(plan)} graphs, each dispatched in its own mode: "
              f"{', '.join(f'graph {i} {m}' for i, m in enumerate(plan))}.\n"
              f"Baseline {measured.get('baseline')!r}; measured speedup "
              f"{'%.3fx' % speedup if isinstance(speedup, float) else 'none'}; "
              f"made with torch {versions.get('torch')}, Triton {versions.get('triton')}.\n"
              f'Torch code by design: verify with the policy beside this file (torch_policy = "reference-ops")."""\n')
    # Dynamo's reasons as comments, one line each: whatever they quote cannot break the file.
    notes = "".join(f"# Graph break {i + 1}: {' '.join(str(b).split())}\n" for i, b in enumerate(breaks))
    return (header + notes + "\nimport torch\n" + renamed_reference(problem_source, problem_path) + "\n"
            + routed_subclass(plan))


def rewritten(problem_path: str, measured: Dict[str, Any]) -> RewriteResult:
    """The measured rewrite made again from the problem (on the meta device, with the classes the
    agent used), checked to be the same forward as the one measured (its key)."""
    info = rewrite_info(measured)
    try:
        problem = load_problem(problem_path, str(measured.get("size", "default")), "result")
        result = rewrite_problem(problem, rules_of(info["classes"]))
    except ValueError as e:
        raise ResultError(str(e)) from e
    if not result.changed or code_key(result.code) != info["key"]:
        raise ResultError(f"{problem_path}: the rewrite made again is not the one measured "
                          f"({result.skipped or 'another forward'}): the problem changed since the measurement?")
    return result


def rewrite_source(problem_path: str, problem_source: str, variant: str, measured: Dict[str, Any]) -> str:
    """The standalone module of a rewrite winner ``MODE~rewrite``: the rewritten forward as
    :func:`kforge.optimize.rewrite.module_source` writes it, eager (the class is ``ModelNew``) or
    compiled in ``MODE`` (the class is ``Rewritten`` and ``ModelNew`` compiles its forward)."""
    mode = variant[:-len(REWRITE)]
    if mode not in MODES:
        raise ResultError(f"unknown mode {mode!r} in {variant!r} (one of: {', '.join(MODES)})")
    result = rewritten(problem_path, measured)
    versions = measured.get("versions", {})
    speedup = measured.get("modes", {}).get(variant, {}).get("speedup")
    how = "run eagerly" if mode == "eager" else f"compiled with torch.compile(mode={mode!r}, dynamic=False)"
    header = (f"kforge optimize result for {os.path.basename(problem_path)} (agent rewrite): the problem's forward\n"
              f"rewritten by the rules {applied_rules(result)}, weakest class {result.exactness},\n"
              f"{how}. Baseline {measured.get('baseline')!r}; measured speedup "
              f"{'%.3fx' % speedup if isinstance(speedup, float) else 'none'}; "
              f"made with torch {versions.get('torch')}, Triton {versions.get('triton')}.\n"
              "Torch code by design: verify with the policy beside this file (reference-ops plus exactly the\n"
              "ops the rewrite introduced)." + (f"\n{SHAPES_FIXED}" if result.shapes_fixed else ""))
    if mode == "eager":
        return module_source(result, problem_source, "ModelNew", header)
    return module_source(result, problem_source, "Rewritten", header) + compiled_subclass("Rewritten", f"mode={mode!r}")


def model_new_source(problem_path: str, problem_source: str, mode: str, measured: Dict[str, Any]) -> str:
    """The standalone module for the winner ``mode``: eager (the reference as it is), a compile
    mode, ``MODE+KNOB`` (compiled with the mode's Inductor options and the knob's setting), or
    ``MODE~rewrite`` (the rewritten forward, :func:`rewrite_source`)."""
    if mode.endswith(REWRITE):
        return rewrite_source(problem_path, problem_source, mode, measured)
    if mode.startswith(GRAPHS):
        return graphs_source(problem_path, problem_source, mode, measured)
    base, knobs = variant_knobs(mode)
    knob = "+".join(knobs)
    if base not in MODES or (knobs and (any(k not in KNOBS for k in knobs) or base == "eager")):
        raise ResultError(f"unknown mode {mode!r} (one of: {', '.join(MODES)}, or MODE+KNOB[+KNOB...] with knobs of: {', '.join(KNOBS)})")
    options = variant_options(mode)[1]
    versions = measured.get("versions", {})
    speedup = measured.get("modes", {}).get(mode, {}).get("speedup")
    how = ("eagerly, as the reference" if mode == "eager" else f"compiled with torch.compile(mode={mode!r}, dynamic=False)"
           if options is None else f"compiled with torch.compile(options={options!r}, dynamic=False): {base} with {knob}")
    header = (f'"""kforge optimize result for {os.path.basename(problem_path)} (agent dispatch): the reference\'s forward,\n'
              f"{how}. Baseline {measured.get('baseline')!r}; measured speedup "
              f"{'%.3fx' % speedup if isinstance(speedup, float) else 'none (the baseline kept)'}; "
              f"made with torch {versions.get('torch')}, Triton {versions.get('triton')}.\n"
              f'Torch code by design: verify with the policy beside this file (torch_policy = "reference-ops")."""\n\n')
    body = renamed_reference(problem_source, problem_path)
    if mode == "eager":
        tail = '''

class ModelNew(Reference):
    """The reference's forward, dispatched eagerly."""
'''
    else:
        tail = compiled_subclass("Reference", f"mode={mode!r}" if options is None else f"options={options!r}")
    return header + "import torch\n" + body + "\n" + tail


def write_result(problem_path: str, measured: Dict[str, Any], out_dir: str) -> Tuple[str, str]:
    """``out_dir/model_new.py`` and ``out_dir/policy.toml`` for the winner in ``measured``."""
    try:
        with open(problem_path) as f:
            source = f.read()
    except OSError as e:
        raise ResultError(f"{problem_path}: {e.strerror}") from e
    winner = measured.get("winner")
    if not isinstance(winner, str):
        raise ResultError("the dispatch result names no winner")
    return write_files(out_dir, model_new_source(problem_path, source, winner, measured), policy_text(measured))


#: The dispatch result of "eager" against default mode, with nothing measured: the reference's own
#: forward as a candidate (suite runs verify every problem with it: ``--eager``).
EAGER = {"winner": "eager", "baseline": "default", "modes": {}}


def write_files(out_dir: str, model_source: str, policy: str) -> Tuple[str, str]:
    """A result's two files, ``out_dir/model_new.py`` and ``out_dir/policy.toml`` (every agent's
    result is written here)."""
    os.makedirs(out_dir, exist_ok=True)
    model_path, policy_path = os.path.join(out_dir, "model_new.py"), os.path.join(out_dir, "policy.toml")
    with open(model_path, "w") as f:
        f.write(model_source)
    with open(policy_path, "w") as f:
        f.write(policy)
    return model_path, policy_path


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kforge.optimize.result")
    ap.add_argument("problem")
    ap.add_argument("measured", nargs="?", help="the JSON python3 -m kforge.optimize.dispatch wrote")
    ap.add_argument("--eager", action="store_true",
                    help="instead of a measurement: the reference's own eager forward, verified against default mode")
    ap.add_argument("--out", required=True, help="directory for model_new.py and policy.toml")
    a = ap.parse_args(argv)
    try:
        if a.eager == (a.measured is not None):
            raise ResultError("name a dispatch result or --eager (one of them)")
        measured: Dict[str, Any] = dict(EAGER)
        if a.measured is not None:
            try:
                with open(a.measured) as f:
                    measured = json.load(f)
            except (OSError, ValueError) as e:
                raise ResultError(f"{a.measured}: not a readable dispatch result ({e})") from e
        for p in write_result(a.problem, measured, a.out):
            print(p)
    except ResultError as e:
        print(f"kforge optimize: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
