"""The warm worker (``python -m kforge.worker``) driven through its control socket, as the daemon
drives it: a SOCK_SEQPACKET socket on fd 3, JSON messages, the job's pipes passed by SCM_RIGHTS."""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence

import pytest

PYTHON_DIR = str(Path(__file__).resolve().parent.parent)
TIMEOUT = 20.0


class Result(NamedTuple):
    exit_code: int
    stdout: str
    stderr: str
    recycle: List[str]


def base_env(**extra: str) -> Dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def cold(argv: Sequence[str], cwd: Path, env: Dict[str, str]) -> Result:
    """The same command in a fresh interpreter, for comparison."""
    p = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    return Result(p.returncode, p.stdout, p.stderr, [])


class FakeDaemon:
    """Starts a worker and speaks the daemon's side of the control protocol."""

    def __init__(self, tmp: Path, expect_ready: bool = True, **env: str) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.fileno()

        def to_fd3() -> None:  # in the child: the worker's control socket is fd 3
            if fd == 3:
                os.set_inheritable(3, True)
            else:
                os.dup2(fd, 3)

        worker_env = base_env(
            PYTHONPATH=PYTHON_DIR, KFORGE_WORKER_FD="3", KFORGE_WORKER_ID="w7",
            KFORGE_WORKER_PRELOAD="", KFORGE_DEVICE="cpu",
        )
        worker_env.update(env)
        self.log = tmp / f"worker-{id(self)}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kforge.worker"], cwd=PYTHON_DIR, env=worker_env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=False, preexec_fn=to_fd3,
            )
        theirs.close()
        self.sock = ours
        self.sock.settimeout(TIMEOUT)
        self.next_job = 1
        self.ready = self.recv() if expect_ready else None
        assert self.ready is not None or not expect_ready, self.log.read_text()

    def send(self, msg: Dict[str, Any], fds: Sequence[int] = ()) -> None:
        socket.send_fds(self.sock, [json.dumps(msg).encode()], list(fds))

    def recv(self) -> Optional[Dict[str, Any]]:
        """The next message, or None at end of file."""
        data = self.sock.recv(1 << 20)
        return json.loads(data) if data else None

    def start(self, argv: Sequence[str], cwd: Path, env: Optional[Dict[str, str]] = None,
              max_jobs_left: Optional[int] = None) -> "tuple[int, int, int]":
        job = self.next_job
        self.next_job += 1
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.send({"type": "run", "job": job, "argv": list(argv), "cwd": str(cwd),
                   "env": [[k, v] for k, v in (env if env is not None else base_env()).items()],
                   "max_jobs_left": max_jobs_left}, [out_w, err_w])
        os.close(out_w)
        os.close(err_w)
        return job, out_r, err_r

    def run(self, argv: Sequence[str], cwd: Path, env: Optional[Dict[str, str]] = None,
            max_jobs_left: Optional[int] = None) -> Result:
        """Run a job; return its exit code, output and the recycle reasons."""
        job, out_r, err_r = self.start(argv, cwd, env, max_jobs_left)
        out, err = drain(out_r, err_r)
        done = self.recv()
        assert done is not None, f"worker died: {self.proc.poll()}\n{err}\n{self.log.read_text()}"
        assert done["type"] == "done" and done["job"] == job, done
        assert isinstance(done["duration_ms"], float) and done["duration_ms"] >= 0
        return Result(done["exit_code"], out, err, done["recycle"])

    def wait_exit(self) -> int:
        """The worker's exit status once it closed the control socket."""
        assert self.recv() is None
        return self.proc.wait(timeout=TIMEOUT)

    def close(self) -> None:
        self.sock.close()
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def drain(out_r: int, err_r: int) -> "tuple[str, str]":
    """Read both pipes to end of file."""
    bufs: Dict[int, bytearray] = {out_r: bytearray(), err_r: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + TIMEOUT
    open_fds = set(bufs)
    while open_fds:
        events = sel.select(timeout=max(0.0, deadline - time.monotonic()))
        assert events, "timed out waiting for the job's output"
        for key, _ in events:
            chunk = os.read(key.fd, 65536)
            if chunk:
                bufs[key.fd] += chunk
            else:
                sel.unregister(key.fd)
                os.close(key.fd)
                open_fds.discard(key.fd)
    sel.close()
    return bufs[out_r].decode(), bufs[err_r].decode()


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[FakeDaemon]:
    d = FakeDaemon(tmp_path)
    yield d
    d.close()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- start and protocol ------------------------------------------------------------------------


def test_ready_message(worker: FakeDaemon) -> None:
    r = worker.ready
    assert r is not None
    assert r["type"] == "ready"
    assert r["pid"] == worker.proc.pid
    assert r["preloaded"] == [] and r["cuda"] is False and "error" not in r
    assert isinstance(r["startup_ms"], float) and r["startup_ms"] >= 0
    assert r["python"] == sys.version


def test_exit_message_and_eof(tmp_path: Path) -> None:
    d = FakeDaemon(tmp_path)
    d.send({"type": "exit"})
    assert d.wait_exit() == 0
    d.close()
    d = FakeDaemon(tmp_path)
    d.sock.shutdown(socket.SHUT_RDWR)  # the daemon goes away
    assert d.proc.wait(timeout=TIMEOUT) == 0
    d.close()


# -- fresh-interpreter semantics ---------------------------------------------------------------

PROBE = """\
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
                  "file": globals().get("__file__"), "globals": sorted(globals()),
                  "env": dict(os.environ)}))
"""


def test_script_argv_cwd_env_like_cold(worker: FakeDaemon, tmp_path: Path) -> None:
    write(tmp_path / "probe.py", PROBE)
    env = base_env(FOO="bar baz", PYTHONPATH="")
    warm = worker.run(["probe.py", "a", "b c"], tmp_path, env)
    assert warm.exit_code == 0 and warm.recycle == [], warm
    got = json.loads(warm.stdout)
    assert got["argv"] == ["probe.py", "a", "b c"]
    assert got["cwd"] == str(tmp_path)
    assert got["path0"] == os.path.realpath(tmp_path)
    assert got["name"] == "__main__"
    assert got["file"] == str(tmp_path / "probe.py")
    assert got["env"]["FOO"] == "bar baz"
    assert "KFORGE_WORKER_ID" not in got["env"] and "KFORGE_WORKER_FD" not in got["env"]
    want = json.loads(cold(["probe.py", "a", "b c"], tmp_path, env).stdout)
    for key in ("argv", "cwd", "path0", "name", "file", "globals"):
        assert got[key] == want[key], key
    # the worker's own environment is back: a job without FOO does not see it
    assert "FOO" not in json.loads(worker.run(["probe.py"], tmp_path).stdout)["env"]


def test_c_and_m_forms(worker: FakeDaemon, tmp_path: Path) -> None:
    write(tmp_path / "probe.py", PROBE)
    env = base_env()
    for argv in (["-c", "exec(open('probe.py').read())", "x"], ["-m", "probe", "y", "-z"], ["-u", "-m", "probe"]):
        warm = worker.run(argv, tmp_path, env)
        want = cold(argv, tmp_path, env)
        assert warm.exit_code == 0 and warm.stderr == "", warm
        got, exp = json.loads(warm.stdout), json.loads(want.stdout)
        for key in ("argv", "cwd", "path0", "name", "file", "globals"):
            assert got[key] == exp[key], (argv, key)
    missing = worker.run(["-m", "no_such_module_kf"], tmp_path, env)
    assert missing.exit_code == 1 and "No module named no_such_module_kf" in missing.stderr


def test_stdout_and_stderr_separate_and_complete(worker: FakeDaemon, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "for i in range(20000):\n"
        "    print('out', i)\n"
        "    if i % 1000 == 0: print('err', i, file=sys.stderr)\n"
        "sys.stdout.write('no newline at the end')\n"
    )
    r = worker.run(["-c", code], tmp_path)
    assert r.exit_code == 0
    assert r.stdout == "".join(f"out {i}\n" for i in range(20000)) + "no newline at the end"
    assert r.stderr == "".join(f"err {i}\n" for i in range(0, 20000, 1000))


def test_stream_buffering_like_cold(worker: FakeDaemon, tmp_path: Path) -> None:
    code = "import sys; print([(s.line_buffering, s.write_through, s.encoding) for s in (sys.stdout, sys.stderr)])"
    for argv, env in ((["-c", code], base_env()), (["-u", "-c", code], base_env()),
                      (["-c", code], base_env(PYTHONUNBUFFERED="1"))):
        assert worker.run(argv, tmp_path, env).stdout == cold(argv, tmp_path, env).stdout, argv


@pytest.mark.parametrize(
    "body",
    [
        "pass",
        "import sys; sys.exit(3)",
        "import sys; sys.exit(None)",
        "import sys; sys.exit(-1)",
        "import sys; sys.exit('fatal: msg')",
        "def f():\n    raise ValueError('boom')\ndef g():\n    f()\ng()\n",
        "try:\n    1/0\nexcept ZeroDivisionError as e:\n    raise KeyError('k') from e\n",
        "import sys; print('partial'); sys.stdout.flush(); x = (1,\n",
        "import sys; print('x'); sys.stdout.close()",
    ],
    ids=["ok", "exit3", "exit-none", "exit-neg", "exit-msg", "traceback", "chained", "syntax-error", "closed-stdout"],
)
def test_exit_codes_and_tracebacks_like_cold(worker: FakeDaemon, tmp_path: Path, body: str) -> None:
    write(tmp_path / "job.py", body)
    warm = worker.run(["job.py"], tmp_path)
    want = cold(["job.py"], tmp_path, base_env())
    assert (warm.exit_code, warm.stdout, warm.stderr) == (want.exit_code, want.stdout, want.stderr)
    assert warm.recycle == []
    # the same worker serves the next job
    assert worker.run(["-c", "print('next')"], tmp_path).stdout == "next\n"


def test_exit_codes(worker: FakeDaemon, tmp_path: Path) -> None:
    assert worker.run(["-c", "import sys; sys.exit(3)"], tmp_path).exit_code == 3
    r = worker.run(["-c", "import sys; sys.exit('msg')"], tmp_path)
    assert (r.exit_code, r.stderr) == (1, "msg\n")
    r = worker.run(["-c", "raise RuntimeError('x')"], tmp_path)
    assert r.exit_code == 1
    assert r.stderr == 'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\nRuntimeError: x\n'
    r = worker.run(["-c", "raise KeyboardInterrupt"], tmp_path)
    assert r.exit_code == 130 and r.stderr.endswith("KeyboardInterrupt\n")
    r = worker.run(["missing.py"], tmp_path)
    assert r.exit_code == 2 and "can't open file" in r.stderr and "missing.py" in r.stderr


def test_os_exit_kills_the_worker(worker: FakeDaemon, tmp_path: Path) -> None:
    job, out_r, err_r = worker.start(["-c", "import os; print('bye', flush=True); os._exit(7)"], tmp_path)
    assert drain(out_r, err_r) == ("bye\n", "")
    assert worker.wait_exit() == 7


def test_fresh_namespace_between_jobs(worker: FakeDaemon, tmp_path: Path) -> None:
    r = worker.run(["-c", "import __main__; LEFT = 1; print(__main__.LEFT, __name__)"], tmp_path)
    assert r.stdout == "1 __main__\n"
    assert worker.run(["-c", "print('LEFT' in globals())"], tmp_path).stdout == "False\n"
    write(tmp_path / "s.py", "print('LEFT' in globals(), __name__)\nLEFT = 2\n")
    assert worker.run(["s.py"], tmp_path).stdout == "False __main__\n"
    assert worker.run(["s.py"], tmp_path).stdout == "False __main__\n"


def test_edited_module_is_imported_again(worker: FakeDaemon, tmp_path: Path) -> None:
    cand = write(tmp_path / "cand.py", "def value():\n    return 1\n")
    write(tmp_path / "bench.py", "import cand\nprint(cand.value())\n")
    assert worker.run(["bench.py"], tmp_path).stdout == "1\n"
    write(cand, "def value():\n    return 2\n")  # same size: only the mtime tells the pyc is stale
    st = cand.stat()
    os.utime(cand, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    assert worker.run(["bench.py"], tmp_path).stdout == "2\n"
    # a module created between jobs is found
    write(tmp_path / "newmod.py", "X = 'new'\n")
    assert worker.run(["-c", "import newmod; print(newmod.X)"], tmp_path).stdout == "new\n"


def test_state_restored_between_jobs(worker: FakeDaemon, tmp_path: Path) -> None:
    code = (
        "import signal, sys, warnings, logging\n"
        "print(signal.getsignal(signal.SIGUSR1), sys.getrecursionlimit(), len(warnings.filters),"
        " logging.getLogger().level, sys.excepthook is sys.__excepthook__)\n"
    )
    before = worker.run(["-c", code], tmp_path).stdout
    mess = (
        "import signal, sys, warnings, logging\n"
        "signal.signal(signal.SIGUSR1, lambda *a: None); sys.setrecursionlimit(500)\n"
        "warnings.simplefilter('ignore'); logging.basicConfig(level=logging.DEBUG)\n"
        "sys.excepthook = lambda *a: None\n"
    )
    assert worker.run(["-c", mess], tmp_path).recycle == []
    assert worker.run(["-c", code], tmp_path).stdout == before


def test_atexit_callbacks_of_the_job_run_at_its_end(worker: FakeDaemon, tmp_path: Path) -> None:
    code = "import atexit\n@atexit.register\ndef bye():\n    print('at exit')\nprint('main')\n"
    assert worker.run(["-c", code], tmp_path).stdout == "main\nat exit\n"
    assert worker.run(["-c", "print('next')"], tmp_path).stdout == "next\n"


def test_region_without_daemon_in_each_job(worker: FakeDaemon, tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    env = base_env(XDG_RUNTIME_DIR=str(runtime), KFORGE_JOB="5")
    code = "import kforge\nwith kforge.region('x') as r:\n    pass\nprint(r.region, r.held_ms is not None)\n"
    for _ in range(2):  # the warn-once state is reset between jobs
        r = worker.run(["-c", code], tmp_path, env)
        assert (r.exit_code, r.stdout, r.recycle) == (0, "None True\n", []), r
        assert "no daemon" in r.stderr


# -- hygiene -----------------------------------------------------------------------------------


def test_replaced_timer_recycles_the_worker(tmp_path: Path) -> None:
    d = FakeDaemon(tmp_path)
    r = d.run(["-c", "import time; time.perf_counter = lambda: 0.0"], tmp_path)
    assert r.exit_code == 0
    assert r.recycle == ["replaced time.perf_counter"]
    assert d.wait_exit() == 0
    d.close()
    d = FakeDaemon(tmp_path)
    r = d.run(["-c", "import time; print(time.perf_counter.__name__, type(time.perf_counter).__name__)"], tmp_path)
    assert (r.stdout, r.recycle) == ("perf_counter builtin_function_or_method\n", [])
    d.close()


def test_replaced_kforge_callable_recycles(worker: FakeDaemon, tmp_path: Path) -> None:
    r = worker.run(["-c", "import kforge; kforge.do_bench = print"], tmp_path)
    assert r.recycle == ["replaced kforge.do_bench"]
    assert worker.wait_exit() == 0


def test_region_left_open_recycles(worker: FakeDaemon, tmp_path: Path) -> None:
    code = "import kforge\nr = kforge.region('open')\nr.__enter__()\n"
    r = worker.run(["-c", code], tmp_path)
    assert r.exit_code == 0
    assert "kforge region left open" in r.recycle
    assert worker.wait_exit() == 0


def test_thread_left_running_recycles(worker: FakeDaemon, tmp_path: Path) -> None:
    code = (
        "import threading\n"
        "ev = threading.Event()\n"
        "threading.Thread(target=ev.wait, name='lingering', daemon=True).start()\n"
    )
    r = worker.run(["-c", code], tmp_path)
    assert r.exit_code == 0
    assert "thread left running: lingering" in r.recycle
    assert any(x.startswith("native threads left running") for x in r.recycle), r.recycle
    assert worker.wait_exit() == 0


def test_non_daemon_threads_are_waited_for(worker: FakeDaemon, tmp_path: Path) -> None:
    code = (
        "import threading\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "go = threading.Event()\n"
        "def late():\n"
        "    go.wait(); print('thread done', flush=True)\n"
        "threading.Thread(target=late, name='late').start()\n"
        "ThreadPoolExecutor(2).submit(print, 'pool ran')\n"
        "go.set()\n"
    )
    r = worker.run(["-c", code], tmp_path)
    assert r.exit_code == 0
    assert sorted(r.stdout.splitlines()) == ["pool ran", "thread done"]
    assert any(x.startswith("thread left running:") for x in r.recycle)
    assert worker.wait_exit() == 0


def test_max_jobs(tmp_path: Path) -> None:
    d = FakeDaemon(tmp_path, KFORGE_WORKER_MAX_JOBS="2")
    assert d.run(["-c", "pass"], tmp_path).recycle == []
    assert d.run(["-c", "pass"], tmp_path).recycle == ["served 2 jobs"]
    assert d.wait_exit() == 0
    d.close()


def test_max_jobs_left_from_the_daemon(worker: FakeDaemon, tmp_path: Path) -> None:
    assert worker.run(["-c", "pass"], tmp_path, max_jobs_left=2).recycle == []
    assert worker.run(["-c", "pass"], tmp_path, max_jobs_left=1).recycle == ["served 2 jobs"]
    assert worker.wait_exit() == 0


def test_rss_ceiling(tmp_path: Path) -> None:
    d = FakeDaemon(tmp_path, KFORGE_WORKER_MAX_RSS_MB="1")
    r = d.run(["-c", "pass"], tmp_path)
    assert len(r.recycle) == 1 and r.recycle[0].startswith("rss ") and r.recycle[0].endswith("above ceiling 1 MB")
    assert d.wait_exit() == 0
    d.close()


def test_bad_run_message(worker: FakeDaemon, tmp_path: Path) -> None:
    r, w = os.pipe()
    worker.send({"type": "run", "job": 9, "argv": ["-c", "pass"], "cwd": str(tmp_path), "env": []}, [w])
    os.close(w)
    done = worker.recv()
    assert done is not None and done["job"] == 9 and done["exit_code"] == 2
    assert done["recycle"] == ["bad run message: run carries 1 descriptors, not 2"]
    assert worker.wait_exit() == 2
    assert os.read(r, 10) == b""  # the worker closed the descriptor it got
    os.close(r)


# -- torch hygiene, against a stand-in torch package (the checks need only this much API) ------

FAKE_TORCH = '''\
import types
_state = {"device": 0, "mem": 0, "stream": "default", "sticky": "", "dtype": "float32"}
class Tensor:
    def __matmul__(self, other): return other
def matmul(a, b): return b
mm = bmm = matmul
def empty(*shape, device=None): return Tensor()
def get_default_dtype(): return _state["dtype"]
def set_default_dtype(d): _state["dtype"] = d
nn = types.SimpleNamespace(functional=types.SimpleNamespace(linear=matmul))
backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(benchmark=False, allow_tf32=True))
class Event:
    def record(self, stream=None): pass
    def elapsed_time(self, other): return 0.0
    def synchronize(self): pass
def _synchronize():
    if _state["sticky"]:
        raise RuntimeError(_state["sticky"])
cuda = types.SimpleNamespace(
    init=lambda: None, synchronize=_synchronize, Event=Event, empty_cache=lambda: None,
    current_device=lambda: _state["device"], current_stream=lambda: _state["stream"],
    default_stream=lambda: "default", memory_allocated=lambda: _state["mem"],
)
'''


@pytest.fixture
def torch_worker(tmp_path: Path) -> Iterator[FakeDaemon]:
    (tmp_path / "fake").mkdir()
    write(tmp_path / "fake" / "torch.py", FAKE_TORCH)
    d = FakeDaemon(tmp_path, KFORGE_WORKER_PRELOAD="torch", KFORGE_DEVICE="0",
                   PYTHONPATH=f"{PYTHON_DIR}:{tmp_path / 'fake'}")
    yield d
    d.close()


def test_torch_settings_restored(torch_worker: FakeDaemon, tmp_path: Path) -> None:
    r = torch_worker.ready
    assert r is not None and r["preloaded"] == ["torch"] and r["cuda"] is True, r
    code = "import torch; torch.backends.cudnn.benchmark = True; torch.set_default_dtype('float64')"
    assert torch_worker.run(["-c", code], tmp_path).recycle == []
    code = "import torch; print(torch.backends.cudnn.benchmark, torch.get_default_dtype())"
    assert torch_worker.run(["-c", code], tmp_path).stdout == "False float32\n"


@pytest.mark.parametrize(
    "code, reason",
    [
        ("torch._state['mem'] += 10 << 20", "gpu memory not returned: 10485760 bytes"),
        ("torch._state['mem'] += 1000", None),
        ("torch._state['device'] = 1", "cuda current device changed: 1 (was 0)"),
        ("torch._state['stream'] = 'side'", "cuda current stream is not the default stream"),
        ("torch._state['sticky'] = 'illegal memory access'", "cuda error: illegal memory access"),
        ("torch.matmul = lambda a, b: None", "replaced torch.matmul"),
        ("torch.cuda.Event.record = lambda self: None", "replaced torch.cuda.Event.record"),
    ],
)
def test_torch_hygiene(torch_worker: FakeDaemon, tmp_path: Path, code: str, reason: Optional[str]) -> None:
    r = torch_worker.run(["-c", "import torch; " + code], tmp_path)
    assert (r.exit_code, r.stderr) == (0, "")
    assert r.recycle == ([reason] if reason else [])


# -- fork isolation ----------------------------------------------------------------------------


@pytest.fixture
def forking(tmp_path: Path) -> Iterator[FakeDaemon]:
    d = FakeDaemon(tmp_path, KFORGE_WORKER_ISOLATION="fork", KFORGE_WORKER_PRELOAD="json")
    yield d
    d.close()


def test_a_forking_worker_runs_each_job_in_a_child_of_its_own(forking: FakeDaemon, tmp_path: Path) -> None:
    """Each job is a child of the worker (its own pid, the worker's process group), with the
    preloads imported; the worker itself runs no job code."""
    assert forking.ready is not None and forking.ready["isolation"] == "fork" and forking.ready["preloaded"] == ["json"]
    code = "import os, sys; print(os.getpid(), os.getppid(), os.getpgid(0), 'json' in sys.modules)"
    pids = []
    for _ in range(2):
        r = forking.run(["-c", code], tmp_path)
        pid, ppid, pgid, preloaded = r.stdout.split()
        assert (int(ppid), int(pgid), preloaded) == (forking.proc.pid, os.getpgid(forking.proc.pid), "True"), r
        pids.append(int(pid))
    assert forking.proc.pid not in pids and pids[0] != pids[1]


def skip_without_cuda_torch() -> None:
    """Skip unless torch is built with CUDA (its device count and bad-fork flag; no GPU needed)."""
    torch = pytest.importorskip("torch")
    if getattr(torch._C, "_cuda_getDeviceCount", None) is None or getattr(torch._C, "_cuda_isInBadFork", None) is None:
        pytest.skip("a torch built without CUDA")


def test_a_preload_that_initializes_cuda_is_left_out_of_a_forking_gpu_worker(tmp_path: Path) -> None:
    """On a GPU, a preload whose import initializes the CUDA driver (here a device count, as
    torch's own imports did in session 25's warm verifies on an H100) is left out, said so in
    the ready message, and the other preloads are imported: a forked job can still use CUDA
    (torch does not mark it a bad fork). Each preload is imported once in the worker, which
    starts again in its own process without the culprit: only the preloads before it are
    imported twice, and a job sees none of the worker's own bookkeeping."""
    skip_without_cuda_torch()
    mods, imports = tmp_path / "mods", tmp_path / "imports"
    mods.mkdir()
    note = f"open({str(imports)!r}, 'a').write(__name__ + chr(10))\n"
    write(mods / "plain_torch.py", "import torch\n" + note)
    write(mods / "counts_devices.py", "import torch\n" + note + "COUNT = torch._C._cuda_getDeviceCount()\n")
    d = FakeDaemon(tmp_path, KFORGE_WORKER_ISOLATION="fork", KFORGE_DEVICE="0",
                   KFORGE_WORKER_PRELOAD="plain_torch,counts_devices,json", PYTHONPATH=f"{PYTHON_DIR}:{mods}")
    try:
        r = d.ready
        assert r is not None and r["preloaded"] == ["plain_torch", "json"], r
        assert r["pid"] == d.proc.pid, "the worker started again in its own process"
        assert "preload counts_devices left out: importing it initializes the CUDA driver" in r.get("error", ""), r
        assert imports.read_text().split() == ["plain_torch", "counts_devices", "plain_torch"]
        assert "starting again without it" in d.log.read_text()
        env = "import os; print(sorted(k for k in os.environ if k.startswith('KFORGE_WORKER_')))"
        assert d.run(["-c", env], tmp_path).stdout == "[]\n"
        code = "import sys, torch; print(torch._C._cuda_isInBadFork(), 'counts_devices' in sys.modules)"
        assert d.run(["-c", code], tmp_path).stdout == "False False\n"
    finally:
        d.close()


def test_a_forking_gpu_worker_whose_forks_cannot_use_cuda_does_not_start(tmp_path: Path) -> None:
    """Where the CUDA driver was initialized before any preload (here by a ``sitecustomize``), no
    preload is to blame and none left out: the worker says why and ends with status 2, rather
    than fail every job in its first CUDA call."""
    skip_without_cuda_torch()
    site = tmp_path / "site"
    site.mkdir()
    write(site / "sitecustomize.py", "import torch\ntorch._C._cuda_getDeviceCount()\n")
    d = FakeDaemon(tmp_path, expect_ready=False, KFORGE_WORKER_ISOLATION="fork", KFORGE_DEVICE="0",
                   KFORGE_WORKER_PRELOAD="json,email.mime.text", PYTHONPATH=f"{PYTHON_DIR}:{site}")
    try:
        assert d.wait_exit() == 2
        log = d.log.read_text()
        assert "the CUDA driver was initialized in the worker before any job" in log
        assert "left out" not in log, "no preload is blamed for what came before them"
    finally:
        d.close()


def test_a_forked_job_leaves_nothing_for_the_next(forking: FakeDaemon, tmp_path: Path) -> None:
    """What one job patches process-wide (a timer, a module attribute, the environment) is gone
    for the next: each starts from the worker's untouched state, and nothing is recycled."""
    patch = "import time, json, os; time.perf_counter = lambda: 0.0; json.MARK = 1; os.environ['LEFT'] = '1'"
    assert forking.run(["-c", patch], tmp_path).recycle == []
    look = "import time, json, os; print(time.perf_counter() > 0, hasattr(json, 'MARK'), 'LEFT' in os.environ)"
    assert forking.run(["-c", look], tmp_path).stdout == "True False False\n"


def test_a_forked_job_ends_as_an_interpreter_does(forking: FakeDaemon, tmp_path: Path) -> None:
    """Exit codes and tracebacks as a fresh interpreter's; its non-daemon threads are joined and
    its atexit callbacks run before the child exits; os._exit and a signal end only the child."""
    for argv in (["-c", "import sys; sys.exit(3)"], ["-c", "raise ValueError('boom')"]):
        r, c = forking.run(argv, tmp_path), cold(argv, tmp_path, base_env())
        assert (r.exit_code, r.stderr) == (c.exit_code, c.stderr)
    ends = ("import atexit, threading, time\natexit.register(lambda: print('atexit', flush=True))\n"
            "threading.Thread(target=lambda: (time.sleep(0.2), print('thread', flush=True))).start()\n")
    assert forking.run(["-c", ends], tmp_path).stdout == "thread\natexit\n"
    assert forking.run(["-c", "import os; os._exit(7)"], tmp_path).exit_code == 7
    job, out_r, err_r = forking.start(["-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], tmp_path)
    drain(out_r, err_r)
    done = forking.recv()
    assert done is not None and (done["exit_code"], done["signal"]) == (137, 9), done
    assert forking.proc.poll() is None, "the worker outlives its job's child"
    assert forking.run(["-c", "print('next')"], tmp_path).stdout == "next\n"


def test_a_forking_worker_gone_takes_its_job_with_it(forking: FakeDaemon, tmp_path: Path) -> None:
    """The daemon gone (end of file on the control socket) while a job runs: the worker kills
    the job's child and exits."""
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    job, out_r, err_r = forking.start(["-c", code], tmp_path)
    deadline = time.monotonic() + TIMEOUT
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.01)
    child = int(pid_file.read_text())
    forking.sock.close()
    assert forking.proc.wait(timeout=TIMEOUT) == 0
    drain(out_r, err_r)  # end of file: the child, which held the pipes, is gone
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_a_worker_refuses_an_unknown_isolation(tmp_path: Path) -> None:
    with pytest.raises(AssertionError):
        FakeDaemon(tmp_path, KFORGE_WORKER_ISOLATION="threads")
    logs = list(tmp_path.glob("worker-*.log"))
    assert any("KFORGE_WORKER_ISOLATION must be one of in-process, fork, got 'threads'" in p.read_text() for p in logs)


def test_what_a_forked_job_leaves_running_ends_with_it(forking: FakeDaemon, tmp_path: Path) -> None:
    """A process the job started and left running (holding the job's output) is killed when the
    job's own process ends, as the daemon does for a cold job: the output closes, nothing stays."""
    pid_file = tmp_path / "left.pid"
    code = ("import subprocess, sys\n"
            f"p = subprocess.Popen(['sleep', '30'])\nopen({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "print('started', flush=True)\n")
    t0 = time.monotonic()
    r = forking.run(["-c", code], tmp_path)
    assert (r.exit_code, r.stdout) == (0, "started\n"), r
    assert time.monotonic() - t0 < 20, "the job ended with its process, not with the sleep"
    left = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(left, 0)
    assert forking.run(["-c", "print('next')"], tmp_path).stdout == "next\n"


def test_a_jobs_children_are_told_they_are_not_the_job(forking: FakeDaemon, tmp_path: Path) -> None:
    """``KFORGE_WARM_ISOLATION`` names the job's own process: a process the job starts inherits
    the variable, with another pid than its own (kforge verify's runner tells them apart)."""
    code = ("import os, subprocess, sys\nprint(os.environ['KFORGE_WARM_ISOLATION'] == f'fork:{os.getpid()}')\n"
            "sys.stdout.flush()\nsubprocess.run([sys.executable, '-c', "
            "\"import os; print(os.environ['KFORGE_WARM_ISOLATION'].endswith(f':{os.getpid()}'))\"])\n")
    assert forking.run(["-c", code], tmp_path).stdout == "True\nFalse\n"
