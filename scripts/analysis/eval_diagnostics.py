#!/usr/bin/env python3
"""Diagnostics of a runtime-evaluation state directory (issue 5): why inflation is what it is.

Usage: python3 scripts/analysis/eval_diagnostics.py STATE_DIR

Per run (store label): commands measured, median number of timed samples (all and matmul), the
share of commands whose last five samples are > 5 % slower than their first five (kernels that
slow down under sustained load), and the SM clock / temperature at region grant and release.
Then, for every pair of runs A, B on the same GPU, p50 and p95 over commands of
median_B / median_A - 1 (B's inflation relative to A: with A the `command` run — the ground-truth
protocol — this is a same-GPU inflation figure). Last, where the ground truth was taken on more than
one GPU (a `truth-pair` step: one store per GPU), the same command's truth on one GPU relative to
another's, per duration bucket: how far two H200s of one host agree. Reads every store the
manifests name, the SQLite store, the workload and the manifests (Python standard library).
"""

from __future__ import annotations

import glob
import json
import os
import sqlite3
import statistics as st
import sys
from typing import Dict, List


def q(xs: List[float], p: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = p * (len(s) - 1)
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def main(state: str) -> int:
    manifests = [json.load(open(m)) for m in sorted(glob.glob(os.path.join(state, "*.run.json")))]
    if not manifests:
        print(f"{state}: no *.run.json manifests", file=sys.stderr)
        return 2
    cmds = {json.loads(l)["id"]: json.loads(l) for l in open(os.path.join(state, os.path.basename(manifests[0]["workload"])))}
    device = {m["label"]: m["device"] for m in manifests}
    samples: Dict[str, Dict[str, List[float]]] = {}
    regions: Dict[str, List[tuple]] = {}
    # Each store is read for the labels of the manifests that name it (a label in two stores is
    # refused: its rows would mix).
    labels_of: Dict[str, List[str]] = {}
    for m in manifests:
        labels_of.setdefault(os.path.basename(m["db"]), []).append(m["label"])
    seen: Dict[str, str] = {}
    for store, labels in sorted(labels_of.items()):
        for label in labels:
            if seen.setdefault(label, store) != store:
                print(f"{state}: label {label} is named in two stores ({seen[label]} and {store})", file=sys.stderr)
                return 2
        path = os.path.join(state, store)
        if not os.path.exists(path):
            print(f"{state}: store {store} named by a manifest is missing", file=sys.stderr)
            return 2
        db = sqlite3.connect(path)
        marks = ",".join("?" * len(labels))
        for label, name, s in db.execute("select j.label, m.name, m.samples_ms from measurements m join jobs j on m.job = j.id "
                                         f"where m.valid = 1 and j.label in ({marks})", labels):
            samples.setdefault(label, {})[name] = json.loads(s)
        for row in db.execute("select j.label, r.sm_clock_mhz_granted, r.sm_clock_mhz_released, r.gpu_temp_c_granted, r.gpu_temp_c_released "
                              f"from regions r join jobs j on r.job = j.id where j.label in ({marks})", labels):
            regions.setdefault(row[0], []).append(row[1:])
    print(f"{'RUN':<24} {'CMDS':>5} {'N_MED':>6} {'N_MM':>5} {'SLOWS':>6} {'MHZ_G/R p50':>12} {'MHZ_R min':>9} {'C_G/R p50':>10}")
    for label in sorted(samples):
        d = samples[label]
        mm = [len(v) for k, v in d.items() if cmds.get(k, {}).get("operator") == "matmul"]
        slow = sum(1 for v in d.values() if len(v) >= 10 and st.mean(v[-5:]) > 1.05 * st.mean(v[:5]))
        rg = regions.get(label, [])
        g = [r[0] for r in rg if r[0]]
        rel = [r[1] for r in rg if r[1]]
        tg = [r[2] for r in rg if r[2]]
        tr = [r[3] for r in rg if r[3]]
        clocks = f"{st.median(g):.0f}/{st.median(rel):.0f}" if g and rel else "-"
        temps = f"{st.median(tg):.0f}/{st.median(tr):.0f}" if tg and tr else "-"
        print(f"{label:<24} {len(d):>5} {st.median([len(v) for v in d.values()]):>6.0f} {(st.median(mm) if mm else 0):>5.0f} "
              f"{slow / len(d) * 100:>5.1f}% {clocks:>12} {(min(rel) if rel else 0):>9} {temps:>10}")
    print()
    print(f"{'B relative to A (same GPU)':<50} {'N':>4} {'p50':>8} {'p95':>8}")
    labels = sorted(samples)
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            if device.get(a) != device.get(b):
                continue
            common = sorted(set(samples[a]) & set(samples[b]))
            r = [st.median(samples[b][k]) / st.median(samples[a][k]) - 1 for k in common]
            if len(r) >= 5:
                print(f"{b + ' rel. to ' + a:<50} {len(r):>4} {q(r, 0.5) * 100:>7.2f}% {q(r, 0.95) * 100:>7.2f}%")
    truth_across_gpus(manifests, samples)
    return 0


BUCKETS = [("<0.1ms", 0.0, 0.1), ("0.1-1ms", 0.1, 1.0), ("1-10ms", 1.0, 10.0), (">10ms", 10.0, float("inf"))]


def truth_across_gpus(manifests: List[dict], samples: Dict[str, Dict[str, List[float]]]) -> None:
    """Each GPU's cold ground truth (all its parts) relative to the first GPU's, per duration
    bucket (a warm truth, timed without process start-up, is another protocol: left out)."""
    per_gpu: Dict[str, Dict[str, float]] = {}
    for m in manifests:
        if m["kind"] == "truth" and not m.get("warm") and not m["device"].startswith("all: "):
            for k, v in samples.get(m["label"], {}).items():
                per_gpu.setdefault(m["device"], {})[k] = st.median(v)
    gpus = sorted(per_gpu)
    if len(gpus) < 2:
        return
    ref = per_gpu[gpus[0]]
    rows = []
    for g in gpus[1:]:
        other = per_gpu[g]
        for name, lo, hi in BUCKETS + [("all", 0.0, float("inf"))]:
            r = [other[k] / ref[k] - 1 for k in sorted(set(ref) & set(other)) if lo <= ref[k] < hi]
            if r:
                rows.append(f"{short(g):<18} {name:<8} {len(r):>4} {q(r, 0.5) * 100:>7.2f}% {q(r, 0.05) * 100:>7.2f}% "
                            f"{q(r, 0.95) * 100:>7.2f}% {q([abs(x) for x in r], 0.95) * 100:>7.2f}%")
    if rows:
        print()
        print(f"ground truth on GPU B relative to GPU {short(gpus[0])} (the same commands)")
        print(f"{'GPU B':<18} {'BUCKET':<8} {'N':>4} {'p50':>8} {'p5':>8} {'p95':>8} {'|x| p95':>8}")
        print("\n".join(rows))


def short(device: str) -> str:
    """`0 (NVIDIA H200, 140 GiB, GPU-b4d4b180-…)` → `0 GPU-b4d4b180`: index and UUID head."""
    index = device.split(" (")[0]
    uuid = next((p.strip().rstrip(")") for p in device.split(",") if p.strip().startswith("GPU-")), "")
    return f"{index} {uuid[:12]}".strip()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
