"""scripts/check-tree-size on a temporary git repository: oversize files under bench/ and binary
archives or stores anywhere fail it, by name; untracked files and the same size elsewhere do not."""

from __future__ import annotations

import gzip
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "check-tree-size")
LIMIT = 512 * 1024


def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "bench" / "results" / "x").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(r)], check=True)
    (r / "bench" / "results" / "x" / "README.md").write_text("# x\n")
    return r


def track(r: Path, *paths: str) -> None:
    subprocess.run(["git", "-C", str(r), "add", *paths], check=True)


def check(r: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, SCRIPT, str(r)], capture_output=True, text=True)


def test_a_small_tree_passes(tmp_path: Path) -> None:
    r = repo(tmp_path)
    (r / "bench" / "results" / "x" / "summary.json").write_text("{}" + " " * (LIMIT - 2))  # exactly the limit
    (r / "src.rs").write_text("x" * (2 * LIMIT))  # large, but not under bench/
    track(r, ".")
    got = check(r)
    assert got.returncode == 0 and got.stderr == "", got.stderr


def test_an_oversize_file_under_bench_fails_by_name(tmp_path: Path) -> None:
    r = repo(tmp_path)
    (r / "bench" / "results" / "x" / "report.json").write_text("{}" + " " * (LIMIT - 1))  # one byte over
    track(r, ".")
    got = check(r)
    assert got.returncode == 1
    assert "bench/results/x/report.json is 512.0 KiB, over the 512 KiB limit" in got.stderr, got.stderr


def test_archives_and_stores_fail_by_name_or_by_content(tmp_path: Path) -> None:
    r = repo(tmp_path)
    (r / "state.tgz").write_bytes(gzip.compress(b"x"))
    (r / "docs").mkdir()
    (r / "docs" / "notes.txt").write_bytes(gzip.compress(b"a gzip stream under another name"))
    sqlite3.connect(r / "bench" / "results" / "x" / "store").execute("create table t (x)").connection.commit()
    (r / "empty.zip").write_bytes(b"")
    track(r, ".")
    got = check(r)
    assert got.returncode == 1
    for name in ("state.tgz", "docs/notes.txt", "bench/results/x/store", "empty.zip"):
        assert f"check-tree-size: {name} is a binary archive or database" in got.stderr, got.stderr


def test_untracked_files_do_not_count_in_a_checkout(tmp_path: Path) -> None:
    r = repo(tmp_path)
    track(r, ".")
    (r / "bench" / "results" / "x" / "state.tgz").write_bytes(gzip.compress(b"x" * (2 * LIMIT)))
    assert check(r).returncode == 0
    track(r, ".")
    assert "bench/results/x/state.tgz" in check(r).stderr


def test_outside_git_every_file_counts(tmp_path: Path) -> None:
    d = tmp_path / "plain"
    (d / "bench").mkdir(parents=True)
    (d / "bench" / "big.json").write_text(" " * (LIMIT + 1))
    got = check(d)
    assert got.returncode == 1 and "bench/big.json is 512.0 KiB" in got.stderr, got.stderr


def test_the_repository_itself_passes() -> None:
    got = check(ROOT)
    assert got.returncode == 0, got.stderr
