"""The result file of a ``dispatch`` winner: a standalone KernelBench-format ``ModelNew`` module
(torch alone; no kforge import) and the verify policy it needs.

The winner is the reference's own forward, eager or compiled in another mode: torch code by
design. So the module carries the problem's source with its ``Model`` renamed ``Reference``, and
``ModelNew`` derives from it (the same parameter names: ``load_state_dict`` of the reference's
weights works) and, for a compile mode, compiles its forward on the first call. The policy
beside it is ``torch_policy = "reference-ops"``, with gate 4's ``baseline_mode`` the baseline the
agent measured against: the candidate may compute with what the reference computes with; correctness, the exploit checks and the performance gate judge it as
any other candidate (``kforge verify PROBLEM model_new.py --policy policy.toml``).

``python3 -m kforge.optimize.result PROBLEM DISPATCH.json --out DIR`` writes ``DIR/model_new.py``
and ``DIR/policy.toml`` for the winner recorded in ``DISPATCH.json``
(``python3 -m kforge.optimize.dispatch``'s result).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from typing import Any, Dict, Optional, Sequence, Tuple

from .dispatch import KNOBS, MODES, variant_options

#: Baselines a verify policy can name (gate 4 compiles its baseline; eager is no baseline there).
COMPILE_BASELINES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def policy_text(measured: Dict[str, Any]) -> str:
    """The verify policy of a dispatch result: ``reference-ops``, and gate 4 timed against the
    baseline the dispatch agent measured against (when it is a compile mode)."""
    text = 'torch_policy = "reference-ops"\n'
    baseline = measured.get("baseline")
    if baseline in COMPILE_BASELINES:
        text += f'baseline_mode = "{baseline}"\n'
    return text


class ResultError(Exception):
    """The inputs cannot make a result (exit status 2)."""


def renamed_reference(problem_source: str, path: str) -> str:
    """The problem's source with its class ``Model`` (and every use of the name) renamed
    ``Reference``; refused when the source does not parse or has no such class."""
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

    return ast.unparse(Rename().visit(tree))


def model_new_source(problem_path: str, problem_source: str, mode: str, measured: Dict[str, Any]) -> str:
    """The standalone module for the winner ``mode``: eager (the reference as it is), a compile
    mode, or ``MODE+KNOB`` (compiled with the mode's Inductor options and the knob's setting)."""
    base, _, knob = mode.partition("+")
    if base not in MODES or (knob and (knob not in KNOBS or base == "eager")):
        raise ResultError(f"unknown mode {mode!r} (one of: {', '.join(MODES)}, or MODE+KNOB with a knob of: {', '.join(KNOBS)})")
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
        compile_args = f"mode={mode!r}" if options is None else f"options={options!r}"
        tail = f'''

class ModelNew(Reference):
    """The reference's forward, compiled on the first call (static shapes)."""

    def forward(self, *inputs):
        compiled = self.__dict__.get("_compiled_forward")
        if compiled is None:
            compiled = torch.compile(super().forward, {compile_args}, dynamic=False)
            self.__dict__["_compiled_forward"] = compiled
        return compiled(*inputs)
'''
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
    os.makedirs(out_dir, exist_ok=True)
    model_path, policy_path = os.path.join(out_dir, "model_new.py"), os.path.join(out_dir, "policy.toml")
    with open(model_path, "w") as f:
        f.write(model_new_source(problem_path, source, winner, measured))
    with open(policy_path, "w") as f:
        f.write(policy_text(measured))
    return model_path, policy_path


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kforge.optimize.result")
    ap.add_argument("problem")
    ap.add_argument("measured", help="the JSON python3 -m kforge.optimize.dispatch wrote")
    ap.add_argument("--out", required=True, help="directory for model_new.py and policy.toml")
    a = ap.parse_args(argv)
    try:
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
