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
echo "$* cpus=$(sed -n 's/^Cpus_allowed_list:\s*//p' /proc/self/status)" >> "$KF_LOG"
if [ "$1 $2" = "workload gen" ]; then
  while [ $# -gt 0 ]; do [ "$1" = --out ] && echo '{}' > "$2"; shift; done
elif [ "$1 $2" = "workload run" ] || [ "$1 $2" = "workload truth" ]; then
  dir=$(dirname "$3"); name=""; part=""
  [ "$2" = truth ] && name=truth
  while [ $# -gt 0 ]; do
    case "$1" in --name) name=$2 ;; --offset) part=$2 ;; --limit) part=${part:-0} ;; esac; shift
  done
  echo '{}' > "$dir/$name${part:+-$part}.run.json"
fi
"""


def run_eval(repo: Path, state: Path, out: Path, log: Path, *steps: str) -> str:
    env = dict(os.environ, OUT=str(out), KF_LOG=str(log), PATH=f"{repo / 'bin'}:{os.environ['PATH']}")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "device" / "eval.sh"), str(state), *steps],
                       cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def stand_ins(tmp_path: Path, gpus: int) -> tuple[Path, Path, Path]:
    """A repository with the stand-in kforge, and an nvidia-smi that lists `gpus` GPUs."""
    repo, out, log = tmp_path / "repo", tmp_path / "out", tmp_path / "log"
    (repo / "target" / "release").mkdir(parents=True)
    (repo / "bin").mkdir()
    kf = repo / "target" / "release" / "kforge"
    kf.write_text(STUB)
    smi = repo / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: stand-in (UUID: GPU-{i})'\n" for i in range(gpus)))
    for f in (kf, smi):
        f.chmod(0o755)
    return repo, out, log


def opt(c: list[str], name: str) -> str:
    return c[c.index(name) + 1]


def test_run_steps_over_every_gpu_with_and_without_gpu_groups(tmp_path: Path) -> None:
    repo, out, log = stand_ins(tmp_path, 1)
    steps = ("gen:50:1", "run:region:warm:8::region-warm-2gpu:all", "run:region:warm:8:::all-split",
             "run:region:isolate:8::region-isolate-nosettle:0:0", "run:region:isolate:8:::all")
    run_eval(repo, tmp_path / "no-state", out, log, *steps)
    calls = [l.split() for l in log.read_text().splitlines()]
    assert [c[:2] for c in calls] == [["workload", "gen"]] + [["workload", "run"]] * 4

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


def test_truth_on_every_gpu_at_once_each_on_its_share_of_the_cores(tmp_path: Path) -> None:
    repo, out, log = stand_ins(tmp_path, 3)
    cores = sorted(os.sched_getaffinity(0))
    run_eval(repo, tmp_path / "no-state", out, log, "gen:50:1", "truth-pair:0:5", "truth-each:5:5")
    truths = [l.split() for l in log.read_text().splitlines() if l.startswith("workload truth")]
    by = {(opt(c, "--offset"), opt(c, "--device")): c for c in truths}
    # truth-pair: GPUs 0 and 1; truth-each: all three GPUs nvidia-smi lists; every part once.
    assert sorted(by) == [("0", "0"), ("0", "1"), ("5", "0"), ("5", "1"), ("5", "2")] and len(truths) == 5
    # Each GPU's part has its own store and name; GPU 0's keeps the defaults.
    assert "--name" not in by[("5", "0")] and (opt(by[("5", "2")], "--name"), Path(opt(by[("5", "2")], "--db")).name) == (
        "truth-gpu2", "kforge-eval-gpu2.db")

    def cpus(c: list[str]) -> str:
        return c[-1].removeprefix("cpus=")

    n = len(cores)
    if cores == list(range(n)):  # the shares are taken from cpu 0 up
        per = n // 2
        share = lambda i: str(i * per) if per == 1 else f"{i * per}-{i * per + per - 1}"  # noqa: E731
        assert (cpus(by[("0", "0")]), cpus(by[("0", "1")])) == (share(0), share(1))
        if n < 3:  # fewer cores than GPUs: the three parts share all of them
            assert {cpus(by[("5", d)]) for d in "012"} == {f"0-{n - 1}" if n > 1 else "0"}
    # Done parts are skipped: a second call with the state starts no truth again.
    with tarfile.open(out / "state.tgz") as t:
        t.extractall(tmp_path / "state", filter="data")
    log.unlink()
    again = run_eval(repo, tmp_path / "state", out, log, "gen:50:1", "truth-pair:0:5", "truth-each:5:5")
    assert not log.exists() and again.count(": done (") == 3, again
