#!/usr/bin/env bash
# The verification cascade over the candidate corpus on the GPU machine (issue 7), one call.
# Builds nothing there: carry target/release/kforge. Runs every entry of
# tests/candidates/expect.json with `kforge verify --device 0` (performance gate included, the
# corpus' problems are small: expect honest candidates to be rejected by performance, with their
# measured speedup), writes $OUT/verify/<n>.json and prints one row per candidate last.
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
K=$PWD/target/release/kforge
test -x "$K" || { echo "carry target/release/kforge"; exit 2; }
mkdir -p "$OUT/verify"
nvidia-smi -L
python3 - "$K" "$OUT/verify" <<'PY'
import json, subprocess, sys
k, out = sys.argv[1], sys.argv[2]
rows = json.load(open("tests/candidates/expect.json"))
table = []
for i, e in enumerate(rows):
    j = f"{out}/{i}.json"
    pol = ["--policy", f"tests/candidates/{e['policy']}"] if e.get("policy") else []
    p = subprocess.run([k, "verify", "--device", "0", *pol, "--json", j, f"tests/candidates/{e['problem']}", f"tests/candidates/{e['candidate']}"],
                       capture_output=True, text=True)
    open(f"{out}/{i}.log", "w").write(p.stdout + p.stderr)
    try:
        v = json.load(open(j))
    except (OSError, ValueError):
        v = {"outcome": "no-verdict", "rejected_by": None, "gates": []}
    perf = next((c for g in v.get("gates", []) if g["gate"] == "performance" for c in g["checks"] if c["name"] == "speedup"), None)
    sp = perf["evidence"].get("speedup") if perf else None
    by = v.get("rejected_by") or ""
    ok = (e["expect"] == "pass" and (v["outcome"] == "accepted" or by.startswith("performance:"))) or \
         (e["expect"] == "reject" and any(by.startswith(w) for w in e["rejected_by"]))
    table.append((e["candidate"], v["outcome"], by, sp, ok))
json.dump(table, open(f"{out}/summary.json", "w"), indent=1)
print(f"{'CANDIDATE':<42} {'OUTCOME':<28} {'REJECTED BY':<34} {'SPEEDUP':>8} AS EXPECTED")
for c, o, by, sp, ok in table:
    print(f"{c:<42} {o:<28} {by:<34} {(f'{sp:.3f}x' if isinstance(sp, float) else '-'):>8} {'yes' if ok else 'NO'}")
print(f"{sum(r[4] for r in table)}/{len(table)} as expected")
PY
