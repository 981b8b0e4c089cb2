"""Issues 6 and 7 on the GPU machine: `kforge inspect` over the problem suite and `kforge verify`
over the candidate corpus, every task a job of one kforge daemon (scripts/device/suite.sh starts
it), so several compile at once while their timed parts run in exclusive regions.

    python3 scripts/device/suite.py K SOCKET WORKDIR OUT TASK...
      TASK: inspect:MODE[:GLOB]   every problem file of GLOB (default problems/level*/*.py)
            verify[:WORDS]        every entry of tests/candidates/expect.json (WORDS: only candidates
                                  whose path contains one of these comma-separated words)
            verify-suite[:NAMES]  the suite candidates of tests/candidates/suite/ (NAMES: comma-
                                  separated file stems) against their problems
            verify-eager[:GLOB]   every problem of GLOB (default problems/level*/*.py) against its
                                  own eager forward as the candidate: `kforge optimize`'s dispatch
                                  result for "eager" (python -m kforge.optimize.result), verified
                                  with the policy.toml written beside it (reference-ops, baseline
                                  default) — a candidate per problem, to verify the whole suite
            verify-results:DIR    every result of a `kforge optimize` campaign's output DIR (each
                                  folder with report.json: its model_new.py under its policy.toml,
                                  at the report's problem and size) verified again, and compared
                                  with the campaign's decision (improved: accepted; the baseline
                                  kept: any verdict but could-not-run)

Env: DEVICE (every task's --device, e.g. cpu; default the GPUs in turn), SIZE (the problems' size preset for inspect and verify-suite tasks, default "default"),
PARALLEL (tasks in flight, default 6 per GPU), DEADLINE_S (no task starts after this many
seconds, default 540), SKIP (a file of task keys already done, one per line), NGPU,
INTERLEAVE=1 (the tasks of the named kinds taken in turn, one of each, instead of kind after kind);
FINAL_PACK=1 (no tasks): only pack WORKDIR, the stopped daemon's store included.
A task named twice runs once, at its first place: list the longest first
(`inspect:max-autotune:problems/level3/*.py inspect:max-autotune`) so they do not end the call.
After every finished task WORKDIR is packed into OUT/suite.tgz (a call cut short keeps what it
finished, and a copy of the daemon's store as it was then, store-snapshot.db); the tables (one row
per problem or candidate) are printed last and written to OUT/summary.json.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import glob
import json
import os
import sqlite3
import subprocess
import sys
import tarfile
import threading
import time
from typing import Any, Dict, List, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "analysis"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from suite_report import EXPECT, inspect_row, speedup_evidence, verify_row  # noqa: E402  (one reader of the results)
from kforge.optimize.result import EAGER, write_result  # noqa: E402  (the tree's package, not installed)

K, SOCKET, WORK, OUT = sys.argv[1:5]
TASKS = sys.argv[5:]
NGPU = int(os.environ.get("NGPU", "1"))
#: DEVICE: every task's --device (e.g. cpu, to try a script without a GPU); default: GPUs in turn.
DEVICE = os.environ.get("DEVICE", "")
PARALLEL = int(os.environ.get("PARALLEL", str(6 * NGPU)))
DEADLINE = time.time() + float(os.environ.get("DEADLINE_S", "540"))
SKIP = set(open(os.environ["SKIP"]).read().split()) if os.environ.get("SKIP") else set()
PACK = threading.Lock()
#: verify-results: each result's decision in its campaign (task name: decision).
DECIDED: Dict[str, Dict[str, Any]] = {}
SIZE = os.environ.get("SIZE", "default")
#: The suite candidates' problems (tests/candidates/suite/README.md).
SUITE_CANDIDATES = {"silu_bf16": "level1/016_silu_bf16.py", "gelu_fp32": "level1/015_gelu_erf_fp32.py",
                    "softmax_fp32": "level1/013_softmax_fp32.py", "layernorm_fp32": "level1/009_layernorm_fp32.py",
                    "gemm_bias_gelu_bf16": "level2/002_gemm_bias_gelu_bf16.py"}


def tasks() -> List[Tuple[str, List[str], str]]:
    """(key, argv, result dir) per task, in launch order."""
    out: List[Tuple[str, List[str], str]] = []
    n = 0
    for t in TASKS:
        what, *rest = t.split(":")
        if what == "inspect":
            mode = rest[0]
            pattern = rest[1] if len(rest) > 1 else "problems/level*/*.py"
            d = f"{WORK}/inspect-{mode}"
            for f in sorted(glob.glob(pattern)):
                name = os.path.basename(f)[:-3]
                gpu = DEVICE or str(n % NGPU)
                n += 1
                argv = [K, "--socket", SOCKET, "inspect", f, "--daemon", "--device", gpu, "--mode", mode,
                        "--size", SIZE, "--capture-out", f"{d}/{name}.capture.json", "--json", f"{d}/{name}.report.json"]
                out.append((f"inspect-{mode}/{name}", argv, d))
        elif what == "verify":
            d = f"{WORK}/verify"
            for i, e in enumerate(json.load(open("tests/candidates/expect.json"))):
                if rest and not any(w in e["candidate"] for w in rest[0].split(",")):
                    continue
                if e.get("device") == "cpu":  # CPU only (a C++ loop over host memory)
                    continue
                gpu = DEVICE or str(n % NGPU)
                n += 1
                p = e.get("policy")  # a corpus TOML file, or a preset by name (strict-no-torch)
                pol = ["--policy", f"tests/candidates/{p}" if p.endswith(".toml") else p] if p else []
                kern = ["--kernel", e["kernel"]] if e.get("kernel") else []
                kern += ["--time-limit-s", str(e["time_limit_s"])] if e.get("time_limit_s") else []  # a hang candidate
                argv = [K, "--socket", SOCKET, "verify", "--daemon", "--device", gpu, *pol, *kern, "--json", f"{d}/{i}.json",
                        f"tests/candidates/{e['problem']}", f"tests/candidates/{e['candidate']}"]
                out.append((f"verify/{i}", argv, d))
        elif what == "verify-suite":
            d = f"{WORK}/verify-suite"
            for name, prob in SUITE_CANDIDATES.items():
                if rest and name not in rest[0].split(","):
                    continue
                gpu = DEVICE or str(n % NGPU)
                n += 1
                argv = [K, "--socket", SOCKET, "verify", "--daemon", "--device", gpu, "--size", SIZE, "--json", f"{d}/{name}.json",
                        f"problems/{prob}", f"tests/candidates/suite/{name}.py"]
                out.append((f"verify-suite/{name}", argv, d))
        elif what == "verify-eager":
            d = f"{WORK}/verify-eager"
            for f in sorted(glob.glob(rest[0] if rest else "problems/level*/*.py")):
                name = os.path.basename(f)[:-3]
                gpu = DEVICE or str(n % NGPU)
                n += 1
                model, policy = eager_result(f, f"{WORK}/eager/{name}")
                argv = [K, "--socket", SOCKET, "verify", "--daemon", "--device", gpu, "--size", SIZE, "--policy", policy,
                        "--json", f"{d}/{name}.json", f, model]
                out.append((f"verify-eager/{name}", argv, d))
        elif what == "verify-results":
            d = f"{WORK}/verify-results"
            for report in sorted(glob.glob(f"{rest[0]}/**/report.json", recursive=True)):
                r, folder = json.load(open(report)), os.path.dirname(report)
                name = os.path.relpath(folder, rest[0]).replace("/", "__")
                if not os.path.exists(f"{folder}/model_new.py"):
                    print(f"verify-results/{name}: no model_new.py (a report restored from a decisions file): not verified here")
                    continue
                gpu = DEVICE or str(n % NGPU)
                n += 1
                argv = [K, "--socket", SOCKET, "verify", "--daemon", "--device", gpu, "--size", r["size"],
                        "--policy", f"{folder}/policy.toml", "--json", f"{d}/{name}.json", r["problem"], f"{folder}/model_new.py"]
                DECIDED[name] = r["decision"]
                out.append((f"verify-results/{name}", argv, d))
        else:
            sys.exit(f"unknown task {t}")
    if os.environ.get("INTERLEAVE") == "1":
        out = interleaved(out)
    seen = set(SKIP)  # a task named twice (a long subset listed first) runs once, at its first place
    todo = []
    for t in out:
        if t[0] not in seen:
            seen.add(t[0])
            todo.append(t)
    return todo


def eager_result(problem: str, out_dir: str) -> Tuple[str, str]:
    """The dispatch agent's result file for "eager" (the reference's own forward) and its policy."""
    return write_result(problem, dict(EAGER), out_dir)


def interleaved(tasks: List[Tuple[str, List[str], str]]) -> List[Tuple[str, List[str], str]]:
    """One task of each kind in turn (kinds in their first-named order)."""
    kinds: Dict[str, List[Tuple[str, List[str], str]]] = {}
    for t in tasks:
        kinds.setdefault(t[0].split("/")[0], []).append(t)
    queues = list(kinds.values())
    out = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def _results_only(info: tarfile.TarInfo, with_store: bool = False) -> "tarfile.TarInfo | None":
    """Leave out the daemon's socket folder (its ledger is renamed in place as jobs come and go)
    and the live SQLite store (packed only once the daemon stopped: ``with_store``; before that
    its ``store-snapshot.db``), and a snapshot being written."""
    parts = info.name.split("/")
    if len(parts) > 1 and (parts[1].endswith(".sock.d") or parts[1].endswith(".sock")
                           or (parts[1].startswith("store.db") and not with_store)
                           or parts[1].endswith(".db.tmp")):
        return None
    return info


def snapshot_store() -> None:
    """A consistent copy of the live store as ``store-snapshot.db`` (SQLite's online backup), so
    that a call cut at its limit, whose daemon never stops, still brings back its regions and
    measurements (``scripts/analysis/floor_rounds.py`` reads them). A failed copy is said and
    skipped: the next pack tries again."""
    live = f"{WORK}/store.db"
    if not os.path.exists(live):
        return
    try:
        # Read only in effect (a WAL store's readers may need to write its -shm: not mode=ro).
        with contextlib.closing(sqlite3.connect(live, timeout=5)) as src, \
                contextlib.closing(sqlite3.connect(f"{WORK}/store-snapshot.db.tmp")) as dst:
            src.backup(dst)
        os.replace(f"{WORK}/store-snapshot.db.tmp", f"{WORK}/store-snapshot.db")
    except (sqlite3.Error, OSError) as e:
        print(f"pack: no store snapshot: {e}", flush=True)


def pack(with_store: bool = False) -> None:
    with PACK:
        tmp = f"{OUT}/suite.tgz.tmp"
        if not with_store:
            snapshot_store()
        try:
            with tarfile.open(tmp, "w:gz") as tf:
                tf.add(WORK, arcname="suite", filter=lambda i: _results_only(i, with_store))
            os.replace(tmp, f"{OUT}/suite.tgz")
        except OSError as e:  # a file gone while packing: the next pack takes it
            print(f"pack: {e}", flush=True)


def run(key: str, argv: List[str], d: str) -> Dict[str, Any]:
    if time.time() > DEADLINE:
        return {"key": key, "skipped": True}
    os.makedirs(d, exist_ok=True)
    t0 = time.time()
    p = subprocess.run(argv, capture_output=True, text=True)
    base = f"{WORK}/{key}"
    open(f"{base}.log", "w").write(p.stdout + p.stderr)
    r = {"key": key, "rc": p.returncode, "s": round(time.time() - t0, 1)}
    open(f"{WORK}/done.txt", "a").write(key + "\n")
    with PACK:
        print(f"{time.strftime('%T')} {key} rc={p.returncode} {r['s']} s", flush=True)
    pack()
    return r


def inspect_rows(d: str) -> List[Dict[str, Any]]:
    return [inspect_row(d, os.path.basename(log)[:-4]) for log in sorted(glob.glob(f"{d}/*.log"))]


def verify_rows(d: str) -> List[Dict[str, Any]]:
    expect = json.load(open(EXPECT))
    return [verify_row(d, i, e) for i, e in enumerate(expect) if os.path.exists(f"{d}/{i}.log")]


def memory_summary() -> Dict[str, Any]:
    """What the daemon's admission recorded (`kforge report --json`: job_memory): jobs, how many
    were retried alone after a CUDA out-of-memory error beside siblings, the largest peak, and
    where the expected peaks came from (declared, learned, default)."""
    p = subprocess.run([K, "--socket", SOCKET, "report", "--json"], capture_output=True, text=True)
    try:
        rows = json.loads(p.stdout).get("job_memory", [])
    except ValueError:
        return {}
    by: Dict[str, int] = {}
    for r in rows:
        by[str(r.get("source"))] = by.get(str(r.get("source")), 0) + 1
    return {"jobs": len(rows), "retried_alone": sum(1 for r in rows if r.get("retried")),
            "peak_gib_max": max([r.get("peak_bytes", 0) for r in rows] or [0]) / 2**30, "by_source": by}


def main() -> None:
    if os.environ.get("FINAL_PACK"):  # suite.sh, after the daemon stopped: the store too
        pack(with_store=True)
        return
    todo = tasks()
    print(f"{len(todo)} tasks, {PARALLEL} in flight, {NGPU} GPU(s), size {SIZE}", flush=True)
    t0 = time.time()
    with cf.ThreadPoolExecutor(PARALLEL) as ex:
        results = list(ex.map(lambda t: run(*t), todo))
    wall = round(time.time() - t0, 1)
    skipped = [r["key"] for r in results if r.get("skipped")]
    summary: Dict[str, Any] = {"skipped": skipped, "size": SIZE, "parallel": PARALLEL, "wall_s": wall,
                               "tasks": [{k: r[k] for k in ("key", "rc", "s") if k in r} for r in results]}
    print(f"{len(results) - len(skipped)} tasks in {wall} s, {PARALLEL} in flight; task seconds summed: "
          f"{sum(r.get('s', 0) for r in results):.1f}")
    summary["memory"] = memory_summary()
    m = summary["memory"]
    if m:
        print(f"GPU memory: {m['jobs']} jobs recorded, {m['retried_alone']} retried alone after an out-of-memory error, "
              f"peak {m['peak_gib_max']:.1f} GiB (by admission source: {m['by_source']})")
    for d in sorted(glob.glob(f"{WORK}/inspect-*")):
        mode = os.path.basename(d)[len("inspect-"):]
        rows = inspect_rows(d)
        summary[f"inspect-{mode}"] = rows
        print(f"\n== kforge inspect, mode {mode}")
        print(f"{'PROBLEM':<40} {'TRITON':>6} {'TEMPL':>5} {'VENDOR':>6} {'GPU_US':>9} {'REPL%':>6} {'REPLAY':>7} {'RESTITCH':>9} {'T/T0':>6} {'FLOOR':>6}")
        for r in rows:
            if r["ok"]:
                ratio = f"{r['restitch_ratio']:.3f}" if r["restitch_ratio"] else "-"
                floor = f"{r['noise_floor']:.3f}" if r.get("noise_floor") else "-"
                print(f"{r['problem']:<40} {r['triton']:>6} {r['templates']:>5} {r['vendor']:>6} {r['gpu_us']:>9.1f} "
                      f"{r['replaceable_share'] * 100:>5.1f}% {r['replay_ok']:>3}/{r['replay_n']:<3} {str(r['restitch_identical']):>9} {ratio:>6} {floor:>6}")
            else:
                print(f"{r['problem']:<40} FAILED: {r['reason']}")
        print(f"{sum(r['ok'] for r in rows)}/{len(rows)} problems inspected in mode {mode}")
        floors = [r["noise_floor"] for r in rows if r.get("noise_floor")]
        if floors:
            print(f"noise floor: max {max(floors):.4f}, {sum(f <= 1.01 for f in floors)}/{len(floors)} at most 1.01")
    if os.path.isdir(f"{WORK}/verify"):
        rows = verify_rows(f"{WORK}/verify")
        summary["verify"] = rows
        print("\n== kforge verify")
        print(f"{'CANDIDATE':<40} {'OUTCOME':<26} {'REJECTED BY':<34} {'SPEEDUP':>8} AS EXPECTED")
        for r in rows:
            sp = f"{r['speedup']:.3f}x" if isinstance(r["speedup"], float) else "-"
            print(f"{r['candidate']:<40} {r['outcome']:<26} {r['rejected_by']:<34} {sp:>8} {'yes' if r['as_expected'] else 'NO'}")
        print(f"{sum(r['as_expected'] for r in rows)}/{len(rows)} as expected")
    for kind in ("verify-suite", "verify-eager", "verify-results"):
        suite_verdicts(kind, results, summary)
    if DECIDED and "verify-results" in summary:
        results_agree(summary["verify-results"])
    json.dump(summary, open(f"{OUT}/summary.json", "w"), indent=1)
    if skipped:
        print(f"{len(skipped)} tasks not started before the deadline: run again with SKIP=<done.txt>")


def suite_verdicts(kind: str, results: List[Dict[str, Any]], summary: Dict[str, Any]) -> None:
    """The verdicts of the verify-suite or verify-eager tasks: a row each, printed and in summary."""
    if os.path.isdir(f"{WORK}/{kind}"):
        rows = []
        for f in sorted(glob.glob(f"{WORK}/{kind}/*.json")):
            v = json.load(open(f))
            secs = next((r["s"] for r in results if r["key"] == f"{kind}/{os.path.basename(f)[:-5]}"), None)
            rows.append({"candidate": os.path.basename(f)[:-5], "outcome": v.get("outcome"), "rejected_by": v.get("rejected_by"),
                         "speedup": speedup_evidence(v).get("speedup"), "seconds": secs,
                         "phase_seconds": v.get("phase_seconds"), "error": v.get("error"), "cause": v.get("cause")})
        summary[kind] = rows
        print(f"\n== kforge verify, {kind}, size {SIZE}")
        for r in rows:
            sp = f"{r['speedup']:.3f}x" if isinstance(r["speedup"], float) else "-"
            print(f"{r['candidate']:<40} {str(r['outcome']):<26} {str(r['rejected_by'] or ''):<30} {sp:>8} {r['seconds']} s")
        print(f"{sum(r['outcome'] != 'could-not-run' for r in rows)}/{len(rows)} with a verdict (not could-not-run)")


def results_agree(rows: List[Dict[str, Any]]) -> None:
    """verify-results: each verdict against the campaign's decision (an improvement must be
    accepted again; a kept baseline needs a verdict, any), a column added to the rows."""
    for r in rows:
        d = DECIDED.get(r["candidate"], {})
        r["decision"] = d.get("kind")
        r["decided_speedup"] = d.get("speedup")
        # On the CPU gate 4 does not run: an improvement passes without its performance check.
        improved_ok = ("accepted", "passed-without-performance") if DEVICE == "cpu" else ("accepted",)
        r["agrees"] = r["outcome"] in improved_ok if d.get("kind") == "improved" else r["outcome"] != "could-not-run"
    print(f"{sum(r['agrees'] for r in rows)}/{len(rows)} re-verified as decided"
          + "".join(f"\n  NOT: {r['candidate']} decided {r['decision']}, now {r['outcome']} {r['rejected_by'] or ''}"
                    for r in rows if not r["agrees"]))


if __name__ == "__main__":
    main()
