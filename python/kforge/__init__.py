"""kforge: Python client of the kforge benchmark daemon.

Mark the timed part of a benchmark with :func:`region` (or time a callable with
:func:`do_bench`); when the command runs under the kforge daemon the region is made exclusive on
the command's device, and without a daemon everything still runs (non-exclusively).

The daemon socket is found by :func:`default_socket_path`: ``$KFORGE_SOCKET``, else
``$XDG_RUNTIME_DIR/kforge/kforge.sock``, else ``/tmp/kforge-<uid>/kforge.sock``.
"""

from __future__ import annotations

from .bench import do_bench, do_bench_interleaved
from .client import MAX_FRAME, PROTOCOL_VERSION, Client, default_socket_path, encode_frame, read_frame
from .errors import KforgeError, KforgeWarning, ProtocolError, RegionRevoked
from .region import Region, region, report_measurement

__version__ = "0.1.0"

__all__ = [
    "PROTOCOL_VERSION",
    "MAX_FRAME",
    "Client",
    "KforgeError",
    "KforgeWarning",
    "ProtocolError",
    "Region",
    "RegionRevoked",
    "default_socket_path",
    "do_bench",
    "do_bench_interleaved",
    "encode_frame",
    "read_frame",
    "region",
    "report_measurement",
]
