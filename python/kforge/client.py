"""Connection to the kforge daemon: socket discovery, framing and the request/reply client.

Wire format (mirrors ``crates/kforge-proto``): a Unix stream socket carrying frames, each a
little-endian ``u32`` body length followed by that many bytes of UTF-8 JSON. Bodies larger than
:data:`MAX_FRAME` (1 MiB) are rejected. Every message is a JSON object tagged by ``"type"``
(snake_case). The first request on a connection is ``hello``; the daemon answers ``welcome`` or
an ``error`` (``version_mismatch``) and closes.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import warnings
from types import FrameType
from typing import Any, Dict, Optional, Set

from .errors import KforgeError, KforgeWarning, ProtocolError

#: Version of the message set spoken by this client (``kforge_proto::PROTOCOL_VERSION``).
PROTOCOL_VERSION: int = 3
#: Largest accepted frame body in bytes (``kforge_proto::MAX_FRAME``).
MAX_FRAME: int = 1 << 20

_HEADER = struct.Struct("<I")

Message = Dict[str, Any]


def default_socket_path() -> str:
    """Return the daemon socket path used when none is given explicitly.

    The rule, shared with the Rust CLI and daemon:

    1. ``$KFORGE_SOCKET`` if set and non-empty;
    2. else ``$XDG_RUNTIME_DIR/kforge/kforge.sock`` if ``XDG_RUNTIME_DIR`` is set and non-empty;
    3. else ``/tmp/kforge-<uid>/kforge.sock``.

    An explicit path argument (e.g. ``Client.connect(path)``) always takes precedence.
    """
    env = os.environ.get("KFORGE_SOCKET")
    if env:
        return env
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "kforge", "kforge.sock")
    return f"/tmp/kforge-{os.getuid()}/kforge.sock"


def encode_frame(obj: Message) -> bytes:
    """Encode one message as a frame: little-endian ``u32`` length + compact UTF-8 JSON.

    Raises :class:`ProtocolError` if the message is not JSON-serialisable (NaN and infinities
    included: JSON cannot carry them) or its body exceeds :data:`MAX_FRAME`.
    """
    try:
        body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"kforge: message cannot be encoded as JSON: {e}") from e
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"kforge: frame of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _HEADER.pack(len(body)) + body


def _recv_exact(sock: socket.socket, n: int, what: str) -> bytes:
    """Read exactly ``n`` bytes; raise :class:`ProtocolError` on end of stream."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            if got == 0 and what == "header":
                raise ProtocolError("kforge: connection closed by the daemon")
            raise ProtocolError(
                f"kforge: short read: connection closed after {got} of {n} bytes of the frame {what}"
            )
        got += k
    return bytes(buf)


def read_frame(sock: socket.socket) -> Message:
    """Read and decode one frame from ``sock``; return the JSON object.

    Raises :class:`ProtocolError` when the stream ends (cleanly between frames or in the middle
    of one: a *short read*), when the announced length exceeds :data:`MAX_FRAME` (checked before
    the body is read), or when the body is not a UTF-8 JSON object.
    """
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, "header"))
    if length > MAX_FRAME:
        raise ProtocolError(f"kforge: frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
    body = _recv_exact(sock, length, "body")
    try:
        msg = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"kforge: malformed frame body: {e}") from e
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError(f"kforge: frame is not a tagged JSON object: {body[:200]!r}")
    return msg


def raise_for_error(reply: Message, expected: str) -> Message:
    """Return ``reply`` if its type is ``expected``; raise :class:`KforgeError` otherwise.

    An ``error`` reply becomes a :class:`KforgeError` carrying the daemon's message and code.
    """
    kind = reply.get("type")
    if kind == expected:
        return reply
    if kind == "error":
        code = reply.get("code")
        raise KforgeError(f"kforge daemon: {reply.get('message', '(no message)')} [{code}]", code)
    raise ProtocolError(f"kforge: expected a {expected!r} reply, got {kind!r}: {reply}")


class Client:
    """One connection to the daemon.

    Use :meth:`connect` to open a socket and perform the ``hello`` handshake, or wrap an already
    connected socket (``Client(sock)``, then :meth:`handshake`). :meth:`request` is thread-safe:
    one request/reply exchange runs at a time. ``region_revoked`` messages, which the daemon may
    send unprompted while a region is held, are recorded in :attr:`revoked` (ids) and
    :attr:`revoke_reasons` and never returned as replies.
    """

    def __init__(self, sock: socket.socket, path: Optional[str] = None) -> None:
        self.sock: Optional[socket.socket] = sock
        self.path: Optional[str] = path
        self.pid: int = os.getpid()
        self.daemon_pid: Optional[int] = None
        self.revoked: Set[int] = set()
        self.revoke_reasons: Dict[int, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def connect(
        cls, path: Optional[str] = None, *, timeout: Optional[float] = 10.0, client: str = "python"
    ) -> "Client":
        """Connect to the daemon at ``path`` (default: :func:`default_socket_path`) and say hello.

        ``timeout`` bounds connecting and the handshake only; later requests block as long as
        the daemon needs (a region may wait behind others). Raises :class:`OSError` if the
        socket cannot be reached and :class:`KforgeError` if the daemon refuses the handshake.
        """
        path = path or default_socket_path()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
            self = cls(sock, path)
            self.handshake(client)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        return self

    @property
    def closed(self) -> bool:
        """Whether the connection was closed (explicitly or after an i/o failure)."""
        return self.sock is None

    def handshake(self, client: str = "python") -> Message:
        """Send ``hello`` with :data:`PROTOCOL_VERSION`; return the ``welcome`` reply.

        Raises :class:`KforgeError` with the daemon's message (code ``version_mismatch``, ...)
        if the daemon answers with an error.
        """
        reply = self.request({"type": "hello", "protocol": PROTOCOL_VERSION, "client": client})
        reply = raise_for_error(reply, "welcome")
        self.daemon_pid = reply.get("daemon_pid")
        return reply

    def send(self, msg: Message) -> None:
        """Send one message (no reply is read)."""
        sock = self._sock()
        sock.sendall(encode_frame(msg))

    def recv(self) -> Message:
        """Read the next message that is not ``region_revoked`` (those are recorded)."""
        sock = self._sock()
        while True:
            msg = read_frame(sock)
            if msg.get("type") == "region_revoked":
                region = int(msg["region"])
                self.revoked.add(region)
                self.revoke_reasons[region] = str(msg.get("reason", ""))
                continue
            return msg

    def request(self, msg: Message) -> Message:
        """Send one message and return the next reply that is not ``region_revoked``.

        The reply is returned as is (``error`` replies included; see :func:`raise_for_error`).
        An encoding error raises :class:`ProtocolError` and leaves the connection usable; any
        failure after sending (lost connection, bad frame, ``KeyboardInterrupt``) closes the
        connection, since replies could no longer be matched to requests.
        """
        frame = encode_frame(msg)
        with self._lock:
            sock = self._sock()
            try:
                sock.sendall(frame)
                return self.recv()
            except OSError as e:
                self.close()
                raise ProtocolError(f"kforge: lost connection to the daemon: {e}") from e
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        """Close the socket (idempotent)."""
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def _sock(self) -> socket.socket:
        if self.sock is None:
            raise ProtocolError("kforge: the connection to the daemon is closed")
        return self.sock

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"daemon_pid={self.daemon_pid}"
        return f"<kforge.Client {self.path!r} {state}>"


# ---------------------------------------------------------------------------------------------
# Process-wide lazy connection used by kforge.region() and kforge.report_measurement().

_state_lock = threading.Lock()
_conn: Optional[Client] = None
_conn_pid: Optional[int] = None
_warned: bool = False


def _warn_no_daemon(path: str, why: str) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    # Attribute the warning to the first caller outside the kforge package (subpackages included).
    level = 1
    frame: Optional[FrameType] = sys._getframe(0)
    pkg_dir = os.path.dirname(os.path.abspath(__file__)) + os.sep
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(pkg_dir):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"kforge: no daemon at {path} ({why}); regions are not exclusive",
        KforgeWarning,
        stacklevel=level,
    )


def connection() -> Optional[Client]:
    """Return this process's connection to the daemon, connecting lazily; ``None`` without one.

    One connection per process: a connection inherited through ``fork`` is dropped (the pid is
    remembered) and a new one is made. Without a daemon (no ``KFORGE_SOCKET`` and nothing at the
    default path, or connecting fails) a single :class:`KforgeWarning` is emitted per process and
    ``None`` is returned. A daemon that refuses the handshake raises :class:`KforgeError`.
    """
    global _conn, _conn_pid
    with _state_lock:
        pid = os.getpid()
        if _conn is not None and (_conn_pid != pid or _conn.closed):
            if _conn_pid == pid:
                _conn.close()
            # else: inherited through fork; the parent still owns the socket, leave it alone.
            _conn = None
        if _conn is not None:
            return _conn
        explicit = bool(os.environ.get("KFORGE_SOCKET"))
        path = default_socket_path()
        if not explicit and not os.path.exists(path):
            _warn_no_daemon(path, "KFORGE_SOCKET is not set and the default socket does not exist")
            return None
        try:
            conn = Client.connect(path)
        except OSError as e:
            _warn_no_daemon(path, f"cannot connect: {e}")
            return None
        except ProtocolError as e:
            _warn_no_daemon(path, str(e))
            return None
        _conn, _conn_pid = conn, pid
        return conn


def reset_connection() -> None:
    """Forget the process-wide connection and the warn-once flag (for tests)."""
    global _conn, _conn_pid, _warned
    with _state_lock:
        if _conn is not None and _conn_pid == os.getpid():
            _conn.close()
        _conn, _conn_pid, _warned = None, None, False


def _after_fork_in_child() -> None:
    global _state_lock, _conn, _conn_pid
    # The parent's lock may have been held by another thread at fork time.
    _state_lock = threading.Lock()
    _conn, _conn_pid = None, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
