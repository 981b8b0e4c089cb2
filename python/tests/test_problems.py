"""The problem suite under problems/: static checks (no torch needed) and, where torch is
importable, a build of every Model plus one CUDA forward when a GPU is present."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from typing import Dict, List

import pytest

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
MINIMUMS = {"level1": 16, "level2": 14, "level3": 10}
NAME_RE = re.compile(r"^(\d{3})_([a-z0-9]+(?:_[a-z0-9]+)*)\.py$")
CONST_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _level_files() -> Dict[str, List[Path]]:
    levels = sorted(p for p in PROBLEMS.glob("level*") if p.is_dir())
    return {lvl.name: sorted(lvl.glob("*.py")) for lvl in levels}


ALL_FILES = [f for files in _level_files().values() for f in files]
IDS = [f"{f.parent.name}/{f.name}" for f in ALL_FILES]


def _is_nn_module(base: ast.expr) -> bool:
    if isinstance(base, ast.Attribute) and base.attr == "Module":
        v = base.value
        if isinstance(v, ast.Name) and v.id == "nn":
            return True
        if (isinstance(v, ast.Attribute) and v.attr == "nn" and isinstance(v.value, ast.Name)
                and v.value.id == "torch"):
            return True
    return False


def test_levels_meet_minimums() -> None:
    files = _level_files()
    for level, minimum in MINIMUMS.items():
        assert level in files, f"missing problems/{level}"
        assert len(files[level]) >= minimum, f"{level}: {len(files[level])} < {minimum}"


@pytest.mark.parametrize("level", sorted(MINIMUMS))
def test_names_unique_and_contiguous(level: str) -> None:
    files = _level_files().get(level, [])
    numbers, stems = [], []
    for f in files:
        m = NAME_RE.match(f.name)
        assert m, f"{level}/{f.name} is not named NNN_short_name.py"
        numbers.append(int(m.group(1)))
        stems.append(m.group(2))
    assert len(set(numbers)) == len(numbers), f"{level}: duplicate numbers"
    assert len(set(stems)) == len(stems), f"{level}: duplicate short names"
    assert sorted(numbers) == list(range(1, len(files) + 1)), f"{level}: not numbered 001..N"


def test_readme_lists_every_problem() -> None:
    readme = (PROBLEMS / "README.md").read_text()
    missing = [i for i in IDS if i not in readme]
    assert not missing, f"not in problems/README.md: {missing}"


@pytest.mark.parametrize("path", ALL_FILES, ids=IDS)
def test_problem_file_structure(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    doc = ast.get_docstring(tree)
    assert doc and doc.strip(), "missing module docstring"

    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    assert "Model" in classes, "no top-level class Model"
    model = classes["Model"]
    assert any(_is_nn_module(b) for b in model.bases), "Model must subclass nn.Module"
    methods = {n.name for n in model.body if isinstance(n, ast.FunctionDef)}
    assert {"__init__", "forward"} <= methods, f"Model lacks {({'__init__', 'forward'} - methods)}"

    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"get_inputs", "get_init_inputs"} <= funcs, "missing get_inputs / get_init_inputs"

    consts = [
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Constant)
        and type(n.value.value) is int
        for t in n.targets
        if isinstance(t, ast.Name) and CONST_RE.match(t.id)
    ]
    assert consts, "no module-level UPPER_CASE integer size constant"


def _outputs(out) -> list:
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _outputs(o)]
    return [out]


@pytest.mark.parametrize("path", ALL_FILES, ids=IDS)
def test_problem_runs(path: Path) -> None:
    torch = pytest.importorskip("torch")
    name = f"kforge_problem_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    torch.manual_seed(0)
    if not torch.cuda.is_available():
        model = module.Model(*module.get_init_inputs())
        assert isinstance(model, torch.nn.Module)
        pytest.skip("no CUDA device: built the model, skipped the forward")

    try:
        with torch.device("cuda"):
            model = module.Model(*module.get_init_inputs())
            inputs = module.get_inputs()
        model = model.cuda()
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in inputs]
        with torch.no_grad():
            out = model(*inputs)
        torch.cuda.synchronize()
        tensors = _outputs(out)
        assert tensors, "forward returned nothing"
        for t in tensors:
            assert isinstance(t, torch.Tensor)
            assert t.is_cuda, "output left the GPU"
            assert bool(torch.isfinite(t.float()).all()), "non-finite output"
    finally:
        model = inputs = out = None  # noqa: F841 - release GPU memory before the next problem
        torch.cuda.empty_cache()


# --- size presets (problems/README.md "Size presets") ---------------------------------------

GIB = 1 << 30
LARGE_INPUT_BYTES = 8 * GIB  # inputs + parameters of one problem at the large preset
LARGE_FORWARD_BYTES = 40 * GIB  # inputs + parameters + every intermediate: 3 jobs fit on a 140 GB GPU
MAX_NUMEL = 1 << 31  # every input, parameter and output keeps int32 element offsets valid


def _int_constants(tree: ast.Module) -> Dict[str, int]:
    return {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and type(n.value.value) is int
        for t in n.targets
        if isinstance(t, ast.Name) and CONST_RE.match(t.id)
    }


@pytest.mark.parametrize("path", ALL_FILES, ids=IDS)
def test_size_constants_are_literals(path: Path) -> None:
    """The rule that makes a preset complete: every module-level UPPER_CASE constant is a literal
    (a size derived from another is computed inside a function), so setting a preset's keys
    changes everything that depends on them."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for n in tree.body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Name) and CONST_RE.match(t.id) and t.id != "LARGE":
                assert isinstance(n.value, ast.Constant), (
                    f"{path.name}: {t.id} is computed at import time (line {n.lineno}); "
                    "compute derived sizes inside the functions so a size preset reaches them")


@pytest.mark.parametrize("path", ALL_FILES, ids=IDS)
def test_large_preset_names_constants(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    consts = _int_constants(tree)
    large = [n for n in tree.body if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "LARGE" for t in n.targets)]
    assert len(large) == 1, "no (or more than one) module-level LARGE dict"
    preset = ast.literal_eval(large[0].value)
    assert isinstance(preset, dict) and preset, "LARGE must be a non-empty dict literal"
    for key, value in preset.items():
        assert key in consts, f"LARGE key {key!r} is not an UPPER_CASE integer constant"
        assert type(value) is int and value > 0, f"LARGE[{key!r}] = {value!r}"
        assert value != consts[key], f"LARGE[{key!r}] repeats the default {value}"
    assert "# large: " in path.read_text() and " est." in path.read_text(), "no '# large: ..., ~X ms est.' comment"


def _load(path: Path, size: str):
    from kforge.harness import apply_size

    spec = importlib.util.spec_from_file_location(f"kforge_problem_{size}_{path.parent.name}_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    apply_size(module, size, str(path))
    return module


# Meta-device forwards of some problems (and a TorchDispatchMode's first use) import Triton, so
# they run in one child process: this process's later Triton tests still choose the interpreter.
META_SCRIPT = r"""
import importlib.util, json, sys, traceback
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from kforge.harness import apply_size

def nbytes(ts):
    return sum(t.numel() * t.element_size() for t in ts)

class Allocated(TorchDispatchMode):
    total = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        self.total += nbytes([t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)])
        return result

def build(path, size):
    spec = importlib.util.spec_from_file_location("kforge_problem_meta_" + size, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    apply_size(module, size, path)
    with torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
        inputs = module.get_inputs()
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)] + list(model.parameters()) + list(model.buffers())
    return model, inputs, tensors

report = {}
for ident, path in json.loads(sys.argv[1]):
    try:
        _, _, small = build(path, "default")
        model, inputs, large = build(path, "large")
        counted = Allocated()
        with torch.no_grad(), counted:
            out = model(*inputs)
        outs = [t for t in tree_flatten(out)[0]]
        report[ident] = {
            "default_bytes": nbytes(small), "large_bytes": nbytes(large), "allocated": counted.total,
            "outputs_meta": bool(outs) and all(isinstance(t, torch.Tensor) and t.is_meta for t in outs),
            "largest": max([list(t.shape) for t in large + [t for t in outs if isinstance(t, torch.Tensor)]],
                           key=lambda s: torch.Size(s).numel()),
        }
    except Exception:
        report[ident] = {"error": traceback.format_exc()}
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def meta_report() -> Dict[str, Dict[str, object]]:
    """Per problem, both presets built on the meta device (no memory) and one large forward:
    input + parameter bytes at each preset, the bytes of every op's output summed (never freed:
    an upper bound of the forward's intermediates and output), the largest tensor's shape."""
    pytest.importorskip("torch")
    import json
    import subprocess
    import sys

    arg = json.dumps([[i, str(f)] for i, f in zip(IDS, ALL_FILES)])
    done = subprocess.run([sys.executable, "-c", META_SCRIPT, arg], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("path", ALL_FILES, ids=IDS)
def test_large_preset_on_meta(path: Path, meta_report: Dict[str, Dict[str, object]]) -> None:
    """The large preset is strictly bigger than the default, keeps inputs + parameters within
    8 GiB, every input, parameter and output under 2^31 elements and inputs + parameters + all
    intermediates within 40 GiB, and its forward runs on the meta device with consistent shapes."""
    r = meta_report[IDS[ALL_FILES.index(path)]]
    assert "error" not in r, r.get("error")
    large, small, allocated = int(r["large_bytes"]), int(r["default_bytes"]), int(r["allocated"])  # type: ignore[call-overload]
    assert large > small, "the large preset is not bigger than the default"
    assert large <= LARGE_INPUT_BYTES, f"large inputs + parameters {large / GIB:.2f} GiB > 8 GiB"
    assert large + allocated <= LARGE_FORWARD_BYTES, f"one large forward may hold {(large + allocated) / GIB:.1f} GiB > 40 GiB"
    assert r["outputs_meta"], "the forward returned no tensor, or one off the meta device"
    numel = 1
    for d in r["largest"]:  # type: ignore[attr-defined]
        numel *= int(d)
    assert numel < MAX_NUMEL, f"a tensor of shape {r['largest']} has 2^31 or more elements"


def test_apply_size_errors(tmp_path: Path) -> None:
    from kforge.harness import apply_size

    path = ALL_FILES[0]
    module = _load(path, "default")
    before = {k: getattr(module, k) for k in module.LARGE}
    with pytest.raises(ValueError, match="unknown size 'huge'"):
        apply_size(module, "huge", str(path))
    apply_size(module, "default", str(path))
    assert {k: getattr(module, k) for k in module.LARGE} == before
    apply_size(module, "large", str(path))
    assert {k: getattr(module, k) for k in module.LARGE} == module.LARGE

    bad = tmp_path / "bad.py"
    bad.write_text("N = 4\nLARGE = {'M': 8}\n")
    spec = importlib.util.spec_from_file_location("kforge_bad_problem", bad)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(ValueError, match=r"bad\.py: LARGE key 'M' is not an UPPER_CASE integer constant"):
        apply_size(mod, "large", str(bad))
    mod.LARGE = {"N": 8.5}
    with pytest.raises(ValueError, match=r"bad\.py: LARGE\['N'\] = 8.5 is not an integer"):
        apply_size(mod, "large", str(bad))
    del mod.LARGE
    with pytest.raises(ValueError, match=r"bad\.py: no LARGE dict"):
        apply_size(mod, "large", str(bad))
