"""The summary of scripts/device/llm_search.sh: every candidate of the first run against
tests/llm/h200/expect.json, the replay's agreement, the calls' cost and the region time of the
verify jobs; W/llm_search.json and a table on stdout."""
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any, Dict, List


def matches(expected: str, actual: str) -> bool:
    return any(actual.startswith(alt) if alt else actual == "" for alt in expected.split("|"))


def rows(first: Dict[str, Dict[str, Any]], expect: Dict[str, Any]) -> List[Dict[str, Any]]:
    out = []
    for problem, want in expect.items():
        got = {c["id"]: c for c in first.get(problem, {}).get("llm", {}).get("candidates", [])}
        for cid, e in want.items():
            c = got.get(cid, {})
            verdict, gate = c.get("verdict", "missing"), c.get("gate") or ""
            ok = matches(e["verdict"], verdict) and matches(e["gate"], gate) and c.get("exploit", False) == e.get("exploit", c.get("exploit", False))
            out.append({"problem": problem, "candidate": cid, "what": e["what"], "verdict": verdict, "gate": gate,
                        "exploit": c.get("exploit"), "speedup": c.get("speedup"), "as_expected": ok})
    return out


def tier(m: Any, c: Any) -> str:
    """kforge_agents::analyst::Tier::of."""
    if m is None or c is None:
        return "unknown"
    if m > 80 or c > 80:
        return "near-optimal"
    if m < 40 and c < 40:
        return "under-utilized"
    return "memory-bound" if m >= c else "compute-bound"


def profile_summary(w: Path) -> Dict[str, Any]:
    """Per problem, the llm step's profile (llm/profile-*.json): its kernels' tiers, or the
    progress line that said why there was none."""
    out: Dict[str, Any] = {}
    log = (w / "first.log").read_text(errors="replace") if (w / "first.log").exists() else ""
    for llm in sorted((w / "out").glob("**/llm")):
        problem = llm.parent.name
        files = sorted(llm.glob("profile-*.json"))
        if files:
            ks = json.loads(files[0].read_text()).get("kernels", [])
            out[problem] = {"kernels": len(ks), "tiers": [tier(k.get("sol_memory_pct"), k.get("sol_compute_pct")) for k in ks]}
        else:
            why = [line for line in log.splitlines() if "no profile of the baseline" in line]
            out[problem] = {"kernels": 0, "why": why[-1][-300:] if why else "no profile step ran (the CPU device, or --llm-no-profile)"}
    return out


def main() -> int:
    w, rc1, rc2, s1, s2 = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    expect = json.loads(Path(sys.argv[6] if len(sys.argv) > 6 else "tests/llm/h200/expect.json").read_text())
    # The replay overwrote each report.json: the first run's candidates are read from the journal.
    db = sqlite3.connect(w / "out" / "journal.db")
    runs = [r[0] for r in db.execute("SELECT id FROM optimize_runs ORDER BY id")]
    by_run: Dict[int, List[Any]] = {r: [] for r in runs}
    for run, problem, cand, verdict, gate, exploit, speedup, h in db.execute(
            "SELECT run, problem, candidate, verdict, gate, exploit, speedup, content_hash FROM optimize_llm_candidates ORDER BY run, problem, candidate"):
        by_run[run].append((Path(problem).stem, cand, verdict, gate, bool(exploit), speedup, h))
    journaled = {p: {} for p in expect}
    for problem, cand, verdict, gate, exploit, speedup, _ in by_run.get(runs[0], []):
        journaled.setdefault(problem, {})[cand] = {"id": cand, "verdict": verdict, "gate": gate, "exploit": exploit, "speedup": speedup}
    first_view = {p: {"llm": {"candidates": list(c.values())}} for p, c in journaled.items()}
    table = rows(first_view, expect)
    strip = lambda rs: [(p, c, v, g, h) for p, c, v, g, _, _, h in rs]
    replay_same = len(runs) > 1 and strip(by_run[runs[0]]) == strip(by_run[runs[1]])
    calls = {run: db.execute("SELECT COUNT(*), COALESCE(SUM(prompt_tokens+completion_tokens),0), COALESCE(SUM(replayed),0) FROM llm_calls WHERE run=?", (run,)).fetchone() for run in runs}
    try:
        rep = json.loads((w / "daemon-report.json").read_text())
        verify_jobs = [j for j in rep.get("jobs", []) if str(j.get("label", "")).startswith("verify:")]
    except (OSError, ValueError):
        verify_jobs = []
    profiles = profile_summary(w)
    summary = {"exit": [rc1, rc2], "wall_s": [s1, s2], "candidates": table, "replay_identical": replay_same,
               "profiles": profiles,
               "calls": {str(r): {"calls": c[0], "tokens": c[1], "replayed": c[2]} for r, c in calls.items()},
               "verify_jobs": len(verify_jobs), "all_as_expected": all(r["as_expected"] for r in table)}
    (w / "llm_search.json").write_text(json.dumps(summary, indent=1))
    print(f"runs exit {rc1}/{rc2}, wall {s1} s / {s2} s; verify jobs through the daemon: {len(verify_jobs)}")
    for r, c in calls.items():
        print(f"run {r}: {c[0]} calls, {c[1]} tokens, {c[2]} replayed")
    print(f"replay identical: {replay_same}; every verdict as expected: {summary['all_as_expected']}")
    for problem, p in profiles.items():
        print(f"profile step, {problem}: {p}")
    print(f"{'problem':<28} {'candidate':<13} {'verdict':<28} {'check':<28} {'speedup':>8}  ok  what")
    for r in table:
        sp = f"{r['speedup']:.3f}x" if r["speedup"] else "-"
        print(f"{r['problem']:<28} {r['candidate']:<13} {r['verdict']:<28} {r['gate'] or '':<28} {sp:>8}  {'yes' if r['as_expected'] else 'NO '} {r['what']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
