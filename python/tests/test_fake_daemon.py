"""Against a fake daemon: handshake, request fields, revocation, errors and measurements."""

from __future__ import annotations

import os
import socket
import threading
import warnings
from typing import Callable

import pytest

import kforge
from kforge import Client, KforgeError, RegionRevoked, encode_frame, read_frame
from conftest import FakeDaemon


def test_handshake(daemon: FakeDaemon) -> None:
    with Client.connect(daemon.path) as c:
        assert c.daemon_pid == 4242
        assert not c.closed
    assert c.closed
    assert daemon.requests == [{"type": "hello", "protocol": kforge.PROTOCOL_VERSION, "client": "python"}]


def test_version_mismatch_raises_with_daemons_message(daemon_factory: Callable[..., FakeDaemon]) -> None:
    newer = kforge.PROTOCOL_VERSION + 1
    d = daemon_factory(protocol=newer)
    with pytest.raises(KforgeError, match=f"daemon speaks protocol {newer}, client {kforge.PROTOCOL_VERSION}") as e:
        Client.connect(d.path)
    assert e.value.code == "version_mismatch"


def test_version_mismatch_through_region(daemon_factory: Callable[..., FakeDaemon]) -> None:
    daemon_factory(protocol=kforge.PROTOCOL_VERSION + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a refusing daemon is an error, not "no daemon"
        with pytest.raises(KforgeError, match="version_mismatch"):
            with kforge.region("x"):
                pass


def test_region_request_fields_and_grant(daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFORGE_JOB", "7")
    monkeypatch.setenv("KFORGE_DEVICE", "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no daemon" warning
        with kforge.region(name="matmul", lease_s=1.5) as r:
            assert r.region == 5
            assert r.exclusive is True
            assert r.grant is not None and r.grant["frozen_jobs"] == 2 and r.grant["core"] == 0
            assert r.valid is None
    assert daemon.types() == ["hello", "region_enter", "region_exit"]
    assert daemon.requests[1] == {
        "type": "region_enter", "job": 7, "device": "cpu", "name": "matmul",
        "pid": os.getpid(), "tid": threading.get_native_id(), "lease_ms": 1500,
    }
    assert daemon.requests[2] == {"type": "region_exit", "region": 5}
    assert r.valid is True and r.revoked is False and r.tainted is False and r.held_ms == 12.5


def test_region_without_job_env_sends_nulls(daemon: FakeDaemon) -> None:
    with kforge.region() as r:
        pass
    enter = daemon.requests[1]
    assert enter["job"] is None and enter["device"] is None and enter["lease_ms"] is None
    assert enter["name"] == "region"
    assert r.valid is True


def test_one_connection_per_process(daemon: FakeDaemon) -> None:
    for _ in range(3):
        with kforge.region("r"):
            pass
    assert daemon.types().count("hello") == 1
    assert [m["region"] for m in daemon.requests if m["type"] == "region_exit"] == [5, 6, 7]


@pytest.mark.parametrize("after_grant", [True, False])
def test_revoked_region_raises_on_exit(daemon: FakeDaemon, after_grant: bool) -> None:
    daemon.revoke.add(5)
    daemon.revoke_after_grant = after_grant  # revoked arrives unprompted, or just before released
    with pytest.raises(RegionRevoked, match="lease of 1 ms expired") as e:
        with kforge.region("slow") as r:
            pass
    assert e.value.region == 5 and isinstance(e.value, KforgeError)
    assert r.revoked is True and r.valid is False
    assert daemon.types() == ["hello", "region_enter", "region_exit"]
    # the connection stays usable, and the revocation was consumed
    with kforge.region("next") as r2:
        pass
    assert r2.region == 6 and r2.revoked is False


def test_revoked_does_not_mask_body_exception(daemon: FakeDaemon) -> None:
    daemon.revoke.add(5)
    with pytest.raises(ZeroDivisionError):
        with kforge.region("boom") as r:
            1 / 0
    assert r.revoked is True
    assert daemon.types()[-1] == "region_exit"


def test_request_skips_and_records_revocations() -> None:
    a, b = socket.socketpair()
    with a, b:
        c = Client(a)
        b.sendall(encode_frame({"type": "region_revoked", "region": 3, "reason": "late"})
                  + encode_frame({"type": "recorded", "measurement": 1, "valid": False}))
        assert c.request({"type": "measurement", "name": "m", "samples_ms": [1.0]}) == {
            "type": "recorded", "measurement": 1, "valid": False}
        assert read_frame(b) == {"type": "measurement", "name": "m", "samples_ms": [1.0]}
        assert c.revoked == {3} and c.revoke_reasons == {3: "late"}


def test_lost_connection_is_a_kforge_error() -> None:
    a, b = socket.socketpair()
    c = Client(a)
    b.close()
    with pytest.raises(kforge.ProtocolError, match="lost connection|closed by the daemon"):
        c.request({"type": "status"})
    assert c.closed
    with pytest.raises(kforge.ProtocolError, match="connection to the daemon is closed"):
        c.request({"type": "status"})


def test_nested_region_raises(daemon: FakeDaemon) -> None:
    with kforge.region("outer") as outer:
        with pytest.raises(KforgeError, match=r"not re-entrant.*'outer'|'outer'.*not re-entrant"):
            with kforge.region("inner"):
                pass
    assert daemon.types() == ["hello", "region_enter", "region_exit"]
    assert outer.valid is True


def test_regions_in_other_threads_are_not_nesting(daemon: FakeDaemon) -> None:
    results = []

    def worker() -> None:
        with kforge.region("worker") as r:
            pass
        results.append(r.region)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    with kforge.region("main") as r:
        pass
    assert results == [5] and r.region == 6


def test_enter_error_is_raised_and_lock_released(daemon: FakeDaemon) -> None:
    daemon.fail_enter = "no_such_device"
    with pytest.raises(KforgeError, match="no such device") as e:
        with kforge.region("x"):
            pass
    assert e.value.code == "no_such_device"
    daemon.fail_enter = None
    with kforge.region("y") as r:  # would deadlock if the region lock had leaked
        pass
    assert r.region == 5


def test_report_measurement_returns_ids(daemon: FakeDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFORGE_JOB", "9")
    with kforge.region("k") as r:
        pass
    assert kforge.report_measurement("k", [1.0, 2], region=r.region) == 11
    assert kforge.report_measurement("k", (3.5,), region=r) == 12
    assert kforge.report_measurement("free", []) == 13
    ms = [m for m in daemon.requests if m["type"] == "measurement"]
    assert ms[0] == {"type": "measurement", "region": 5, "job": 9, "name": "k", "samples_ms": [1.0, 2.0]}
    assert ms[1]["region"] == 5 and ms[1]["samples_ms"] == [3.5]
    assert ms[2]["region"] is None


def test_do_bench_runs_inside_region_and_reports(daemon: FakeDaemon) -> None:
    def kernel() -> None:
        sum(range(200))

    samples = kforge.do_bench(kernel, warmup=0.2, rep=1, return_mode="all", device="cpu")
    assert daemon.types() == ["hello", "region_enter", "measurement", "region_exit"]
    assert daemon.requests[1]["name"] == "kernel"
    m = daemon.requests[2]
    assert m["region"] == 5 and m["name"] == "kernel"
    assert isinstance(samples, list) and m["samples_ms"] == samples

    kforge.do_bench(kernel, warmup=0.2, rep=1, name="custom", device="cpu")
    assert daemon.requests[4]["name"] == "custom" and daemon.requests[5]["name"] == "custom"


def test_do_bench_revoked_raises(daemon: FakeDaemon) -> None:
    daemon.revoke.add(5)
    with pytest.raises(RegionRevoked):
        kforge.do_bench(lambda: None, warmup=0.1, rep=0.2, device="cpu")
    assert daemon.types() == ["hello", "region_enter", "measurement", "region_exit"]
