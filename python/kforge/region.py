"""Exclusive timed regions (``kforge.region``) and measurement reporting."""

from __future__ import annotations

import math
import os
import threading
import time
from types import TracebackType
from typing import Any, Dict, Iterable, List, Optional, Tuple, Type, Union

from .client import Client, connection, raise_for_error
from .errors import KforgeError, RegionRevoked

# Regions of one process are serialised by this lock before asking the daemon: one connection
# carries one request at a time, so a thread waiting for its grant must not stand between
# another thread's region and that region's exit. (Regions of one job's device are exclusive
# anyway, so this costs no concurrency.)
_region_lock = threading.Lock()
# Per-thread record of the active region, to reject nesting: (pid, Region).
_local = threading.local()
# The joinable region this process holds, if any (at most one: regions of a process are
# serialised): [(pid, Region)] or []. A region of another thread joins it.
_joinable_lock = threading.Lock()
_joinable_held: List[Tuple[int, "Region"]] = []
# How often a thread waiting for the region lock looks for a joinable region to join.
_JOIN_POLL_S = 0.05


def _held_joinable() -> Optional["Region"]:
    with _joinable_lock:
        if _joinable_held and _joinable_held[0][0] == os.getpid() and _joinable_held[0][1]._live():
            return _joinable_held[0][1]
    return None


def _env_job() -> Optional[int]:
    raw = os.environ.get("KFORGE_JOB")
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise KforgeError(f"kforge: KFORGE_JOB must be an integer job id, got {raw!r}") from None


def _env_device() -> Optional[str]:
    return os.environ.get("KFORGE_DEVICE") or None


class Region:
    """A timed region; use it through :func:`region`.

    After ``__enter__`` (the object yielded by ``with``):

    * ``region``: the daemon's region id (``None`` without a daemon);
    * ``grant``: the full ``region_granted`` reply as a dict (``None`` without a daemon);
    * ``exclusive``: whether the daemon made the device exclusive (``False`` without a daemon).

    After ``__exit__``:

    * ``valid``: the daemon's verdict on the region (``None`` without a daemon);
    * ``revoked``: whether the lease ran out and the daemon revoked the region;
    * ``tainted``: whether the daemon flagged the region (e.g. a drain timed out);
    * ``held_ms``: how long the region was held (the daemon's figure, else measured locally).

    A ``joinable`` region (what ``kforge run --auto-regions`` enters around an unmodified
    script's timing) may have other regions of the process entered while it is held (of its own
    thread, or of another thread, which would otherwise wait for it): those run inside the held
    region (same ``region`` id and grant, ``joined`` true) without asking the daemon, and their
    exit leaves the outer region held. ``nested`` counts the regions joined into this one
    that are still open. A joinable region may be exited from another thread than the one that
    entered it (:meth:`claim_idle` first; ``kforge --auto-regions`` ends a lingering region from
    its reaper thread): from then on it is no longer the entering thread's active region.

    ``waiting_for`` says, while ``__enter__`` blocks, what it waits for (``"region lock"``: another
    thread of this process holds a region; ``"daemon grant"``: the daemon has not answered yet);
    ``None`` otherwise.
    """

    def __init__(self, name: str = "region", lease_s: Optional[float] = None, joinable: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"kforge.region: name must be a non-empty string, got {name!r}")
        if lease_s is not None:
            if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)):
                raise ValueError(f"kforge.region: lease_s must be a number of seconds, got {lease_s!r}")
            if not (lease_s > 0 and math.isfinite(lease_s)):
                raise ValueError(f"kforge.region: lease_s must be positive and finite, got {lease_s!r}")
        self.name: str = name
        self.lease_s: Optional[float] = lease_s
        self.region: Optional[int] = None
        self.grant: Optional[Dict[str, Any]] = None
        self.exclusive: bool = False
        self.valid: Optional[bool] = None
        self.revoked: bool = False
        self.tainted: bool = False
        self.held_ms: Optional[float] = None
        self.joinable: bool = joinable
        self.joined: bool = False
        self.nested: int = 0
        self.waiting_for: Optional[str] = None
        # Entered and not yet exited; closing: claimed for an exit (no more joins).
        self._held: bool = False
        self._closing: bool = False
        self._outer: Optional[Region] = None
        self._prev_active: Optional[Tuple[int, Region]] = None
        self._set_active: bool = False
        self._conn: Optional[Client] = None
        self._locked: bool = False
        self._t0: int = 0

    # -- context manager ---------------------------------------------------------------------

    def __enter__(self) -> "Region":
        active = getattr(_local, "active", None)
        if active is not None and (active[0] != os.getpid() or not active[1]._live()):
            active = None  # inherited through fork (the parent's), or exited by another thread
        if active is not None and active[1].joinable and active[1] is not self:
            if self._join(active[1], cross_thread=False):
                return self
            active = None  # being exited right now: wait for the region lock below
        if active is not None:
            raise KforgeError(
                f"kforge.region({self.name!r}) entered inside region {active[1].name!r} of the same "
                "thread: regions are not re-entrant; time the inner part without a region"
            )
        self.region, self.grant, self.exclusive, self.joined = None, None, False, False
        self.valid, self.revoked, self.tainted, self.held_ms = None, False, False, None
        # Another thread of this process may hold a joinable region: waiting for the region lock
        # could then wait for ever (that thread may be waiting for this one), so join it instead.
        self.waiting_for = "region lock"
        try:
            while not _region_lock.acquire(timeout=_JOIN_POLL_S):
                held = _held_joinable()
                if held is not None and held is not self and self._join(held, cross_thread=True):
                    return self
            self._locked = True
            try:
                conn = connection()
                if conn is not None:
                    self.waiting_for = "daemon grant"
                    self._enter_daemon(conn)
            finally:
                if self._conn is None:
                    self._release_lock()  # no daemon (or refused): nothing to hold
        finally:
            self.waiting_for = None
        self._held, self._closing = True, False
        _local.active = (os.getpid(), self)
        if self.joinable:
            with _joinable_lock:
                _joinable_held[:] = [(os.getpid(), self)]
        self._t0 = time.perf_counter_ns()
        return self

    def _live(self) -> bool:
        return self._held and not self._closing

    def claim_idle(self) -> bool:
        """Claim this held joinable region for an exit if no region is joined into it: from now
        on nothing joins it and it is no thread's active region. False (nothing changed) if it
        is not held, already claimed, or a joined region is still open."""
        with _joinable_lock:
            if not self._live() or self.nested > 0:
                return False
            self._closing = True
            return True

    def _join(self, outer: "Region", cross_thread: bool) -> bool:
        """Run inside ``outer`` (a joinable region this process holds) without asking the daemon;
        a region of another thread makes this thread's active region this one until exit.
        False if ``outer`` is being exited (claimed) meanwhile."""
        with _joinable_lock:
            if not outer._live():
                return False
            outer.nested += 1
        self.region, self.grant, self.exclusive = outer.region, outer.grant, outer.exclusive
        self.valid, self.revoked, self.tainted, self.held_ms = None, False, outer.tainted, None
        self.joined, self._outer = True, outer
        self._held = True
        if cross_thread:
            self._prev_active, self._set_active = getattr(_local, "active", None), True
            _local.active = (os.getpid(), self)
        self._t0 = time.perf_counter_ns()
        return True

    def _enter_daemon(self, conn: Client) -> None:
        """Ask the daemon for the region (the caller holds the region lock)."""
        msg: Dict[str, Any] = {
            "type": "region_enter",
            "job": _env_job(),
            "device": _env_device(),
            "name": self.name,
            "pid": os.getpid(),
            "tid": threading.get_native_id(),
            "lease_ms": None if self.lease_s is None else max(1, int(round(self.lease_s * 1000))),
        }
        grant = raise_for_error(conn.request(msg), "region_granted")
        self._conn = conn
        self.grant = grant
        self.region = int(grant["region"])
        self.exclusive = bool(grant.get("exclusive", False))
        self.tainted = bool(grant.get("tainted", False))

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        local_ms = (time.perf_counter_ns() - self._t0) / 1e6
        self._held = False
        if self.joined:
            self.held_ms = local_ms
            if self._outer is not None:
                with _joinable_lock:
                    self._outer.nested -= 1
                self._outer = None
            if self._set_active:
                _local.active, self._prev_active, self._set_active = self._prev_active, None, False
            return  # the outer region stays held
        _local.active = None
        if self.joinable:
            with _joinable_lock:
                if _joinable_held and _joinable_held[0][1] is self:
                    _joinable_held.clear()
        conn, self._conn = self._conn, None
        if conn is None:
            self.held_ms = local_ms
            return
        region = self.region
        assert region is not None
        try:
            reply = raise_for_error(conn.request({"type": "region_exit", "region": region}), "region_released")
        except KforgeError:
            if exc_type is None:
                raise
            return  # do not mask the body's exception
        finally:
            self._release_lock()
            # Revocations seen before the exit reply arrived stay on the connection; take ours.
            was_revoked = region in conn.revoked
            conn.revoked.discard(region)
            reason = conn.revoke_reasons.pop(region, "lease expired")
        self.valid = bool(reply.get("valid", False))
        self.revoked = bool(reply.get("revoked", False)) or was_revoked
        self.tainted = self.tainted or bool(reply.get("tainted", False))
        held = reply.get("held_ms")
        self.held_ms = float(held) if held is not None else local_ms
        self._closing = False
        if self.revoked and exc_type is None:
            raise RegionRevoked(region, reason)

    def _release_lock(self) -> None:
        if self._locked:
            self._locked = False
            _region_lock.release()

    def __repr__(self) -> str:
        return (
            f"<kforge.Region {self.name!r} region={self.region} exclusive={self.exclusive} "
            f"valid={self.valid} revoked={self.revoked}>"
        )


def region(name: str = "region", lease_s: Optional[float] = None) -> Region:
    """Mark the timed part of a benchmark: ``with kforge.region(name="matmul") as r: ...``.

    With a daemon (see :func:`kforge.default_socket_path`), entering blocks until the daemon
    grants the region: it closes the device's submission gate, drains it, freezes sibling jobs
    and pins this thread to a reserved core. The request carries ``job`` (``$KFORGE_JOB``),
    ``device`` (``$KFORGE_DEVICE``), ``name``, ``pid``, the native ``tid`` and ``lease_ms``
    (from ``lease_s``; ``None`` lets the daemon choose). Exiting releases the region; if the
    daemon revoked it (the lease ran out), :class:`kforge.RegionRevoked` is raised unless the
    body already raised.

    Without a daemon the region is a no-op (a single :class:`kforge.KforgeWarning` per process
    says so), so scripts still run. Regions do not nest within a thread (:class:`KforgeError`);
    regions of different threads of one process are serialised.
    """
    return Region(name, lease_s)


def report_measurement(
    name: str, samples_ms: Iterable[float], region: Union[int, Region, None] = None
) -> Optional[int]:
    """Record timing samples (milliseconds) with the daemon; return the measurement id.

    ``region`` ties the samples to a region (its id, or the :class:`Region` object itself);
    ``job`` is taken from ``$KFORGE_JOB``. Returns ``None`` (and does nothing) without a daemon.
    Raises :class:`ValueError` for non-finite samples and :class:`KforgeError` if the daemon
    rejects the measurement.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"kforge.report_measurement: name must be a non-empty string, got {name!r}")
    samples = [float(s) for s in samples_ms]
    if not all(math.isfinite(s) for s in samples):
        raise ValueError("kforge.report_measurement: samples must be finite numbers")
    region_id = region.region if isinstance(region, Region) else region
    if region_id is not None and (isinstance(region_id, bool) or not isinstance(region_id, int)):
        raise ValueError(f"kforge.report_measurement: region must be an int id, got {region_id!r}")
    conn = connection()
    if conn is None:
        return None
    msg: Dict[str, Any] = {
        "type": "measurement",
        "region": region_id,
        "job": _env_job(),
        "name": name,
        "samples_ms": samples,
    }
    reply = raise_for_error(conn.request(msg), "recorded")
    return int(reply["measurement"])


def active_region() -> Optional[Region]:
    """The region this thread holds (entered and not yet exited), if any."""
    active = getattr(_local, "active", None)
    if active is None or active[0] != os.getpid() or not active[1]._live():
        return None  # none, inherited through fork, or exited (or being exited) by another thread
    r: Region = active[1]
    return r


def region_open() -> bool:
    """A region of this thread is active, or any thread holds the process's region lock (the
    warm worker's check that a job left no region open)."""
    return active_region() is not None or _region_lock.locked()


def _after_fork_in_child() -> None:
    global _region_lock, _joinable_lock
    _region_lock = threading.Lock()
    _joinable_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
