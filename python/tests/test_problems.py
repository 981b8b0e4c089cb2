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
