"""Framing: encode/decode round trips, the 1 MiB limit, short reads and socket discovery."""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import kforge
from kforge import MAX_FRAME, ProtocolError, default_socket_path, encode_frame, read_frame


@pytest.fixture
def pair() -> Iterator[Tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()


def test_constants() -> None:
    assert kforge.PROTOCOL_VERSION == 3
    assert MAX_FRAME == 1 << 20


def test_encode_layout() -> None:
    msg = {"type": "region_exit", "region": 7}
    frame = encode_frame(msg)
    (length,) = struct.unpack("<I", frame[:4])
    assert length == len(frame) - 4
    assert json.loads(frame[4:].decode("utf-8")) == msg


def test_round_trip(pair: Tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    msgs: List[Dict[str, Any]] = [
        {"type": "hello", "protocol": 3, "client": "python"},
        {"type": "measurement", "region": None, "job": 3, "name": "naïve ✓", "samples_ms": [0.5, 1.25]},
        {"type": "status"},
    ]
    a.sendall(b"".join(encode_frame(m) for m in msgs))
    assert [read_frame(b) for _ in msgs] == msgs


def test_frame_split_across_writes(pair: Tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    frame = encode_frame({"type": "ok"})
    a.sendall(frame[:2])
    a.sendall(frame[2:5])
    a.sendall(frame[5:])
    assert read_frame(b) == {"type": "ok"}


def test_encode_oversized() -> None:
    with pytest.raises(ProtocolError, match="exceeds the 1048576-byte limit"):
        encode_frame({"type": "measurement", "name": "x" * MAX_FRAME, "samples_ms": []})


def test_encode_at_limit() -> None:
    overhead = len(json.dumps({"type": "x", "p": ""}, separators=(",", ":")))
    frame = encode_frame({"type": "x", "p": "y" * (MAX_FRAME - overhead)})
    assert len(frame) == MAX_FRAME + 4


def test_encode_rejects_nan_and_unserialisable() -> None:
    with pytest.raises(ProtocolError, match="JSON"):
        encode_frame({"type": "measurement", "samples_ms": [float("nan")]})
    with pytest.raises(ProtocolError, match="JSON"):
        encode_frame({"type": "x", "v": object()})


def test_read_oversized_is_rejected_before_body(pair: Tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(struct.pack("<I", MAX_FRAME + 1) + b"{}")
    a.shutdown(socket.SHUT_WR)  # had the body been read, this would be a short read instead
    with pytest.raises(ProtocolError, match="exceeds"):
        read_frame(b)


def test_clean_close_between_frames(pair: Tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(ProtocolError, match="connection closed by the daemon"):
        read_frame(b)


def test_short_header(pair: Tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(b"\x05\x00")
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(ProtocolError, match=r"short read: connection closed after 2 of 4 bytes of the frame header"):
        read_frame(b)


def test_short_body(pair: Tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    frame = encode_frame({"type": "status"})
    a.sendall(frame[:-1])
    a.shutdown(socket.SHUT_WR)
    n = len(frame) - 4
    with pytest.raises(ProtocolError, match=rf"short read: connection closed after {n - 1} of {n} bytes of the frame body"):
        read_frame(b)


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"no_type": 1}'])
def test_malformed_bodies(pair: Tuple[socket.socket, socket.socket], body: bytes) -> None:
    a, b = pair
    a.sendall(struct.pack("<I", len(body)) + body)
    with pytest.raises(ProtocolError):
        read_frame(b)


def test_socket_path_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFORGE_SOCKET", "/run/x/k.sock")
    assert default_socket_path() == "/run/x/k.sock"


def test_socket_path_from_xdg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert default_socket_path() == "/run/user/1000/kforge/kforge.sock"


def test_socket_path_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_socket_path() == f"/tmp/kforge-{os.getuid()}/kforge.sock"
