"""The ``config`` agent of ``kforge optimize``: per generated Triton kernel of the compiled
baseline, a search over its launch configuration (block sizes, ``num_warps``, ``num_stages``;
for a looped reduction also a block that covers the whole reduction, the persistent form the
looped kernel offers) on the kernel's captured arguments, the kernels taken in the order of their
time share; every configuration is compiled and checked before anything is timed; the winners
are pinned together into the compiled model and validated and timed end to end.

``python3 -m kforge.optimize.config PROBLEM --out RESULT.json [--device cuda] [--size default|large]
[--baseline MODE] [--rounds N] [--max-configs N] [--top-kernels K] [--result-dir DIR]``

How a configuration is pinned: Inductor's own per-kernel lookup table
(``torch._inductor.config.autotune_lookup_table``: the SHA-256 of the kernel's size hints and
its ``@triton.jit`` function with the name left out, mapped to one configuration). A kernel
compiled with an entry for its hash gets exactly that configuration and no other; the table is a
compile option, so the result file pins the same configurations through ``torch.compile(...,
options=...)`` alone (torch and Triton, no kforge import, no patched library function). Every
kernel the baseline launched is pinned in the table — the tuned ones to their winners, the
others to the configuration the baseline autotuned to — and coordinate-descent tuning is off, so
nothing tunes again at the first call (issue 159525: tuning during the first calls skews the
timing). A kernel whose function is not named ``*_fused_*`` is not looked up by Inductor: it is
left as it is.

Exit status: 0 result written, 2 could not run (bad input or the environment: one line
``kforge optimize: WHY``). torch is imported inside the functions that use it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..autoregions import inductor_regions
from ..bench import do_bench_interleaved
from ..harness import SIZES, clone_output, compare, finite_json, identical, max_abs_diff, paired_round, to_device
from ..inspect.capture import copy_strided
from ..inspect.inductor import CUDA_GRAPH_MODES, WrapperHook, kernel_sources, triton_globals
from ..inspect.kernel_source import KernelSpec, kernel_spec
from ..inspect.restitch import compile_problem, swapping
from ..inspect.roofline import ROOF_SKIP, ROOF_TRUST_MAX, at_roof, device_peak, peak_of, roofline, roofline_summary
from .dispatch import (MODES, DispatchError, another_round_fits, choose, device_profile, load_problem, run_then_leave,
                       rounds_cut, triton_version)
from .result import ResultError, policy_text, renamed_reference, write_files

#: The heuristics (``@triton_heuristics.KIND``) whose kernels the agent tunes.
KINDS = ("pointwise", "reduction", "persistent_reduction", "template")
#: Inductor's largest block per dimension (``runtime.hints.TRITON_MAX_BLOCK`` on NVIDIA); a
#: reduction block up to 4096 in a loop (larger only as the persistent form).
MAX_BLOCK = {"X": 4096, "Y": 1024, "Z": 1024, "R0_": 4096, "R1_": 2048, "R": 4096}
#: A block covering a whole reduction (the persistent form of a looped reduction) up to this.
MAX_PERSISTENT_R = 16384
#: Elements per thread of a tile: at least one (every thread has work), at most this many.
MAX_ELEMENTS_PER_THREAD = {"pointwise": 64, "reduction": 128, "persistent_reduction": 128}
#: CUDA's largest grid in y and z.
MAX_GRID_YZ = 65535
WARPS = (1, 2, 4, 8, 16)
STAGES = {"pointwise": (1,), "reduction": (1, 2, 3), "persistent_reduction": (1,), "template": (2, 3, 4, 5)}
TEMPLATE_WARPS = (2, 4, 8)
#: Timed calls of each configuration per round at least (kernel level) and per model round.
KERNEL_ROUND_CALLS = 10
MODEL_ROUND_CALLS = 10
#: What one kernel's tuning is expected to take before any has been timed in the step (s).
FIRST_TUNE_S = 30.0
#: Why a selected kernel was not tuned: the config step's deadline (``--tune-until``).
NOT_TUNED = "the step's deadline came first (kforge optimize bounds a config step that no wall budget of this size holds)"


class ConfigError(Exception):
    """Bad input or an environment that cannot run the search (exit status 2)."""


@dataclass(frozen=True)
class LaunchConfig:
    """One launch configuration: the block-size kwargs, ``num_warps`` and ``num_stages``."""

    kwargs: Tuple[Tuple[str, int], ...]
    num_warps: int
    num_stages: int

    @staticmethod
    def make(kwargs: Dict[str, int], num_warps: int, num_stages: int) -> "LaunchConfig":
        return LaunchConfig(tuple(sorted((str(k), int(v)) for k, v in kwargs.items())), int(num_warps), int(num_stages))

    @staticmethod
    def of_triton(cfg: Any) -> "LaunchConfig":
        """The configuration of a ``triton.Config`` (integer kwargs only: Inductor's blocks)."""
        kw = {k: v for k, v in dict(cfg.kwargs).items() if isinstance(v, int) and not isinstance(v, bool)}
        return LaunchConfig.make(kw, cfg.num_warps, cfg.num_stages)

    @staticmethod
    def of_dict(d: Dict[str, Any]) -> "LaunchConfig":
        return LaunchConfig.make(dict(d["kwargs"]), d["num_warps"], d["num_stages"])

    @staticmethod
    def of_entry(d: Dict[str, Any]) -> "LaunchConfig":
        """The configuration of a lookup-table entry (other keys than blocks, warps, stages dropped)."""
        kw = {k: v for k, v in d.items() if k not in ("num_warps", "num_stages") and isinstance(v, int) and not isinstance(v, bool)}
        return LaunchConfig.make(kw, d["num_warps"], d["num_stages"])

    def block(self, name: str) -> Optional[int]:
        return dict(self.kwargs).get(name)

    def as_dict(self) -> Dict[str, Any]:
        return {"kwargs": dict(self.kwargs), "num_warps": self.num_warps, "num_stages": self.num_stages}

    def entry(self) -> Dict[str, int]:
        """The lookup-table entry (``triton_heuristics.config_from_dict``'s form)."""
        return {**dict(self.kwargs), "num_warps": self.num_warps, "num_stages": self.num_stages}

    def label(self) -> str:
        return " ".join([f"{k}={v}" for k, v in self.kwargs] + [f"warps={self.num_warps}", f"stages={self.num_stages}"])


def block_prefix(block: str) -> str:
    """``XBLOCK`` -> ``X``, ``R0_BLOCK`` -> ``R0_``, ``RBLOCK`` -> ``R``."""
    return block[: -len("BLOCK")]


def hint_key(block: str, hints: Dict[str, int]) -> str:
    """The size-hint key of a block: ``x`` for XBLOCK, ``r0_`` for R0_BLOCK; the older ``RBLOCK``
    is ``r`` (torch before 2.6) or ``r0_``, whichever the hints have."""
    p = block_prefix(block).lower()
    if p == "r" and "r" not in hints and "r0_" in hints:
        return "r0_"
    return p


_NAME_SUB = re.compile(r"^def [^(]+\(")
_SIZE_HINTS = re.compile(r"size_hints=(\{.*?\})")


def lookup_hash(source: str) -> str:
    """The key of a kernel in Inductor's ``autotune_lookup_table``: SHA-256 of the size hints as
    the source spells them (``None`` for a template) and the ``@triton.jit`` function's text with
    its name left out — as ``AsyncCompile.triton`` and ``lookup_autotune_config`` compute it
    (``triton_heuristics.generate_lookup_hash_from_source_code``)."""
    m = _SIZE_HINTS.search(source)
    parts = source.split("@triton.jit\n")
    if len(parts) < 2:
        raise ConfigError("the kernel source has no @triton.jit function")
    fn = _NAME_SUB.sub("(", parts[1].strip(), count=1)
    return hashlib.sha256(((m.group(1) if m else "None") + fn).encode("utf-8")).hexdigest()


def pinnable(name: str) -> bool:
    """Inductor looks a kernel up in the table only when its function's source has ``_fused_``."""
    return "_fused_" in name


def _pow2(lo: int, hi: int) -> List[int]:
    out, v = [], 1
    while v <= hi:
        if v >= lo:
            out.append(v)
        v *= 2
    return out


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def block_choices(spec: KernelSpec, block: str) -> List[int]:
    """The sizes a block may take: powers of two up to the extent's next power of two and
    Inductor's maximum (1 where the extent is 1); a looped reduction's block also the whole
    reduction (its persistent form) up to ``MAX_PERSISTENT_R``."""
    numel = _numel(spec, block)
    if numel <= 1:
        return [1]
    prefix = block_prefix(block)
    top = _next_pow2(numel)
    is_r = prefix.startswith("R")
    choices = _pow2(16 if is_r else 1, min(top, MAX_BLOCK.get(prefix, 1024)))
    if is_r and top <= MAX_PERSISTENT_R and top not in choices:
        choices.append(top)
    return choices


def _numel(spec: KernelSpec, block: str) -> int:
    hints = spec.size_hints or {}
    key = hint_key(block, hints)
    return spec.numels.get(key, hints.get(key, 1))


def _admissible(spec: KernelSpec, cfg: LaunchConfig) -> bool:
    tile = 1
    if spec.kind == "persistent_reduction":  # the reduction's block is in the body: the whole extent
        for key, n in (spec.size_hints or {}).items():
            if key.startswith("r") and f"{key.upper()}BLOCK" not in dict(cfg.kwargs):
                tile *= _next_pow2(spec.numels.get(key, n))
    for b, v in cfg.kwargs:
        tile *= v
        prefix = block_prefix(b)
        if prefix in ("Y", "Z") and math.ceil(_numel(spec, b) / v) > MAX_GRID_YZ:
            return False
    threads = 32 * cfg.num_warps
    return threads <= max(tile, 32) and tile <= threads * MAX_ELEMENTS_PER_THREAD.get(spec.kind, 64)


def distance(a: LaunchConfig, b: LaunchConfig) -> float:
    """How far two configurations are apart: the sum of |log2| ratios of every block, the warps
    and the stages (a block one has and the other not counts 4)."""
    ka, kb = dict(a.kwargs), dict(b.kwargs)
    d = sum(abs(math.log2(max(ka[k], 1) / max(kb[k], 1))) if k in ka and k in kb else 4.0 for k in set(ka) | set(kb))
    return d + abs(math.log2(a.num_warps / b.num_warps)) + abs(a.num_stages - b.num_stages)


def config_space(spec: KernelSpec, original: LaunchConfig, max_configs: int) -> List[LaunchConfig]:
    """The configurations to try for a kernel, the original first, then the others nearest to
    it first (the neighbourhood a cap keeps), deduplicated, at most ``max_configs``.

    The blocks varied are those the original configuration sets (what Inductor passes: a
    persistent reduction's R0_BLOCK is fixed in its body, a kernel without an x dimension has no
    XBLOCK); a template's blocks are fixed in its body and its grid in the wrapper, so only its
    warps and stages vary. Kinds the agent does not know (foreach, user autotune, scans split
    across blocks, cooperative reductions) give the original alone."""
    if max_configs < 1:
        raise ConfigError(f"--max-configs must be at least 1, got {max_configs}")
    out: List[LaunchConfig] = [original]
    if spec.kind not in KINDS:
        return out
    if spec.kind == "template":
        candidates = [LaunchConfig.make(dict(original.kwargs), w, s) for w in TEMPLATE_WARPS for s in STAGES["template"]]
    else:
        names = [b for b, _ in original.kwargs if b in spec.blocks]
        fixed = {b: v for b, v in original.kwargs if b not in names}
        grids: List[Dict[str, int]] = [dict(fixed)]
        for b in names:
            grids = [{**g, b: v} for g in grids for v in block_choices(spec, b)]
        candidates = [LaunchConfig.make(g, w, s) for g in grids for w in WARPS for s in STAGES[spec.kind]]
        candidates = [c for c in candidates if _admissible(spec, c)]
    seen = {original}
    rest = []
    for c in candidates:
        if c not in seen:
            seen.add(c)
            rest.append(c)
    rest.sort(key=lambda c: (distance(c, original), c.label()))
    return (out + rest)[:max_configs]


def select_kernels(device_us: Dict[str, float], kernels: Iterable[str], top_k: int, coverage: float = 0.95) -> List[Dict[str, Any]]:
    """The kernels to tune, by time share: of ``kernels`` (the replaceable ones, by name) those
    with device time in ``device_us`` (per call, every kind of device work), largest first, until
    ``coverage`` of the replaceable time is covered or ``top_k`` are taken. Each with its share of
    all device time and of the replaceable time."""
    if top_k < 1:
        raise ConfigError(f"--top-kernels must be at least 1, got {top_k}")
    total = sum(device_us.values())
    mine = sorted(((device_us[k], k) for k in set(kernels) if device_us.get(k, 0.0) > 0), key=lambda t: (-t[0], t[1]))
    replaceable = sum(us for us, _ in mine)
    out: List[Dict[str, Any]] = []
    covered = 0.0
    for us, k in mine:
        if len(out) >= top_k or (replaceable > 0 and covered >= coverage * replaceable):
            break
        out.append({"kernel": k, "us": us, "share": us / total if total else 0.0,
                    "replaceable_share": us / replaceable if replaceable else 0.0})
        covered += us
    return out


def check_outputs(out: Sequence[Any], ref: Sequence[Any]) -> Dict[str, Any]:
    """A configuration's arguments after its launch against the original configuration's:
    ``identical`` bit for bit, else ``ok`` within the dtype's tolerance (a reduction may sum in
    another order), else not ``ok`` with why."""
    if identical(list(out), list(ref)):
        return {"ok": True, "identical": True, "max_abs_diff": 0.0}
    r = compare(list(out), list(ref), {})
    return {"ok": bool(r["ok"]), "identical": False, **{k: v for k, v in r.items() if k != "ok"}}


def split_rounds(samples: Sequence[Sequence[float]], rounds: int) -> List[List[float]]:
    """Per function, one value per ``rounds`` consecutive slices of its samples (all functions
    were timed call by call in turn: slice r of each covers the same stretch of time): the first
    function's (the original's) median, the others on its scale by their paired ratios to it in
    that slice (``harness.paired_round``)."""
    n = max(1, min(len(xs) for xs in samples) // rounds)
    cut = [[list(xs[i * n:(i + 1) * n] if i < rounds - 1 else xs[i * n:]) for xs in samples] for i in range(rounds)]
    per_round = [paired_round(r) for r in cut]
    return [[per_round[i][f] for i in range(rounds)] for f in range(len(samples))]


def choose_config(original: str, per_round: Dict[str, List[Tuple[float, float, float]]],
                  excluded: Dict[str, str]) -> Dict[str, Any]:
    """The winner among measured configurations (``dispatch.choose``: speedup over the original
    per round, its 95 % interval, the noise floor of the original against itself; the fastest
    whose interval clears the floor, else the original). Configurations in ``excluded`` (they
    changed the results, or did not compile) never win, whatever they measured."""
    timed = {k: v for k, v in per_round.items() if k not in excluded}
    if not timed:
        return {"modes": {}, "noise_floor": None, "winner": original, "fallback": True}
    return choose(original, timed)


# --- on the GPU ---------------------------------------------------------------------------------


#: Inductor options the result compiles with (beside the mode's own), and as its kernels' sources
#: then carry them in their ``inductor_meta``: no coordinate descent and no scaling of a reduction
#: block at load time (either would change a pinned configuration), no local autotune cache (a
#: stale best-config file would not override the table; and the kernels' sources differ from
#: the baseline's, so no kernel object is shared with a baseline compiled in the same process).
RESULT_OPTIONS = {"coordinate_descent_tuning": False, "dynamic_scale_rblock": False, "autotune_local_cache": False}


def as_the_result_compiles(source: str, tag: str) -> str:
    """A kernel source as the result file's compile generates it: ``RESULT_OPTIONS`` in its
    ``inductor_meta`` (the decorator: the function, and so the lookup hash, is unchanged), and a
    first line ``# tag`` (a source new to Inductor's kernel cache: a new kernel object)."""
    head, sep, fn = source.partition("@triton.jit\n")
    for key, value in RESULT_OPTIONS.items():
        head = re.sub(rf"'{key}': [^,}}]+", f"'{key}': {value!r}", head)
    return f"# {tag}\n" + head + sep + fn


def compiled_configs(kernel: Any) -> List[LaunchConfig]:
    """The configurations a compiled kernel launches: its launchers', else its compile results',
    else the configurations it was given."""
    for attr in ("launchers", "compile_results"):
        xs = getattr(kernel, attr, None) or []
        if xs:
            return [LaunchConfig.of_triton(x.config) for x in xs]
    return [LaunchConfig.of_triton(c) for c in getattr(kernel, "configs", None) or []]


def compile_configs(jobs: Sequence[Tuple[str, str, LaunchConfig]]) -> List[Any]:
    """Each (name, source, configuration) compiled from the source with exactly that
    configuration — Inductor's lookup table holding it for the kernel's hash; all submitted first
    (Inductor's compile workers, when it has them, take the table entry with the source) — then
    checked: a kernel that got other configurations (a torch whose workers do not take the table)
    is compiled again in this process, where the table is read. Per job the kernel, or the
    exception (a Triton compile error, out of resources, still another configuration)."""
    import torch._inductor.config as icfg
    from torch._inductor.async_compile import AsyncCompile

    def submit(name: str, source: str, cfg: LaunchConfig, threads: Optional[int]) -> Any:
        patch: Dict[str, Any] = {"autotune_lookup_table": {lookup_hash(source): cfg.entry()}}
        if threads is not None:
            patch["compile_threads"] = threads
        with icfg.patch(patch):
            return AsyncCompile().triton(name, as_the_result_compiles(source, f"kforge config {cfg.label()} {threads}"),
                                         device_str="cuda")

    def settle(k: Any, cfg: LaunchConfig) -> Any:
        k = k.result() if hasattr(k, "result") else k
        got = compiled_configs(k)
        if got != [cfg]:
            raise ConfigError(f"Inductor compiled {[c.label() for c in got]} for {cfg.label()}")
        return k

    out: List[Any] = []
    pending = []
    for name, source, cfg in jobs:
        try:
            pending.append(submit(name, source, cfg, None))
        except Exception as e:
            pending.append(e)
    for (name, source, cfg), k in zip(jobs, pending):
        try:
            if isinstance(k, Exception):
                raise k
            out.append(settle(k, cfg))
        except Exception:
            try:
                out.append(settle(submit(name, source, cfg, 1), cfg))
            except Exception as e:  # this kernel's failure is its result
                out.append(e)
    return out


def _on_stream(kw: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    out = dict(kw)
    if "stream" in out:
        out["stream"] = torch.cuda.current_stream().cuda_stream
    return out


def _copies(before: Sequence[Any], dev: Any) -> List[Any]:
    return [copy_strided(x, dev) for x in before]


def search(space: Sequence[LaunchConfig], build: Callable[[LaunchConfig], Any], launch: Callable[[Any, List[Any]], None],
           fresh: Callable[[], List[Any]], original: Any, rounds: int, device: str, label: str,
           timed: Optional[Callable[[Any, List[Any]], None]] = None) -> Dict[str, Any]:
    """One kernel's search over ``space`` (its first entry the original configuration): every
    configuration built first (``build``: compiled, or why not), each launched on fresh copies of
    the captured arguments and checked against ``original``'s result (``check_outputs``), then
    all that pass timed against ``original`` in one region (call by call in turn, ``rounds``
    slices of the samples; ``timed`` launches there, default ``launch``) and the choice made
    (``choose_config``). ``space[0]`` built the same way
    is checked (``pin_reproduces_original``) but not timed: the original itself is the baseline."""
    first = space[0].label()
    excluded: Dict[str, str] = {}
    built: Dict[str, Any] = {}
    for cfg in space:
        try:
            built[cfg.label()] = build(cfg)
        except Exception as e:  # a Triton compile error, out of resources, another configuration
            excluded[cfg.label()] = f"did not compile: {type(e).__name__}: {str(e)[:200]}"
    ref = fresh()
    launch(original, ref)
    checks: Dict[str, Any] = {}
    for cfg_label, k in built.items():
        args = fresh()
        try:
            launch(k, args)
        except Exception as e:
            excluded[cfg_label] = f"failed to run: {type(e).__name__}: {str(e)[:200]}"
            continue
        checks[cfg_label] = check_outputs(args, ref)
        if not checks[cfg_label]["ok"]:
            excluded[cfg_label] = f"changes the results: {checks[cfg_label].get('why', '')}"
        del args
    runnable = [c for c in built if c not in excluded and c != first]
    result: Dict[str, Any] = {"original": space[0].as_dict(), "configs_tried": len(space), "excluded": excluded,
                              "checks": checks, "pin_reproduces_original": checks.get(first, {}).get("identical")}
    if not runnable:
        result.update({"winner": first, "new": space[0].as_dict(), "fallback": True, "speedup": 1.0,
                       "why": "no other configuration compiled, ran and matched"})
        return result
    args = fresh()
    go = timed or launch
    fns = [lambda: go(original, args)] + [(lambda k=built[c]: go(k, args)) for c in runnable] + [lambda: go(original, args)]
    samples = do_bench_interleaved(fns, warmup=5, rep=20 * rounds, name=label, min_calls=KERNEL_ROUND_CALLS * rounds,
                                   device=device)
    med = split_rounds(samples, rounds)
    per_round = {c: [(med[0][r], med[1 + i][r], med[-1][r]) for r in range(rounds)] for i, c in enumerate(runnable)}
    chosen = choose_config(first, per_round, excluded)
    winner = next((c for c in space if c.label() == chosen["winner"]), space[0])
    result.update({"winner": winner.label(), "new": winner.as_dict(), "fallback": chosen["fallback"],
                   "noise_floor": chosen["noise_floor"], "configs": chosen["modes"],
                   "speedup": chosen["modes"].get(winner.label(), {}).get("speedup", 1.0),
                   "ci95": chosen["modes"].get(winner.label(), {}).get("ci95")})
    return result


def tune_kernel(name: str, source: str, old: Any, rec: Dict[str, Any], dev: Any, max_configs: int,
                rounds: int) -> Dict[str, Any]:
    """One Inductor kernel's search (``search``) on a GPU: its configurations compiled from its
    source through the lookup table, launched like the wrapper launches it (``kernel.run``) on
    device copies of the arguments recorded at its first launch in the model."""
    import torch

    spec = kernel_spec(name, source)
    original = tuned_config(old)
    if original is None:
        raise ConfigError(f"kernel {name}: not autotuned to one configuration")
    kw = _on_stream(rec["kwargs"])

    def launch(k: Any, args: List[Any]) -> None:
        k.run(*args, **kw)
        torch.cuda.synchronize()

    def timed_launch(k: Any, args: List[Any]) -> None:
        k.run(*args, **kw)

    space = config_space(spec, original, max_configs)
    built = dict(zip([c.label() for c in space], compile_configs([(name, source, c) for c in space])))

    def build(cfg: LaunchConfig) -> Any:
        k = built[cfg.label()]
        if isinstance(k, Exception):
            raise k
        return k

    r = search(space, build, launch,
               lambda: _copies(rec["before"], dev), old, rounds, str(dev), f"optimize:config:{name[:60]}", timed_launch)
    return {"kind": spec.kind, "lookup_hash": lookup_hash(source), **r}


def recording(recorded: Dict[str, Dict[str, Any]], restore: List[Tuple[Any, Any]]) -> Callable[[Any], None]:
    """A ``WrapperHook`` callback: each Triton kernel of a loaded wrapper records the arguments
    of its first launch (host copies, sizes and strides kept; not while a CUDA graph records)."""
    def on_load(mod: Any) -> None:
        import torch

        for name, obj in triton_globals(mod).items():
            orig = obj.run

            def run(*args: Any, _orig: Any = orig, _name: str = name, **kw: Any) -> Any:
                if _name not in recorded and not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
                    recorded[_name] = {"before": [copy_strided(x, "cpu") for x in args], "kwargs": kw}
                return _orig(*args, **kw)

            obj.run = run
            restore.append((obj, orig))

    return on_load



def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def wrapper_kernels(modules: Sequence[Any]) -> List[Tuple[Any, str, Any, str]]:
    """(wrapper module, kernel name, kernel object, kernel source) of every Triton kernel."""
    out = []
    for mod in modules:
        src = kernel_sources(_read(mod.__file__))
        for name, k in triton_globals(mod).items():
            if name in src:
                out.append((mod, name, k, src[name]))
    return out


def tuned_config(kernel: Any) -> Optional[LaunchConfig]:
    """The one configuration a kernel autotuned to (None: not launched, or not down to one)."""
    ls = getattr(kernel, "launchers", None) or []
    return LaunchConfig.of_triton(ls[0].config) if len(ls) == 1 else None


def model_rounds(first: Callable[[], Any], second: Callable[[], Any], rounds: int,
                 end: Optional[float] = None) -> List[Tuple[float, float, float]]:
    """(baseline, re-stitched, baseline again) per round (the baseline's median, the others by their
    paired ratios to it: ``harness.paired_round``), each round in one region, every
    timed call after an untimed call of the same function (the switch is not timed). With ``end``
    (Unix seconds: the step's end) no round past the first two starts that would end after it
    (:func:`another_round_fits`): fewer rounds, a wider interval, a step that ends in its budget."""
    rows: List[Tuple[float, float, float]] = []
    last_s = 0.0
    for r in range(rounds):
        if not another_round_fits(r, last_s, end, time.time()):
            break
        t0 = time.time()
        a, b, c = do_bench_interleaved([first, second, first], name=f"optimize:config-round-{r}",
                                       prepare_each=[first, second, first], min_calls=MODEL_ROUND_CALLS)
        last_s = time.time() - t0
        tb, tn, tb2 = paired_round([a, b, c])
        rows.append((tb, tn, tb2))
    return rows


def restitch_winners(problem: Any, mode: str, dev: Any, compiled: Callable[..., Any], inputs: Sequence[Any],
                     modules: Sequence[Any], pins: Dict[str, LaunchConfig],
                     winners: Dict[str, LaunchConfig]) -> Tuple[Any, Callable[[], Any], Callable[[], Any]]:
    """The winners pinned at once into the model: (its output, the baseline, the re-stitched).
    Without CUDA graphs in the baseline compile itself (the winners set in its wrapper modules,
    the other kernels its own); with CUDA graphs into a second compile, every kernel of which is
    pinned (winners, else the baseline's own configuration) before its graphs are recorded."""
    import torch

    if mode not in CUDA_GRAPH_MODES:
        swaps = [(mod, name, old, src) for mod, name, old, src in wrapper_kernels(modules) if src in winners]
        built = compile_configs([(name, src, winners[src]) for _m, name, _o, src in swaps])
        bad = [(name, k) for (_m, name, _o, _s), k in zip(swaps, built) if isinstance(k, Exception)]
        if bad:
            raise ConfigError(f"kernel {bad[0][0]}: pinning it for the re-stitch failed: {type(bad[0][1]).__name__}: {bad[0][1]}")
        pairs = [(mod, name, old, k) for (mod, name, old, _s), k in zip(swaps, built)]
        first, second = swapping(pairs, lambda: compiled(*inputs))
        out = clone_output(second())
        return out, first, second
    _model, compiled2, inputs2 = compile_problem(problem, mode, dev, second=True)
    with WrapperHook(private_from=modules) as hook:
        compiled2(*inputs2)  # the warm-up: loads the wrapper, records no graph yet
    todo: List[Tuple[Any, str, str, LaunchConfig]] = [
        (mod, name, src, cfg) for mod, name, _old, src in wrapper_kernels(hook.modules)
        for cfg in [winners.get(src, pins.get(src))] if cfg is not None]
    jobs: List[Tuple[str, str, LaunchConfig]] = [(n, s, c) for _m, n, s, c in todo]
    for (mod, name, _src, _cfg), k in zip(todo, compile_configs(jobs)):
        if isinstance(k, Exception):
            raise ConfigError(f"kernel {name}: pinning it for the re-stitch failed: {type(k).__name__}: {k}")
        setattr(mod, name, k)
    for _ in range(3):
        out = clone_output(compiled2(*inputs2))  # the graphs record here, with the pinned kernels
    torch.cuda.synchronize()
    return out, (lambda: compiled(*inputs)), (lambda: compiled2(*inputs2))


def compile_options(mode: str) -> Dict[str, Any]:
    """The Inductor options of the result: the mode's own and ``RESULT_OPTIONS`` (those this
    torch has)."""
    import torch._inductor
    import torch._inductor.config as icfg

    return {**torch._inductor.list_mode_options(mode), **{k: v for k, v in RESULT_OPTIONS.items() if hasattr(icfg, k)}}


def reserve_s(compile_s: float, mode: str) -> float:
    """What a config step needs after its kernels are tuned, from its baseline's compile of
    ``compile_s`` seconds: the result file's compile (its check), with CUDA graphs also the
    re-stitch's second compile, each as long as the baseline's, and a fifth more for the timing."""
    return compile_s * (2 if mode in CUDA_GRAPH_MODES else 1) * 1.2


def next_fits(now: float, until: Optional[float], reserve: float, tuned_s: Sequence[float]) -> bool:
    """Whether one more kernel's tuning fits before ``until`` (Unix seconds; ``None``: no
    deadline) with ``reserve`` seconds left after it. A tuning is expected to take as long as
    the longest one so far (``tuned_s``), ``FIRST_TUNE_S`` before any."""
    if until is None:
        return True
    return now + max(tuned_s, default=FIRST_TUNE_S) + reserve <= until


def cut_why(not_tuned: Sequence[str]) -> str:
    """What a result's ``why`` says of the kernels the deadline left out ("" for none)."""
    return f"not tuned, {NOT_TUNED}: {', '.join(not_tuned)}" if not_tuned else ""


def note_not_tuned(result: Dict[str, Any]) -> Dict[str, Any]:
    """``result`` with its ``why`` naming the kernels its deadline left out (``not_tuned``),
    whatever the step decided (a winner's result has no ``why`` of its own)."""
    cut = cut_why(result.get("not_tuned") or [])
    if cut:
        result["why"] = f"{result['why']}; {cut}" if result.get("why") else cut
    return result


def amdahl_ceiling(share: float) -> float:
    """The speedup of the model if its Triton kernels (``share`` of its device time) took none."""
    return math.inf if share >= 1.0 else 1.0 / (1.0 - share)


def pruned_why(share: float, beat: float) -> Optional[str]:
    """Why the search is not worth its cost, or ``None``: no launch configuration can make the
    model faster than its Amdahl ceiling, so when that does not exceed ``beat`` (the speedup
    another family's verified result already has) the config family cannot win."""
    ceiling = amdahl_ceiling(share)
    if ceiling > beat:
        return None
    return (f"not searched: the Amdahl ceiling of its Triton kernels ({share:.0%} of the baseline's device time) "
            f"is {ceiling:.3f}x, not above the {beat:.3f}x another family's verified result has")


def roof_skipped(rows: Dict[str, Dict[str, Any]], skipped: Dict[str, str], skip_at: float) -> Dict[str, str]:
    """The kernels not skipped for another reason that run at their roof (:func:`at_roof`), with
    why; their rows are marked ``skipped`` (what the report lists as not tuned at the roof)."""
    out: Dict[str, str] = {}
    for n, r in rows.items():
        why = None if n in skipped else at_roof(r, skip_at)
        if why:
            out[n] = why
            r["skipped"] = True
    return out


def roof_pruned_why(ceiling: Optional[float], beat: float) -> Optional[str]:
    """Why the search is not worth its cost by the roofline, or ``None``: with every generated
    kernel at its roof (those without a roofline at no time) the model would be at most
    ``ceiling`` faster, and that does not exceed ``beat``."""
    if ceiling is None or ceiling > beat:
        return None
    return (f"not searched: its roofline ceiling (every generated kernel at its bandwidth roof) is {ceiling:.3f}x, "
            f"not above the {beat:.3f}x to beat")


def nothing_tuned_why(skipped: Dict[str, str], not_tuned: Sequence[str]) -> str:
    """Why no kernel was tuned: every one with device time is at its roof (none was selected, none
    deferred by the deadline), or how many of those that were not tuned are."""
    roof = [n for n, why in skipped.items() if why.startswith("at its bandwidth roof")]
    if roof and len(roof) == len(skipped) and not not_tuned:
        return f"no kernel was tuned: every generated kernel runs at its bandwidth roof ({', '.join(roof[:3])})"
    return "no kernel was tuned" + (f" ({len(roof)} at their bandwidth roof)" if roof else "")


def measure(problem: Any, mode: str, dev: Any, rounds: int, max_configs: int, top_k: int,
            problem_path: Optional[str] = None, result_dir: Optional[str] = None, beat: float = 1.0,
            tune_until: Optional[float] = None, end: Optional[float] = None, roof_skip: float = ROOF_SKIP) -> Dict[str, Any]:
    """The whole agent step on a GPU (see the module's docstring). With ``problem_path`` and
    ``result_dir`` the result file is written there and, for a winner, checked: imported, compiled,
    its kernels' configurations read back against the table and its output against the baseline's
    (``model_new``); a winner whose file does not reproduce its pins falls back. With ``beat``
    above 1, the kernels are searched only when their Amdahl ceiling exceeds it
    (:func:`pruned_why`). With ``tune_until`` (Unix seconds: the tuning's deadline) a kernel is
    tuned only while its tuning and what follows it fit before then (:func:`next_fits`); the others
    are listed in ``not_tuned``. With ``end`` (Unix seconds: the step's end, after ``tune_until``) the
    re-stitched model's timing rounds past the first two stop before it (``rounds_cut``). A kernel
    whose least traffic moves at ``roof_skip`` of the device's bandwidth or more is not tuned
    (:func:`at_roof`; the result's ``roofline`` has every kernel's row)."""
    import torch
    import torch._inductor.config as icfg

    if not hasattr(icfg, "autotune_lookup_table"):
        raise ConfigError(f"torch {torch.__version__} has no torch._inductor.config.autotune_lookup_table to pin configurations with")
    icfg.fx_graph_cache = False  # wrapper modules generated (and loaded) in this process
    began = time.perf_counter()
    _model, compiled, inputs = compile_problem(problem, mode, dev)
    recorded: Dict[str, Dict[str, Any]] = {}
    restore: List[Tuple[Any, Any]] = []
    with torch.no_grad():
        with WrapperHook(recording(recorded, restore)) as hook:
            expected = clone_output(compiled(*inputs))
        compile_s = time.perf_counter() - began  # the compile runs at the first call
        for obj, orig in restore:
            obj.run = orig
        for _ in range(3):
            compiled(*inputs)
        torch.cuda.synchronize()
        totals = device_profile(compiled, inputs, 3, "optimize:config-profile")
        us = {n: t["us"] for n, t in totals.items()}
        found = wrapper_kernels(hook.modules)
        names = [n for _m, n, _k, _s in found]
        pins = {src: cfg for _m, n, k, src in found if pinnable(n) for cfg in [tuned_config(k)] if cfg is not None}
        skipped = unsearchable(found, pins, recorded)
        rates, l2, peak_why = device_peak(dev)
        rows = roofline(found, recorded, totals, peak_of(rates), l2)
        skipped.update(roof_skipped(rows, skipped, roof_skip))
        roof = {**roofline_summary(us, names, rows, rates, l2, peak_why), "skip_at": roof_skip}
        share = sum(us.get(n, 0.0) for n in set(names)) / max(sum(us.values()), 1e-9)
        by_roof = roof_pruned_why(roof["ceiling"], beat) if roof_skip <= ROOF_TRUST_MAX else None
        pruned = pruned_why(share, beat) or by_roof
        selected = [] if pruned else select_kernels(us, [n for n in names if n not in skipped], top_k)
        by_name = {n: (m, k, s) for m, n, k, s in found}

        def tune(name: str) -> Dict[str, Any]:
            _mod, old, src = by_name[name]
            return tune_kernel(name, src, old, recorded[name], dev, max_configs, rounds)

        kernels, not_tuned = tune_selected(selected, tune, tune_until, reserve_s(compile_s, mode))
        recorded.clear()
        winners = {by_name[n][2]: LaunchConfig.of_dict(r["new"]) for n, r in kernels.items() if r.get("fallback") is False}
        result: Dict[str, Any] = {
            "baseline": mode, "kernels_seen": len(found), "skipped": skipped, "kernels": kernels,
            "device_us": {n: round(v, 2) for n, v in sorted(us.items(), key=lambda t: -t[1])[:40]},
            "triton_share": share, "roofline": roof, "beat": beat, "compile_s": round(compile_s, 2),
            "tune_until": tune_until, "until": end, "not_tuned": not_tuned,
            "prepared": {mode: {"ok": True}}, "modes": {}, "noise_floor": None, "winner": mode, "fallback": True,
            "compile_options": compile_options(mode),
            "pins": {lookup_hash(s): {"kernel": n, **(winners.get(s) or pins[s]).entry()} for _m, n, _k, s in found if s in pins}}
        if not winners:
            result["why"] = pruned or ("no kernel's configuration beat its original beyond noise" if kernels else
                                       nothing_tuned_why(skipped, not_tuned))
            return result
        out, first, second = restitch_winners(problem, mode, dev, compiled, inputs, hook.modules, pins, winners)
        check = check_outputs([out], [expected])
        result["restitch"] = {**check, "kernels_pinned": len(winners), "max_abs_diff": max_abs_diff(out, expected)}
        result["prepared"]["config"] = {"ok": check["ok"], "why": check.get("why")}
        if not check["ok"]:
            result["why"] = f"the re-stitched model's output differs from the baseline's: {check.get('why')}"
            return result
        timed = model_rounds(first, second, rounds, end)
        result.update(choose(mode, {"config": timed}))
        if cut := rounds_cut(len(timed), rounds):
            result["rounds_cut"] = cut
        del first, second, out  # the re-stitched compile (with CUDA graphs a second one) before the file's
        torch.cuda.empty_cache()
        if problem_path is not None and result_dir is not None:
            result["versions"] = versions()
            model_path, _policy = write_result(problem_path, result, result_dir)
            if not result["fallback"]:
                result["model_new"] = check_model_new(model_path, problem, dev, result["pins"], expected)
                if unreproduced(result, mode):
                    write_result(problem_path, result, result_dir)
    return result


def unsearchable(found: Sequence[Tuple[Any, str, Any, str]], pins: Dict[str, LaunchConfig],
                 recorded: Dict[str, Dict[str, Any]]) -> Dict[str, str]:
    """Why each of the wrapper modules' kernels (``(module, name, kernel, source)``) cannot be
    searched, by name: a name that is not Inductor's ``*_fused_*`` (the lookup table keys on
    those), a kernel not autotuned to one configuration (no pin), a name that two modules share, a
    kernel whose launch was not recorded (no arguments to replay). A searchable kernel has no row."""
    names = [n for _m, n, _k, _s in found]
    return {n: why for _m, n, _k, src in found for why in [
        "not *_fused_*: Inductor's lookup table does not apply" if not pinnable(n) else
        "not autotuned to one configuration" if src not in pins else
        "its name is in more than one wrapper module" if names.count(n) > 1 else
        "its launch was not recorded" if n not in recorded else ""] if why}


def tune_selected(selected: Sequence[Dict[str, Any]], tune: Callable[[str], Dict[str, Any]], tune_until: Optional[float],
                  reserve: float, clock: Callable[[], float] = time.time) -> Tuple[Dict[str, Any], List[str]]:
    """Each selected kernel tuned in turn (``tune(name)``: its search's result) while it and what
    follows fit before ``tune_until`` (:func:`next_fits`, ``reserve`` kept for the re-stitch);
    the rest are returned as not tuned. A kernel whose tuning raises keeps its original
    (``fallback``, the error named): one kernel's failure is its result, not the step's."""
    kernels: Dict[str, Any] = {}
    tuned_s: List[float] = []
    not_tuned: List[str] = []
    for sel in selected:
        name = sel["kernel"]
        if not next_fits(clock(), tune_until, reserve, tuned_s):
            not_tuned.append(name)
            continue
        t = clock()
        try:
            kernels[name] = {**sel, **tune(name)}
        except Exception as e:
            kernels[name] = {**sel, "fallback": True, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        tuned_s.append(clock() - t)
    return kernels, not_tuned


def unreproduced(result: Dict[str, Any], mode: str) -> bool:
    """Whether the written result file failed to reproduce the winners (its check is
    ``result["model_new"]``: a tuned kernel missed or not found, or its output wrong); if so the
    result falls back to ``mode``, saying why, and is to be written again."""
    check = result["model_new"]
    tuned = {n for n, r in result["kernels"].items() if r.get("fallback") is False}
    missed = [n for n in check["missed"] + check["not_found"] if n in tuned]
    if not missed and check["ok"]:
        return False
    result.update(winner=mode, fallback=True,
                  why=f"the result file does not reproduce the winners (missed {missed}; output ok: {check['ok']})")
    return True


def versions() -> Dict[str, Optional[str]]:
    import torch

    return {"torch": str(torch.__version__), "triton": triton_version()}


def check_model_new(model_path: str, problem: Any, dev: Any, pins: Dict[str, Dict[str, Any]], expected: Any) -> Dict[str, Any]:
    """The result file run as a candidate would be: imported, ``ModelNew`` built like the problem's
    model (same seeds) and called (the first call compiles; with CUDA graphs the next ones record);
    every Triton kernel its compile loaded that has a table entry launched exactly that entry
    (``pinned``) or not (``missed``); entries no kernel had (``not_found``) — each by the name the
    kernel had in the baseline; the output against the baseline's."""
    import torch

    spec = importlib.util.spec_from_file_location("kforge_config_model_new", model_path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{model_path}: cannot be imported")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with torch.device(dev):
        torch.manual_seed(0)
        model = mod.ModelNew(*[to_device(x, dev) for x in problem.get_init_inputs()]).to(dev).eval()
        torch.manual_seed(1)
        inputs = [to_device(x, dev) for x in problem.get_inputs()]
    with torch.no_grad():
        with WrapperHook() as hook:
            out = clone_output(model(*inputs))
        for _ in range(2):
            out = clone_output(model(*inputs))
    torch.cuda.synchronize()
    pinned: List[str] = []
    missed: List[str] = []
    seen = set()
    for _m, name, k, src in wrapper_kernels(hook.modules):
        h = lookup_hash(src)
        if h in pins:
            seen.add(h)
            (pinned if compiled_configs(k) == [LaunchConfig.of_entry(pins[h])] else missed).append(str(pins[h].get("kernel", name)))
    not_found = sorted(str(e.get("kernel")) for h, e in pins.items() if h not in seen)
    return {"kernels": len(wrapper_kernels(hook.modules)), "pinned": pinned, "missed": missed, "not_found": not_found,
            **check_outputs([out], [expected])}


# --- the result file ----------------------------------------------------------------------------


def model_new_source(problem_path: str, problem_source: str, measured: Dict[str, Any]) -> str:
    """The standalone ``ModelNew`` module of a config result: the reference's forward compiled in
    the baseline's mode with its options written out and every pinned kernel's configuration in
    Inductor's lookup table (torch and Triton alone). For a fallback, the baseline mode as it is."""
    mode = measured.get("baseline")
    if mode not in MODES or mode == "eager":
        raise ResultError(f"the config result's baseline {mode!r} is not a compile mode")
    versions = measured.get("versions", {})
    won = measured.get("winner") == "config" and not measured.get("fallback", True)
    speedup = measured.get("modes", {}).get("config", {}).get("speedup")
    body = renamed_reference(problem_source, problem_path)
    kernels = measured.get("kernels", {})
    tuned = sorted(n for n, r in kernels.items() if r.get("fallback") is False)
    if won:
        options = {**measured["compile_options"]}
        pins = {h: {k: v for k, v in e.items() if k != "kernel"} for h, e in sorted(measured["pins"].items())}
        how = (f"compiled with torch.compile(options=..., dynamic=False): the {mode!r} mode's Inductor options,\n"
               f"coordinate descent off, and {len(pins)} Triton kernel(s) pinned through Inductor's autotune_lookup_table\n"
               f"({len(tuned)} to configurations the config agent measured faster: {', '.join(tuned)}; the others\n"
               "to the configuration the baseline autotuned to). A key is the SHA-256 of a kernel's size hints and\n"
               "function: a torch or Triton that generates other code misses it and runs Inductor's own choice.\n")
        compile_args = "options=COMPILE_OPTIONS"
    else:
        options, pins = {}, {}
        how = f"compiled with torch.compile(mode={mode!r}, dynamic=False): the baseline (no configuration won)"
        compile_args = f"mode={mode!r}"
    header = (f'"""kforge optimize result for {problem_path.rsplit("/", 1)[-1]} (agent config): the reference\'s forward,\n'
              f"{how.rstrip(chr(10)).rstrip('.')}.\nBaseline {mode!r}; measured speedup "
              f"{'%.3fx' % speedup if won and isinstance(speedup, float) else 'none (the baseline kept)'}; "
              f"made with torch {versions.get('torch')}, Triton {versions.get('triton')}.\n"
              'Torch code by design: verify with the policy beside this file (torch_policy = "reference-ops")."""\n\n')
    lines = ["", "", "#: The lookup table: kernel hash -> its launch configuration (the kernel named in the comment)."]
    lines.append("PINNED_CONFIGS = {")
    for h, e in pins.items():
        lines.append(f"    {h!r}: {e!r},  # {measured['pins'][h].get('kernel')}")
    lines.append("}")
    if won:
        lines.append(f"COMPILE_OPTIONS = {{**{options!r}, 'autotune_lookup_table': PINNED_CONFIGS}}")
    tail = f'''

class ModelNew(Reference):
    """The reference's forward, compiled on the first call (static shapes)."""

    def forward(self, *inputs):
        compiled = self.__dict__.get("_compiled_forward")
        if compiled is None:
            compiled = torch.compile(super().forward, {compile_args}, dynamic=False)
            self.__dict__["_compiled_forward"] = compiled
        return compiled(*inputs)
'''
    return header + "import torch\n" + body + "\n".join(lines) + "\n" + tail


def write_result(problem_path: str, measured: Dict[str, Any], out_dir: str) -> Tuple[str, str]:
    """``out_dir/model_new.py`` and ``out_dir/policy.toml`` for a config result."""
    try:
        source = _read(problem_path)
    except OSError as e:
        raise ResultError(f"{problem_path}: {e.strerror}") from e
    return write_files(out_dir, model_new_source(problem_path, source, measured), policy_text(measured))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kforge.optimize.config")
    ap.add_argument("problem")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="cuda or cuda:N (Triton kernels need a GPU)")
    ap.add_argument("--size", default="default", choices=SIZES)
    ap.add_argument("--baseline", default="max-autotune")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-configs", type=int, default=24)
    ap.add_argument("--top-kernels", type=int, default=8)
    ap.add_argument("--result-dir", help="also write model_new.py and policy.toml there")
    ap.add_argument("--beat", type=float, default=1.0, metavar="SPEEDUP",
                    help="the speedup another family's verified result already has: the kernels are searched "
                         "only when their Amdahl ceiling exceeds it (kforge optimize passes the dispatch family's)")
    ap.add_argument("--tune-until", type=float, default=None, metavar="UNIX_S",
                    help="the tuning's deadline: a kernel is tuned only while its tuning, the re-stitch and the "
                         "result's check fit before it (kforge optimize bounds a config step no wall budget holds)")
    ap.add_argument("--until", type=float, default=None, metavar="UNIX_S",
                    help="the step's end: no timing round of the re-stitched model past the first two starts that "
                         "would end after it (kforge optimize gives every config step under a wall budget one)")
    ap.add_argument("--roof-skip", type=float, default=ROOF_SKIP, metavar="FRACTION",
                    help=f"a kernel whose least traffic moves at this fraction of the device's bandwidth or more "
                         f"is at its roof and not tuned (default {ROOF_SKIP}; above {ROOF_TRUST_MAX}: every kernel is tuned)")
    a = ap.parse_args(argv)
    try:
        if not (math.isfinite(a.roof_skip) and a.roof_skip > 0):
            raise ConfigError(f"--roof-skip must be a positive fraction of the device's bandwidth, got {a.roof_skip}")
        if a.rounds < 2:
            raise ConfigError(f"--rounds must be at least 2 (an interval needs two rounds), got {a.rounds}")
        if a.until is not None and a.tune_until is not None and a.until < a.tune_until:
            raise ConfigError(f"--until {a.until:.3f} is before --tune-until {a.tune_until:.3f}: the step's end "
                              f"comes after its tuning's deadline")
        if a.max_configs < 2:
            raise ConfigError(f"--max-configs must be at least 2 (the original and one other), got {a.max_configs}")
        if a.top_kernels < 1:
            raise ConfigError(f"--top-kernels must be at least 1, got {a.top_kernels}")
        if not (math.isfinite(a.beat) and a.beat > 0):
            raise ConfigError(f"--beat must be a positive speedup, got {a.beat}")
        if a.baseline not in MODES or a.baseline == "eager":
            raise ConfigError(f"--baseline {a.baseline!r}: the config agent tunes a compiled baseline's kernels "
                              f"(one of: {', '.join(m for m in MODES if m != 'eager')})")
        if not a.device.startswith("cuda"):
            raise ConfigError(f"--device {a.device}: the config agent times Triton kernels, which need a GPU (cuda)")
        try:
            import torch
        except ImportError as e:
            raise ConfigError(f"torch is not importable here ({e})") from e
        try:
            problem = load_problem(a.problem, a.size)
        except DispatchError as e:
            raise ConfigError(str(e)) from e
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {a.device} but no CUDA GPU is visible")
        result_dir = a.result_dir or tempfile.mkdtemp(prefix="kforge-config-")
        inductor_regions()  # under a daemon, the baseline compile's own autotuning runs in regions
        result = note_not_tuned(measure(problem, a.baseline, torch.device(a.device), a.rounds, a.max_configs,
                                        a.top_kernels, a.problem, result_dir, a.beat, a.tune_until, a.until,
                                        a.roof_skip))
        result.update(problem=a.problem, size=a.size, device=a.device, agent="config", versions=versions())
        if a.result_dir:
            write_result(a.problem, result, a.result_dir)
    except (ConfigError, ResultError) as e:
        print(f"kforge optimize: {e}", file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        json.dump(finite_json(result), f, indent=1, allow_nan=False)
    return 0


if __name__ == "__main__":
    run_then_leave(main, "config")
