"""A script of ``scripts/analysis/`` loaded as a module, for its tests (the scripts are not a
package: each runs on its own on the device machine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

ANALYSIS = Path(__file__).resolve().parents[2] / "scripts" / "analysis"


def analysis_script(name: str) -> Any:
    """``scripts/analysis/NAME.py`` as a fresh module named NAME."""
    spec = importlib.util.spec_from_file_location(name, ANALYSIS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m
