"""Issue 17 (b), per suite problem at the large preset, over as many device calls and sessions as it
takes: each call's `scripts/device/verify_scale.sh` output ($OUT/verify_scale.json, every verdict
whole) merged into one compact committed file, a row per problem, from which the next call's SKIP
list comes (a fresh tree keeps nothing else: devstate/ is gone between sessions).

    python3 scripts/analysis/verify_scale_merge.py merge CALL_JSON [--kept FILE]
    python3 scripts/analysis/verify_scale_merge.py done [--warm] [--kept FILE]   > skip.txt
    python3 scripts/analysis/verify_scale_merge.py table [--kept FILE]

FILE defaults to bench/results/verify-scale/per_problem.json. A row of a later call replaces an
earlier one's; a row without a verify verdict (the call was cut before it, the harness failed)
is kept but not listed as done, so the next call runs it again. The table is the README's:
the naive harness's and verify's wall seconds, their ratio (issue 17's goal: at most 3), the GPU
memory peak, the verdict and where verify's time went.

A warm verify (`--daemon --warm`, WARM=1) keeps its own GPU and the naive harness's seconds of
its own call: a call with WARM_ONLY=1 adds the warm verify to a row whose cold verify ran on
another card, and its ratio compares with the naive harness on its own card. `done --warm` lists
the rows with a warm verdict (WARM_ONLY's SKIP list).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite_report import speedup_evidence, write_rows  # noqa: E402  (one reader of the results)

ROOT = Path(__file__).resolve().parents[2]
KEPT = ROOT / "bench" / "results" / "verify-scale" / "per_problem.json"
#: The phases a row keeps (verify's phase_seconds), in the table's order.
PHASES = ("setup.import-torch", "setup.prime-torch-compile", "checks", "baseline-compile-beside-checks", "timing",
          "total")


def compact(row: Dict[str, Any]) -> Dict[str, Any]:
    """One verify_scale.sh row cut to what the table needs; a warm verify with its call's GPU and
    naive seconds (its ratio's own)."""
    out: Dict[str, Any] = {"name": row["name"]}
    if row.get("gpu"):  # the call's GPU (calls before it named none: the merge keeps an earlier name)
        out["gpu"] = row["gpu"]
    for what in ("naive-host", "naive-device"):
        if isinstance(row.get(what), dict):
            r = row[what]
            out[what] = {"exit": r.get("exit"), "seconds": r.get("seconds"), "error": (r.get("error") or "")[-300:] or None}
    for what in ("verify", "verify-warm"):  # cold; through a forking warm worker (WARM=1)
        v = row.get(what)
        if isinstance(v, dict):
            verdict = v.get("verdict") or {}
            phases = verdict.get("phase_seconds") or {}
            out[what] = {
                "exit": v.get("exit"), "seconds": v.get("seconds"), "gpu_memory_peak_mib": v.get("gpu_memory_peak_mib"),
                "outcome": verdict.get("outcome"), "rejected_by": verdict.get("rejected_by"),
                "speedup": speedup_evidence(verdict).get("speedup"),
                "phase_seconds": {k: phases[k] for k in PHASES if k in phases},
                "error": (v.get("verdict_error") or "")[-300:] or None,
            }
    naive = row.get("naive-device")
    if "verify-warm" in out:
        out["verify-warm"]["gpu"] = row.get("gpu")
        ok = isinstance(naive, dict) and naive.get("exit") == 0
        out["verify-warm"]["naive_seconds"] = naive.get("seconds") if isinstance(naive, dict) and ok else None
    return out


def has_verdict(row: Dict[str, Any], what: str = "verify") -> bool:
    return bool(row.get(what, {}).get("outcome"))


def read(kept: Path) -> List[Dict[str, Any]]:
    return json.loads(kept.read_text())["rows"] if kept.exists() else []


def merge(kept: List[Dict[str, Any]], call: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    rows = {r["name"]: r for r in kept}
    for r in call:
        c = compact(r)
        old = rows.get(c["name"], {})
        if "verify" not in c and "verify" in old:
            # A warm-only call (WARM_ONLY=1): its warm verify added, the cold row's parts kept
            # (its naive run and GPU are the warm verify's own).
            rows[c["name"]] = {**old, **{k: v for k, v in c.items() if k == "verify-warm"}}
            continue
        # A call that ran only part of a row (verify alone, say) keeps the earlier parts.
        rows[c["name"]] = {**old, **c}
    return [rows[k] for k in sorted(rows)]


def cell(x: Optional[float], fmt: str = "%.1f") -> str:
    return fmt % x if isinstance(x, (int, float)) else "-"


def table(rows: List[Dict[str, Any]]) -> str:
    head = ("| problem (its eager forward as the candidate) | GPU | naive, device inputs (s) | `kforge verify` (s) "
            "| ÷ naive | GPU peak (GiB) | verdict | import torch | prime compile | checks | timing "
            "| `--daemon --warm` (s) | ÷ naive |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        v, nd = r.get("verify", {}), r.get("naive-device", {})
        secs, naive = v.get("seconds"), nd.get("seconds")
        peak = v.get("gpu_memory_peak_mib")
        verdict = " by ".join(x for x in (v.get("outcome") or "no verdict", v.get("rejected_by")) if x)
        if isinstance(v.get("speedup"), (int, float)):
            verdict += f" ({v['speedup']:.3f}×)"
        ph = v.get("phase_seconds", {})
        warm = warm_cell(r)
        lines.append(f"| {r['name']} | {short_gpu(r.get('gpu'))} | {cell(naive)} | {cell(secs)} | {cell(ratio(r, 'verify'), '%.2f')} | "
                     f"{cell(float(peak) / 1024 if peak else None)} | {verdict} | {cell(ph.get('setup.import-torch'))} | "
                     f"{cell(ph.get('setup.prime-torch-compile'))} | {cell(ph.get('checks'))} | {cell(ph.get('timing'))} | "
                     f"{warm} |")
    done = [r for r in rows if has_verdict(r)]
    lines.append("")
    lines.append(f"{len(done)}/{len(rows)} with a verdict")
    warmed = [r for r in rows if has_verdict(r, "verify-warm")]
    for gpu in sorted({short_gpu(r.get("gpu")) for r in done} | {warm_gpu(r) for r in warmed}):
        on_gpu = [r for r in rows if short_gpu(r.get("gpu")) == gpu]
        ratios = ratios_of([r for r in on_gpu if has_verdict(r)], "verify")
        lines.append(f"- {gpu}: {len(ratios)}; verify ÷ naive: " + ratio_summary(ratios))
        warm_ratios = ratios_of([r for r in warmed if warm_gpu(r) == gpu], "verify-warm")
        if warm_ratios:
            lines.append(f"  - warm verifies on this card: {len(warm_ratios)}, through a forking warm worker (`--daemon --warm`); ÷ naive: "
                         + ratio_summary(warm_ratios))
    return "\n".join(lines)


def ratio(r: Dict[str, Any], what: str) -> Optional[float]:
    """Row ``r``'s ``what`` (``verify``, ``verify-warm``) seconds ÷ its naive harness's (a warm
    verify's: that of its own call, where it kept one); None without both."""
    run = r.get(what, {})
    naive = run.get("naive_seconds") if run.get("naive_seconds") else r.get("naive-device", {}).get("seconds")
    secs = run.get("seconds")
    return float(secs) / float(naive) if secs and naive else None


def warm_gpu(r: Dict[str, Any]) -> str:
    """The card row ``r``'s warm verify ran on (its row's when it names none)."""
    return short_gpu(r.get("verify-warm", {}).get("gpu") or r.get("gpu"))


def ratios_of(rows: List[Dict[str, Any]], what: str) -> List[float]:
    """The rows' ratios (:func:`ratio`) where they have one."""
    return [x for x in (ratio(r, what) for r in rows) if x is not None]


def short_gpu(name: Optional[str]) -> str:
    """``NVIDIA H100 80GB HBM3`` → ``H100``; a row without a name: ``-``."""
    words = [w for w in (name or "").split() if w.upper() != "NVIDIA"]
    return words[0] if words else (name or "-")


def ratio_summary(ratios: List[float]) -> str:
    if not ratios:
        return "none yet"
    return (f"median {sorted(ratios)[len(ratios) // 2]:.2f}, max {max(ratios):.2f}, "
            f"{sum(x <= 3 for x in ratios)}/{len(ratios)} at most 3")


def warm_cell(r: Dict[str, Any]) -> str:
    """Row ``r``'s warm verify: its seconds and ratio; its verdict when it differs from the cold
    one's."""
    w, cold = r.get("verify-warm", {}), r.get("verify", {})
    if not w:
        return "- | -"
    same = (w.get("outcome"), w.get("rejected_by")) == (cold.get("outcome"), cold.get("rejected_by"))
    note = "" if same else f" ({w.get('outcome') or 'no verdict'}{' by ' + w['rejected_by'] if w.get('rejected_by') else ''})"
    if warm_gpu(r) != short_gpu(r.get("gpu")):
        note += f" ({warm_gpu(r)})"
    return f"{cell(w.get('seconds'))}{note} | {cell(ratio(r, 'verify-warm'), '%.2f')}"


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="verify_scale_merge.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("merge", "done", "table"))
    ap.add_argument("call", nargs="?", help="merge: the call's verify_scale.json")
    ap.add_argument("--kept", type=Path, default=KEPT)
    ap.add_argument("--warm", action="store_true", help="done: the rows with a warm verify's verdict")
    a = ap.parse_args(argv)
    rows = read(a.kept)
    if a.what == "merge":
        if not a.call:
            ap.error("merge needs the call's verify_scale.json")
        rows = merge(rows, json.loads(Path(a.call).read_text()))
        write_rows(a.kept, "rows", rows)
        print(f"{a.kept}: {sum(map(has_verdict, rows))}/{len(rows)} problems with a verdict")
    elif a.what == "done":
        print("\n".join(r["name"] for r in rows if has_verdict(r, "verify-warm" if a.warm else "verify")))
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
