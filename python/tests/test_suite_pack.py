"""scripts/device/suite.py's pack: a call cut at its limit still brings back the live daemon
store's rows, as a consistent copy (store-snapshot.db), never the live file itself."""

from __future__ import annotations

import importlib.util
import sqlite3
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

SUITE = Path(__file__).resolve().parents[2] / "scripts" / "device" / "suite.py"


def load_suite(work: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(sys, "argv", ["suite.py", "kforge", str(work / "k.sock"), str(work), str(out)])
    spec = importlib.util.spec_from_file_location("suite_under_test", SUITE)
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_a_pack_holds_a_snapshot_of_the_live_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "k.sock.d").mkdir()  # the daemon's socket folder: never packed
    live = sqlite3.connect(work / "store.db")  # the daemon's connection, still open, in WAL mode
    live.execute("pragma journal_mode=wal")
    live.execute("create table regions (id integer primary key, name text)")
    live.executemany("insert into regions (name) values (?)", [("inspect:round-trip",)] * 7)
    live.commit()
    (work / "inspect-default").mkdir()
    (work / "inspect-default" / "x.log").write_text("done\n")
    suite = load_suite(work, out, monkeypatch)
    suite.pack()
    with tarfile.open(out / "suite.tgz") as tf:
        names = tf.getnames()
        tf.extractall(tmp_path / "unpacked")
    assert "suite/store-snapshot.db" in names and "suite/inspect-default/x.log" in names
    assert not any(n.startswith("suite/store.db") or ".sock" in n or n.endswith(".tmp") for n in names)
    copy = sqlite3.connect(tmp_path / "unpacked" / "suite" / "store-snapshot.db")
    assert copy.execute("select count(*) from regions").fetchone()[0] == 7  # the committed rows, WAL included
    live.close()


def test_no_store_no_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    suite = load_suite(work, out, monkeypatch)
    suite.pack()
    with tarfile.open(out / "suite.tgz") as tf:
        assert not any("store" in n for n in tf.getnames())
