"""Shared fixtures: a clean kforge environment and a tiny fake daemon speaking the protocol."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Set

import pytest

import kforge
from kforge.client import encode_frame, read_frame, reset_connection

Message = Dict[str, Any]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """No KFORGE_* variables, an empty XDG_RUNTIME_DIR, and a fresh process-wide connection."""
    for var in ("KFORGE_SOCKET", "KFORGE_JOB", "KFORGE_DEVICE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    runtime = tempfile.mkdtemp(prefix="kfx", dir="/tmp")
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    reset_connection()
    yield runtime
    reset_connection()
    shutil.rmtree(runtime, ignore_errors=True)


class FakeDaemon:
    """A one-connection daemon on a temporary AF_UNIX socket, served by a thread.

    Every request is appended to ``requests`` and answered by :meth:`handle`, which speaks the
    protocol: ``welcome`` (or ``error``/close on a protocol mismatch), ``region_granted`` (ids
    from 5), ``region_revoked`` for regions in ``revoke``, ``region_released`` (``tainted`` for
    regions in ``taint``) and ``recorded`` (ids from 11). ``fail_enter`` makes region_enter answer
    with that error code.
    """

    def __init__(self, protocol: int = kforge.PROTOCOL_VERSION) -> None:
        self.protocol = protocol
        self.dir = tempfile.mkdtemp(prefix="kfd", dir="/tmp")
        self.path = os.path.join(self.dir, "d.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self.listener.settimeout(30)
        self.requests: List[Message] = []
        self.errors: List[BaseException] = []
        self.revoke: Set[int] = set()
        self.taint: Set[int] = set()
        self.revoke_after_grant: bool = True
        self.fail_enter: Optional[str] = None
        self.next_region = 5
        self.next_measurement = 11
        self.held: Set[int] = set()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def handle(self, msg: Message) -> List[Message]:
        kind = msg["type"]
        if kind == "hello":
            if msg["protocol"] != self.protocol:
                return [{"type": "error", "code": "version_mismatch",
                         "message": f"daemon speaks protocol {self.protocol}, client {msg['protocol']}"}]
            return [{"type": "welcome", "protocol": self.protocol, "daemon_pid": 4242}]
        if kind == "region_enter":
            if self.fail_enter:
                return [{"type": "error", "code": self.fail_enter, "message": "no such device: 9"}]
            rid = self.next_region
            self.next_region += 1
            self.held.add(rid)
            grant: Message = {
                "type": "region_granted", "region": rid, "device": msg.get("device") or "cpu",
                "exclusive": True, "wait_ms": 0.5, "gate_ms": 0.1, "drain_ms": 0.2,
                "drain_timed_out": False, "freeze_ms": 0.3, "frozen_jobs": 2, "isolate_ms": 0.05,
                "core": 0, "tainted": False, "lease_ms": msg.get("lease_ms") or 60000,
            }
            out = [grant]
            if rid in self.revoke and self.revoke_after_grant:
                out.append({"type": "region_revoked", "region": rid, "reason": "lease of 1 ms expired"})
            return out
        if kind == "region_exit":
            rid = msg["region"]
            if rid not in self.held:
                return [{"type": "error", "code": "no_such_region", "message": f"region {rid} not held"}]
            self.held.discard(rid)
            out = []
            revoked = rid in self.revoke
            if revoked and not self.revoke_after_grant:
                out.append({"type": "region_revoked", "region": rid, "reason": "lease of 1 ms expired"})
            out.append({"type": "region_released", "region": rid, "valid": not revoked,
                        "revoked": revoked, "tainted": rid in self.taint, "held_ms": 12.5})
            return out
        if kind == "measurement":
            mid = self.next_measurement
            self.next_measurement += 1
            return [{"type": "recorded", "measurement": mid, "valid": True}]
        return [{"type": "error", "code": "bad_request", "message": f"unexpected {kind}"}]

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
            with conn:
                while True:
                    try:
                        msg = read_frame(conn)
                    except kforge.ProtocolError:
                        return  # client closed
                    self.requests.append(msg)
                    replies = self.handle(msg)
                    for reply in replies:
                        conn.sendall(encode_frame(reply))
                    if replies and replies[0]["type"] == "error" and msg["type"] == "hello":
                        return  # the daemon closes after a failed handshake
        except BaseException as e:  # surfaced by close()
            self.errors.append(e)

    def types(self) -> List[str]:
        return [m["type"] for m in self.requests]

    def close(self) -> None:
        reset_connection()  # closing the client ends the serving loop
        self.thread.join(timeout=10)
        self.listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        assert not self.thread.is_alive(), "fake daemon thread did not finish"
        assert not self.errors, self.errors


@pytest.fixture
def daemon_factory(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeDaemon]]:
    """Start fake daemons and point KFORGE_SOCKET at the latest one."""
    started: List[FakeDaemon] = []

    def start(protocol: int = kforge.PROTOCOL_VERSION) -> FakeDaemon:
        d = FakeDaemon(protocol)
        started.append(d)
        monkeypatch.setenv("KFORGE_SOCKET", d.path)
        return d

    yield start
    for d in started:
        d.close()


@pytest.fixture
def daemon(daemon_factory: Callable[..., FakeDaemon]) -> FakeDaemon:
    """A fake daemon of the current protocol (2) with KFORGE_SOCKET pointing at it."""
    return daemon_factory()


@pytest.fixture
def round_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], Any]:
    """Timing rounds on a stand-in clock: ``round_clock(module)`` makes that module's
    ``do_bench_interleaved`` take 10 s of its ``time`` a round (each function's samples ``1 + i``)
    and returns the clock (``now``, from 1000 s)."""
    from types import SimpleNamespace

    clock = SimpleNamespace(now=1000.0)

    def bench(fns: List[Any], name: str, **kw: Any) -> List[List[float]]:
        clock.now += 10.0
        return [[1.0 + i] * 3 for i in range(len(fns))]

    def patch(module: Any) -> Any:
        monkeypatch.setattr(module, "do_bench_interleaved", bench)
        monkeypatch.setattr(module, "time", SimpleNamespace(time=lambda: clock.now, perf_counter=lambda: clock.now))
        return clock

    return patch
