"""Merge the results of `scripts/device/suite.sh` calls (unpacked suite.tgz folders; a later folder's
result for a task replaces an earlier one's) into Markdown tables and one JSON summary.

    python3 scripts/analysis/suite_report.py OUT_DIR SUITE_DIR [SUITE_DIR...]

Writes OUT_DIR/inspect.md, OUT_DIR/verify.md and OUT_DIR/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

EXPECT = "tests/candidates/expect.json"


def inspect_row(d: str, name: str) -> Dict[str, Any]:
    rep = f"{d}/{name}.report.json"
    if not os.path.exists(rep):
        lines = open(f"{d}/{name}.log").read().strip().splitlines() or ["no output"]
        errors = [ln for ln in lines if "Error:" in ln and not ln.startswith("E1")]
        cause = errors[0] if errors else lines[-1]
        return {"problem": name, "ok": False, "reason": cause.strip()[:200]}
    r = json.load(open(rep))
    rs = r.get("restitch") or {}
    rp = r.get("replay") or []
    return {"problem": name, "ok": True, "graphs": r["graphs"], "triton": r["triton_kernels"], "templates": r["template_kernels"],
            "vendor": r["vendor_calls"], "gpu_us": r["attribution"]["total_us"], "replaceable_share": r["attribution"]["replaceable_share"],
            "replay_ok": sum(1 for x in rp if x.get("ok")), "replay_n": len(rp),
            "replay_failed": [x["kernel"] for x in rp if not x.get("ok")],
            "restitch_identical": rs.get("identical"), "restitch_ratio": rs.get("ratio"), "restitch_replaced": rs.get("kernels_replaced"),
            "baseline_ms": rs.get("baseline_ms"), "restitched_ms": rs.get("restitched_ms"),
            "restitch_ci95": rs.get("ratio_ci95"), "restitch_within_noise": rs.get("within_noise"),
            "noise_floor": rs.get("noise_floor"), "rounds": len(rs.get("per_round") or []),
            "calls": (rs.get("plan") or {}).get("calls"),
            "restitch_against": rs.get("timed_against"),
            "restitch_why": (rs.get("difference") or {}).get("why") or rs.get("timing_skipped")
            or (f"round trip failed: {rs['error']}" if rs.get("error") else None),
            "eager_max_abs_diff": (r.get("check") or {}).get("max_abs_diff_vs_eager")}


def speedup_evidence(v: Dict[str, Any]) -> Dict[str, Any]:
    """The evidence of a verdict's ``performance:speedup`` check (speedup, ci95, noise_floor,
    per_round), empty when gate 4 did not run."""
    checks = [c for g in v.get("gates", []) for c in g["checks"]]
    perf = next((c for c in checks if c["gate"] == "performance" and c["name"] == "speedup"), None)
    return dict(perf["evidence"]) if perf else {}


def write_rows(path: Path, key: str, rows: List[Dict[str, Any]]) -> None:
    """Rows kept across device calls, committed: ``{KEY: [...]}`` with one row a line (compact,
    and a diff shows which rows a call changed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{{\"{key}\": [\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]}\n")


def verify_row(d: str, i: int, e: Dict[str, Any]) -> Dict[str, Any]:
    try:
        v = json.load(open(f"{d}/{i}.json"))
    except (OSError, ValueError):
        v = {"outcome": "no-verdict", "rejected_by": None, "gates": []}
    checks = [c for g in v.get("gates", []) for c in g["checks"]]
    ev = speedup_evidence(v)
    by = v.get("rejected_by") or ""
    first = next((c for c in checks if c["ok"] is False), None)
    ok = (e["expect"] == "pass" and (v["outcome"] == "accepted" or by.startswith("performance:"))) or \
         (e["expect"] == "reject" and any(by.startswith(w) for w in e["rejected_by"]))
    evidence = ""
    if first is not None:
        fe = dict(first["evidence"])
        fe.pop("per_round", None)
        evidence = json.dumps(fe, default=str)[:150]
    return {"candidate": e["candidate"], "kernel": e.get("kernel"), "exploit": e.get("exploit"), "expect": e["expect"],
            "outcome": v["outcome"], "rejected_by": by, "speedup": ev.get("speedup"), "ci95": ev.get("ci95"),
            "noise_floor": ev.get("noise_floor"), "evidence": evidence, "as_expected": ok}


def ci(r: Dict[str, Any]) -> str:
    """Interval and noise verdict of an interleaved round trip (captures from rev 2026-11-30 on)."""
    c, why = r.get("restitch_ci95"), r.get("restitch_why")
    if not c:
        return f" (not timed: {why})" if why else ""
    # Under CUDA graphs the re-stitched model is another compile's graph, timed against the
    # baseline's; the noise floor is the baseline's graph against itself.
    other = " (another compile's CUDA graph; floor: one graph against itself)" if str(
        r.get("restitch_against") or "").startswith("the baseline compile") else ""
    verdict = "within noise" if r.get("restitch_within_noise") else "beyond noise" + other + (f": {why}" if why else "")
    return f" ({c[0]:.3f}–{c[1]:.3f}, {verdict})"


def fmt(x: Optional[float], f: str) -> str:
    return format(x, f) if isinstance(x, (int, float)) else "-"


def calls_suffix(r: Dict[str, Any]) -> str:
    """`×CALLS` after a row's rounds where its round trip planned them (the calls a side per round
    after the first, since session 31), else nothing."""
    return f"×{r['calls']}" if r.get("calls") else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", metavar="OUT_DIR", help="where inspect.md, verify.md and summary.json go")
    ap.add_argument("dirs", metavar="SUITE_DIR", nargs="+", help="unpacked suite.tgz folders (suite/), in call order")
    a = ap.parse_args()
    out, dirs = a.out, a.dirs
    for d in dirs:
        if not os.path.isdir(d):
            ap.error(f"{d}: no such folder (an unpacked suite.tgz's suite/)")
    os.makedirs(out, exist_ok=True)
    expect = json.load(open(EXPECT))
    inspect: Dict[str, Dict[str, Dict[str, Any]]] = {}
    verify: Dict[int, Dict[str, Any]] = {}
    for d in dirs:
        for sub in sorted(os.listdir(d)):
            p = f"{d}/{sub}"
            if sub.startswith("inspect-"):
                mode = sub[len("inspect-"):]
                for f in sorted(os.listdir(p)):
                    if f.endswith(".log"):
                        inspect.setdefault(mode, {})[f[:-4]] = inspect_row(p, f[:-4])
            elif sub == "verify":
                for i, e in enumerate(expect):
                    if os.path.exists(f"{p}/{i}.log"):
                        verify[i] = verify_row(p, i, e)
    md: List[str] = []
    for mode, rows in sorted(inspect.items()):
        good = [r for r in rows.values() if r["ok"]]
        md.append(f"### mode `{mode}`: {len(good)}/{len(rows)} problems inspected\n")
        md.append("| problem | Triton | templ. | vendor | GPU µs/run | replaceable | replay ok | re-stitch identical | re-stitch T/T0 "
                  "| noise floor (rounds×calls) |")
        md.append("|---|---|---|---|---|---|---|---|---|---|")
        for name, r in sorted(rows.items()):
            if r["ok"]:
                md.append(f"| {name} | {r['triton']} | {r['templates']} | {r['vendor']} | {r['gpu_us']:.1f} | {r['replaceable_share'] * 100:.1f} % | "
                          f"{r['replay_ok']}/{r['replay_n']} | {r['restitch_identical']} | {fmt(r['restitch_ratio'], '.3f')}{ci(r).replace('|', '/')} | "
                          f"{fmt(r['noise_floor'], '.4f')} ({r['rounds']}{calls_suffix(r)}) |")
            else:
                md.append(f"| {name} | failed: {r['reason']} |||||||||")
        md.append("")
    open(f"{out}/inspect.md", "w").write("\n".join(md))
    vm = ["| candidate | exploit | expected | outcome | rejected by | first failing evidence | speedup (95 % CI; noise floor) | as expected |",
          "|---|---|---|---|---|---|---|---|"]
    for i, r in sorted(verify.items()):
        sp = f"{r['speedup']:.3f}× ({r['ci95'][0]:.2f}–{r['ci95'][1]:.2f}; {r['noise_floor']:.2f})" if isinstance(r["speedup"], float) else "-"
        cand = r["candidate"] + (f" (`--kernel {r['kernel']}`)" if r["kernel"] else "")
        vm.append(f"| {cand} | {r['exploit'] or '-'} | {r['expect']} | {r['outcome']} | {r['rejected_by'] or '-'} | "
                  f"{r['evidence'].replace('|', '/') or '-'} | {sp} | {'yes' if r['as_expected'] else 'NO'} |")
    vm.append(f"\n{sum(r['as_expected'] for r in verify.values())}/{len(verify)} as expected")
    open(f"{out}/verify.md", "w").write("\n".join(vm) + "\n")
    json.dump({"inspect": {m: list(r.values()) for m, r in inspect.items()}, "verify": [verify[i] for i in sorted(verify)]},
              open(f"{out}/summary.json", "w"), indent=1)
    for mode, rows in sorted(inspect.items()):
        print(f"inspect {mode}: {sum(r['ok'] for r in rows.values())}/{len(rows)}")
    print(f"verify: {sum(r['as_expected'] for r in verify.values())}/{len(verify)} as expected")


if __name__ == "__main__":
    main()
