"""The serial and the in-flight phase of scripts/device/serial_compare.sh, side by side.

    python3 scripts/device/serial_compare.py SERIAL_SUMMARY PARALLEL_SUMMARY OUT_JSON

Per task both phases finished: its seconds alone and in flight, its exit status in each, and for
verify tasks both verdicts (they must agree: the same candidate, the same cascade). Totals over
those tasks: the serial wall (their seconds alone, summed), the in-flight wall (the phase's wall
when it finished every one of them), the speedup, the stretch of a task's own seconds, and each
phase's memory record (out-of-memory retries). Writes OUT_JSON and prints a table last.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional


def load(path: str) -> Dict[str, Any]:
    try:
        with open(path) as f:
            data: Dict[str, Any] = json.load(f)
            return data
    except (OSError, ValueError) as e:
        sys.exit(f"serial_compare: cannot read {path}: {e} (did the phase reach its end? see its .out)")


def finished(summary: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {t["key"]: t for t in summary.get("tasks", []) if "s" in t}


def verdicts(summary: Dict[str, Any]) -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {}
    for r in summary.get("verify-eager", []):
        out[f"verify-eager/{r['candidate']}"] = r["outcome"] + (f" by {r['rejected_by']}" if r.get("rejected_by") else "")
    return out


def compare(serial: Dict[str, Any], par: Dict[str, Any]) -> Dict[str, Any]:
    s_done, p_done = finished(serial), finished(par)
    s_ver, p_ver = verdicts(serial), verdicts(par)
    keys = [k for k in s_done if k in p_done]
    rows: List[Dict[str, Any]] = []
    for k in keys:
        rows.append({"task": k, "serial_s": s_done[k]["s"], "in_flight_s": p_done[k]["s"],
                     "stretch": round(p_done[k]["s"] / s_done[k]["s"], 2) if s_done[k]["s"] else None,
                     "rc": [s_done[k]["rc"], p_done[k]["rc"]], "verdicts": [s_ver.get(k), p_ver.get(k)]})
    serial_wall = round(sum(r["serial_s"] for r in rows), 1)
    all_in_par = len(p_done) == len(keys)
    par_wall = par.get("wall_s") if all_in_par else None
    return {"tasks_compared": len(keys), "serial_tasks": len(s_done), "in_flight_tasks": len(p_done),
            "in_flight": par.get("parallel"), "serial_wall_s": serial_wall, "serial_phase_wall_s": serial.get("wall_s"),
            "in_flight_wall_s": par_wall, "speedup": round(serial_wall / par_wall, 2) if par_wall else None,
            "verdicts_agree": all(r["verdicts"][0] == r["verdicts"][1] for r in rows),
            "exit_codes_agree": all(r["rc"][0] == r["rc"][1] for r in rows),
            "memory": {"serial": serial.get("memory"), "in_flight": par.get("memory")}, "rows": rows}


def table(c: Dict[str, Any]) -> None:
    print(f"{'TASK':<50} {'ALONE_S':>8} {'IN_FLIGHT_S':>11} {'STRETCH':>7}  VERDICT (alone / in flight)")
    for r in c["rows"]:
        v = " / ".join(str(x) for x in r["verdicts"]) if r["verdicts"][0] else f"rc {r['rc'][0]} / {r['rc'][1]}"
        print(f"{r['task']:<50} {r['serial_s']:>8.1f} {r['in_flight_s']:>11.1f} {r['stretch']:>7}  {v}")
    print(f"{c['tasks_compared']} tasks: serial {c['serial_wall_s']} s, {c['in_flight']} in flight "
          f"{c['in_flight_wall_s']} s, speedup {c['speedup']}; verdicts agree: {c['verdicts_agree']}, "
          f"exit codes agree: {c['exit_codes_agree']}")
    for phase, m in c["memory"].items():
        if m:
            print(f"{phase}: {m['jobs']} jobs, {m['retried_alone']} retried alone, peak {m['peak_gib_max']:.1f} GiB")


def main() -> int:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    c = compare(load(sys.argv[1]), load(sys.argv[2]))
    with open(sys.argv[3], "w") as f:
        json.dump(c, f, indent=1)
    table(c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
