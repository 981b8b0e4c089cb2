"""Compile workers for the dispatch agent's measure step: Inductor's caches warmed in parallel.

A measure step prepares its variants one after another in one process (each compiled on its own
copy of the model, then called once and judged), because every variant must then be timed in that
process against the same baseline. At real sizes most of the step is compiling: a level-3 model's
max-autotune compile is CPU-bound Python for 30-90 s, and a step compiles up to a dozen. With
``--compile-workers N`` the step starts N worker processes (``python3 -m kforge.optimize.dispatch
PROBLEM --warm-only V1,V2,...``) that compile the variants ahead of it, each a share of them in the
order the step will need them, into the Inductor caches the step reads (its FX graph and autotune
caches, ``TORCHINDUCTOR_CACHE_DIR``, which the workers inherit with the rest of the environment:
under a daemon their autotune benchmarks run in regions like the step's own). When the step
reaches a variant a worker has, it waits for that worker's line about it, then prepares it as
before, its compile a cache hit. What is timed and judged is unchanged: the step's own compiled
copies, in the step's own process. A worker's failure costs only its warm-up: the step compiles
the variant itself.

When the baseline's own compile autotunes (a max-autotune baseline), the workers are started
held (``hold_autotuning``, the worker's ``--hold-autotuning``): each compiles at once its variants
that do not autotune (``default``, ``reduce-overhead``, knobs without autotuning), then waits for
a line on its stdin before those that do, which :meth:`CompileWorkers.release` writes once the
step has prepared its baseline. A max-autotune variant benchmarks the same GEMM and convolution
choices the baseline does: on an H100 at the large size, three workers autotuning them beside
the baseline's compile ran the same benchmarks four times over (19.7 s for 21 choices, per
process), each inside a daemon's exclusive region, and the baseline's compile, which the step
needs before anything else, did not end within the step's 350 s. Inductor keeps its autotune
results on disk (its autotune cache and the ``.best_config`` files in ``TORCHINDUCTOR_CACHE_DIR``),
so a variant compiled after the baseline finds most of its autotuning done.

Each worker prints one JSON line per variant on stdout, as it finishes it: ``{"variant": V,
"ok": true, "seconds": S}`` or ``{"variant": V, "ok": false, "seconds": S, "why": ...}``.

This module imports no torch and nothing of :mod:`.dispatch` (which imports it).
"""

from __future__ import annotations

import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Sequence

from ..harness import die_with_parent

#: Seconds a worker has to exit after SIGTERM before it is killed.
STOP_PATIENCE_S = 5.0


@dataclass(frozen=True)
class WarmSpec:
    """What a worker needs to make the step's model: the problem file, its size, the device."""

    problem: str
    size: str
    device: str
    workers: int


def warmable(variant: str) -> bool:
    """Whether a worker can warm ``variant``: a compile mode with or without knobs; not eager (no
    compile), not a per-graph plan (its backend routes graphs in the step's process), not a
    rewrite (its forward is made in the step's process)."""
    return variant != "eager" and not variant.startswith("graphs:") and "~" not in variant


def shares(variants: Sequence[str], workers: int) -> List[List[str]]:
    """``variants`` dealt round-robin to ``workers`` workers, each share in the step's order (so
    the first variants the step needs are the first each worker compiles); no empty share."""
    n = max(0, min(workers, len(variants)))
    return [list(variants[i::n]) for i in range(n)]


@dataclass
class _Worker:
    proc: "subprocess.Popen[str]"
    share: List[str]
    seen: Dict[str, Dict[str, Any]]
    #: Its stdout's lines as rows, read by a thread; None when it ended (EOF).
    rows: "queue.Queue[Optional[Dict[str, Any]]]"
    ended: bool = False


class CompileWorkers:
    """The workers of one measure step. ``wait(v, deadline)`` blocks until the worker that has
    ``v`` said it finished it, exited, or stayed silent past ``deadline`` (Unix seconds; and never
    longer than ``SILENT_S``), and returns its line (``None``: no worker has ``v``, the worker
    exited without a line for it, or it timed out: then it is stopped, and the step compiles its
    variants itself). ``stop()`` ends the workers (SIGTERM, then SIGKILL after
    ``STOP_PATIENCE_S``) and reaps them; after it ``wait`` returns ``None``. A context manager
    stops them on exit. A worker dies with the step's process (``PR_SET_PDEATHSIG``) even where
    no daemon kills the job.

    With ``hold_autotuning`` (the step's baseline autotunes) each worker compiles its autotuning
    variants only after ``release()``, which the step calls once its baseline is prepared: they
    would otherwise run the baseline's own autotune benchmarks again beside its compile (see the
    module's docstring). Its other variants it compiles at once."""

    def __init__(self, spec: WarmSpec, variants: Sequence[str], python: Optional[str] = None,
                 hold_autotuning: bool = False) -> None:
        self._workers: List[_Worker] = []
        self._of: Dict[str, _Worker] = {}
        for share in shares([v for v in variants if warmable(v)], spec.workers):
            args = [python or sys.executable, "-m", "kforge.optimize.dispatch", spec.problem, "--out", os.devnull,
                    "--device", spec.device, "--size", spec.size, "--warm-only", ",".join(share)]
            if hold_autotuning:
                args.append("--hold-autotuning")
            # In the step's own process group and cgroup (no new session): the daemon freezes
            # them with the step during a sibling's region, counts their GPU memory as the job's
            # and does not see them as processes outside its jobs; killing the job kills them.
            # A held worker reads its stdin (a pipe: ``release``); any other has none.
            proc = subprocess.Popen(args, stdout=subprocess.PIPE,
                                    stdin=subprocess.PIPE if hold_autotuning else subprocess.DEVNULL, text=True,
                                    env=worker_env(), preexec_fn=die_with_parent)
            w = _Worker(proc, share, {}, queue.Queue())
            threading.Thread(target=read_rows, args=(proc, w.rows), daemon=True).start()
            self._workers.append(w)
            for v in share:
                self._of[v] = w

    @property
    def count(self) -> int:
        return len(self._workers)

    def wait(self, variant: str, deadline: Optional[float] = None) -> Optional[Dict[str, Any]]:
        w = self._of.get(variant)
        if w is None:
            return None
        until = min(deadline if deadline is not None else math.inf, time.time() + SILENT_S)
        while variant not in w.seen and not w.ended:
            try:
                row = w.rows.get(timeout=max(0.0, until - time.time()))
            except queue.Empty:  # silent past the deadline: its variants are the step's own now
                say(f"compile worker {w.proc.pid} said nothing about {variant} in time: stopped")
                self._drop(w)
                return None
            take(w, row)
        return w.seen.get(variant)

    def compiled(self, variant: str) -> bool:
        """Whether the worker that has ``variant`` said it compiled it, asked without waiting:
        its preparation is then a cache hit."""
        w = self._of.get(variant)
        if w is None:
            return False
        while variant not in w.seen and not w.ended:
            try:
                take(w, w.rows.get_nowait())
            except queue.Empty:
                break
        return bool(w.seen.get(variant, {}).get("ok"))

    def release(self) -> None:
        """Held workers (``hold_autotuning``) let go on to their autotuning variants: a line
        written to each one's stdin, which is then closed. The step calls it once its baseline is
        prepared, whose autotune results the workers' variants then find in Inductor's caches. A
        worker that exited meanwhile is passed over; a second call, or one after ``stop()``, does
        nothing; without ``hold_autotuning`` it does nothing."""
        for w in self._workers:
            let_go(w.proc)

    def _drop(self, w: _Worker) -> None:
        """``w`` ended and forgotten: ``wait`` returns ``None`` for its variants."""
        end(w.proc)
        w.ended = True

    def stop(self) -> None:
        for w in self._workers:
            if w.proc.poll() is None:
                w.proc.terminate()  # Inductor's compile pool follows its parent out
        for w in self._workers:
            end(w.proc)
            w.ended = True

    def __enter__(self) -> "CompileWorkers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: Seconds a step waits at most for a worker's line about one variant (a level-3 max-autotune
#: compile takes 30-90 s on the H100; a worker silent this long is stuck).
SILENT_S = 900.0


def take(w: _Worker, row: Optional[Dict[str, Any]]) -> None:
    """A row a worker's reader passed on: what it said of a variant, or ``None`` when it ended."""
    if row is None:
        w.ended = True
    else:
        w.seen[str(row["variant"])] = row


def end(proc: "subprocess.Popen[str]") -> None:
    """``proc`` terminated (SIGTERM, SIGKILL after ``STOP_PATIENCE_S``) and reaped, its stdin
    pipe (a held worker's) closed after it exited: it is not let go on to compile meanwhile."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=STOP_PATIENCE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    close_stdin(proc)


def let_go(proc: "subprocess.Popen[str]") -> None:
    """A held worker ``proc`` let go (:meth:`CompileWorkers.release`): a line on its stdin, which
    is then closed; nothing for one with no stdin pipe or whose pipe is closed already. A worker
    that exited meanwhile has no reader: the write's broken pipe is passed over."""
    pipe = proc.stdin
    if pipe is None or pipe.closed:
        return
    try:
        if proc.poll() is None:
            pipe.write("\n")
            pipe.flush()
    except OSError:  # BrokenPipeError: it exited between the poll and the write
        pass
    close_stdin(proc)


def close_stdin(proc: "subprocess.Popen[str]") -> None:
    """``proc``'s stdin pipe closed, if it has one still open (a held worker's)."""
    pipe = proc.stdin
    if pipe is None or pipe.closed:
        return
    try:
        pipe.close()
    except OSError:  # what was buffered met a closed pipe; the file descriptor is closed anyway
        pass


def read_rows(proc: "subprocess.Popen[str]", rows: "queue.Queue[Optional[Dict[str, Any]]]") -> None:
    """Each worker line of ``proc``'s stdout into ``rows`` as a dict, then None at its end (other
    lines, a library's prints, are skipped)."""
    out: Optional[IO[str]] = proc.stdout
    try:
        for line in out if out is not None else ():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("variant"), str):
                rows.put(row)
    except (OSError, ValueError):
        pass  # closed under it
    finally:
        rows.put(None)
        if out is not None:
            out.close()


def say(line: str) -> None:
    """A progress line of the measure step on stderr, which ``kforge optimize`` keeps in the
    step's log: what a long measure step was doing when it was stopped (the one writer of such
    lines, for :mod:`.dispatch` too), stamped with the wall clock (``[HH:MM:SS]``, the time
    ``campaign.sh`` gives its run's start and end too: what a step did by the time a run was
    killed)."""
    print(f"dispatch: {line} [{time.strftime('%H:%M:%S')}]", file=sys.stderr, flush=True)


def worker_env() -> Dict[str, str]:
    """This process's environment (the daemon job's socket, Inductor's cache directory), with
    the directory this kforge package is imported from first on ``PYTHONPATH``, so that the
    worker imports the same kforge."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def worker_line(variant: str, ok: bool, seconds: float, why: Optional[str] = None) -> str:
    """A worker's line about ``variant`` (see the module's docstring)."""
    row: Dict[str, Any] = {"variant": variant, "ok": ok, "seconds": round(seconds, 3)}
    if why is not None:
        row["why"] = why
    return json.dumps(row)


def workers_for_memory(workers: int, footprint: int, free: int) -> int:
    """How many of ``workers`` the device's free memory holds: each worker builds the model and
    its inputs again and compiles (autotuning allocates outputs and workspaces), taken as four
    times the step's own ``footprint`` (bytes, after building the reference), within half of
    ``free`` (siblings' jobs allocate too)."""
    if footprint <= 0:
        return workers
    return max(0, min(workers, (free // 2) // (4 * footprint)))
