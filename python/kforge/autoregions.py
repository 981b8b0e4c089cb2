"""Regions for unmodified benchmark scripts: ``kforge run --auto-regions``.

With ``--auto-regions`` the daemon sets ``KFORGE_AUTO_REGIONS=1`` in the job's environment and
prepends a directory holding only a ``sitecustomize.py`` to its ``PYTHONPATH``; that file calls
:func:`bootstrap`, which runs the ``sitecustomize`` the environment already had (the next one on
``sys.path``: chained, not shadowed) and then :func:`install`. A warm worker calls
:func:`install` itself for such a job and :meth:`AutoRegions.uninstall` after it. Outside a
kforge job (no ``KFORGE_SOCKET``) or without the variable, nothing is patched.

Covered timing entry points (each wrapped when its module is imported, or at once if it already
is), and the region each gets:

* ``triton.testing.do_bench`` and ``triton.testing.do_bench_cudagraph``: each call runs inside one
  region, ``auto:do_bench`` / ``auto:do_bench_cudagraph`` (attribute lookups and
  ``from triton.testing import do_bench`` made after the import both see the wrapper);
* ``torch.utils.benchmark.Timer.timeit``, ``.blocked_autorange`` and ``.adaptive_autorange``: each
  call one region, ``auto:Timer.timeit`` and so on;
* CUDA events, ``torch.cuda.Event(enable_timing=True)``: region ``auto:cuda-event``, by the rule
  below;
* Inductor's own autotuning (:meth:`AutoRegions.patch_inductor_benchmarking`): the methods
  :data:`INDUCTOR_METHODS` of every benchmarker class of ``torch._inductor.runtime.benchmarking``
  (the module's ``benchmarker`` object is what max-autotune's choice selection, the Triton
  heuristics' config benchmarking and coordinate descent all call) and
  ``torch._inductor.utils.do_bench_using_profiling``: each call one region,
  ``auto:inductor.benchmark_gpu`` and so on (a call nested in another: inside the outer one's); the
  autotune subprocess (``autotune_in_subproc``) gets the hooks too: ``python_subprocess_env``,
  which builds its environment, is made to put the bootstrap directory first on its
  ``PYTHONPATH`` (Inductor builds that from ``sys.path``, which no longer holds it).
  :func:`inductor_regions` installs only these, for a kforge step that compiles under a daemon
  without ``--auto-regions``.

Not covered: host clocks (``time.perf_counter``/``time.time`` loops, ``timeit``), events created
without ``enable_timing``, names bound before the hook saw the module (``from triton.testing
import do_bench`` in a ``sitecustomize`` that ran before ours), CUDA events recorded from C++,
processes started with ``python -S``/``-I`` (no ``sitecustomize``) and non-Python processes.

The event rule (per thread). A region is *entered* when a timing event is recorded while the
thread holds no region (kforge's own or an automatic one): before the event is recorded, so the
interval it starts lies inside the region. Timing events recorded while the interval is open are
its *end* events. The interval *ends* when the host has seen it complete:

1. ``torch.cuda.synchronize()`` or ``Stream.synchronize()`` returns after an end event was
   recorded (everything recorded before it has finished);
2. ``Event.synchronize()`` returns for the last end event recorded;
3. ``Event.elapsed_time()`` returns after an end event was recorded (it succeeds only when both
   of its events have completed; before any end event it is an earlier interval's).

Why host waits and not the first ``elapsed_time()`` alone: every timing loop must wait for its
end event before it can read a time, so the wait is the earliest moment the interval is known to
be complete; GPU work the script issues after the wait and before it reads the time (a
correctness check, the next input) then runs outside the region, and a loop that records all its
event pairs and waits once gets one region, not one per pair. A wait before any end event
(``start.record(); fn(); torch.cuda.synchronize(); end.record()``) does not exit: the interval
is still open. ``elapsed_time()`` is the fallback for a script that waits some other way
(``Event.query()`` polling).

Linger. When an interval ends the region is not exited at once: it *lingers* for
:data:`LINGER_S`, and a timing event recorded on the same thread within that time starts the next
interval in the same region (a trial loop — KernelBench's one event pair, ``synchronize`` and
``elapsed_time`` per trial — is one region, not one per trial). A region entered per trial made
every trial pay the entry (the gate closed and drained, the siblings frozen and thawed, the
thread moved to a reserved core) right before its start event: on the H200 the per-trial event
times rose 7-10 % at p50 and 27-32 % at p95 with nothing else on the GPU, and beside three
competing jobs each entry also waited ~0.55 s (p50) for their queued work to drain and the GPU's
power to settle: a 100-trial series took 43 s and the eval ran into its time limit. A lingering region is
exited by the first of: the grace period passing (a reaper thread, at most a few ms late, or the
next hook call of the thread), a wrapped timing call (``do_bench``, ``Timer``: it gets its own
region), the lease check below, ``atexit``/``uninstall``. A continuing region older than
:data:`CONTINUE_WITHIN_LEASE` of its lease is exited and a new one entered instead, so a long
loop never runs into the daemon's revocation. Bound: a region outlives its last interval by at
most ``LINGER_S`` plus the reaper's wake-up (the GIL's switch interval, 5 ms) and one
``region_exit`` round trip, except while a ``kforge.region`` joined into it is still open (it is
exited when that one exits, if the grace period has passed). What the script does in that window
(the next problem's set-up, a correctness check) runs inside the region: at most ``LINGER_S`` of
it, never a long computation. The first interval of a region still follows its entry directly.

A region never stays open for good: one open longer than its lease (the daemon's maximum region
length, ``lease_ms`` of the grant; the daemon revokes it then anyway) is exited at the next
event call of the thread, every open one is exited at interpreter exit (``atexit``) and by
:meth:`AutoRegions.uninstall`, and a revoked region is reported on stderr, never raised into the
script. A wrapped timing call still inside its region after :data:`LONG_HOLD_SHARE` of the lease
is reported once on stderr with its thread's innermost frames (the reaper's long-hold report).

Nesting. An automatic region is *joinable*: a ``kforge.region``/``kforge.do_bench`` entered inside
it (``kforge.do_bench`` inside a user's event loop) runs inside the held region instead of asking
the daemon again, so nothing double-enters; and no automatic region is entered while the thread
holds any region (``triton.testing.do_bench`` records events inside ``auto:do_bench``;
``kforge.do_bench`` inside its own region). Inside a joined region or a wrapped call, events and
waits are theirs, not the enclosing interval's: ``kforge.do_bench``'s own synchronize inside a
user's event interval does not end that interval's region. A region another thread enters while
an automatic region is held joins it as well (waiting for it could wait for ever: the holder may
be waiting for that thread).

Diagnostics: an automatic region whose entry waits longer than :data:`SLOW_ENTRY_S` gets a line
on stderr then (and every ``SLOW_ENTRY_S`` after) naming the region, the wait so far, what it waits
for (the process's region lock or the daemon's grant) and the automatic regions the process
holds, and one when it is finally granted.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import weakref
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from .errors import KforgeError
from .region import Region, active_region

#: Set to ``1`` by the daemon for a job submitted with ``--auto-regions``.
ENV = "KFORGE_AUTO_REGIONS"
#: The attribute that marks an event created with ``enable_timing=True``.
TIMING_MARK = "kforge_auto_timing"
#: The attribute that marks a callable wrapped by this module.
WRAPPED_MARK = "kforge_auto_wrapped"
#: Lease used when the grant names none (no daemon): the daemon's default.
DEFAULT_LEASE_S = 60.0
EVENT_REGION = "auto:cuda-event"
#: How long an event region stays held after its interval ended, waiting for the next interval
#: of the thread (see "Linger" above). Trials of a timing loop are well under 1 ms apart; 50 ms
#: also covers a loop that makes fresh inputs or flushes the L2 between trials.
LINGER_S = 0.05
#: A lingering region older than this fraction of its lease is not continued: exited, and a new
#: one entered for the next interval (a long loop never reaches the daemon's revocation).
CONTINUE_WITHIN_LEASE = 0.5
#: An automatic region entry that waits longer than this is reported on stderr while it waits.
SLOW_ENTRY_S = 2.0
#: A wrapped timing call still holding its region after this share of the region's lease is
#: reported once on stderr, with where its thread is: the daemon revokes the region at the
#: lease, and on the H100 Inductor's benchmark calls of a max-autotune compile were revoked so
#: (something other than timing ran inside them: a lazy compile, a wait on a lock).
LONG_HOLD_SHARE = 0.5
#: Innermost frames of a long hold's report.
HOLD_FRAMES = 8
TIMER_METHODS = ("timeit", "blocked_autorange", "adaptive_autorange")
#: Inductor's benchmarker methods, wrapped on each class of :data:`INDUCTOR_BENCHMARKING` that
#: defines them: ``benchmark`` dispatches by device to the others; ``benchmark_gpu`` is the one
#: every GPU benchmark reaches (``benchmark_gpu_with_cuda_graph`` captures, then calls it).
INDUCTOR_METHODS = ("benchmark", "benchmark_cpu", "benchmark_gpu", "benchmark_gpu_with_cuda_graph")
INDUCTOR_BENCHMARKING = "torch._inductor.runtime.benchmarking"
#: The region names of Inductor's autotuning benchmarks (``auto:inductor.benchmark_gpu``, ...).
INDUCTOR_REGION_PREFIX = "auto:inductor."
#: Their lease: one benchmark of a kernel or a template choice takes well under a second (its
#: regions' median was 0.04-0.06 s in session 21's campaign), but a pathological choice (seconds
#: a call, at the large preset) held its regions to the daemon's 60 s lease, every sibling job
#: frozen meanwhile: 231 s of a 468 s device call. Revoked at this lease, the choice's timing
#: goes on unexclusive (it loses anyway) and the siblings are thawed.
INDUCTOR_LEASE_S = 15.0
#: An autotuning benchmark whose region came back tainted (not exclusive: a sibling's drain timed
#: out or was skipped, its GPU work ran beside the benchmark) is timed once more, in a region of
#: its own: its choice is then made on an exclusive timing, as in an isolated compile. Not a
#: revoked one (it outlived its lease: timing it again would hold the GPU as long again).
INDUCTOR_TAINTED_RETAKES = 1
#: Retakes pause after this many in a row came back tainted again (a sibling's long kernels are
#: still in flight; in session 23 one process stayed behind for 424 drains, and 838 of 903
#: autotuning regions were tainted), until a benchmark's region comes back clean.
INDUCTOR_RETAKE_STREAK = 3
#: An autotuning benchmark (``benchmark_gpu``) whose callable takes longer than this a call, on
#: its first call and again on a second (the first may have compiled or loaded it), is timed by
#: that second call alone: Inductor's own benchmark would run it 5 more times (its runtime
#: estimate, then at least one timed call), and such a choice never wins against the kernels of
#: a 1-15 ms forward. In sessions 22 and 23 one such choice of level3/007 held its regions for
#: 20-152 s, its kernels still in flight after the 15 s lease had revoked them (the siblings'
#: drains timed out on them). An isolated compile would time it as slow too: the choice made is
#: the same, from one sample.
INDUCTOR_SLOW_CALL_S = 1.0
INDUCTOR_UTILS = "torch._inductor.utils"
#: The name of the bootstrap directory the daemon puts first on an ``--auto-regions`` job's
#: ``PYTHONPATH`` (``kforge_python::AUTO_REGIONS_DIR``).
BOOT_DIR_NAME = "kforge-auto-regions"
#: What that directory's ``sitecustomize.py`` runs (``kforge_python::AUTO_REGIONS_SITECUSTOMIZE``
#: writes the same): :func:`inductor_regions` writes one for the autotune subprocess of a step
#: that is no ``--auto-regions`` job.
BOOT_SOURCE = (
    "import os as _os\n\n"
    "from kforge.autoregions import bootstrap as _bootstrap\n\n"
    "_bootstrap(_os.path.dirname(_os.path.abspath(__file__)))\n"
)
TRITON_FUNCTIONS = ("do_bench", "do_bench_cudagraph")

RegionFactory = Callable[[str], Region]
_MISSING = object()


def enabled(environ: Optional[Dict[str, str]] = None) -> bool:
    """Whether this process is a job of a daemon that asked for automatic regions."""
    env = os.environ if environ is None else environ
    return env.get(ENV) == "1" and bool(env.get("KFORGE_SOCKET"))


def joinable_region(name: str) -> Region:
    """The region an automatic hook enters: joinable by kforge's own regions; one of Inductor's
    autotuning benchmarks with the shorter lease :data:`INDUCTOR_LEASE_S`."""
    lease_s = INDUCTOR_LEASE_S if name.startswith(INDUCTOR_REGION_PREFIX) else None
    return Region(name, lease_s=lease_s, joinable=True)


class _Open:
    """An automatic region held by the event rule on one thread."""

    def __init__(self, region: Region, opened: float, lease_s: float) -> None:
        self.pid = os.getpid()
        self.tid = threading.get_ident()
        self.region = region
        self.opened = opened
        self.lease_s = lease_s
        self.last_end: Optional[Any] = None
        # Set while the region lingers (its interval ended): when the grace period ends.
        self.linger_until: Optional[float] = None
        # Claimed for an exit (by the thread or the reaper); done: the exit finished.
        self.closed = False
        self.done = threading.Event()


class _Holding:
    """A wrapped timing call holding its region (for the long-hold report)."""

    def __init__(self, name: str, region: Region, opened: float, lease_s: float) -> None:
        self.name = name
        self.region = region
        self.opened = opened
        self.lease_s = lease_s
        self.report_at: Optional[float] = opened + LONG_HOLD_SHARE * lease_s  # None: reported


class _Waiting:
    """An automatic region entry in progress (for the slow-entry report)."""

    def __init__(self, name: str, region: Region, started: float) -> None:
        self.name = name
        self.region = region
        self.started = started
        self.next_report = started + SLOW_ENTRY_S
        self.reported = False


def cuda_synchronize() -> bool:
    """Wait for the current CUDA device's queued work; False (nothing waited for) when CUDA is
    not initialized in this process."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return False
    cuda.synchronize()
    return True


def benchmarked_autotuner(fn: Any) -> Any:
    """The Inductor ``CachingAutotuner`` whose own ``run`` a benchmark's callable calls, or None:
    a ``functools.partial`` of that bound method (torch 2.11's ``make_run_fn``), or a closure
    over it (later torch's ``run_fn``). A subclass's own ``run`` (the kernel benchmark's
    ``DebugAutotuner``) does more than launch, and is not one."""
    f: Any = fn
    while isinstance(f, functools.partial):
        f = f.func
    bound = [f] + [c.cell_contents for c in (getattr(f, "__closure__", None) or ()) if _cell_full(c)]
    for b in bound:
        if getattr(getattr(b, "__func__", None), "__qualname__", "") == "CachingAutotuner.run":
            return getattr(b, "__self__", None)
    return None


def _cell_full(cell: Any) -> bool:
    """Whether a closure cell holds a value (an unassigned one raises on reading)."""
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def launches_its_kernel_alone(fn: Callable[..., Any]) -> bool:
    """Whether a call of ``fn`` (a benchmark's callable) does nothing but launch one compiled
    Triton kernel: a call of an Inductor ``CachingAutotuner``'s ``run`` (:func:`benchmarked_autotuner`:
    a max-autotune template choice, as ``select_algorithm`` benchmarks it) that holds exactly one
    launcher and tunes nothing on its first call (no coordinate descent to do for it, no combo
    tuning). Its first call's time is then the kernel's, not a compile's or a tuning's: making a
    launcher (``precompile``) already loaded the kernel's binary and initialized its handles
    (``make_launcher``: the static launcher's ``load_kernel``, or Triton's ``_init_handles``),
    so no one-time cost of a second or more is left to a first launch. False for anything else,
    and whenever it cannot tell (another torch's internals)."""
    owner = benchmarked_autotuner(fn)
    launchers, meta = getattr(owner, "launchers", None), getattr(owner, "inductor_meta", None)
    if not isinstance(launchers, list) or len(launchers) != 1 or not isinstance(meta, dict):
        return False  # none yet (compiled on the first call), or several (tuned on it)
    if meta.get("combo_tuning_groups"):
        return False
    return not (meta.get("coordinate_descent_tuning") and would_tune_by_coordinate_descent(owner, launchers[0]))


def compile_choice(fn: Any) -> bool:
    """Compile the kernel of a benchmark's callable that calls an Inductor ``CachingAutotuner``'s
    ``run`` (:func:`benchmarked_autotuner`) holding no launcher yet (what its first ``run`` would do:
    ``precompile``); whether it did. In session 29's probe 12 of 28 max-autotune template choices
    reached their benchmark so on torch 2.11. Nothing when the thread holds a region already (a
    nested benchmark: the outer call compiled it; a lingering event region is ended first, by
    the caller), and nothing but a return of False when
    ``precompile`` fails (``run`` then tries again and raises as Inductor does)."""
    owner = benchmarked_autotuner(fn)
    launchers, precompile = getattr(owner, "launchers", None), getattr(owner, "precompile", None)
    if not isinstance(launchers, list) or launchers or not callable(precompile) or active_region() is not None:
        return False
    try:
        precompile()
    except Exception:
        return False
    return True


#: Inductor's heuristic types whose kernels coordinate descent never tunes (a max-autotune
#: template choice's among them), though max-autotune turns it on for every kernel.
NOT_COORDESC_TUNED = frozenset({"TEMPLATE", "USER_AUTOTUNE", "FIXED"})


def would_tune_by_coordinate_descent(owner: Any, launcher: Any) -> bool:
    """Whether a ``CachingAutotuner``'s next ``run``, with coordinate descent on, would tune
    ``launcher``'s config: not once it was found so (``found_by_coordesc``), nor for a heuristic
    type Inductor never tunes so (:data:`NOT_COORDESC_TUNED`). On torch 2.11 (H100, session 29)
    every max-autotune template choice's ``inductor_meta`` had ``coordinate_descent_tuning`` set
    (``scripts/device/slow_choice_probe.py``)."""
    if getattr(getattr(launcher, "config", None), "found_by_coordesc", False):
        return False
    kind = getattr(getattr(owner, "heuristic_type", None), "name", None)
    return kind not in NOT_COORDESC_TUNED


def inductor_deterministic() -> bool:
    """Whether Inductor's deterministic mode is on (``torch._inductor.config.deterministic``)."""
    config = sys.modules.get("torch._inductor.config")
    return bool(getattr(config, "deterministic", False))


def what_was_timed(args: Sequence[Any]) -> str:
    """The callable a wrapped benchmark call timed, for a report: its first callable argument
    (a method's first argument is the benchmarker itself), on one line, at most 300 characters."""
    what = next((a for a in args if callable(a)), args[0] if args else "?")
    return " ".join(repr(what).split())[:300]


def lease_of(r: Region) -> float:
    """Region ``r``'s lease in seconds, from its grant (:data:`DEFAULT_LEASE_S` when it names
    none)."""
    lease_ms = (r.grant or {}).get("lease_ms")
    return float(lease_ms) / 1e3 if isinstance(lease_ms, (int, float)) and lease_ms > 0 else DEFAULT_LEASE_S


def describe_hold(tid: int, h: _Holding, now: float) -> str:
    """The long-hold report's line: the region, how long of its lease, and the innermost
    :data:`HOLD_FRAMES` frames of the holding thread, innermost first."""
    frame = sys._current_frames().get(tid)
    stack = traceback.extract_stack(frame, limit=HOLD_FRAMES) if frame is not None else []
    where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(stack))
    return (
        f"kforge --auto-regions: region {h.name!r} ({h.region.region}) held for {now - h.opened:.1f} s of its "
        f"{h.lease_s:g} s lease; thread {tid} is at: {where or 'unknown'}"
    )


class AutoRegions:
    """The hooks of one process: what they patched (to undo it) and the regions they hold.

    ``open_region`` makes the region objects (a test can record them); ``clock`` measures how
    long an event region has been open and lingers; ``warn`` writes a line for the user
    (stderr). ``reaper``: start the thread that exits lingering regions when their grace period
    ends and reports slow entries (a test without it calls :meth:`reap` itself).
    """

    def __init__(
        self,
        open_region: RegionFactory = joinable_region,
        clock: Callable[[], float] = time.monotonic,
        warn: Optional[Callable[[str], None]] = None,
        reaper: bool = True,
    ) -> None:
        self.open_region = open_region
        self.clock = clock
        self.warn = warn or (lambda line: sys.stderr.write(line + "\n"))
        self.entered: Dict[str, int] = {}
        #: Autotuning benchmarks timed in a tainted region: ``retaken`` (timed again; of those,
        #: ``tainted_again``) and ``kept`` (retakes paused, or the region was revoked).
        self.retakes: Dict[str, int] = {"retaken": 0, "tainted_again": 0, "kept": 0}
        self._tainted_streak = 0
        #: Autotuning benchmarks timed by one call (:data:`INDUCTOR_SLOW_CALL_S`).
        self.slow_call_count = 0
        #: The slowest such call, in seconds.
        self.slowest_call_s = 0.0
        #: Waits for the device's queued work (``torch.cuda.synchronize`` once CUDA is
        #: initialized); a test sets its own.
        self.device_sync: Callable[[], bool] = cuda_synchronize
        #: Intervals that started in a lingering region instead of entering one.
        self.continued = 0
        self._patched: List[Tuple[Any, str, Any]] = []
        self._local = threading.local()
        self._open: Dict[int, _Open] = {}  # by thread id: for the reaper and interpreter exit
        self._waiting: Dict[int, _Waiting] = {}  # entries in progress, by thread id
        self._holding: Dict[int, _Holding] = {}  # wrapped calls inside their regions, by thread id
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._finder: Optional[_PatchOnImport] = None
        self._use_reaper = reaper
        self._reaper: Optional[threading.Thread] = None
        self._reaper_pid = 0
        self._stopping = False
        self._changes = 0
        self._wake_at: Optional[float] = None  # when the reaper wakes next (None: when notified)
        #: The bootstrap directory Inductor's Python subprocesses get first on their PYTHONPATH
        #: (so the autotune subprocess installs the hooks too); None: they get nothing.
        self.boot_dir: Optional[str] = find_boot_dir()
        _instances.add(self)

    def _after_fork_in_child(self) -> None:
        # A lock the parent's reaper held at fork time would never be released here.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._reaper, self._reaper_pid = None, 0
        self._open = {k: v for k, v in self._open.items() if v.pid == os.getpid()}
        self._waiting = {}
        self._holding = {}

    # -- regions -----------------------------------------------------------------------------

    def _enter(self, name: str) -> Optional[Region]:
        r = self.open_region(name)
        self._ensure_reaper()
        tid = threading.get_ident()
        w = _Waiting(name, r, self.clock())
        with self._cond:
            self._waiting[tid] = w
            self._changed(w.next_report)
        try:
            r.__enter__()
        except KforgeError as e:
            self.warn(f"kforge --auto-regions: could not enter region {name!r}: {e}")
            return None
        finally:
            with self._cond:
                self._waiting.pop(tid, None)
            waited = self.clock() - w.started
            if waited > SLOW_ENTRY_S:
                self.warn(f"kforge --auto-regions: region {name!r} was granted after {waited:.1f} s")
        self.entered[name] = self.entered.get(name, 0) + 1
        return r

    def _exit(self, r: Region) -> None:
        try:
            r.__exit__(None, None, None)
        except KforgeError as e:
            self.warn(f"kforge --auto-regions: region {r.name!r} ({r.region}): {e}")

    def call_in_region(self, name: str, fn: Callable[..., Any], args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)`` inside region ``name``, or as is when the thread holds one (a
        lingering event region of the thread is exited first: the call gets its own)."""
        self.end_lingering()
        self._local.quiet = getattr(self._local, "quiet", 0) + 1
        try:
            if active_region() is not None:
                return fn(*args, **kwargs)
            self._local.slow_call = False
            result, r = self._timed(name, fn, args, kwargs)
            # Timed by one slow call: it loses whatever ran beside it, and a retake would cost
            # two such calls again.
            if r is not None and not self._local.slow_call and self._retake(name, r):
                result, again = self._timed(name, fn, args, kwargs)
                self._retaken(again)
            return result
        finally:
            self._local.quiet -= 1

    def end_lingering(self) -> None:
        """Expired regions closed, and this thread's event region exited if it only lingers (no
        interval open in it): a wrapped call that comes now gets a region of its own."""
        self.close_expired()
        o = self.held_event_region()
        if o is not None and o.linger_until is not None:
            self._close(o)

    def _timed(self, name: str, fn: Callable[..., Any], args: Sequence[Any],
               kwargs: Dict[str, Any]) -> Tuple[Any, Optional[Region]]:
        """``fn``'s result, called inside a new region ``name`` (None: none could be entered;
        the call runs as is), and that region, exited."""
        r = self._enter(name)
        if r is None:
            return fn(*args, **kwargs), None
        tid = self._hold(name, r)
        try:
            return fn(*args, **kwargs), r
        finally:
            with self._lock:
                h = self._holding.pop(tid, None)
            self._exit(r)
            if h is not None and h.report_at is not None and not self._use_reaper:
                self.report_long_hold_at_exit(h, args)

    def _retake(self, name: str, r: Region) -> bool:
        """Whether the call that region ``r`` timed is timed again (:data:`INDUCTOR_TAINTED_RETAKES`):
        one of Inductor's autotuning benchmarks, ``r`` tainted and not revoked, and retakes not
        paused (:data:`INDUCTOR_RETAKE_STREAK`)."""
        if not name.startswith(INDUCTOR_REGION_PREFIX):
            return False
        if not r.tainted:
            self._tainted_streak = 0
            return False
        if r.revoked or self._tainted_streak >= INDUCTOR_RETAKE_STREAK:
            self.retakes["kept"] += 1
            return False
        if self.retakes["retaken"] == 0:
            self.warn(f"kforge --auto-regions: region {name!r} ({r.region}) was not exclusive (tainted): "
                      "its benchmark is timed again, and so is each such one (the count at exit)")
        return True

    def _retaken(self, again: Optional[Region]) -> None:
        """Count a retake; ``again``: its region (None: it ran outside one)."""
        self.retakes["retaken"] += 1
        if again is None or again.tainted:
            self.retakes["tainted_again"] += 1
            self._tainted_streak += 1
        else:
            self._tainted_streak = 0

    def report_retakes(self) -> None:
        """The counts of autotuning benchmarks timed in tainted regions and of those timed by one
        slow call (a line at exit for each, when any)."""
        t = self.retakes
        if t["retaken"] or t["kept"]:
            self.warn(f"kforge --auto-regions: {t['retaken']} autotuning benchmark(s) timed again after a "
                      f"tainted region ({t['tainted_again']} tainted again); {t['kept']} kept as timed "
                      "(revoked, or retakes paused while regions stayed tainted)")
        if self.slow_call_count:
            self.warn(f"kforge --auto-regions: {self.slow_call_count} autotuning benchmark(s) timed by one call, "
                      f"each call over {INDUCTOR_SLOW_CALL_S:g} s (the slowest {self.slowest_call_s:.1f} s)")

    def slow_call_first(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Inductor's ``benchmark_gpu`` ``fn`` with its callable called once first, and again if
        that took longer than :data:`INDUCTOR_SLOW_CALL_S`: when the second call is as slow, its
        time (ms) is the benchmark's result and Inductor's benchmark is not run; so is the first
        call's when that one only launched its kernel (:func:`launches_its_kernel_alone`: no
        second call). Without a device to wait for (``device_sync`` returns False) ``fn`` runs as
        is."""

        @functools.wraps(fn)
        def benchmark_gpu(bench: Any, _callable: Callable[[], Any], *args: Any, **kwargs: Any) -> Any:
            timed = self._slow_call_s(_callable)
            if timed is None:
                return fn(bench, _callable, *args, **kwargs)
            slow, calls = timed
            self._local.slow_call = True
            self.slow_call_count += 1
            self.slowest_call_s = max(self.slowest_call_s, slow)
            if self.slow_call_count == 1:
                how = "once: it only launched its kernel" if calls == 1 else "twice"
                self.warn(f"kforge --auto-regions: an autotuning benchmark's call took {slow:.1f} s (over "
                          f"{INDUCTOR_SLOW_CALL_S:g} s, {how}): it is timed by that call alone, and so is each such "
                          f"one (the count at exit); the call timed: {what_was_timed((_callable,))}")
            return [slow * 1e3] if kwargs.get("return_mode") == "all" else slow * 1e3

        return benchmark_gpu

    def _slow_call_s(self, fn: Callable[[], Any]) -> Optional[Tuple[float, int]]:
        """Seconds of ``fn``'s second call when its first and second both took longer than
        :data:`INDUCTOR_SLOW_CALL_S` (each timed from a device wait to a device wait), or of its
        first when that one only launched its kernel and was that slow, with the calls made; None
        otherwise, and after the first call when that was quick or no device can be waited for.
        One call is enough when it only launched its kernel (:func:`launches_its_kernel_alone`):
        in session 29 such choices of a level-3 convolution took 2.9-26 s a call, and their
        second calls held exclusive regions for as long again.
        Not in Inductor's deterministic mode (its benchmark refuses to run unless vetted), and
        None when a call raises: Inductor's benchmark then calls it again and handles the error
        as it does (an invalid launch configuration is timed as infinite)."""
        if inductor_deterministic() or not self.device_sync():
            return None
        took, alone, calls = 0.0, launches_its_kernel_alone(fn), 0
        try:
            for calls in (1, 2):
                start = self.clock()
                fn()
                self.device_sync()
                took = self.clock() - start
                if took <= INDUCTOR_SLOW_CALL_S:
                    return None
                if alone:
                    break  # nothing compiled or tuned in it: the first call's time is the kernel's
        except Exception:
            return None
        return took, calls

    def report_long_hold_at_exit(self, h: _Holding, args: Sequence[Any]) -> None:
        """Without a reaper thread (:func:`inductor_regions`' hooks), the long-hold report comes
        when the call returns: held past :data:`LONG_HOLD_SHARE` of its lease, the region and
        what it timed (the benchmarked callable, which names the kernel or the template choice).
        In session 21 a depthwise convolution's max-autotune compile held such regions to their
        60 s lease, its siblings frozen meanwhile."""
        held = self.clock() - h.opened
        if held < LONG_HOLD_SHARE * h.lease_s:
            return
        what = what_was_timed(args)
        self.warn(f"kforge --auto-regions: region {h.name!r} ({h.region.region}) held for {held:.1f} s of its "
                  f"{h.lease_s:g} s lease; the call timed: {what}")

    def _hold(self, name: str, r: Region) -> int:
        """Note that this thread's wrapped call holds ``r`` (the reaper reports it past
        :data:`LONG_HOLD_SHARE` of its lease); returns the thread's id."""
        tid = threading.get_ident()
        h = _Holding(name, r, self.clock(), lease_of(r))
        with self._cond:
            self._holding[tid] = h
            self._changed(h.report_at)
        return tid

    def wrap(self, fn: Callable[..., Any], name: str, compile_choice_first: bool = False) -> Callable[..., Any]:
        """``fn`` so that each call runs inside region ``name``. With ``compile_choice_first`` (an
        Inductor benchmark method, ``benchmark(self, callable, ...)``) the callable's kernel is
        compiled before the region is entered (:func:`compile_choice`), where its first call
        would compile it inside, holding the GPU for CPU work; its first call then only launches
        it."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if compile_choice_first and len(args) > 1:
                self.end_lingering()  # the call gets its own region anyway: compile outside any
                compile_choice(args[1])
            return self.call_in_region(name, fn, args, kwargs)

        setattr(wrapper, WRAPPED_MARK, True)
        return wrapper

    # -- the event rule ------------------------------------------------------------------------

    def held_event_region(self) -> Optional[_Open]:
        """This thread's event region (an interval open in it, or lingering), if it holds one."""
        o: Optional[_Open] = getattr(self._local, "open", None)
        if o is not None and o.pid != os.getpid():
            # Inherited through fork: the parent holds that region on its own connection.
            self._local.open = None
            with self._lock:
                self._open = {k: v for k, v in self._open.items() if v.pid == os.getpid()}
            return None
        if o is not None and o.closed:
            self._local.open = None  # exited (by the reaper, or at the lease)
            return None
        return o

    def quiet(self, o: Optional[_Open]) -> bool:
        """Events are someone else's now: inside a wrapped timing call, or inside a kforge region
        joined into the event region (``kforge.do_bench`` in a user's event loop) — their own
        events and waits must not end the user's interval."""
        return getattr(self._local, "quiet", 0) > 0 or (o is not None and o.region.nested > 0)

    def before_record(self, event: Any) -> bool:
        """A timing event is about to be recorded: enter a region if the thread holds none, or
        start the next interval in its lingering one. Whether this event started an interval."""
        self.close_expired()
        if not getattr(event, TIMING_MARK, False):
            return False
        o = self.held_event_region()
        if o is not None:
            if o.linger_until is None or self.quiet(o):
                return False  # inside an open interval (an end event), or someone else's events
            if self._continue(o):
                return True
        if active_region() is not None:
            return False  # kforge's own region, or a wrapped do_bench, holds the device already
        r = self._enter(EVENT_REGION)
        if r is None:
            return False
        o = _Open(r, self.clock(), lease_of(r))
        self._local.open = o
        with self._lock:
            self._open[o.tid] = o
        return True

    def _continue(self, o: _Open) -> bool:
        """Start the next interval in lingering region ``o``; False when it is too old to go on
        (then exited) or is being exited."""
        with self._lock:
            young = self.clock() - o.opened <= o.lease_s * CONTINUE_WITHIN_LEASE
            if not o.closed and young:
                o.linger_until, o.last_end = None, None
                self.continued += 1
                return True
        self._close(o)
        return False

    def after_record(self, event: Any) -> None:
        """A timing event that did not start an interval was recorded: inside an open interval
        it is an end event."""
        o = self.held_event_region()
        if o is not None and o.linger_until is None and getattr(event, TIMING_MARK, False) and not self.quiet(o):
            o.last_end = event

    def after_device_wait(self) -> None:
        """``torch.cuda.synchronize()`` / ``Stream.synchronize()`` returned."""
        o = self.held_event_region()
        if o is not None and o.last_end is not None and not self.quiet(o):
            self._linger(o)

    def after_event_wait(self, event: Any) -> None:
        """``Event.synchronize()`` returned for ``event``."""
        o = self.held_event_region()
        if o is not None and o.last_end is not None and event is o.last_end and not self.quiet(o):
            self._linger(o)

    def after_elapsed(self) -> None:
        """``Event.elapsed_time()`` returned: both events of an interval completed (an earlier
        interval's, if no end event was recorded in this region yet)."""
        o = self.held_event_region()
        if o is not None and o.last_end is not None and not self.quiet(o):
            self._linger(o)

    def _linger(self, o: _Open) -> None:
        """The interval of ``o`` ended: keep the region for :data:`LINGER_S`."""
        with self._cond:
            o.last_end = None
            o.linger_until = self.clock() + LINGER_S
            self._changed(o.linger_until)

    def _close(self, o: _Open, force: bool = False, lingered_out: bool = False) -> bool:
        """Exit event region ``o`` unless it is already being exited or (without ``force``) a
        kforge region joined into it is still open; with ``lingered_out`` (the reaper) only if it
        still lingers past its grace period (its thread may have started the next interval
        meanwhile). Whether this call exited it."""
        with self._lock:
            if lingered_out and (o.linger_until is None or self.clock() < o.linger_until):
                return False
            if o.closed or not (o.region.claim_idle() or force):
                return False
            o.closed = True
            if self._open.get(o.tid) is o:
                del self._open[o.tid]
        try:
            self._exit(o.region)
        finally:
            o.done.set()
        return True

    def close_event_region(self) -> None:
        """Exit this thread's event region now (an open interval or a lingering region)."""
        o = self.held_event_region()
        if o is not None:
            self._close(o, force=True)
            self._local.open = None

    def close_expired(self) -> None:
        """Exit this thread's event region if its grace period ended or it has been open longer
        than its lease."""
        o = self.held_event_region()
        if o is None:
            return
        now = self.clock()
        if o.linger_until is not None and now >= o.linger_until:
            self._close(o)
        elif now - o.opened > o.lease_s:
            self.warn(
                f"kforge --auto-regions: an event region stayed open past its lease ({o.lease_s:g} s) "
                "without a synchronize or elapsed_time; it was exited"
            )
            self.close_event_region()

    def reap(self) -> Optional[float]:
        """Exit the lingering regions of this process whose grace period ended, report entries
        waiting longer than :data:`SLOW_ENTRY_S`; return the seconds until the next such moment
        (``None``: nothing to watch until a region lingers or an entry starts, which notify the
        reaper). What the reaper thread runs in a loop."""
        due: List[_Open] = []
        slow: List[str] = []
        held: List[Tuple[int, _Holding, float]] = []
        with self._lock:
            now = self.clock()
            wait: Optional[float] = None
            for o in self._open.values():
                if o.pid != os.getpid() or o.closed or o.linger_until is None:
                    continue
                if now < o.linger_until:
                    nxt = o.linger_until - now
                elif o.region.nested == 0:
                    due.append(o)
                    continue
                else:
                    nxt = LINGER_S  # a kforge region joined into it is still open: look again later
                wait = nxt if wait is None else min(wait, nxt)
            for tid, w in self._waiting.items():
                if now >= w.next_report:
                    w.next_report = now + SLOW_ENTRY_S
                    slow.append(self._describe_wait(tid, w, now))
                nxt = max(w.next_report - now, 0.001)
                wait = nxt if wait is None else min(wait, nxt)
            for tid, h in self._holding.items():
                if h.report_at is None:
                    continue
                if now >= h.report_at:
                    h.report_at = None
                    held.append((tid, h, now))
                    continue
                nxt = h.report_at - now
                wait = nxt if wait is None else min(wait, nxt)
            self._wake_at = None if wait is None else now + wait
        for o in due:
            self._close(o, lingered_out=True)
        # Formatted outside the lock: a stack is walked and its source lines read from disk.
        slow.extend(describe_hold(*h) for h in held)
        for line in slow:
            self.warn(line)
        return wait

    def _describe_wait(self, tid: int, w: _Waiting, now: float) -> str:
        held = ", ".join(
            f"{o.region.name} {o.region.region} on thread {t} "
            f"({'lingering' if o.linger_until is not None else 'interval open'}, {now - o.opened:.1f} s)"
            for t, o in self._open.items()
            if o.pid == os.getpid() and not o.closed
        )
        return (
            f"kforge --auto-regions: region {w.name!r} of thread {tid} still waiting after {now - w.started:.1f} s "
            f"for {w.region.waiting_for or 'its entry'}; event regions this process holds: {held or 'none'}"
        )

    def _ensure_reaper(self) -> None:
        if not self._use_reaper:
            return
        with self._lock:
            if self._reaper is not None and self._reaper_pid == os.getpid():
                return
            self._stopping = False
            self._reaper_pid = os.getpid()
            self._reaper = threading.Thread(target=self._reap_loop, name="kforge-auto-regions", daemon=True)
            self._reaper.start()

    def _reap_loop(self) -> None:
        while True:
            with self._cond:
                seen = self._changes
            wait = self.reap()
            with self._cond:
                if self._stopping:
                    return
                if self._changes == seen:  # nothing lingered or started entering since reap looked
                    self._cond.wait(timeout=wait)
                if self._stopping:
                    return

    def _changed(self, at: Optional[float] = None) -> None:
        """Something for the reaper at clock time ``at`` (``None``: now): a region lingers until
        then, or an entry's slow-entry report is due. Wakes it only if it would sleep past that
        (the caller holds the lock): in a trial loop it wakes about once per grace period, not
        once per trial, so it does not compete for the GIL while the script launches work."""
        if at is None or self._wake_at is None or at < self._wake_at:
            self._changes += 1
            self._cond.notify_all()

    def threads(self) -> Set[threading.Thread]:
        """The threads these hooks started (the reaper), which :meth:`uninstall` stops: not the
        job's (a warm worker's check for threads a job left running skips them)."""
        t = self._reaper
        return {t} if t is not None and self._reaper_pid == os.getpid() else set()

    def _stop_reaper(self) -> None:
        with self._cond:
            self._stopping = True
            self._changed()
            t, self._reaper = self._reaper, None
        if t is not None and t is not threading.current_thread() and self._reaper_pid == os.getpid():
            t.join(timeout=5)

    def close_all(self) -> None:
        """Exit every event region still open or lingering (interpreter exit, uninstall)."""
        with self._lock:
            left = [o for o in self._open.values() if o.pid == os.getpid()]
        self._local.open = None
        for o in left:
            self._close(o, force=True)

    # -- patching ------------------------------------------------------------------------------

    def _set(self, owner: Any, attr: str, value: Any) -> None:
        self._patched.append((owner, attr, vars(owner).get(attr, _MISSING)))
        setattr(owner, attr, value)

    def patch_event_class(self, cls: Any, sync_owner: Any = None) -> None:
        """Patch an event class like ``torch.cuda.Event`` (``__new__(cls, enable_timing=False,
        ...)``, ``record``, ``synchronize``, ``elapsed_time``) and, on ``sync_owner`` (the
        ``torch.cuda`` module), ``synchronize`` and ``Stream.synchronize``."""
        if getattr(vars(cls).get("record"), WRAPPED_MARK, False):
            return
        rule = self
        original_new = cls.__new__
        own_new = "__new__" in vars(cls)

        def new(klass: Any, *args: Any, **kwargs: Any) -> Any:
            if own_new:
                ev = original_new(klass, *args, **kwargs)
            else:
                ev = original_new(klass)
            timing = kwargs.get("enable_timing", args[0] if args else False)
            try:
                setattr(ev, TIMING_MARK, bool(timing))
            except AttributeError:
                pass  # an event without a __dict__ is never a region's event
            return ev

        record, synchronize, elapsed = cls.record, cls.synchronize, cls.elapsed_time

        def record_w(ev: Any, *args: Any, **kwargs: Any) -> Any:
            opened = rule.before_record(ev)
            out = record(ev, *args, **kwargs)
            if not opened:
                rule.after_record(ev)
            return out

        def synchronize_w(ev: Any, *args: Any, **kwargs: Any) -> Any:
            out = synchronize(ev, *args, **kwargs)
            rule.after_event_wait(ev)
            return out

        def elapsed_w(ev: Any, *args: Any, **kwargs: Any) -> Any:
            out = elapsed(ev, *args, **kwargs)
            rule.after_elapsed()
            return out

        for attr, fn, orig in (("record", record_w, record), ("synchronize", synchronize_w, synchronize),
                               ("elapsed_time", elapsed_w, elapsed)):
            functools.update_wrapper(fn, orig)
            setattr(fn, WRAPPED_MARK, True)
            self._set(cls, attr, fn)
        self._set(cls, "__new__", staticmethod(new))
        if sync_owner is None:
            return
        device_sync = getattr(sync_owner, "synchronize", None)
        if callable(device_sync) and not getattr(device_sync, WRAPPED_MARK, False):
            self._set(sync_owner, "synchronize", self._after(device_sync))
        stream = getattr(sync_owner, "Stream", None)
        stream_sync = getattr(stream, "synchronize", None)
        if stream is not None and callable(stream_sync) and not getattr(stream_sync, WRAPPED_MARK, False):
            self._set(stream, "synchronize", self._after(stream_sync))

    def _after(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            self.after_device_wait()
            return out

        setattr(wrapper, WRAPPED_MARK, True)
        return wrapper

    def patch_triton_testing(self, module: Any) -> None:
        """Wrap ``do_bench`` and ``do_bench_cudagraph`` of a ``triton.testing`` module."""
        for attr in TRITON_FUNCTIONS:
            fn = getattr(module, attr, None)
            if callable(fn) and not getattr(fn, WRAPPED_MARK, False):
                self._set(module, attr, self.wrap(fn, f"auto:{attr}"))

    def patch_timer_class(self, cls: Any) -> None:
        """Wrap the measuring methods of ``torch.utils.benchmark.Timer``."""
        for attr in TIMER_METHODS:
            fn = vars(cls).get(attr)
            if callable(fn) and not getattr(fn, WRAPPED_MARK, False):
                self._set(cls, attr, self.wrap(fn, f"auto:Timer.{attr}"))

    def patch_torch_cuda(self, module: Any) -> None:
        event = getattr(module, "Event", None)
        if isinstance(event, type):
            self.patch_event_class(event, module)

    def patch_torch_benchmark(self, module: Any) -> None:
        timer = getattr(module, "Timer", None)
        if isinstance(timer, type):
            self.patch_timer_class(timer)

    def patch_inductor_benchmarking(self, module: Any) -> None:
        """Wrap :data:`INDUCTOR_METHODS` on every class ``module`` defines that defines them
        itself (``Benchmarker``, ``TritonBenchmarker``, ``InductorBenchmarker``, ...): patched on
        the class, so the module's ``benchmarker`` object and a bound method taken from it later
        both see the wrapper. A call inside another (``benchmark`` → ``benchmark_gpu`` →
        ``triton.testing.do_bench``) runs in the outer call's region."""
        for cls in list(vars(module).values()):
            if not isinstance(cls, type) or cls.__module__ != module.__name__:
                continue
            for attr in INDUCTOR_METHODS:
                fn = vars(cls).get(attr)
                if callable(fn) and not getattr(fn, WRAPPED_MARK, False):
                    inner = self.slow_call_first(fn) if attr == "benchmark_gpu" else fn
                    self._set(cls, attr, self.wrap(inner, f"auto:inductor.{attr}", compile_choice_first=True))

    def patch_inductor_utils(self, module: Any) -> None:
        """Wrap ``do_bench_using_profiling`` (a region per call) and ``python_subprocess_env``
        (the environment of Inductor's Python subprocesses: :attr:`boot_dir` first on its
        ``PYTHONPATH``) of ``torch._inductor.utils``."""
        fn = getattr(module, "do_bench_using_profiling", None)
        if callable(fn) and not getattr(fn, WRAPPED_MARK, False):
            self._rebind(module, "do_bench_using_profiling", fn, self.wrap(fn, "auto:inductor.do_bench_using_profiling"))
        env_fn = getattr(module, "python_subprocess_env", None)
        if callable(env_fn) and not getattr(env_fn, WRAPPED_MARK, False):
            self._rebind(module, "python_subprocess_env", env_fn, self.subprocess_env(env_fn))

    def _rebind(self, module: Any, attr: str, old: Any, new: Any) -> None:
        """Set ``module.attr`` to ``new``, and the same name in every module of its package that
        bound ``old`` by name before (``from torch._inductor.utils import python_subprocess_env``
        in ``autotune_process``, imported first in a warm worker that preloaded Inductor)."""
        self._set(module, attr, new)
        top = module.__name__.split(".")[0] + "."
        for name, other in list(sys.modules.items()):
            if other is not module and name.startswith(top) and vars(other).get(attr) is old:
                self._set(other, attr, new)

    def subprocess_env(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (building a subprocess's environment) with :attr:`boot_dir` put first on the
        ``PYTHONPATH`` of what it returns, and ``KFORGE_AUTO_REGIONS=1`` (the child installs the
        hooks when ``KFORGE_SOCKET`` is set too)."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            env = fn(*args, **kwargs)
            boot = self.boot_dir
            if boot is not None and isinstance(env, dict):
                rest = [p for p in str(env.get("PYTHONPATH") or "").split(os.pathsep) if p and p != boot]
                env["PYTHONPATH"] = os.pathsep.join([boot, *rest])
                env[ENV] = "1"
            return env

        setattr(wrapper, WRAPPED_MARK, True)
        return wrapper

    def hooks(self) -> Dict[str, Callable[[Any], None]]:
        """Module name → what to patch in it once it is imported."""
        return {
            "triton.testing": self.patch_triton_testing,
            "torch.cuda": self.patch_torch_cuda,
            "torch.utils.benchmark": self.patch_torch_benchmark,
            INDUCTOR_BENCHMARKING: self.patch_inductor_benchmarking,
            INDUCTOR_UTILS: self.patch_inductor_utils,
        }

    def install(self) -> None:
        """Patch the covered modules already imported; patch the others when they are."""
        if self._finder is not None:
            return
        self._finder = _PatchOnImport(self.hooks())
        sys.meta_path.insert(0, self._finder)
        self.patch_imported()

    def patch_imported(self) -> None:
        """Patch the covered modules already imported (what is patched already is left as is)."""
        for name, hook in self.hooks().items():
            mod = sys.modules.get(name)
            if mod is not None:
                hook(mod)

    def uninstall(self) -> None:
        """Exit open regions, stop the reaper, stop watching imports and restore everything
        patched."""
        self.close_all()
        self._stop_reaper()
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        while self._patched:
            owner, attr, old = self._patched.pop()
            if old is _MISSING:
                try:
                    delattr(owner, attr)
                except AttributeError:
                    pass
            else:
                setattr(owner, attr, old)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds a watched module through the other finders and runs its hook after the module's
    code: the module's own loader is kept (only its ``exec_module`` is wrapped)."""

    def __init__(self, hooks: Dict[str, Callable[[Any], None]]) -> None:
        self.hooks = hooks
        self.busy: Set[str] = set()

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        hook = self.hooks.get(fullname)
        if hook is None or fullname in self.busy:
            return None
        self.busy.add(fullname)
        try:
            spec: Optional[importlib.machinery.ModuleSpec] = None
            for finder in sys.meta_path:
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self.busy.discard(fullname)
        loader = None if spec is None else spec.loader
        exec_module = getattr(loader, "exec_module", None)
        # Only a loader object of its own with a __dict__ (not a class such as BuiltinImporter):
        # its exec_module is wrapped for this one call and then put back, so a loader shared by
        # several modules (a zip archive's) is left as it was.
        if spec is None or exec_module is None or isinstance(loader, type) or not hasattr(loader, "__dict__"):
            return spec
        own_attr = vars(loader).get("exec_module", _MISSING)

        def exec_then_patch(module: ModuleType) -> None:
            if own_attr is _MISSING:
                vars(loader).pop("exec_module", None)
            else:
                setattr(loader, "exec_module", own_attr)
            exec_module(module)
            if module.__name__ == fullname:
                hook(module)

        setattr(loader, "exec_module", exec_then_patch)
        return spec


class InductorRegions(AutoRegions):
    """Only the hooks of Inductor's own autotuning (:func:`inductor_regions`): no CUDA-event
    rule, no ``triton.testing``/``Timer`` wrappers (a kforge step times with ``kforge.do_bench``
    itself)."""

    def hooks(self) -> Dict[str, Callable[[Any], None]]:
        return {
            INDUCTOR_BENCHMARKING: self.patch_inductor_benchmarking,
            INDUCTOR_UTILS: self.patch_inductor_utils,
        }


_process: Optional[AutoRegions] = None
_inductor: Optional[InductorRegions] = None
_instances: "weakref.WeakSet[AutoRegions]" = weakref.WeakSet()
#: The directory the ``sitecustomize`` bootstrap of this process ran from (see :func:`bootstrap`).
_boot_dir: Optional[str] = None


def find_boot_dir(environ: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The ``--auto-regions`` bootstrap directory of this process: the one :func:`bootstrap` ran
    from, else the first ``PYTHONPATH`` entry named :data:`BOOT_DIR_NAME` that holds a
    ``sitecustomize.py`` (a warm worker's job); None when there is none."""
    if _boot_dir is not None:
        return _boot_dir
    env = os.environ if environ is None else environ
    for entry in (env.get("PYTHONPATH") or "").split(os.pathsep):
        if os.path.basename(os.path.normpath(entry or ".")) == BOOT_DIR_NAME and \
                os.path.isfile(os.path.join(entry, "sitecustomize.py")):
            return os.path.realpath(entry)
    return None


def write_boot_dir(parent: str) -> str:
    """Write a bootstrap directory (:data:`BOOT_DIR_NAME`, holding only a ``sitecustomize.py``
    running :data:`BOOT_SOURCE`) into ``parent``; return it."""
    boot = os.path.join(parent, BOOT_DIR_NAME)
    os.makedirs(boot, exist_ok=True)
    with open(os.path.join(boot, "sitecustomize.py"), "w") as f:
        f.write(BOOT_SOURCE)
    return boot


#: Bootstrap directories :func:`inductor_regions` made (removed at exit).
_boot_parents: List[str] = []


def release_inductor_regions() -> None:
    """What exit does for :func:`inductor_regions`' hooks: every event region they hold exited,
    their bootstrap directories removed. Run at interpreter exit, and by a step that leaves with
    ``os._exit`` (:func:`kforge.optimize.dispatch.leave`). Idempotent."""
    if _inductor is not None:
        _inductor.close_all()
        _inductor.report_retakes()
        _inductor.retakes = {k: 0 for k in _inductor.retakes}
        _inductor.slow_call_count, _inductor.slowest_call_s = 0, 0.0
    while _boot_parents:
        shutil.rmtree(_boot_parents.pop(), True)


def inductor_regions(environ: Optional[Dict[str, str]] = None) -> Optional[AutoRegions]:
    """Make every benchmark of Inductor's own autotuning in this process (and in its autotune
    subprocesses) a region, for a kforge step that compiles with ``torch.compile`` under a daemon
    (``KFORGE_SOCKET`` set): call it before compiling. Returns the hooks in force (those of
    ``--auto-regions`` when the process has them already: they include these), None outside a
    daemon job (nothing is patched). Idempotent; :meth:`AutoRegions.uninstall` undoes it."""
    global _inductor
    env = os.environ if environ is None else environ
    if not env.get("KFORGE_SOCKET"):
        return None
    if _process is not None:
        return _process
    if _inductor is None:
        # No reaper thread: these hooks hold no lingering region, and a verify step counts the
        # threads its candidate leaves (slow entries are reported when the entry returns).
        _inductor = InductorRegions(reaper=False)
        if _inductor.boot_dir is None:
            parent = tempfile.mkdtemp(prefix="kforge-boot-")
            _inductor.boot_dir = write_boot_dir(parent)
            _boot_parents.append(parent)
        _inductor.install()
        atexit.register(release_inductor_regions)
    elif _inductor._finder is None:
        _inductor.install()  # uninstalled since: again
    else:
        # A warm worker's --auto-regions hooks of an earlier job patched these methods first
        # (then these skipped them) and restored them after it: patch what is plain again.
        _inductor.patch_imported()
    return _inductor


def _after_fork_in_child() -> None:
    for auto in list(_instances):
        auto._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def install() -> AutoRegions:
    """Install the hooks in this process (once); their regions are exited at interpreter exit."""
    global _process
    if _process is None:
        _process = AutoRegions()
        _process.install()
        atexit.register(_process.close_all)
        atexit.register(_process.report_retakes)  # runs first (last registered)
    return _process


def chain_sitecustomize(own_dir: str) -> None:
    """Run the ``sitecustomize`` that ``own_dir``'s one shadows, if there is one, and take
    ``own_dir`` off ``sys.path`` (it holds nothing else)."""
    own = os.path.realpath(own_dir)
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != own]
    mine = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as e:
        if e.name != "sitecustomize":
            raise
        if mine is not None:
            sys.modules["sitecustomize"] = mine


def bootstrap(own_dir: str) -> None:
    """What the ``sitecustomize.py`` of ``--auto-regions`` runs: chain, then install (and note
    ``own_dir`` for Inductor's subprocesses: :func:`find_boot_dir`)."""
    global _boot_dir
    _boot_dir = os.path.realpath(own_dir)
    try:
        chain_sitecustomize(own_dir)
    finally:
        if enabled():
            install()
