"""Exception and warning types of the kforge client."""

from __future__ import annotations

from typing import Optional


class KforgeError(Exception):
    """Any failure reported by, or while talking to, the kforge daemon.

    ``code`` carries the daemon's error code (for example ``"version_mismatch"``)
    when the error came from an ``error`` reply, else ``None``.
    """

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message: str = message
        self.code: Optional[str] = code


class ProtocolError(KforgeError):
    """A malformed, oversized, truncated or unexpected frame, or a lost connection."""


class RegionRevoked(KforgeError):
    """The daemon revoked a region (its lease ran out): its timings are not valid.

    Raised by the region's ``__exit__`` when the body itself did not raise.
    """

    def __init__(self, region: int, reason: str) -> None:
        super().__init__(f"kforge: region {region} was revoked by the daemon: {reason}", "region_revoked")
        self.region: int = region
        self.reason: str = reason


class KforgeWarning(UserWarning):
    """Warning category of the client (e.g. running without a daemon)."""
