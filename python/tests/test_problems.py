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


def _meta_build(path: Path, size: str):
    torch = pytest.importorskip("torch")
    module = _load(path, size)
    with torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
        inputs = module.get_inputs()
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    tensors += list(model.parameters()) + list(model.buffers())
    return model, inputs, tensors


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("path", ALL_FILES, ids=IDS)
def test_large_preset_on_meta(path: Path) -> None:
    """Both presets build on the meta device (no memory); the large one is strictly bigger, keeps
    inputs + parameters within 8 GiB, every tensor under 2^31 elements and inputs + parameters +
    all intermediates (summed, never freed: an upper bound) within 40 GiB, and its forward runs
    with consistent shapes."""
    torch = pytest.importorskip("torch")
    _, _, small = _meta_build(path, "default")
    model, inputs, large = _meta_build(path, "large")
    assert _nbytes(large) > _nbytes(small), "the large preset is not bigger than the default"
    assert _nbytes(large) <= LARGE_INPUT_BYTES, f"large inputs + parameters {_nbytes(large) / GIB:.2f} GiB > 8 GiB"
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Allocated(TorchDispatchMode):
        """Sums the bytes of every op's outputs: an upper bound of the forward's intermediates."""

        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            result = func(*args, **(kwargs or {}))
            self.total += _nbytes([t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)])
            return result

    counted = Allocated()
    with torch.no_grad(), counted:
        out = model(*inputs)
    footprint = _nbytes(large) + counted.total
    assert footprint <= LARGE_FORWARD_BYTES, f"one large forward may hold {footprint / GIB:.1f} GiB > 40 GiB"
    outs = _outputs(out)
    assert outs and all(isinstance(t, torch.Tensor) and t.is_meta for t in outs)
    for t in large + outs:
        assert t.numel() < MAX_NUMEL, f"a tensor of shape {tuple(t.shape)} has 2^31 or more elements"


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
