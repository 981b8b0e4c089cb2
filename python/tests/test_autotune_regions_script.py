"""scripts/device/autotune_choices.py (the compile job of autotune_regions.sh) run for real on
the CPU — a frozen Linear gives max-autotune's choice selection two choices to benchmark — and
autotune_regions_summary.py's agreement table over made-up compiles and a store dump."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from standins import run_device_script
from typing import Any, Dict

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICE = ROOT / "scripts" / "device"
sys.path.insert(0, str(DEVICE))

import autotune_regions_summary as summary  # noqa: E402

PROBLEM = textwrap.dedent(
    """
    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 64)

        def forward(self, x):
            return torch.relu(self.fc(x))

    def get_inputs():
        return [torch.randn(32, 64)]

    def get_init_inputs():
        return []
    """
)


def test_the_driver_records_the_choice_selection_of_a_real_compile(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    prob = tmp_path / "p.py"
    prob.write_text(PROBLEM)
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_")}
    env.update(PYTHONPATH=str(ROOT / "python"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"),
               TORCHINDUCTOR_FREEZING="1", TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS="CPP,ATEN",
               XDG_RUNTIME_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, str(DEVICE / "autotune_choices.py"), str(prob), str(out), "--device", "cpu"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["select"], rec
    sel = rec["select"][0]
    assert sel["n"] == 2 and sel["winner"] and len(sel["top"]) == 2 and sel["margin"] >= 0.0
    assert any(k.startswith("select:") for k in rec["choices"]) and rec["ms"] > 0
    assert any(k.endswith(".benchmark_cpu") for k in rec["benchmarks"]), rec["benchmarks"]


def test_the_driver_needs_a_cache_directory_of_its_own(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["PYTHONPATH"] = str(ROOT / "python")
    r = subprocess.run([sys.executable, str(DEVICE / "autotune_choices.py"), "x.py", str(tmp_path / "o.json")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "TORCHINDUCTOR_CACHE_DIR" in r.stderr


def rec(problem: str, pid: int, mm: str, poi: str, margin: float = 0.2, ms: float = 1.0) -> Dict[str, Any]:
    return {"problem": problem, "pid": pid, "ms": ms, "compile_s": 10.0,
            "select": [{"op": "mm", "inputs": "f32[64,64]", "winner": mm, "margin": margin, "n": 3, "top": []}],
            "configs": [{"kernel": "triton_poi_0", "winner": poi, "margin": 0.5, "n": 4, "top": []}],
            "coordesc": [], "best_config": {},
            "choices": {"select:mm(f32[64,64])": mm, "config:triton_poi_0": poi}}


def write(work: Path, tag: str, r: Dict[str, Any]) -> None:
    (work / f"{tag}.json").write_text(json.dumps(r))


def test_the_summary_counts_compiles_that_made_the_isolated_choices(tmp_path: Path) -> None:
    w = tmp_path
    write(w, "alone.0.1", rec("a.py", 100, "tmpl-64", "XBLOCK=256", margin=0.01))
    write(w, "alone.1.1", rec("b.py", 101, "extern-mm", "XBLOCK=128"))
    write(w, "plain.1", rec("a.py", 200, "tmpl-128", "XBLOCK=256", ms=1.2))  # a close call lost
    write(w, "plain.2", rec("b.py", 201, "extern-mm", "XBLOCK=512", ms=1.1))  # not a close call
    write(w, "auto.1", rec("a.py", 300, "tmpl-64", "XBLOCK=256"))
    write(w, "auto.2", rec("b.py", 301, "extern-mm", "XBLOCK=128"))
    (w / "exits.txt").write_text("alone.0.1 exit 0\nalone.1.1 exit 0\nplain.1 exit 0\nplain.2 exit 0\n"
                                 "auto.1 exit 0\nauto.2 exit 0\nauto.3 exit 124\n")
    jobs = [{"id": i + 1, "label": t} for i, t in enumerate(["alone.0.1", "alone.1.1", "plain.1", "plain.2",
                                                             "auto.1", "auto.2", "auto.3"])]
    regions = [{"job": 5, "name": "auto:inductor.benchmark", "pid": 300}] * 3 + \
              [{"job": 5, "name": "auto:inductor.benchmark_gpu", "pid": 999}] + \
              [{"job": 3, "name": "autotune:compiled", "pid": 200}]
    (w / "report.json").write_text(json.dumps({"jobs": jobs, "regions": regions}))
    (w / "meta.json").write_text(json.dumps({"close": 0.03}))
    s = summary.summarise(str(w))
    plain, auto = s["runs"]["plain"], s["runs"]["auto"]
    assert (plain["identical"], plain["compared"], plain["differ"], plain["differ_close"]) == (0, 2, 2, 1)
    assert plain["ms_ratio_median"] == pytest.approx(1.2)
    assert (auto["identical"], auto["compared"], auto["differ"], auto["compiles"], auto["failed"]) == (2, 2, 0, 3, 1)
    assert auto["regions"] == 4 and auto["regions_other_pid"] == 1
    assert s["compiles"]["auto.1"]["regions"] == {"auto:inductor.benchmark": 3, "auto:inductor.benchmark_gpu": 1}
    assert "vs_isolated" not in s["compiles"]["alone.0.1"], "the reference is not compared with itself"
    text = summary.table(s)
    assert "plain.1 select:mm(f32[64,64]): isolated tmpl-64 | this tmpl-128 (close call)" in text
    assert text.splitlines()[0].split()[0] == "run"


# `kforge --socket S CMD ...` for scripts/device/autotune_regions.sh. The compile job
# (autotune_choices.py) is replaced by a writer of its JSON: `mm` chooses `tmpl-64` alone and
# with regions, `tmpl-128` in a parallel round without them; each job notes its label, flags and
# Inductor cache directory.
STUB = r"""#!/usr/bin/env bash
shift 2
cmd=$1; shift
echo "$cmd $*" >> "$KF_STATE/log"
case $cmd in
  daemon) echo $$ > "$KF_STATE/daemon.pid"; exec sleep 120 ;;
  shutdown) [ -e "$KF_STATE/daemon.pid" ] && kill "$(cat "$KF_STATE/daemon.pid")" 2>/dev/null; rm -f "$KF_STATE/daemon.pid" ;;
  status) echo "device 0" ;;
  report) python3 - "$KF_STATE" <<'PY'
import json, sys, os
st = sys.argv[1]
jobs, regions = [], []
for i, line in enumerate(sorted(open(os.path.join(st, "labels")))):
    label, auto, cache = line.split()
    jobs.append({"id": i + 1, "label": label})
    if auto == "1":
        regions += [{"job": i + 1, "name": "auto:inductor.benchmark", "pid": 7}] * 2
print(json.dumps({"jobs": jobs, "regions": regions}))
PY
  ;;
  run) label=""; auto=0
       while [ "$1" != -- ]; do
         case $1 in --label) label=$2; shift ;; --auto-regions) auto=1 ;; esac; shift
       done
       shift  # --
       echo "$label $auto $TORCHINDUCTOR_CACHE_DIR" >> "$KF_STATE/labels"
       python3 - "$label" "$3" "$4" "$auto" "${5:-}" <<'PY'
import json, sys
label, problem, out, auto, step = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5] == "--step"
mm = "tmpl-128" if label.startswith("plain.") else "tmpl-64"
json.dump({"problem": problem, "pid": 7, "ms": 1.0, "compile_s": 2.0, "step": step,
           "select": [{"op": "mm", "inputs": "x", "winner": mm, "margin": 0.2, "n": 2, "top": []}],
           "configs": [], "coordesc": [], "best_config": {}, "choices": {"select:mm(x)": mm}}, open(out, "w"))
print(label, "compiled")
PY
  ;;
esac
"""


def run_autotune_script(tmp_path: Path, **env_extra: str) -> "tuple[subprocess.CompletedProcess[str], Path, Path]":
    env = dict(PROBLEMS="a.py b.py", N="3")
    env.update(env_extra)
    return run_device_script(tmp_path, "autotune_regions.sh", STUB, **env)


def test_the_script_compiles_alone_then_in_parallel_rounds_and_prints_the_agreement(tmp_path: Path) -> None:
    r, out, state = run_autotune_script(tmp_path, STEP="1")
    labels = [line.split() for line in (state / "labels").read_text().splitlines()]
    assert [l[0] for l in labels[:2]] == ["alone.0.1", "alone.1.1"]
    assert sorted(l[0] for l in labels[2:]) == sorted(f"{run}.{i}" for run in ("plain", "auto", "step") for i in (1, 2, 3))
    assert {l[0]: l[1] for l in labels}["auto.2"] == "1" and {l[0]: l[1] for l in labels}["step.2"] == "0"
    caches = [l[2] for l in labels]
    assert len(set(caches)) == len(caches), "every compile has an Inductor cache of its own"
    log = (state / "log").read_text().splitlines()
    assert log[-1].startswith("shutdown")
    assert not (state / "daemon.pid").exists(), "the daemon was shut down"
    s = json.loads((out / "autotune_regions.json").read_text())
    assert s["runs"]["plain"]["identical"] == 0 and s["runs"]["plain"]["compared"] == 3
    assert s["runs"]["auto"]["identical"] == 3 and s["runs"]["auto"]["regions"] == 6
    assert s["runs"]["step"]["identical"] == 3
    assert s["compiles"]["step.1"]["problem"] == "a.py" and s["compiles"]["step.3"]["problem"] == "a.py"
    assert s["meta"]["n"] == 3 and s["meta"]["problems"] == ["a.py", "b.py"]
    assert sorted(p.name for p in out.iterdir()) == ["autotune_regions.json", "autotune_regions.tgz", "autotune_regions.txt"]
    table = r.stdout.splitlines()
    assert any(line.split()[:3] == ["auto", "3", "3/3"] for line in table), table
    assert any(line.split()[:3] == ["plain", "3", "0/3"] for line in table), table
