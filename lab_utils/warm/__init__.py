"""Warm starts: a server that has imported what a process needs once, and forks that process on request.

Four kinds (``Kind``): grader kernels (``KERNEL``, below), nbgrader runs (``lab_utils.grading.nbgrader_run``), and
torchrun's agents and the workers they start (``lab_utils.labkit.torchrun.warmstart``).

A fresh ``python -m ipykernel_launcher`` pays 0.4-2 CPU-s before it answers (IPython, ipykernel, zmq, then torch and
numpy in the course's first cell); ``dtlabs validate``, every grading and the test suite start hundreds. The server
(``forked.serve``) imports ``PRELOAD`` (a ``Kind``'s preload) once, checks that no import started a thread (a fork copies
only the calling thread, so a lock another thread held would stay held in the child; torch's OpenMP pool starts on
the first parallel op, which the server never runs, and numpy's OpenBLAS pool is held at one thread until the child
sets its own), and then forks one child per request. The server never runs a cell, a student's or the course's:
every child starts from the same clean state.

A forked child is what a cold start would be (``forked._become``): a session and process group of its own (so an interrupt or
a kill reaches it and what it started, as ``LocalProvisioner`` signals a kernel's group), the caller's
standard streams, working directory, environment, umask and resource limits, and its environment readable from
``/proc/PID/environ`` (rewritten in place), so the grading token still finds it for reaping. It dies with the
server (``PR_SET_PDEATHSIG``), and the server kills it when the connection that asked for it closes: a kernel never
outlives the process that started it, as a cold kernel's parent poller makes it exit. (Same for a run: see
``Kind.run``.)

Servers are found through ``ADDRESS_VAR`` (a grading process shares its server with the nbgrader runs it starts)
or started on first use by this process; a server only forks for its own user (``SO_PEERCRED``), and only kernels
whose import-relevant environment (``import_key``) is the one it imported under. The provisioner
(``lab_utils.grading.split.provisioner``) decides when to use one; where none can start, ``why_cold`` says why.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import resource
import signal
import socket
import subprocess
import shutil
import sys
import threading
from dataclasses import dataclass

from lab_utils import netns, processes, sockets, tempdirs

ADDRESS_VAR = "DTLABS_WARM_KERNEL_SERVER"  # a server's address and key, for the nbgrader runs of one grading
FOLDER_PREFIX = "dtlabs-warm-"  # a server's private folder (0700), with its socket


@dataclass(frozen=True)
class Kind:
    """What a server forks: ``python -m MODULE ARGV`` (``python ARGV`` where ``module`` is None) run as
    ``run(request)`` (``"module:function"``; its return is exit status 0, a SystemExit its code) in the forked child,
    after the server imported ``preload`` and called ``prepare``."""

    name: str
    module: str | None
    preload: tuple
    run: str
    prepare: str | None = None
    address_var: str | None = None  # names a server a process shares with the processes it starts


def _call(ref: str, *args):
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)(*args)


# What a grader kernel imports before its first cell can run, and what the course's cells import first. Never a
# lab's own notebook code: only packages.
PRELOAD = (
    "ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.zmqshell", "ipykernel.comm", "IPython.core.completer",
    "ipykernel.debugger",  # every IPythonKernel imports it (debugpy: a third of a forked kernel's start)
    "jupyter_client.session", "numpy", "torch", "torch.distributed", "torch.nn", "torch.optim", "cloudpickle",
    "psutil", "lab_utils.launcher.launch", "lab_utils.launcher.plaindata", "lab_utils.labkit.checks",
    "lab_utils.grading.split.proxy",
)
# Environment that decides what an import finds or how an extension initialises: a server serves only kernels whose
# values match those it imported under (OMP_NUM_THREADS included: libgomp reads it when torch loads it).
KEY_VARS = (netns.JOIN_VAR,  # the network it runs in: a server joins it when it starts, and its children are in it
            "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE",
            "LD_PRELOAD", "LD_LIBRARY_PATH", "OPENBLAS_THREAD_TIMEOUT")  # OpenBLAS reads its spin when numpy loads it
KEY_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "TORCH_")  # OPENBLAS_NUM_THREADS: set in the kernel (_openblas_threads)
PAD_VAR = "DTLABS_WARM_ENV_ROOM"
ENV_ROOM = 1 << 16  # bytes of /proc/PID/environ a forked kernel can fill with its own environment
ARG_ROOM = 1 << 12  # and of /proc/PID/cmdline, for its own command line
START_TIMEOUT_S = 120.0
FORK_TIMEOUT_S = 60.0  # a first request waits for the server's imports too


def socket_parent() -> str:
    """Where servers make their socket folders: the user's runtime folder (``XDG_RUNTIME_DIR``, the place for a
    user's sockets), else /tmp; not the temp folder a command or a test points ``TMPDIR`` at, which a server outlives
    (each removes its folder when it exits; one killed outright, the next server's start does)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    return runtime if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK) else "/tmp"


def import_key(env: dict, executable: str = sys.executable) -> str:
    """What must match between a kernel's environment and its server's: the interpreter and ``KEY_VARS``."""
    items = {k: v for k, v in env.items() if k in KEY_VARS or k.startswith(KEY_PREFIXES)}
    return json.dumps([os.path.abspath(executable), sorted(items.items())])


KERNEL = Kind("kernel", "ipykernel_launcher", PRELOAD, "lab_utils.warm.forked:run_kernel",
              address_var=ADDRESS_VAR)


class Refused(RuntimeError):
    """No warm start for this kernel: the message says why (the provisioner starts it cold and says so)."""


# ------------------------------------------------------------------------------------------ the caller's side
class Server:
    """A warm server this process started: a child that ends when this process does (its control socket closes)."""

    def __init__(self, kind: Kind, env: dict, executable: str = sys.executable):
        self.kind = kind
        # A socket file in a folder of this user's alone (0700), never an abstract name, which any local user can
        # connect to. The folder is named for this process: its ``stop`` removes it, or where this process was killed,
        # the next server's start does.
        tempdirs.remove_orphaned_tempdirs(FOLDER_PREFIX, [socket_parent()])
        self.folder = tempdirs.owned_tempdir(FOLDER_PREFIX, tag=kind.name, dir=socket_parent())
        self.address = os.path.join(self.folder, "server")
        self.key = import_key(env, executable)
        # bound here, so a request made before the server is up waits in the backlog
        listener = sockets.listen_unix(self.address, 64, kind=socket.SOCK_SEQPACKET)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server_env = {k: v for k, v in env.items() if "TOKEN" not in k and k != ADDRESS_VAR}
        server_env[PAD_VAR] = "x" * ENV_ROOM
        server_env["OPENBLAS_NUM_THREADS"] = "1"  # numpy's OpenBLAS starts its pool at import; a kernel sets its own
        fds = [theirs.fileno(), listener.fileno()]
        try:
            # -P -s: nothing before sys.path, no user site; a kernel's own path is set when it is forked (_become)
            self.proc = subprocess.Popen(
                [executable, "-P", "-s", "-c", "import sys; from lab_utils.warm.forked import serve; "
                 "serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])", *map(str, fds),
                 json.dumps(dataclasses.asdict(kind)), self.folder, "#" * ARG_ROOM],
                pass_fds=fds, cwd="/", env=server_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, start_new_session=True, preexec_fn=netns.preexec(env))
        finally:
            theirs.close()
            listener.close()
        self.ctl = mine
        self.ready = threading.Event()
        self.error: str | None = None
        self.served = False  # it imported and served: a server that never did is not started again
        threading.Thread(target=self._watch, daemon=True, name="dtlabs-warm-server").start()

    def _watch(self) -> None:
        try:
            data = self.ctl.recv(1 << 16)
        except OSError:
            data = b""
        msg = json.loads(data) if data else {}
        if not msg.get("ready"):
            err = msg.get("error") or (self.proc.stderr.read().decode(errors="replace").strip()[-400:] if not data
                                       else "") or "the server exited"
            self.error = err
        self.served = self.error is None
        self.ready.set()
        self.proc.stderr.close()
        if self.error is None:
            try:
                self.ctl.recv(1)  # blocks until the server is gone
            except OSError:
                pass
            self.error = f"the warm server (pid {self.proc.pid}) exited"

    @property
    def named(self) -> str:
        """This server as the value of a ``Kind.address_var``, for the processes this one starts (``fork`` reads it)."""
        return json.dumps([self.address, self.key])

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        if not self.ready.wait(timeout):
            self.stop()
            raise Refused(f"the warm server did not import {', '.join(self.kind.preload)} within {timeout:g} s")
        if self.error:
            raise Refused(self.error)

    def stop(self) -> None:
        processes.killpg_quiet(self.proc.pid)
        self.ctl.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self.folder, ignore_errors=True)


class WarmChild:
    """A process forked by a warm server, behind the parts of ``Popen`` jupyter_client uses (``pid``, ``poll``,
    ``wait``, ``send_signal``, ``kill``, ``terminate``). Its exit code comes over the connection that asked for it;
    closing that connection (``close``, or this process's death) makes the server kill it."""

    stdin = stdout = stderr = None

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid, self.returncode = conn, pid, None

    def _read(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        self.conn.settimeout(timeout)
        try:
            data = self.conn.recv(4096)
        except (BlockingIOError, socket.timeout):
            return
        except OSError:
            data = b""
        # the server gone before it reported: the child died with it (PR_SET_PDEATHSIG, SIGKILL)
        self.returncode = json.loads(data)["code"] if data else -signal.SIGKILL
        self.conn.close()

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def close(self) -> None:
        self.conn.close()


_SERVERS: dict[tuple, Server] = {}
_LOCK = threading.Lock()


def prestart(kind: Kind, env: dict) -> None:
    """Start this process's server for ``env`` now, without waiting: it imports while the caller imports its own
    (``dtlabs validate`` starts one kernel, and nbgrader's imports take as long as the server's)."""
    try:
        own_server(kind, env, wait=False)
    except Refused:
        pass  # the kernel starts cold and says why


def own_server(kind: Kind, env: dict, wait: bool = True, executable: str = sys.executable) -> Server:
    """This process's server of ``kind`` for ``env``'s import key, on ``executable``, started on first use
    (``Refused`` if it cannot run; one that could not import is not tried again)."""
    key = (kind.name, import_key(env, executable))
    with _LOCK:
        server = _SERVERS.get(key)
        if server is not None and server.ready.is_set() and server.error and not server.served:
            raise Refused(server.error)
        if server is None or (server.ready.is_set() and server.error):
            try:
                server = _SERVERS[key] = Server(kind, env, executable)
            except OSError as exc:
                raise Refused(f"the warm server could not start: {exc}") from None
    if wait:
        server.wait_ready()
    return server


def shared_env(env: dict) -> dict:
    """``{ADDRESS_VAR: ...}`` naming this process's server for ``env`` (started if need be), for the processes it
    starts (a grading's nbgrader runs) to fork their kernels from; empty where warm kernels are off or no server
    can run (the kernels then start cold and say why)."""
    from lab_utils import settings

    if not settings.load().warm_kernels or not sys.platform.startswith("linux"):
        return {}
    inherited = os.environ.get(ADDRESS_VAR)  # a server this process's parent shares: passed on, not doubled
    if inherited:
        try:
            if json.loads(inherited)[1] == import_key(env):
                return {ADDRESS_VAR: inherited}
        except (ValueError, TypeError, IndexError):
            pass
    try:
        server = own_server(KERNEL, env, wait=False)  # its address is bound already; it imports meanwhile
    except Refused:
        return {}
    return {ADDRESS_VAR: server.named}


def own_processes() -> set:
    """The pids of this process's warm servers and of all they forked: this process's descendants that are none of a
    submission's (a grading's watchdog counts and kills every other descendant of its process, orphans included)."""
    with _LOCK:
        servers = [s.proc.pid for s in _SERVERS.values() if s.proc.poll() is None]
    return {*servers, *(p.pid for pid in servers for p in processes.descendants(pid))}


def stop_servers(kind: Kind) -> None:
    """Stop this process's servers of ``kind`` (and so all they forked); the next request starts a new one."""
    with _LOCK:
        servers = [s for k, s in _SERVERS.items() if k[0] == kind.name]
        for k in [k for k in _SERVERS if k[0] == kind.name]:
            del _SERVERS[k]
    for s in servers:
        s.stop()


def fork(kind: Kind, argv: list, env: dict, cwd: str, fds=(0, 1, 2), executable: str = sys.executable,
         own: bool = True) -> WarmChild:
    """Fork ``EXECUTABLE -m MODULE ARGV`` of ``kind`` from a warm server running ``executable``: the one
    ``kind.address_var`` names if it serves this environment, else (``own``) this process's own. ``Refused`` says
    why not."""
    key = import_key(env, executable)
    addresses = []
    inherited = os.environ.get(kind.address_var) if kind.address_var else None
    if inherited:
        try:
            address, their_key = json.loads(inherited)
            if their_key == key:
                addresses.append(address)
        except (ValueError, TypeError):
            pass
    if own:
        addresses.append(None)
    why = Refused(f"no warm {kind.name} server serves this environment")
    for address in addresses:
        try:
            if address is None:
                address = own_server(kind, env, executable=executable).address
            return _request(address, argv, env, cwd, fds)
        except Refused as exc:
            why = exc
    raise why


def fork_with_pipe(kind: Kind, argv: list, env: dict, cwd: str) -> tuple[WarmChild, int]:
    """``fork`` with stdin empty and stdout and stderr one pipe: (the child, the pipe's read end, which the caller
    closes). ``Refused`` as ``fork``."""
    read, write = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        return fork(kind, argv, env, cwd, fds=(devnull, write, write)), read
    except Refused:
        os.close(read)
        raise
    finally:
        os.close(write)
        os.close(devnull)


def _request(address, argv, env, cwd, fds) -> WarmChild:
    request = {"argv": list(argv), "env": dict(env), "cwd": str(cwd),
               "umask": _umask(), "rlimits": _rlimits()}
    try:
        conn = sockets.connect_unix(address, socket.SOCK_SEQPACKET)
    except OSError as exc:
        raise Refused(f"the warm server did not fork the kernel: {exc}") from None
    try:
        socket.send_fds(conn, [json.dumps(request).encode()], list(fds))
        conn.settimeout(FORK_TIMEOUT_S)
        reply = conn.recv(1 << 16)
    except OSError as exc:
        conn.close()
        raise Refused(f"the warm server did not fork the kernel: {exc}") from None
    msg = json.loads(reply) if reply else {"error": "the warm server closed the connection"}
    if "pid" not in msg:
        conn.close()
        raise Refused(msg.get("error", "no reason given"))
    return WarmChild(conn, msg["pid"])


def _umask() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # pragma: no cover - kernels without /proc/self/status' Umask line
    os.umask(mask)
    return mask


def _rlimits() -> dict:
    return {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource)
            if name.startswith("RLIMIT_")}
