"""scripts/device/autotuned.py: Inductor's autotuning results kept across sessions in a committed
JSON file, per GPU; exported from a cache and restored into a fresh one (a cache's own files
win), other files and other machines' results left alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "device" / "autotuned.py"
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def run(*args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def a_cache(root: Path) -> Path:
    (root / "cache").mkdir(parents=True)
    (root / "ab").mkdir()
    (root / "cache" / "0123abcd").write_text('{"system": {}, "cache": {"mm": 1}}')  # select_algorithm's timings
    (root / "ab" / "k.best_config").write_text('{"XBLOCK": 64}')
    (root / "ab" / "k.py").write_text("# generated code: not an autotuning result\n")
    (root / "ab" / "big.best_config").write_text("x" * ((256 << 10) + 1))
    (root / "ab" / "bin.best_config").write_bytes(b"\xff\xfe\x00")
    return root


def test_a_cache_exported_and_restored_into_a_fresh_one_on_the_same_gpu(tmp_path: Path) -> None:
    cache, kept, out = a_cache(tmp_path / "cache"), tmp_path / "kept.json", tmp_path / "autotuned.json"
    kept.write_text(json.dumps({"autotuned": 1, "machines": {H200: {"cd/old.best_config": '{"XBLOCK": 8}'},
                                                            H100: {"ef/earlier.best_config": '{"XBLOCK": 16}'}}}))
    r = run("export", str(cache), str(out), "--machine", H100, "--kept", str(kept))
    assert r.returncode == 0 and "3 autotuning results" in r.stdout, r.stdout + r.stderr
    text = out.read_text()
    d = json.loads(text)
    assert sorted(d["machines"][H100]) == ["ab/k.best_config", "cache/0123abcd", "ef/earlier.best_config"]
    assert d["machines"][H200] == {"cd/old.best_config": '{"XBLOCK": 8}'}, "another GPU's kept as it was"
    assert text.count("\n") >= 6, "one autotuning file a line"

    fresh = tmp_path / "fresh"
    (fresh / "ab").mkdir(parents=True)
    (fresh / "ab" / "k.best_config").write_text('{"XBLOCK": 128}')  # the cache's own: kept
    r = run("restore", str(out), str(fresh), "--machine", H100)
    assert r.returncode == 0 and "2 of 3" in r.stdout, r.stdout + r.stderr
    assert (fresh / "cache" / "0123abcd").read_text() == '{"system": {}, "cache": {"mm": 1}}'
    assert (fresh / "ef" / "earlier.best_config").read_text() == '{"XBLOCK": 16}'
    assert (fresh / "ab" / "k.best_config").read_text() == '{"XBLOCK": 128}'
    assert not (fresh / "cd").exists(), "the H200's results are not this H100's"


def test_a_file_of_another_format_is_refused_and_paths_stay_inside_the_cache(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"decisions": 1}')
    r = run("restore", str(bad), str(tmp_path / "c"), "--machine", H100)
    assert r.returncode == 1 and "not an autotuning file of version 1" in r.stderr
    evil = tmp_path / "evil.json"
    evil.write_text(json.dumps({"autotuned": 1, "machines": {H100: {"../outside.best_config": "{}",
                                                                    "cache/ok": "{}"}}}))
    r = run("restore", str(evil), str(tmp_path / "c"), "--machine", H100)
    assert r.returncode == 0 and "1 of 2" in r.stdout and not (tmp_path / "outside.best_config").exists()
