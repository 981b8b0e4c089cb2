"""scripts/device/eval.sh with a stand-in kforge binary: the command lines its steps make, the
manifest names it expects, and the skipping of steps whose result the state already holds."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Records its arguments; writes what the real binary would leave in the workload's directory
# (the workload for `gen`, NAME.run.json for `run`).
STUB = r"""#!/usr/bin/env bash
echo "$*" >> "$KF_LOG"
if [ "$1 $2" = "workload gen" ]; then
  while [ $# -gt 0 ]; do [ "$1" = --out ] && echo '{}' > "$2"; shift; done
elif [ "$1 $2" = "workload run" ]; then
  dir=$(dirname "$3"); name=""
  while [ $# -gt 0 ]; do [ "$1" = --name ] && name=$2; shift; done
  echo '{}' > "$dir/$name.run.json"
fi
"""


def run_eval(repo: Path, state: Path, out: Path, log: Path, *steps: str) -> str:
    env = dict(os.environ, OUT=str(out), KF_LOG=str(log), PATH=f"{repo / 'bin'}:{os.environ['PATH']}")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "device" / "eval.sh"), str(state), *steps],
                       cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_run_steps_over_every_gpu_with_and_without_gpu_groups(tmp_path: Path) -> None:
    repo, out, log = tmp_path / "repo", tmp_path / "out", tmp_path / "log"
    (repo / "target" / "release").mkdir(parents=True)
    (repo / "bin").mkdir()
    kf = repo / "target" / "release" / "kforge"
    kf.write_text(STUB)
    smi = repo / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: stand-in'\n")
    for f in (kf, smi):
        f.chmod(0o755)
    steps = ("gen:50:1", "run:region:warm:8::region-warm-2gpu:all", "run:region:warm:8:::all-split",
             "run:region:isolate:8::region-isolate-nosettle:0:0", "run:region:isolate:8:::all")
    run_eval(repo, tmp_path / "no-state", out, log, *steps)
    calls = [l.split() for l in log.read_text().splitlines()]
    assert [c[:2] for c in calls] == [["workload", "gen"]] + [["workload", "run"]] * 4

    def opt(c: list[str], name: str) -> str:
        return c[c.index(name) + 1]

    grouped, split, nosettle, grouped_default = calls[1:]
    # `all`: every GPU, each candidate group on one GPU (kforge's default).
    assert (opt(grouped, "--device"), opt(grouped, "--name"), "--no-gpu-groups" in grouped) == ("all", "region-warm-2gpu", False)
    # `all-split`: every GPU, each command on the least busy one; the default name says so.
    assert (opt(split, "--device"), opt(split, "--name"), "--no-gpu-groups" in split) == ("all", "region-warm-all-split", True)
    assert (opt(nosettle, "--device"), opt(nosettle, "--settle-timeout-ms")) == ("0", "0")
    # A default name says which placement a run over every GPU had.
    assert (opt(grouped_default, "--device"), opt(grouped_default, "--name"), "--no-gpu-groups" in grouped_default) == (
        "all", "region-isolate-all-groups", False)
    # The state the call packed holds every result; a second call with it starts nothing again.
    with tarfile.open(out / "state.tgz") as t:
        names = sorted(n.lstrip("./") for n in t.getnames() if n.endswith(".run.json"))
        t.extractall(tmp_path / "state", filter="data")
    assert names == ["region-isolate-all-groups.run.json", "region-isolate-nosettle.run.json", "region-warm-2gpu.run.json",
                     "region-warm-all-split.run.json"]
    log.unlink()
    again = run_eval(repo, tmp_path / "state", out, log, *steps)
    assert not log.exists(), "no step ran twice"
    assert again.count(": done (") == len(steps), again
