"""The suite.sh task keys bench/results/large-suite/large_suite.json already holds, one a line:
the SKIP file for the calls that finish the large-preset suite (issue 17).

    python3 scripts/device/large_suite_done.py > /tmp/done.txt
    SKIP=/tmp/done.txt SIZE=large PARALLEL=5 INTERLEAVE=1 DEADLINE_S=400 bash scripts/device/suite.sh verify-eager inspect:default
"""
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "large-suite" / "large_suite.json"


def main() -> int:
    problems = json.loads(RESULTS.read_text())["problems"]
    keys = [f"inspect-default/{name}" for name, r in problems.items() if r.get("inspect")]
    keys += [f"verify-eager/{name}" for name, r in problems.items() if r.get("verify")]
    print("\n".join(sorted(keys)))
    print(f"{len(keys)} tasks done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
