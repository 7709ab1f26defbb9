"""Run a function on N local ranks of a real ``torch.distributed`` process group, from a notebook cell.

    results = launch(fn, world_size=2, backend="auto", timeout=120, args=(), kwargs={})

What it promises, and how:
- Notebook-defined functions work: ``fn`` and its arguments travel by value with cloudpickle.
- Fast and fork-safe: ranks are forked from a warm *zygote* (``_worker.py``) that imported torch but never
  CUDA, never runs student code and holds no threads; the notebook process itself is never forked (the
  grading subject forks its zygote from itself at start-up, before any thread or student code: ``fork_zygote``).
- No port races: this process hosts the rendezvous ``TCPStore`` on port 0 and hands the bound port to the
  ranks, so any number of notebooks on one machine launch at once.
- torchrun's environment: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT`` (and ``TORCHELASTIC_USE_AGENT_STORE`` so ``env://`` code joins our store).
- Output streams live into the cell as ``[rank k] ...``, printed from the calling thread (ipykernel routes
  output from background threads unreliably).
- Failures are loud and short (``supervise`` watches the ranks, ``diagnostics`` words the error): a rank that raises stops the others at once and the call raises
  ``RankFailedError`` naming the root-cause rank with its remote traceback; a rank stuck past ``timeout``
  gets its Python stack dumped (faulthandler) into ``RankTimeoutError`` before everything is killed.
- Nothing survives: each rank is its own process group (killed with ``killpg``), ranks die with the zygote
  and the zygote dies with this process (``PR_SET_PDEATHSIG`` on Linux, a parent watchdog elsewhere). The
  zygote is the child subreaper of everything under it: what a rank started (own-session children included)
  is killed when the rank ends, and everything under the zygote when it stops or this process dies.
"""
from __future__ import annotations

import atexit
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

from lab_utils import _wire, processes
from lab_utils.diagnostics import LaunchError, RankFailedError, RankTimeoutError
from lab_utils.env import MAX_LOCAL_WORLD_SIZE, choose_backend, loopback_ifname, threads_per_rank
from lab_utils.supervise import Exit, Rank, drain, kill, start_readers, supervise

__all__ = ["launch", "prewarm", "shutdown", "fork_zygote", "LaunchError", "RankFailedError", "RankTimeoutError"]

MASTER_ADDR = "127.0.0.1"
_PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------------------ the zygote
class _Zygote:
    """The warm fork server, one per launching process."""

    def __init__(self, fork_here: bool = False, close_fds=()):
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if fork_here:  # see fork_zygote
            self.proc = processes.ForkedChild(
                _forked_zygote, child_sock.fileno(), os.getpid(), (parent_sock.fileno(), *close_fds)
            )
        else:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_PARENT, env.get("PYTHONPATH")) if p)
            env["PYTHONUNBUFFERED"] = "1"
            env.setdefault("OMP_NUM_THREADS", "1")  # the zygote computes nothing; ranks set their own
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lab_utils._worker", str(child_sock.fileno()), str(os.getpid())],
                pass_fds=[child_sock.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a Ctrl-C / kernel interrupt reaches us, not the zygote
            )
        child_sock.close()
        self.sock = parent_sock
        self.owner_pid = os.getpid()
        self.ready = threading.Event()
        self.warm = threading.Event()
        self.forked: queue.Queue = queue.Queue()
        self.events: queue.Queue | None = None  # the running launch's event queue
        self.pid_owner: dict[int, tuple] = {}
        self.send_lock = threading.Lock()
        self.dead = threading.Event()
        threading.Thread(target=self._read, name="dtlabs-zygote-reader", daemon=True).start()

    def _read(self):
        try:
            while True:
                msg, _ = _wire.recv_json(self.sock)
                if msg is None:
                    break
                op = msg["op"]
                if op == "ready":
                    self.ready.set()
                elif op == "warm":
                    self.warm.set()
                elif op == "forked":
                    # an exit notice must reach the launch that forked the pid, never a later one
                    self.pid_owner[msg["pid"]] = (self.events, msg["rank"])
                    self.forked.put(msg)
                elif op == "exit":
                    events, rank = self.pid_owner.pop(msg["pid"], (None, None))
                    if events is not None:
                        events.put(Exit(rank, msg["status"]))
        except OSError:
            pass
        finally:
            self.dead.set()
            self.forked.put(None)

    def alive(self) -> bool:
        return not self.dead.is_set() and self.proc.poll() is None and self.owner_pid == os.getpid()

    def fork(self, rank: int, fds) -> None:
        with self.send_lock:
            _wire.send_json(self.sock, {"op": "fork", "rank": rank}, fds=fds)

    def stop(self):
        """SIGTERM first: the zygote kills every process under it (ranks and whatever they started), then exits."""
        for sig, wait_s in ((signal.SIGTERM, 3), (signal.SIGKILL, 5)):
            try:
                self.proc.send_signal(sig)
                self.proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
            except OSError:
                break
        self.sock.close()


def _forked_zygote(sock_fd: int, launcher_pid: int, close_fds) -> None:
    """The child side of ``fork_zygote``: drop the parent's descriptors, leave its session, serve forks."""
    from lab_utils._worker import zygote_main

    for fd in close_fds:
        os.close(fd)
    os.setsid()  # as start_new_session: a Ctrl-C / interrupt reaches the launcher, not the zygote
    zygote_main(sock_fd, launcher_pid)


_zygote: _Zygote | None = None
_zygote_lock = threading.RLock()


def fork_zygote(close_fds=()) -> None:
    """Make this process's zygote by forking this process, after importing what a zygote imports first.

    Saves a fresh interpreter's ``import torch`` (about 1.7 s of CPU) where the launching process will import
    torch anyway: the grading subject, which calls this at start-up, before it starts a thread or runs a cell,
    so the fork is clean (no threads, no CUDA, no student code). ``close_fds``: descriptors the zygote must not
    keep (the subject's socket to the grader, whose end-of-file tells the grader the subject is gone). Anywhere
    else (a notebook kernel has threads) the zygote is a fresh interpreter, started on first use.
    """
    global _zygote
    from lab_utils._worker import CORE_IMPORTS

    for name in CORE_IMPORTS:
        __import__(name)
    if threading.active_count() > 1:
        raise RuntimeError("fork_zygote() needs a single-threaded process; launch() starts a fresh zygote instead")
    with _zygote_lock:
        if _zygote is not None:
            _zygote.stop()
        _zygote = _Zygote(fork_here=True, close_fds=close_fds)


def _get_zygote() -> _Zygote:
    global _zygote
    with _zygote_lock:
        if _zygote is None or not _zygote.alive():
            if _zygote is not None:
                _zygote.stop()
            _zygote = _Zygote()
        return _zygote


def prewarm(wait: bool = False, timeout: float = 120) -> bool:
    """Start the warm fork server now; it imports torch and the distributed stack in the background.

    Call it in a notebook's first cell so the first ``launch`` is quick. ``wait=True`` blocks until every
    warm-up import is done (benchmarks use it). Returns whether the server is fully warm.
    """
    from lab_utils import proxy

    if proxy.session_active():  # grading: this kernel starts no ranks (the student's process warms its own)
        return False
    zygote = _get_zygote()
    if wait:
        zygote.warm.wait(timeout)
    return zygote.warm.is_set()


def shutdown() -> None:
    """Stop the fork server. Called at exit; a later ``launch`` starts a new one."""
    global _zygote
    with _zygote_lock:
        if _zygote is not None:
            _zygote.stop()
            _zygote = None


atexit.register(shutdown)


# ------------------------------------------------------------------------------------------ one launch
def _validate(fn, world_size, timeout):
    if not callable(fn):
        raise TypeError(f"launch() needs a function to run on every rank, got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {world_size!r}")
    if not 1 <= world_size <= MAX_LOCAL_WORLD_SIZE:
        raise ValueError(
            f"world_size={world_size} is out of range: use 1..{MAX_LOCAL_WORLD_SIZE} local ranks "
            "(2-4 is plenty to learn with on a laptop)"
        )
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")


def _pickle_payload(fn, args, kwargs) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same thing to a student
        name = getattr(fn, "__name__", repr(fn))
        raise TypeError(
            f"cannot send {name}() and its arguments to the ranks: {type(exc).__name__}: {exc}. "
            "Everything a rank needs travels by pickle: define it in a cell or a module, and create open "
            "files, locks, sockets or CUDA tensors inside the function instead of capturing them."
        ) from exc


_banner_seen: set = set()


def launch(
    fn,
    world_size: int = 2,
    backend: str = "auto",
    timeout: float | None = 120,
    args=(),
    kwargs=None,
    *,
    debug: bool = False,
    quiet: bool = False,
):
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks of an initialised process group.

    Returns the per-rank return values in rank order (tensors come back on the CPU). ``debug=True`` sets
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, which reports mismatched collectives at once instead of hanging.
    Raises ``RankFailedError`` or ``RankTimeoutError``; bad arguments raise before anything starts.
    """
    kwargs = {} if kwargs is None else kwargs
    from lab_utils import proxy

    if proxy.session_active():  # grading: the ranks start inside the submission's sandbox, never from here
        return proxy.remote_launch(fn, world_size, backend, timeout, args, kwargs, debug=debug, quiet=quiet)
    _validate(fn, world_size, timeout)
    choice = choose_backend(world_size, backend)
    payload = _pickle_payload(fn, args, kwargs)
    if not quiet and (choice.backend, choice.reason) not in _banner_seen:
        _banner_seen.add((choice.backend, choice.reason))
        print(f"[launch] {world_size} ranks, {choice.reason}", flush=True)

    import torch.distributed as dist
    from datetime import timedelta

    store_timeout = timeout if timeout is not None else 3600
    store = dist.TCPStore(
        MASTER_ADDR, 0, world_size=None, is_master=True, timeout=timedelta(seconds=store_timeout),
        wait_for_workers=False,
    )
    with _zygote_lock:
        zygote = _get_zygote()
        events: queue.Queue = queue.Queue()
        zygote.events = events
        try:
            return _run(zygote, events, payload, world_size, choice.backend, store.port, timeout, debug)
        except LaunchError as exc:
            # End the cell's traceback at the student's `launch(...)` line: the supervisor's frames teach nothing,
            # and the message already carries the failing rank's own traceback.
            raise exc.with_traceback(None) from None
        finally:
            zygote.events = None
            del store


def _rank_env(rank, world_size, port, threads):
    env = dict(os.environ)
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(world_size), MASTER_ADDR=MASTER_ADDR,
        MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True", OMP_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
    )
    ifname = loopback_ifname()
    if ifname and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = ifname
    return env


def start_ranks(zygote, events, world_size, make_job) -> tuple[list, list]:
    """Fork ``world_size`` ranks from the zygote, send each the job ``make_job(rank)`` builds, start its readers.

    Returns (ranks, reader threads). On any error the ranks already forked are killed."""
    import cloudpickle

    ranks: list[Rank] = []
    readers: list[threading.Thread] = []
    try:
        for r in range(world_size):
            job_r, job_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            res_r, res_w = os.pipe()
            ranks.append(Rank(r, job_w, out_r, err_r, res_r))
            try:
                zygote.fork(r, [job_r, out_w, err_w, res_w])
            finally:
                for fd in (job_r, out_w, err_w, res_w):
                    os.close(fd)
        for _ in range(world_size):
            msg = zygote.forked.get(timeout=120)
            if msg is None:
                raise LaunchError("the launcher's fork server died while starting ranks; run launch() again")
            ranks[msg["rank"]].pid = msg["pid"]
        for rk in ranks:
            data = cloudpickle.dumps(make_job(rk.rank))
            threading.Thread(target=_write_job, args=(rk.job_w, data), daemon=True).start()
            readers.extend(start_readers(rk, events))
    except BaseException:
        close_ranks(ranks, events, readers)
        raise
    return ranks, readers


def close_ranks(ranks, events, readers, wait_s=2.0) -> None:
    """Kill the ranks (and their process groups), print what they still wrote, close their pipes."""
    kill(ranks)
    drain(ranks, events, readers, wait_s)
    for rk in ranks:
        for fd in (rk.job_w, rk.out_r, rk.err_r, rk.result_r):
            try:
                os.close(fd)
            except OSError:
                pass


def make_job(rank, world_size, backend, port, timeout, debug, payload=None, persistent=False) -> dict:
    threads = threads_per_rank(world_size)
    return dict(
        payload=payload, rank=rank, world_size=world_size, backend=backend, master_addr=MASTER_ADDR,
        master_port=port, env=_rank_env(rank, world_size, port, threads), cwd=os.getcwd(),
        sys_path=list(sys.path), threads=threads, debug=debug, persistent=persistent,
        store_timeout=timeout if timeout is not None else 3600,
        # the process group's own timeout fires after ours, so the student sees our stack dump
        pg_timeout=(timeout + 60) if timeout is not None else 1800,
    )


def _run(zygote, events, payload, world_size, backend, port, timeout, debug):
    start = time.monotonic()
    ranks, readers = start_ranks(
        zygote, events, world_size, lambda r: make_job(r, world_size, backend, port, timeout, debug, payload)
    )
    try:
        return supervise(ranks, events, start, timeout)
    finally:
        close_ranks(ranks, events, readers)


def _write_job(fd, data):
    try:
        _wire.write_frame(fd, data)
    except OSError:
        pass  # the rank died before reading its job; its exit status tells the story
