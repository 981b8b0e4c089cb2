"""Warm worker: a persistent Python process that runs kforge jobs in-process.

The kforge daemon starts ``python3 -m kforge.worker`` with an ``AF_UNIX``/``SOCK_SEQPACKET``
control socket on fd ``$KFORGE_WORKER_FD`` (3). The worker imports ``$KFORGE_WORKER_PRELOAD``
(``torch,triton``; ``auto``: those that are importable; empty: none), creates the CUDA context on
a GPU device, and then runs Python jobs one at a time with the semantics of a fresh interpreter
as far as possible, saving the interpreter start, the imports and the CUDA context per job.

Control protocol: one UTF-8 JSON object per message (at most 1 MiB).

* worker -> daemon, once preloaded: ``{"type": "ready", "pid", "preloaded": [...], "cuda": bool,
  "startup_ms", "python"}`` plus ``"error"`` when a preload or the CUDA context failed;
* daemon -> worker: ``{"type": "run", "job", "argv", "cwd", "env": [[k, v], ...],
  "max_jobs_left"}`` with the write ends of the job's stdout and stderr pipes attached
  (``SCM_RIGHTS``, exactly two); ``argv`` is ``[-u] SCRIPT args...``, ``[-u] -c CODE args...``
  or ``[-u] -m MODULE args...``; ``max_jobs_left`` (optional, may be null) is how many jobs the
  daemon still lets this worker run, this one included;
* worker -> daemon after each job: ``{"type": "done", "job", "exit_code", "recycle": [reasons],
  "duration_ms"}``; with a non-empty ``recycle`` the worker exits (status 0) right after;
* daemon -> worker ``{"type": "exit"}``: exit cleanly (status 0); end of file on the socket: exit
  at once. A message the worker cannot read makes it exit with status 2 (a ``run`` whose job
  id is readable is answered first, with exit code 2 and the problem as recycle reason).

Per job the worker points fds 1/2 at the job's pipes (new ``sys.stdout``/``sys.stderr``, buffered
as on a pipe unless ``-u``/``PYTHONUNBUFFERED``), sets ``sys.argv``, ``sys.path`` (``[0]``: the
script's directory, ``''`` for ``-c``, the cwd for ``-m``; ``$PYTHONPATH`` of the job),
``os.environ`` and the cwd, runs the code in a fresh ``__main__`` and computes the exit status as
CPython does (``SystemExit`` rules, tracebacks through ``sys.excepthook``, 130 for
``KeyboardInterrupt``, 120 when flushing stdout fails). As at interpreter exit it then waits for
the job's non-daemon threads and runs the ``atexit`` callbacks the job registered. Afterwards it
restores its own state, drops the modules the job imported from outside the Python installation
and kforge (so an edited candidate module is imported afresh), and checks hygiene: replaced
timing/torch callables, threads left running, CUDA device/stream/sticky error/leaked memory, a
kforge region left open, job count and RSS ceiling; any finding recycles the worker. A job whose
environment has ``KFORGE_AUTO_REGIONS=1`` (``kforge run --auto-regions``) runs with the hooks of
:mod:`kforge.autoregions` installed; they are removed (open regions exited, patched callables
restored) before the hygiene checks.

What cannot be identical to a fresh interpreter:

* Modules imported before the job (the preloads, their dependencies, the standard library,
  kforge) and library modules a job imported lazily stay imported, with whatever module-level
  state earlier jobs left in them (caches, registries, loggers other than the root logger,
  ``functools.lru_cache`` contents, torch's compile caches, Triton's in-memory kernel cache, CUDA
  allocator pools). Library modules are never re-read from disk after an edit.
* Interpreter-wide settings fixed at start do not follow the job's environment: ``sys.flags``,
  ``PYTHONHASHSEED`` (hash randomisation), ``PYTHONWARNINGS``, ``PYTHONOPTIMIZE``,
  ``PYTHONMALLOC``, ``LD_PRELOAD``/``LD_LIBRARY_PATH`` and other variables read by the dynamic
  loader or by already-loaded C libraries (``CUDA_*``, ``OMP_NUM_THREADS``, ``TORCH_*`` read at
  import). Only ``PYTHONPATH``, ``PYTHONUNBUFFERED``, ``PYTHONIOENCODING`` and
  ``PYTHONDONTWRITEBYTECODE`` are applied per job. Other interpreter options than ``-u`` are not
  supported (the daemon runs such commands cold).
* The process is shared: ``os.getpid()`` is the worker's and the same for every job, the CUDA
  context already exists (its creation is not part of the job), ``sys.modules`` holds more than a
  fresh interpreter's, the job's ``time.perf_counter`` starts long before it, the RNGs of
  libraries other than torch (``random``, numpy) continue from earlier jobs (a fresh process
  seeds them from the OS anyway), and resource limits, the nice value and the CPU affinity a
  job sets persist.
* Restored after each job: ``sys.argv``, ``sys.path``, ``os.environ``, the cwd, ``__main__``,
  ``sys.std*``, ``sys.excepthook``/``displayhook``/trace/profile functions, the recursion limit
  and switch interval, warning filters (and "once" registries), the root logger's handlers and
  level, signal handlers and interval timers, the umask, and with torch its RNG states, TF32 /
  cuDNN / determinism flags, default dtype and device and grad mode (``torch._dynamo`` is reset).
* A traceback through ``-m`` shows runpy's frames as CPython's does, but a directory or zip
  file given as the script runs through ``runpy.run_path`` and shows its frames. A job that
  replaced ``sys.stdout`` with its own object has that object flushed at the end, not closed.
* Output a job's threads or processes write after the job ended (daemon threads, detached
  children) is lost or, for children holding the pipes, delays the end of the job's output.
  ``atexit`` callbacks registered by library code during the job run only when the worker exits.
* A ``SyntaxError`` in a script is compiled from its text: on Python 3.9 an error at the end of
  the file may be reported at another line than a fresh interpreter reports.
* ``os.fork()`` in a job works, but a child that returns from the job's code exits with the job's
  exit code without running ``atexit`` callbacks.
* A job's environment has ``KFORGE_WARM_ISOLATION`` (``in-process:PID`` or ``fork:PID``, PID the
  job's process) besides its own.

**Fork isolation** (``$KFORGE_WORKER_ISOLATION=fork``; the daemon's ``--worker-fork``): the worker
imports its preloads but creates no CUDA context and starts no torch thread pool, and runs each
job in a child it forks for it. The child is a fresh process as far as the job can tell (its own
pid, nothing an earlier job did, CUDA created by the job), with the preloaded modules already
imported; it ends as an interpreter does (non-daemon threads joined, the job's ``atexit``
callbacks run, the streams flushed). The parent never runs job code, so it needs no hygiene
checks; it stays in its process group and cgroup with the child, which the daemon freezes, kills
and counts GPU memory by, as for an in-process job. ``done`` then carries ``"signal"`` when the
child was killed by one (``exit_code`` is 128 + the signal, as a shell reports it), and
``"child_pid"``. The worker refuses to start (status 2) when a preload left a Python thread
running: a fork copies only the forking thread, and another's locks would stay held in the child.
On a GPU device it leaves out a preload whose import initializes the CUDA driver, and the ready
message's ``error`` names it: torch refuses CUDA in every fork made after that, and the jobs could
not use the GPU. Each preload is imported once, in the worker; when one leaves its forks refused
CUDA, the worker starts again in the same process (``exec``: the same pid, control socket and
cgroup) without that one, so only the preloads before it are imported twice. It also has torch ask NVML, not the
driver, whether CUDA is there (``PYTORCH_NVML_BASED_CUDA_CHECK``), and refuses to start (status
2) when a fork would still be refused CUDA. What a fresh interpreter has that such a child has
not: interpreter-wide settings fixed at the worker's start (as above), and the state the
preloads' imports made (the same in every child).
This is the mode for jobs that must be isolated from each other, such as ``kforge verify``'s
runner (``kforge verify --daemon --warm``).
"""

from __future__ import annotations

import atexit
import builtins
import gc
import importlib
import importlib.machinery
import importlib.util
import io
import json
import linecache
import logging
import os
import runpy
import select
import signal
import site
import socket
import sys
import threading
import time
import traceback
import types
import warnings
import zipfile
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

# The client is imported once and kept across jobs; its state is reset after each job.
import kforge

from .client import reset_connection
from .harness import become_subreaper, die_with_parent, task_ids
from .autoregions import AutoRegions, enabled
from .region import region_open

#: Largest control message in bytes, either way.
MAX_MESSAGE: int = 1 << 20
#: Callables a job must not replace, as (module, attribute path); checked by identity.
CRITICAL: Tuple[Tuple[str, str], ...] = (
    ("time", "perf_counter"),
    ("time", "perf_counter_ns"),
    ("time", "time"),
    ("time", "monotonic"),
    ("time", "monotonic_ns"),
    ("time", "sleep"),
    ("torch", "cuda.synchronize"),
    ("torch", "cuda.Event.record"),
    ("torch", "cuda.Event.elapsed_time"),
    ("torch", "cuda.Event.synchronize"),
    ("torch", "matmul"),
    ("torch", "mm"),
    ("torch", "bmm"),
    ("torch", "Tensor.__matmul__"),
    ("torch", "nn.functional.linear"),
    ("torch", "cuda.current_stream"),
    ("triton", "testing.do_bench"),
    ("kforge", "do_bench"),
    ("kforge", "region"),
)
#: GPU memory a job may leave allocated (bytes).
GPU_MEMORY_SLACK: int = 1 << 20

_clock = time.perf_counter  # the worker's own clock and sleep, immune to jobs patching time
_sleep = time.sleep
_MISSING = object()
_THIS_FILE = (lambda: None).__code__.co_filename


def _children(pid: int) -> List[int]:
    """The processes whose parent is ``pid`` (from ``/proc``; empty where there is none)."""
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and fields[1] == str(pid).encode():
            found.append(int(name))
    return found


def _kill_descendants(pid: int) -> None:
    """SIGKILL every descendant of ``pid`` and reap them, until none is left (a process that
    forks while this runs is found in the next round)."""
    for _ in range(100):
        tree, todo = [], _children(pid)
        while todo:
            p = todo.pop()
            tree.append(p)
            todo.extend(_children(p))
        if not tree:
            return
        for p in tree:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        for p in _children(pid):
            try:
                os.waitpid(p, 0)
            except ChildProcessError:
                pass


def _log(text: str) -> None:
    """Write a line to the worker's own stderr (the daemon's worker log before the first job)."""
    try:
        sys.__stderr__.write(f"kforge worker {os.getpid()}: {text}\n")  # type: ignore[union-attr]
        sys.__stderr__.flush()  # type: ignore[union-attr]
    except (OSError, ValueError, AttributeError):
        pass


def _resolve(module: str, path: str) -> Any:
    """``module.path`` looked up without calling descriptors on classes; ``_MISSING`` if absent."""
    obj: Any = sys.modules.get(module, _MISSING)
    for name in path.split("."):
        if obj is _MISSING:
            break
        if isinstance(obj, type):
            obj = next((vars(k)[name] for k in obj.__mro__ if name in vars(k)), _MISSING)
        else:
            obj = getattr(obj, name, _MISSING)
    return obj


def _native_threads() -> int:
    return len(task_ids())


def _rss_mb() -> Optional[float]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        return default


def parse_argv(argv: Sequence[str]) -> Tuple[bool, str, str, List[str]]:
    """Split a warm command line into (unbuffered, kind, target, args); kind is ``script``,
    ``-c`` or ``-m``. Raises :class:`ValueError` for command lines a worker cannot run."""
    if not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a list of strings")
    rest = list(argv)
    unbuffered = False
    while rest and rest[0] == "-u":
        unbuffered, rest = True, rest[1:]
    if not rest:
        raise ValueError("no script given (an interactive interpreter cannot run warm)")
    if rest[0] in ("-c", "-m"):
        if len(rest) < 2:
            raise ValueError(f"Argument expected for the {rest[0]} option")
        return unbuffered, rest[0], rest[1], rest[2:]
    if rest[0].startswith("-"):
        raise ValueError(f"interpreter option {rest[0]} is not supported by warm workers")
    return unbuffered, "script", rest[0], rest[1:]


def system_exit_code(e: SystemExit) -> int:
    """The process exit status CPython gives for an uncaught ``SystemExit`` (printing a
    non-integer code to ``sys.stderr`` as it does)."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:
        pass
    return 1


def _fresh_main(**attrs: Any) -> types.ModuleType:
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __spec__=None, __package__=None, __annotations__={})
    main.__dict__.update(attrs)
    return main


def _text_stream(fd: int, unbuffered: bool, encoding: str, errors: str) -> io.TextIOWrapper:
    """A ``sys.stdout``/``sys.stderr`` for ``fd`` as CPython makes one for a pipe."""
    raw = io.FileIO(fd, "w", closefd=False)
    if unbuffered:
        return io.TextIOWrapper(raw, encoding, errors, write_through=True)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding, errors, line_buffering=fd == 2)


class _SysState:
    """Interpreter-wide settings a job may change, saved at worker start and restored after
    each job: (label, getter, setter)."""

    def __init__(self) -> None:
        items: List[Tuple[str, Callable[[], Any], Callable[[Any], None]]] = [
            ("excepthook", lambda: sys.excepthook, lambda v: setattr(sys, "excepthook", v)),
            ("displayhook", lambda: sys.displayhook, lambda v: setattr(sys, "displayhook", v)),
            ("trace", sys.gettrace, sys.settrace),
            ("profile", sys.getprofile, sys.setprofile),
            ("recursionlimit", sys.getrecursionlimit, sys.setrecursionlimit),
            ("switchinterval", sys.getswitchinterval, sys.setswitchinterval),
            ("dont_write_bytecode", lambda: sys.dont_write_bytecode,
             lambda v: setattr(sys, "dont_write_bytecode", v)),
            ("showwarning", lambda: warnings.showwarning, lambda v: setattr(warnings, "showwarning", v)),
            ("atexit.register", lambda: atexit.register, lambda v: setattr(atexit, "register", v)),
            ("gc", gc.isenabled, lambda v: gc.enable() if v else gc.disable()),
            ("gc thresholds", gc.get_threshold, lambda v: gc.set_threshold(*v)),
            ("root logger level", lambda: logging.root.level, logging.root.setLevel),
            ("root logger handlers", lambda: list(logging.root.handlers),
             lambda v: setattr(logging.root, "handlers", list(v))),
        ]
        if hasattr(sys, "get_int_max_str_digits"):
            items.append(("int_max_str_digits", sys.get_int_max_str_digits, sys.set_int_max_str_digits))
        self.items = items
        self.values = [get() for _, get, _ in items]
        self.filters = list(warnings.filters)
        self.umask = os.umask(0o022)
        os.umask(self.umask)

    def restore(self) -> List[str]:
        failed: List[str] = []
        for (label, get, set_), value in zip(self.items, self.values):
            try:
                if get() is not value and get() != value:
                    set_(value)
            except Exception:
                failed.append(f"cannot restore {label}")
        warnings.resetwarnings()  # also invalidates the per-module "already warned" registries
        filters: Any = warnings.filters
        filters[:] = self.filters
        getattr(warnings, "onceregistry", {}).clear()
        os.umask(self.umask)
        return failed


def _torch_state(torch: Any, cuda: bool) -> List[Tuple[str, Callable[[], Any], Callable[[Any], None]]]:
    """Process-wide torch settings a job may change, restored after each job. Attributes are
    looked up at call time: an item a torch version lacks fails at start and is left out."""

    def flag(path: str) -> Tuple[str, Callable[[], Any], Callable[[Any], None]]:
        parent, _, name = path.rpartition(".")
        return (f"torch.{path}", lambda: getattr(_resolve("torch", parent), name),
                lambda v: setattr(_resolve("torch", parent), name, v))

    items = [
        flag("backends.cuda.matmul.allow_tf32"),
        flag("backends.cuda.matmul.allow_fp16_reduced_precision_reduction"),
        flag("backends.cudnn.allow_tf32"),
        flag("backends.cudnn.benchmark"),
        flag("backends.cudnn.deterministic"),
        ("float32_matmul_precision", lambda: torch.get_float32_matmul_precision(),
         lambda v: torch.set_float32_matmul_precision(v)),
        ("deterministic_algorithms",
         lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
         lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        ("default_dtype", lambda: torch.get_default_dtype(), lambda v: torch.set_default_dtype(v)),
        ("default_device", lambda: torch.get_default_device(), lambda v: torch.set_default_device(v)),
        ("grad_enabled", lambda: torch.is_grad_enabled(), lambda v: torch.set_grad_enabled(v)),
        ("rng state", lambda: torch.get_rng_state(), lambda v: torch.set_rng_state(v)),
    ]
    if cuda:
        items.append(("cuda rng state", lambda: torch.cuda.get_rng_state_all(),
                      lambda v: torch.cuda.set_rng_state_all(v)))
    return items


class Worker:
    """The worker's state between jobs; :meth:`serve` is its main loop."""

    def __init__(self, sock: socket.socket, cuda: bool, fork: bool = False) -> None:
        self.sock = sock
        self.pid = os.getpid()
        self.fork = fork
        #: In a forked job's child: its pid (the job's code ends as an interpreter's does there).
        self.job_pid: Optional[int] = None
        self.cuda = cuda
        self.jobs = 0
        self.max_jobs = _env_int("KFORGE_WORKER_MAX_JOBS", 100)
        self.max_rss_mb = _env_int("KFORGE_WORKER_MAX_RSS_MB", 0)
        self.env = dict(os.environ)
        self.cwd = os.getcwd()
        self.argv = list(sys.argv)
        self.path = list(sys.path)
        # sys.path of a job: [path0] + the job's $PYTHONPATH + this, the worker's sys.path
        # without its own path0 and $PYTHONPATH entries.
        own_pp = {os.path.abspath(p) for p in self.env.get("PYTHONPATH", "").split(os.pathsep) if p}
        self.base_path = [p for p in sys.path[1:] if not p or os.path.abspath(p) not in own_pp]
        self.main = sys.modules["__main__"]
        self.std = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
        self.encoding = [(getattr(s, "encoding", None) or "utf-8", getattr(s, "errors", None) or e)
                         for s, e in ((sys.__stdout__, "strict"), (sys.__stderr__, "backslashreplace"))]
        self.sys_state = _SysState()
        self.signals: Dict[int, Any] = {}
        for sig in signal.valid_signals():
            try:
                handler = signal.getsignal(sig)
            except (OSError, ValueError):
                continue
            if handler is not None:
                self.signals[sig] = handler
        self.originals: Dict[Tuple[str, str], Any] = {}
        self._snapshot_critical()
        self.torch_state: List[Tuple[str, Callable[[], Any], Callable[[Any], None]]] = []
        self.torch_values: List[Any] = []
        self.cuda_device: Optional[int] = None
        torch = sys.modules.get("torch")
        if torch is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for item in _torch_state(torch, cuda):
                    try:
                        self.torch_values.append(item[1]())
                        self.torch_state.append(item)
                    except Exception:
                        pass
            if cuda:
                self.cuda_device = int(torch.cuda.current_device())
        dirs = [sys.prefix, sys.base_prefix, sys.exec_prefix, getattr(sys, "base_exec_prefix", sys.prefix),
                os.path.dirname(os.path.abspath(kforge.__file__ or ""))]
        dirs += list(getattr(site, "getsitepackages", lambda: [])())
        dirs += [site.getusersitepackages()] if hasattr(site, "getusersitepackages") else []
        self.library_dirs = sorted({os.path.realpath(d) for d in dirs if d} - {os.sep})

    # -- protocol ------------------------------------------------------------------------------

    def send(self, msg: Dict[str, Any]) -> None:
        data = json.dumps(msg, ensure_ascii=False).encode("utf-8")
        if len(data) > MAX_MESSAGE:
            raise ValueError(f"control message of {len(data)} bytes exceeds {MAX_MESSAGE}")
        self.sock.send(data)

    def serve(self) -> int:
        """Answer the daemon until told to exit; return the worker's exit status."""
        while True:
            data, fds, flags, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 2)
            if not data and not fds:
                os._exit(0)  # the daemon is gone
            msg: Any = None
            try:
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                    raise ValueError("truncated message or descriptors")
                msg = json.loads(data.decode("utf-8"))
                if not isinstance(msg, dict):
                    raise ValueError("not a JSON object")
                kind = msg.get("type")
                if kind == "exit":
                    for fd in fds:
                        os.close(fd)
                    return 0
                if kind != "run":
                    raise ValueError(f"unknown message type {kind!r}")
                if len(fds) != 2:
                    raise ValueError(f"run carries {len(fds)} descriptors, not 2")
                if not isinstance(msg.get("job"), int):
                    raise ValueError("run without an integer job id")
                env, argv = msg.get("env", []), msg.get("argv")
                if not (isinstance(env, list) and all(isinstance(kv, list) and len(kv) == 2
                                                      and all(isinstance(x, str) for x in kv) for kv in env)):
                    raise ValueError("env must be a list of [name, value] string pairs")
                if not (isinstance(argv, list) and isinstance(msg.get("cwd"), str)):
                    raise ValueError("run needs an argv list and a cwd string")
            except ValueError as e:
                for fd in fds:
                    os.close(fd)
                _log(f"bad control message: {e}: {data[:200]!r}")
                if isinstance(msg, dict) and isinstance(msg.get("job"), int):
                    self.send({"type": "done", "job": msg["job"], "exit_code": 2,
                               "recycle": [f"bad run message: {e}"], "duration_ms": 0.0})
                return 2
            done = self.run_forked(msg, fds) if self.fork else self.run(msg, fds)
            self.send(done)
            if done["recycle"]:
                return 0

    # -- a job ---------------------------------------------------------------------------------

    def run(self, msg: Dict[str, Any], fds: List[int]) -> Dict[str, Any]:
        """Run one job (its output on ``fds``); return the ``done`` message."""
        t0 = _clock()
        self.jobs += 1
        job_env = {k: v for k, v in msg.get("env", [])}
        threads = set(threading.enumerate())
        native = _native_threads()
        modules = set(sys.modules)
        gpu_before = self._gpu_allocated()
        atexits: List[Tuple[Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]] = []
        importlib.invalidate_caches()

        unbuffered = bool(job_env.get("PYTHONUNBUFFERED"))
        try:
            unbuffered_opt, kind, target, args = parse_argv(msg["argv"])
            argv_error = ""
        except ValueError as e:
            unbuffered_opt, kind, target, args, argv_error = False, "", "", [], str(e)
        self._redirect(fds, unbuffered or unbuffered_opt, job_env.get("PYTHONIOENCODING", ""))
        os.environ.clear()
        os.environ.update(job_env)
        # How the job runs, for a job that must know (kforge verify's runner refuses in-process).
        # MODE:PID, so that a process the job starts (which inherits it) can tell it is not the job.
        os.environ["KFORGE_WARM_ISOLATION"] = f"{'fork' if self.job_pid is not None else 'in-process'}:{os.getpid()}"
        sys.dont_write_bytecode = bool(job_env.get("PYTHONDONTWRITEBYTECODE"))
        self._wrap_atexit(atexits)
        # `kforge run --auto-regions`: what the bootstrap's sitecustomize does in a cold job.
        auto = AutoRegions() if enabled(job_env) else None
        if auto is not None:
            auto.install()
        try:
            if argv_error:
                sys.stderr.write(f"{sys.executable}: {argv_error}\n")
                code = 2
            else:
                os.chdir(msg["cwd"])
                code = self._execute(kind, target, args, job_env.get("PYTHONPATH", ""))
        except OSError as e:  # the cwd
            sys.stderr.write(f"kforge worker: cannot enter the job's directory: {e}\n")
            code = 1
        if os.getpid() == self.job_pid:  # fork isolation: the job's child ends as an interpreter
            self._wait_threads(threads)
            self._run_atexits(atexits)
            atexit._run_exitfuncs()  # type: ignore[attr-defined]  # the libraries' (the preloads' too)
            os._exit(code if self._flush() or code != 0 else 120)
        if os.getpid() != self.pid:  # a forked child came back from the job's code
            self._flush()
            os._exit(code)

        recycle = self._wait_threads(threads | (auto.threads() if auto is not None else set()))
        self._run_atexits(atexits)
        if auto is not None:
            auto.uninstall()  # exits what is still open and restores what it patched
        if not self._flush() and code == 0:
            code = 120
        try:
            recycle += self._restore(modules)
            recycle += self._check(native, gpu_before)
        except Exception as e:
            _log(f"after job {msg['job']}: {traceback.format_exc()}")
            recycle.append(f"worker error after the job: {type(e).__name__}: {e}")
        recycle += self._served_enough(msg)
        rss = _rss_mb()
        if self.max_rss_mb > 0 and rss is not None and rss > self.max_rss_mb:
            recycle.append(f"rss {rss:.0f} MB above ceiling {self.max_rss_mb} MB")
        return {"type": "done", "job": msg["job"], "exit_code": code,
                "recycle": [r[:300] for r in recycle[:32]], "duration_ms": (_clock() - t0) * 1e3}

    def run_forked(self, msg: Dict[str, Any], fds: List[int]) -> Dict[str, Any]:
        """Fork isolation: run one job in a child forked for it; return the ``done`` message."""
        t0 = _clock()
        self.jobs += 1
        try:
            pid = os.fork()
        except OSError as e:  # EAGAIN, ENOMEM: the job's failure to start, said so; a new worker
            os.write(fds[1], f"kforge worker: cannot fork the job's process: {e}\n".encode())
            for fd in fds:
                os.close(fd)
            return {"type": "done", "job": msg["job"], "exit_code": 127, "recycle": [f"fork failed: {e}"],
                    "duration_ms": (_clock() - t0) * 1e3}
        if pid == 0:
            self._child(msg, fds)  # never returns
        for fd in fds:
            os.close(fd)
        status = self._wait_child(pid)
        # As the daemon does after a cold job's process: what it left running (its children,
        # orphaned to this worker, their subreaper) goes too, and with it the job's output pipes.
        _kill_descendants(self.pid)
        code = os.waitstatus_to_exitcode(status)
        done: Dict[str, Any] = {"type": "done", "job": msg["job"], "exit_code": code if code >= 0 else 128 - code,
                                "recycle": [], "duration_ms": (_clock() - t0) * 1e3, "child_pid": pid}
        if code < 0:
            done["signal"] = -code
        done["recycle"] += self._served_enough(msg)
        return done

    def _served_enough(self, msg: Dict[str, Any]) -> List[str]:
        """The recycle reason when this worker has run its share of jobs (its own ceiling, or
        the daemon's ``max_jobs_left``)."""
        left = msg.get("max_jobs_left")
        if self.jobs >= self.max_jobs > 0 or (isinstance(left, int) and left <= 1):
            return [f"served {self.jobs} jobs"]
        return []

    def _child(self, msg: Dict[str, Any], fds: List[int]) -> None:
        """The forked child: the job, then ``os._exit`` with its status (1 if the worker's own
        code failed around it); dies with the worker (``PR_SET_PDEATHSIG``)."""
        code = 1
        try:
            self.job_pid = os.getpid()
            die_with_parent()
            if os.getppid() != self.pid:  # the worker died before the death signal was set
                os._exit(1)
            self.sock.close()
            code = self.run(msg, fds)["exit_code"]  # run() ends the child itself
        except BaseException:
            try:
                traceback.print_exc()
            except BaseException:
                pass
        finally:
            os._exit(code)

    def _wait_child(self, pid: int) -> int:
        """The child's wait status. If the daemon goes away meanwhile (end of file on the
        control socket), the child is killed and the worker exits."""
        try:
            pidfd: Optional[int] = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None  # before Linux 5.3: poll
        try:
            while True:
                ready, _, _ = select.select([self.sock] + ([pidfd] if pidfd is not None else []), [], [],
                                            None if pidfd is not None else 0.01)
                if self.sock in ready:
                    data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 2)
                    for fd in fds:
                        os.close(fd)
                    if not data and not fds:  # the daemon is gone: so is the job
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                        os._exit(0)
                    _log(f"message while a job runs, ignored: {data[:200]!r}")
                waited, status = os.waitpid(pid, os.WNOHANG)
                if waited == pid:
                    return status
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _redirect(self, fds: List[int], unbuffered: bool, io_encoding: str) -> None:
        self._flush()
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        enc, _, err = io_encoding.partition(":")
        (out_enc, out_err), (err_enc, err_err) = self.encoding
        out = _text_stream(1, unbuffered, enc or out_enc, err or out_err)
        errs = _text_stream(2, unbuffered, enc or err_enc, err_err)
        sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__ = out, errs, out, errs  # type: ignore[misc]

    def _execute(self, kind: str, target: str, args: List[str], pythonpath: str) -> int:
        """Run the job's code in a fresh ``__main__``; return its exit status."""
        if kind == "-c":
            path0 = ""
        elif kind == "-m":
            path0 = os.getcwd()
        else:
            path0 = os.path.dirname(os.path.realpath(target))
        sys.path[:] = [path0] + [p for p in pythonpath.split(os.pathsep) if p] + self.base_path
        sys.argv = [target if kind == "script" else kind] + args
        try:
            if kind == "-c":
                main = _fresh_main(__loader__=importlib.machinery.BuiltinImporter)
                sys.modules["__main__"] = main
                exec(compile(target, "<string>", "exec", dont_inherit=True), main.__dict__)
            elif kind == "-m":
                sys.modules["__main__"] = _fresh_main(__loader__=importlib.machinery.BuiltinImporter)
                runpy._run_module_as_main(target, alter_argv=True)  # type: ignore[attr-defined]
            else:
                path = os.path.abspath(target)
                if os.path.isdir(path) or zipfile.is_zipfile(path):
                    sys.path.pop(0)  # run_path puts the directory or archive there itself
                    sys.modules["__main__"] = _fresh_main()
                    runpy.run_path(target, run_name="__main__")
                    return 0
                try:
                    with io.open_code(path) as f:
                        source = f.read()
                except OSError as e:
                    sys.stderr.write(f"{sys.executable}: can't open file {path!r}: [Errno {e.errno}] {e.strerror}\n")
                    return 2
                main = _fresh_main(__file__=path, __cached__=None,
                                   __loader__=importlib.machinery.SourceFileLoader("__main__", path))
                sys.modules["__main__"] = main
                exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
            return 0
        except SystemExit as e:
            return system_exit_code(e)
        except BaseException as e:
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == _THIS_FILE:
                tb = tb.tb_next
            try:
                sys.excepthook(type(e), e.with_traceback(tb), tb)
            except BaseException:
                traceback.print_exception(type(e), e, tb)
            return 130 if isinstance(e, KeyboardInterrupt) else 1
        finally:
            sys.modules["__main__"] = self.main

    def _wrap_atexit(self, record: List[Tuple[Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]]) -> None:
        """Make ``atexit.register`` note the callbacks the job's own code registers (run at
        the end of the job, as at interpreter exit); library code registers as usual."""
        original = atexit.register

        def register(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
            if not self._is_library_file(sys._getframe(1).f_code.co_filename):
                record.append((func, args, kwargs))
                return func
            return original(func, *args, **kwargs)

        atexit.register = register  # type: ignore[assignment]

    def _run_atexits(self, record: List[Tuple[Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]]) -> None:
        while record:
            func, args, kwargs = record.pop()
            try:
                func(*args, **kwargs)
            except SystemExit:
                pass
            except BaseException:
                sys.stderr.write(f"Exception ignored in atexit callback: {func!r}\n")
                traceback.print_exc()

    def _wait_threads(self, before: Set[threading.Thread]) -> List[str]:
        """As at interpreter exit, wait for the job's non-daemon threads; return a reason for
        every thread the job left running when its main code ended."""
        new = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if any(not t.daemon for t in new):
            # concurrent.futures stops its idle pool threads through these hooks (they also stop
            # later use of executors in this process: the thread finding recycles the worker).
            for hook in reversed(list(getattr(threading, "_threading_atexits", []))):
                hook()
            for t in new:
                if not t.daemon and t is not threading.current_thread():
                    t.join()
        return [f"thread left running: {t.name}" for t in new]

    def _flush(self) -> bool:
        """Flush the standard streams; False if flushing ``sys.stdout`` failed (CPython then
        exits with status 120)."""
        ok = True
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                if stream is not None and not getattr(stream, "closed", False):
                    stream.flush()
            except Exception:
                ok = ok and stream is not sys.stdout
        return ok

    def _restore(self, modules: Set[str]) -> List[str]:
        """Give the job's output back, drop its modules and restore the worker's state."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__ = self.std  # type: ignore[misc]
        for name in set(sys.modules) - modules:
            mod = sys.modules.get(name)
            if mod is not None and not self._is_library_module(mod):
                del sys.modules[name]
        linecache.clearcache()
        importlib.invalidate_caches()
        os.environ.clear()
        os.environ.update(self.env)
        os.chdir(self.cwd)
        sys.argv = list(self.argv)
        sys.path[:] = self.path
        sys.modules["__main__"] = self.main
        reasons = self.sys_state.restore()
        for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
            signal.setitimer(timer, 0)
        reasons += self._restore_signals()
        torch = sys.modules.get("torch")
        if torch is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for (label, get, set_), value in zip(self.torch_state, self.torch_values):
                    try:
                        try:
                            changed = bool(get() != value)
                        except Exception:  # tensors (RNG states) do not compare to a bool
                            changed = True
                        if changed:
                            set_(value)
                    except Exception as e:
                        reasons.append(f"cannot restore torch {label}: {e}")
                dynamo = sys.modules.get("torch._dynamo")
                if dynamo is not None:
                    try:
                        dynamo.reset()
                    except Exception as e:
                        reasons.append(f"torch._dynamo.reset failed: {e}")
        reset_connection()
        return reasons

    def _restore_signals(self) -> List[str]:
        failed = []
        for sig, handler in self.signals.items():
            try:
                if signal.getsignal(sig) is not handler:
                    signal.signal(sig, handler)
            except (OSError, ValueError, RuntimeError):
                failed.append(f"cannot restore the handler of signal {sig}")
        return failed

    def _is_library_file(self, path: str) -> bool:
        if not path or path.startswith("<frozen "):
            return True  # the runtime's own frozen modules
        if path.startswith("<"):
            return False  # "<string>": code of a -c job or exec'ed by one
        real = os.path.realpath(path)
        return any(real == d or real.startswith(d + os.sep) for d in self.library_dirs)

    def _is_library_module(self, mod: Any) -> bool:
        f = getattr(mod, "__file__", None)
        paths = [f] if isinstance(f, str) else [p for p in getattr(mod, "__path__", None) or [] if isinstance(p, str)]
        return all(self._is_library_file(p) for p in paths)

    # -- hygiene -------------------------------------------------------------------------------

    def _snapshot_critical(self) -> None:
        """Record the critical callables of modules loaded by now (modules a job loads first are
        recorded after that job)."""
        for key in CRITICAL:
            if key not in self.originals:
                value = _resolve(*key)
                if value is not _MISSING:
                    self.originals[key] = value

    def _gpu_allocated(self) -> int:
        torch = sys.modules.get("torch")
        if not self.cuda or torch is None:
            return 0
        try:
            return int(torch.cuda.memory_allocated())
        except Exception:
            return 0

    def _check(self, native: int, gpu_before: int) -> List[str]:
        reasons = [f"replaced {m}.{a}" for (m, a), v in self.originals.items() if _resolve(m, a) is not v]
        self._snapshot_critical()
        if region_open():
            reasons.append("kforge region left open")
        gc.collect()
        torch = sys.modules.get("torch")
        if self.cuda and torch is not None:
            reasons += self._check_cuda(torch, gpu_before)
        if native:
            # A thread that just ended may linger in /proc for a moment.
            for _ in range(100):
                now = _native_threads()
                if now <= native:
                    break
                _sleep(0.001)
            else:
                reasons.append(f"native threads left running: {now} after the job, {native} before")
        return reasons

    def _check_cuda(self, torch: Any, gpu_before: int) -> List[str]:
        try:
            torch.cuda.synchronize()
        except Exception as e:
            return [f"cuda error: {e}"]
        reasons = []
        try:
            if torch.cuda.current_device() != self.cuda_device:
                reasons.append(f"cuda current device changed: {torch.cuda.current_device()} (was {self.cuda_device})")
            if torch.cuda.current_stream() != torch.cuda.default_stream():
                reasons.append("cuda current stream is not the default stream")
            torch.cuda.empty_cache()
            leaked = int(torch.cuda.memory_allocated()) - gpu_before
            if leaked > GPU_MEMORY_SLACK:
                reasons.append(f"gpu memory not returned: {leaked} bytes")
        except Exception as e:
            reasons.append(f"cuda check failed: {e}")
        return reasons


#: The ways a worker runs a job (``$KFORGE_WORKER_ISOLATION``).
ISOLATIONS = ("in-process", "fork")


#: Set by a forking GPU worker for its own ``exec`` (see :func:`_start_again_without`): the preloads
#: it leaves out, comma-separated, and when it first started (``_clock``'s monotonic reading).
LEFT_OUT_ENV = "KFORGE_WORKER_LEFT_OUT"
STARTED_ENV = "KFORGE_WORKER_STARTED"

POISONS_FORKS = ("importing it initializes the CUDA driver in the worker, so that torch refuses CUDA in every "
                 "forked job ('Cannot re-initialize CUDA in forked subprocess'); the jobs import it themselves")


class PoisonedForks(Exception):
    """Importing preload ``name`` left the forking GPU worker's forks refused CUDA."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def preload(spec: str, device: str, fork: bool = False,
            left_out: FrozenSet[str] = frozenset()) -> Tuple[List[str], bool, List[str]]:
    """Import the modules named by ``spec`` (but those in ``left_out``) and, unless the worker
    forks its jobs (``fork``: a CUDA context and torch's thread pools do not survive a fork),
    create the CUDA context on a GPU device; return (preloaded, cuda, errors). A forking worker
    on a GPU checks after each import that its forks may still use CUDA, and raises
    :class:`PoisonedForks` when one may not: torch marks every fork made after this process
    initialized the CUDA driver (``torch.cuda.is_available()``, a device count, a tensor), and
    CUDA then fails in the fork with ``Cannot re-initialize CUDA in forked subprocess``. So it
    failed in session 25's first warm verifies on an H100 (torch 2.11), all in their first CUDA
    call, with Inductor and Dynamo among the preloads."""
    if spec.strip() == "auto":
        names = [n for n in ("torch", "triton") if importlib.util.find_spec(n) is not None]
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
    loaded: List[str] = []
    errors = [f"preload {n} left out: {POISONS_FORKS}" for n in names if n in left_out]
    # Forks spoilt before any preload: no preload is to blame (main refuses to start).
    fork_gpu = fork and _on_gpu(device) and not _forks_refuse_cuda()
    if fork_gpu:
        # torch.cuda.is_available() asks NVML, not the CUDA driver: the driver initialized here
        # would leave every forked job unable to use the GPU (the jobs' env is their own).
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    for name in names:
        if name in left_out:
            continue
        try:
            importlib.import_module(name)
            loaded.append(name)
        except BaseException as e:  # noqa: B036 (a preload may even call sys.exit)
            errors.append(f"preload {name} failed: {type(e).__name__}: {e}")
        if fork_gpu and _forks_refuse_cuda():
            raise PoisonedForks(name)
    cuda = False
    torch = sys.modules.get("torch")
    if fork:
        return loaded, cuda, errors
    if torch is not None:
        _warm_torch_pools(torch, None, errors)
    if torch is not None and _on_gpu(device):
        try:
            torch.cuda.init()
            torch.empty(1, device="cuda")
            torch.cuda.synchronize()
            cuda = True
            _warm_torch_pools(torch, "cuda", errors)
        except Exception as e:
            errors.append(f"cuda init failed: {type(e).__name__}: {e}")
    return loaded, cuda, errors


def _taken_from_env() -> Tuple[Optional[float], FrozenSet[str]]:
    """What the worker's earlier self left for it before its ``exec`` (start time, left-out
    preloads), removed from the environment so that no job sees it."""
    started, left = os.environ.pop(STARTED_ENV, None), os.environ.pop(LEFT_OUT_ENV, "")
    try:
        t0 = float(started) if started else None
    except ValueError:
        t0 = None
    return t0, frozenset(n for n in left.split(",") if n)


def _start_again_without(name: str, left_out: FrozenSet[str], t0: float, fd: int) -> str:
    """Replace this process by a fresh worker (the same pid, cgroup, process group and control
    socket on ``fd``) that leaves out preload ``name`` too; return why that failed (it returns
    only then)."""
    os.environ[LEFT_OUT_ENV] = ",".join(sorted(left_out | {name}))
    os.environ[STARTED_ENV] = repr(t0)
    argv = list(getattr(sys, "orig_argv", []) or [sys.executable, "-m", "kforge.worker"])
    try:
        os.set_inheritable(fd, True)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, argv)
    except OSError as e:
        return f"cannot start again without preload {name}: {e}"
    return "unreachable"  # pragma: no cover (execv returns only by raising)


def _on_gpu(device: str) -> bool:
    """Whether ``KFORGE_DEVICE``'s value names a GPU (not ``cpu``, not unset)."""
    return device not in ("", "cpu")


def _forks_refuse_cuda() -> bool:
    """Whether torch is imported and a child forked now would be refused CUDA by it."""
    torch = sys.modules.get("torch")
    return torch is not None and _fork_is_bad(torch)


def _fork_is_bad(torch: Any) -> bool:
    """Whether a child forked now is in torch's bad fork (CUDA refused there)."""
    in_bad_fork = getattr(torch._C, "_cuda_isInBadFork", None)
    return in_bad_fork is not None and _true_in_a_fork(lambda: bool(in_bad_fork()))


def _true_in_a_fork(check: Callable[[], bool]) -> bool:
    """Whether ``check()``, run in a child forked for it, returned True (False when it raised);
    the child ends with ``os._exit``, so that nothing of the worker's runs there."""
    pid = os.fork()
    if pid == 0:
        try:
            code = 1 if check() else 0
        except BaseException:  # noqa: B036 (a failed import: the worker's own import reports it)
            code = 0
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 1


def _warm_torch_pools(torch: Any, device: Optional[str], errors: List[str]) -> None:
    """Start the thread pools torch creates lazily and keeps (intra-op OpenMP pool, cuBLAS
    handles, the autograd engine's device threads), so that a job's first use of them does not
    look like a thread left running and recycle its worker."""
    try:
        x = torch.ones(1 << 16, device=device, requires_grad=True)
        (x * 2).sum().backward()
        a = torch.ones(64, 64, device=device)
        (a @ a).sum().item()
        if device is not None:
            torch.cuda.synchronize()
    except Exception as e:  # a failed warm-up only costs a recycle later
        errors.append(f"torch warm-up ({device or 'cpu'}) failed: {type(e).__name__}: {e}")


def main() -> int:
    started, left_out = _taken_from_env()
    t0 = _clock() if started is None else started
    fd = _env_int("KFORGE_WORKER_FD", 3)
    try:
        sock = socket.socket(fileno=fd)
    except OSError as e:
        _log(f"no control socket on fd {fd}: {e}")
        return 2
    isolation = os.environ.get("KFORGE_WORKER_ISOLATION", "in-process")
    if isolation not in ISOLATIONS:
        _log(f"KFORGE_WORKER_ISOLATION must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        return 2
    fork = isolation == "fork"
    device = os.environ.get("KFORGE_DEVICE", "cpu")
    try:
        loaded, cuda, errors = preload(os.environ.get("KFORGE_WORKER_PRELOAD", "auto"), device, fork, left_out)
    except PoisonedForks as e:
        _log(f"preload {e.name}: {POISONS_FORKS}; starting again without it")
        _log(_start_again_without(e.name, left_out, t0, fd))
        return 2
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if fork and threads:
        _log(f"fork isolation: the preloads left Python threads running ({', '.join(threads)}); "
             "a forked child would inherit their locks, not the threads: not starting")
        return 2
    if fork:
        become_subreaper()
    worker = Worker(sock, cuda, fork)
    if fork and _on_gpu(device) and _forks_refuse_cuda():
        _log("fork isolation: the CUDA driver was initialized in the worker before any job (torch refuses CUDA "
             "in its forks: 'Cannot re-initialize CUDA in forked subprocess'); every job would fail: not starting")
        return 2
    gc.collect()
    gc.freeze()  # start-up objects are not the jobs' garbage: keeps per-job collections cheap
    ready: Dict[str, Any] = {"type": "ready", "pid": os.getpid(), "preloaded": loaded, "cuda": cuda,
                             "startup_ms": (_clock() - t0) * 1e3, "python": sys.version, "isolation": isolation}
    if errors:
        ready["error"] = "; ".join(errors)
        _log(ready["error"])
    worker.send(ready)
    try:
        return worker.serve()
    except (OSError, KeyboardInterrupt) as e:
        _log(f"control socket: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
