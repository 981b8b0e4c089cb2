"""Running a device script (scripts/device/*.sh) here, under stand-ins: a copy of the scripts in a
temporary repository whose ``target/release/kforge`` is a given shell stub and whose ``PATH``
has an ``nvidia-smi`` naming one stand-in GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Tuple

ROOT = Path(__file__).resolve().parents[2]


def run_device_script(tmp_path: Path, script: str, kforge_stub: str,
                      **env: str) -> Tuple["subprocess.CompletedProcess[str]", Path, Path]:
    """``bash scripts/device/SCRIPT`` in the stand-in repository, with ``OUT`` and ``KF_STATE``
    (the stub's state folder) and ``env`` set; asserts it exits 0. Returns the run, OUT, the state."""
    repo, out, state = tmp_path / "repo", tmp_path / "out", tmp_path / "state"
    for d in (repo / "target" / "release", repo / "bin", state, repo / "scripts"):
        d.mkdir(parents=True)
    shutil.copytree(ROOT / "scripts" / "device", repo / "scripts" / "device")
    kforge = repo / "target" / "release" / "kforge"
    kforge.write_text(kforge_stub)
    kforge.chmod(0o755)
    (repo / "target" / "release" / "libkforge_shim.so").write_text("")
    smi = repo / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: stand-in'\n")
    smi.chmod(0o755)
    full = dict(os.environ, OUT=str(out), KF_STATE=str(state), PATH=f"{repo / 'bin'}:{os.environ['PATH']}", **env)
    r = subprocess.run(["bash", f"scripts/device/{script}"], cwd=repo, env=full, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r, out, state
