"""scripts/device/restitch_launch_probe.py's parts that need no GPU: what differs between an
original kernel object and its replacement, the profile's own-time differences per forward, and
the host blocks' alternation (the probe itself runs on the device machine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Dict, List

PROBE = Path(__file__).resolve().parents[2] / "scripts" / "device" / "restitch_launch_probe.py"


def probe() -> Any:
    spec = importlib.util.spec_from_file_location("restitch_launch_probe", PROBE)
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


class Launcher:
    def __init__(self, config: str) -> None:
        self.config = config


class Kernel:
    def __init__(self, meta: Dict[str, Any], config: str) -> None:
        self.inductor_meta = meta
        self.triton_meta = {"signature": {"x": "*fp32"}}
        self.launchers = [Launcher(config)]
        self._cached_launcher: Any = None


def test_what_differs_between_an_original_and_its_replacement() -> None:
    p = probe()
    old, new = Kernel({"kernel_name": "k", "store_cubin": False}, "XBLOCK=64"), Kernel({"kernel_name": "k"}, "XBLOCK=64")
    old._cached_launcher = old.launchers[0]  # the original has its steady-state launcher; not the replacement
    setattr(new, "fn", "reloaded")  # an attribute only the replacement has
    d = p.differing_attributes(old, new)
    assert d["inductor_meta"] == {"store_cubin": ["False", "None"]}
    assert d["cached_launcher"] == ["Launcher", "NoneType"]
    assert d["instance_attributes"] == {"only_original": [], "only_replacement": ["fn"]}
    assert "launcher_type" not in d and "launcher_fields" not in d and "triton_meta" not in d
    assert p.differing_attributes(old, old) == {}


def test_own_time_deltas_are_per_forward_largest_first() -> None:
    p = probe()
    prof = {"originals": {"a.py:1 run": (40, 0.004), "b.py:2 launch": (40, 0.001)},
            "replacements": {"a.py:1 run": (40, 0.010), "b.py:2 launch": (40, 0.001), "c.py:3 extra": (20, 0.002)}}
    rows = p.own_time_deltas(prof, calls_n=20)
    assert [r["function"] for r in rows[:2]] == ["a.py:1 run", "c.py:3 extra"]
    assert rows[0]["delta_us"] == 300.0 and rows[0]["calls_per_forward"] == [2.0, 2.0]
    assert rows[1]["delta_us"] == 100.0 and rows[1]["calls_per_forward"] == [0.0, 1.0]


def test_host_blocks_alternate_the_sides_block_by_block() -> None:
    p = probe()
    order: List[str] = []

    class Cuda:
        @staticmethod
        def synchronize() -> None:
            pass

    class Torch:
        cuda = Cuda

    out = p.host_blocks(Torch, {"a": lambda: order.append("a"), "b": lambda: order.append("b")}, calls=12, blocks=4)
    assert [len(v) for v in out.values()] == [12, 12]
    assert order[:3] == ["a"] * 3 and order[3:9] == ["b"] * 6 and order[9:12] == ["a"] * 3
