"""The layering of the kforge package, read from its source with ``ast`` (nothing is imported):
no import circles, a bottom module that imports nothing from kforge, a public client that does
not reach into the verify and inspect internals, no underscore names shared across modules, no
imports hidden in functions but the optional heavy ones, and entry points that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

PACKAGE = Path(__file__).resolve().parents[1] / "kforge"
REPO = PACKAGE.parents[1]

#: The bottom module: what verify and inspect share.
BOTTOM = "kforge.harness"
#: The public client: what a benchmark imports.
CLIENT = {"kforge", "kforge.client", "kforge.region", "kforge.bench", "kforge.errors", "kforge.autoregions"}
#: Internals the public client must not import.
INTERNALS = ("kforge.verify", "kforge.inspect", "kforge.optimize", "kforge.harness", "kforge.worker")
#: Third-party modules that may be imported inside functions: optional and heavy (the client and
#: the entry points start without them).
LAZY = ("torch", "triton")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> Dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def is_package(name: str, mods: Dict[str, Path]) -> bool:
    return mods[name].name == "__init__.py"


def resolve(name: str, node: ast.ImportFrom, mods: Dict[str, Path]) -> str:
    """The absolute module a ``from ... import`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package(name, mods) else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def own(target: str) -> bool:
    return target == "kforge" or target.startswith("kforge.")


def imports(name: str, mods: Dict[str, Path]) -> Iterator[Tuple[str, ast.stmt, List[str]]]:
    """(imported module, the statement, names taken from it) for every import in the module,
    at any depth; ``from M import X`` where ``M.X`` is a module imports ``M.X`` (and ``M`` only
    for the names that are not modules)."""
    tree = ast.parse(mods[name].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node, []
        elif isinstance(node, ast.ImportFrom):
            target = resolve(name, node, mods)
            submodules = [a.name for a in node.names if f"{target}.{a.name}" in mods]
            names = [a.name for a in node.names if a.name not in submodules]
            if names:
                yield target, node, names
            for sub in submodules:
                yield f"{target}.{sub}", node, []


def graph() -> Dict[str, Set[str]]:
    mods = modules()
    return {name: {t for t, _, _ in imports(name, mods) if own(t) and t != name} for name in mods}


def cycle(g: Dict[str, Set[str]]) -> List[str]:
    """One import circle of ``g`` (empty if there is none)."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(n: str) -> List[str]:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return []

    for n in sorted(g):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return []


def test_the_walk_finds_the_subpackages() -> None:
    mods = modules()
    for name in ("kforge", BOTTOM, "kforge.verify.runner", "kforge.inspect.capture", "kforge.optimize.rewrite",
                 "kforge.worker"):
        assert name in mods, sorted(mods)


def test_cycle_finder_finds_a_circle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circles() -> None:
    g = graph()
    assert cycle(g) == [], " -> ".join(cycle(g))


def test_bottom_module_imports_nothing_from_kforge() -> None:
    assert graph()[BOTTOM] == set()


def test_internal_packages_import_nothing() -> None:
    """Importing one internal module does not import its siblings."""
    g = graph()
    assert g["kforge.verify"] == set() and g["kforge.inspect"] == set() and g["kforge.optimize"] == set()


def test_public_client_imports_no_internals() -> None:
    g = graph()
    for name in CLIENT:
        assert not [t for t in g[name] if t.startswith(INTERNALS)], (name, g[name])


def test_no_underscore_names_shared_across_modules() -> None:
    """Neither ``from kforge.m import _x`` nor ``m._x`` on an imported kforge module."""
    mods = modules()
    shared: List[str] = []
    for name in mods:
        bound: Set[str] = set()  # local names of imported kforge modules
        for target, node, names in imports(name, mods):
            if not own(target):
                continue
            shared += [f"{name}: from {target} import {n}" for n in names if n.startswith("_") and n != "__version__"]
            if isinstance(node, ast.Import):
                bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
            else:
                bound |= {a.asname or a.name for a in node.names if f"{target}.{a.name}" in mods}
        for node in ast.walk(ast.parse(mods[name].read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                shared.append(f"{name}: {node.value.id}.{node.attr}")
    assert shared == []


def test_imports_in_functions_are_only_the_lazy_third_party_ones() -> None:
    """torch and Triton are imported where they are used (the client and the entry points must
    start without them); everything else, kforge's own modules included, at the top."""
    mods = modules()
    hidden: List[str] = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    targets = [resolve(name, node, mods)]
                else:
                    continue
                hidden += [f"{name}:{node.lineno} {t}" for t in targets if t.split(".")[0] not in LAZY]
    assert hidden == []


def test_every_module_run_with_dash_m_exists_and_runs_main() -> None:
    """The module paths the Rust code starts (``"-m", "kforge...."``) and the docs and docstrings
    name (``-m kforge....``) are modules of the package with a ``__main__`` guard."""
    mods = modules()
    rust = re.compile(r'"-m"(?:\.to_string\(\)|\.into\(\))?\s*,\s*"(kforge(?:\.\w+)+)"')
    text = re.compile(r"-m (kforge(?:\.\w+)+)")
    named: Dict[str, str] = {}
    for path in sorted((REPO / "crates").glob("*/src/**/*.rs")):
        named.update({m: str(path.relative_to(REPO)) for m in rust.findall(path.read_text())})
    assert {"kforge.verify.runner", "kforge.inspect.capture", "kforge.worker"} <= set(named), named
    for path in sorted((REPO / "docs").glob("*.md")) + sorted(mods.values()):
        named.update({m: str(path.relative_to(REPO)) for m in text.findall(path.read_text())})
    for module, where in sorted(named.items()):
        assert module in mods, f"{where} names {module}, which is not a module of the package"
        assert 'if __name__ == "__main__":' in mods[module].read_text(), f"{module} (named by {where}) has no __main__ guard"


def test_setuptools_packages_list_every_subpackage() -> None:
    mods = modules()
    listed = re.search(r"^packages = \[(.*)\]$", (PACKAGE.parent / "pyproject.toml").read_text(), re.M)
    assert listed is not None
    assert sorted(re.findall(r'"([\w.]+)"', listed.group(1))) == sorted(n for n in mods if is_package(n, mods))
