"""scripts/device/auto_regions.sh with stand-in `kforge` and `nvidia-smi` binaries (no GPU here):
the runs it makes and their flags, that it ends (no wait on the daemon, competitors stopped), and
the summary it writes (inflation against `alone`, regions per run from the store dump)."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

from standins import run_device_script

ROOT = Path(__file__).resolve().parents[2]

# `kforge --socket S CMD ...`. The eval (kb_style_eval.py) is replaced by a writer of its JSON:
# times of 1 ms alone, 3 ms beside competitors, 1.1 ms beside them with --auto-regions.
STUB = r"""#!/usr/bin/env bash
shift 2
cmd=$1; shift
echo "$cmd $*" >> "$KF_STATE/log"
case $cmd in
  daemon) echo $$ > "$KF_STATE/daemon.pid"; exec sleep 120 ;;
  shutdown) [ -e "$KF_STATE/daemon.pid" ] && kill "$(cat "$KF_STATE/daemon.pid")" 2>/dev/null; rm -f "$KF_STATE/daemon.pid" ;;
  status) echo "device 0"
          for p in "$KF_STATE"/comp.*; do [ -e "$p" ] && kill -0 "${p##*.}" 2>/dev/null && echo "job competitor"; done; true ;;
  report) python3 - "$KF_STATE" <<'PY'
import json, sys, os
st = sys.argv[1]
jobs, regions = [], []
for i, line in enumerate(open(os.path.join(st, "labels"))):
    label, auto = line.split()
    jobs.append({"id": i + 1, "label": label})
    if auto == "1":
        for k in range(3):
            regions.append({"id": len(regions) + 1, "job": i + 1, "name": "auto:do_bench", "granted_ns": 0,
                            "released_ns": 2_000_000, "drain_ms": 0.5, "frozen_jobs": 3 if "beside" in label else 0})
print(json.dumps({"jobs": jobs, "regions": regions}))
PY
  ;;
  run) label=""; auto=0
       while [ "$1" != -- ]; do
         case $1 in --label) label=$2; shift ;; --auto-regions) auto=1 ;; esac; shift
       done
       shift  # --
       script=$2
       if [ "$(basename "$script")" = competitor.py ]; then
         touch "$KF_STATE/comp.$$"; touch "$3"; exec sleep 120
       fi
       echo "$label $auto" >> "$KF_STATE/labels"
       beside=0; for p in "$KF_STATE"/comp.*; do [ -e "$p" ] && kill -0 "${p##*.}" 2>/dev/null && beside=1; done
       python3 - "$4" "$3" "$auto" "$beside" <<'PY'
import json, os, sys
out, label, auto, beside = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
if label == os.environ.get("KF_FAIL"):
    print(label, "matmul events start +1.00")
    sys.exit(137)  # killed at its time limit: no JSON
t = (1.1 if auto else 3.0) if beside else 1.0
series = {m: [t] * 10 for m in ("do_bench", "events", "event-loop")}
json.dump({"label": label, "device": "stand-in", "problems": {"matmul": series}, "wall_s": 1.0}, open(out, "w"))
print(label, "done")
PY
  ;;
esac
"""


def run_script(tmp_path: Path, **env_extra: str) -> "tuple[subprocess.CompletedProcess[str], Path, Path]":
    env = dict(HEAT_S="0")
    env.update(env_extra)
    return run_device_script(tmp_path, "auto_regions.sh", STUB, **env)


def members(tgz: Path) -> "set[str]":
    with tarfile.open(tgz) as t:
        return {os.path.normpath(n) for n in t.getnames()} - {"."}


def test_the_script_runs_four_evals_and_writes_the_inflation_summary(tmp_path: Path) -> None:
    r, out, state = run_script(tmp_path)
    log = (state / "log").read_text().splitlines()
    runs = [line for line in log if line.startswith("run ") and "kb_style_eval.py" in line]
    assert [("--auto-regions" in line, line.split("--label ")[1].split()[0]) for line in runs] == [
        (False, "alone"), (True, "alone-auto"), (False, "beside"), (True, "beside-auto")]
    assert sum("competitor.py" in line for line in log) == 3
    assert log[-1].startswith("shutdown"), log[-3:]
    assert not (state / "daemon.pid").exists(), "the daemon was shut down"
    summary = json.loads((out / "auto_regions.json").read_text())
    rs = summary["runs"]
    assert rs["beside"]["series"]["matmul/do_bench"]["inflation_p50"] == 3.0
    assert rs["beside-auto"]["series"]["matmul/events"]["inflation_p95"] == 1.1
    assert rs["alone"]["regions"] == {} and rs["beside-auto"]["regions"] == {"auto:do_bench": 3}
    assert rs["beside-auto"]["frozen_jobs_max"] == 3
    assert summary["command"] == "bash scripts/device/auto_regions.sh"
    assert "beside-auto" in r.stdout.splitlines()[-1], "the table comes last"
    assert sorted(p.name for p in out.iterdir()) == ["auto_regions.json", "auto_regions.tgz", "auto_regions.txt"]
    assert (out / "auto_regions.txt").read_text().splitlines()[-1] == r.stdout.splitlines()[-1]
    runs_ = ("alone", "alone-auto", "beside", "beside-auto")
    assert members(out / "auto_regions.tgz") == {"gpu.txt", "daemon.log", "exits.txt", "report.json", "meta.json"} | {
        f"{run}.{ext}" for run in runs_ for ext in ("txt", "json")}
    assert rs["beside-auto"]["exit"] == 0


def test_a_run_killed_at_its_time_limit_is_still_summarised(tmp_path: Path) -> None:
    r, out, _ = run_script(tmp_path, KF_FAIL="beside-auto")
    rs = json.loads((out / "auto_regions.json").read_text())["runs"]
    assert rs["beside-auto"]["exit"] == 137 and rs["beside-auto"]["series"] == {}
    assert rs["beside-auto"]["regions"] == {"auto:do_bench": 3}, "its regions still come from the store dump"
    assert rs["beside-auto"]["region_enter_ms_total"] == 1.5 and rs["beside-auto"]["region_drain_ms_max"] == 0.5
    assert "beside-auto.json" not in members(out / "auto_regions.tgz")
    with tarfile.open(out / "auto_regions.tgz") as t:
        f = t.extractfile("./beside-auto.txt")
        assert f is not None and b"matmul events start" in f.read(), "the progress line says where it was"
    last = r.stdout.splitlines()[-1].split()
    assert last[:2] == ["beside-auto", "137"], last
