"""Inductor's autotuning results carried across sessions in a small committed JSON file.

A campaign's state pack (`campaign.sh`'s STATE) lives in `devstate/`, which does not outlive a
session, and a fresh machine's Inductor cache is empty: a max-autotune compile that outlives one
call (level3/007's baseline in issue 18's large-max-autotune third) then starts its benchmarks
over in every session and never finishes. Its autotuning results are small text files: the
timings of every template choice select_algorithm benchmarked (`cache/<system hash>`, written
after each op) and each Triton kernel's chosen config (`*.best_config`). This keeps them, per
GPU, in one JSON file (one file a line) that the campaign's calls restore from and export to.

    python3 scripts/device/autotuned.py export CACHE OUT_JSON --machine NAME [--kept FILE]
    python3 scripts/device/autotuned.py restore FILE CACHE --machine NAME

`export` writes OUT_JSON: FILE's entries (`--kept`, the committed file: every machine's) with
this machine's files of CACHE over them. `restore` writes this machine's files of FILE into CACHE
where CACHE has none of that name (a cache's own files win). A file over `FILE_MAX` bytes, or
not UTF-8, is left out; so is a machine's whole set over `MACHINE_MAX` (said, not silently).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List

#: The file format's version.
VERSION = 1
#: The largest autotuning file kept (select_algorithm's timings of a large model: tens of KiB).
FILE_MAX = 256 << 10
#: The most one machine's files may hold together: the file is committed.
MACHINE_MAX = 2 << 20


def autotuning_files(cache: Path) -> Dict[str, str]:
    """The cache's autotuning results by path relative to it: `cache/*` and `*.best_config`,
    those that are UTF-8 and at most `FILE_MAX` bytes."""
    found: Dict[str, str] = {}
    if not cache.is_dir():
        return found
    for p in sorted(cache.rglob("*")):
        rel = p.relative_to(cache).as_posix()
        if not p.is_file() or not (rel.startswith("cache/") or rel.endswith(".best_config")):
            continue
        if p.stat().st_size > FILE_MAX:
            continue
        try:
            found[rel] = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
    return found


def read(path: Path) -> Dict[str, Dict[str, str]]:
    """A file's entries per machine; none when it does not exist."""
    if not path.exists():
        return {}
    d = json.loads(path.read_text(encoding="utf-8"))
    if d.get("autotuned") != VERSION:
        raise ValueError(f"{path}: not an autotuning file of version {VERSION}")
    machines: Dict[str, Dict[str, str]] = d["machines"]
    return machines


def text_of(machines: Dict[str, Dict[str, str]]) -> str:
    """The file's text: per machine, one autotuning file a line, in path order."""
    blocks: List[str] = []
    for machine in sorted(machines):
        files = machines[machine]
        lines = ",\n".join(f"{json.dumps(k)}: {json.dumps(files[k], ensure_ascii=False)}" for k in sorted(files))
        blocks.append(f"{json.dumps(machine)}: {{\n{lines}\n}}")
    return f'{{"autotuned": {VERSION}, "machines": {{\n' + ",\n".join(blocks) + "\n}}\n"


def export(cache: Path, out: Path, machine: str, kept: Path) -> str:
    machines = read(kept)
    files = {**machines.get(machine, {}), **autotuning_files(cache)}
    size = sum(len(v.encode()) for v in files.values())
    if size > MACHINE_MAX:
        return f"autotuned: {len(files)} files of {machine} hold {size} bytes, over {MACHINE_MAX}: not written"
    machines[machine] = files
    out.write_text(text_of(machines), encoding="utf-8")
    return f"autotuned: {len(files)} autotuning results of {machine} in {out} ({size} bytes)"


def restore(path: Path, cache: Path, machine: str) -> str:
    files = read(path).get(machine, {})
    written = 0
    for rel, text in files.items():
        target = cache / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute() or target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written += 1
    return f"autotuned: {written} of {len(files)} autotuning results of {machine} restored into {cache}"


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="autotuned.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    e = sub.add_parser("export", help="the cache's autotuning results into OUT_JSON, over --kept's")
    e.add_argument("cache", type=Path)
    e.add_argument("out", type=Path)
    e.add_argument("--machine", required=True)
    e.add_argument("--kept", type=Path, default=Path("/nonexistent"))
    r = sub.add_parser("restore", help="this machine's autotuning results of FILE into CACHE")
    r.add_argument("file", type=Path)
    r.add_argument("cache", type=Path)
    r.add_argument("--machine", required=True)
    a = ap.parse_args(argv)
    try:
        if a.what == "export":
            print(export(a.cache, a.out, a.machine, a.kept))
        else:
            print(restore(a.file, a.cache, a.machine))
    except (ValueError, KeyError, OSError) as err:
        print(f"autotuned: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
