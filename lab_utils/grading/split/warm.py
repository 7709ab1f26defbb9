"""Warm starts: a server that has imported what a process needs once, and forks that process on request.

Two kinds (``Kind``): grader kernels (``KERNEL``, below) and nbgrader runs (``lab_utils.grading.nbgrader_run``).

A fresh ``python -m ipykernel_launcher`` pays 0.4-2 CPU-s before it answers (IPython, ipykernel, zmq, then torch and
numpy in the course's first cell); ``dtlabs validate``, every grading and the test suite start hundreds. The server
(``serve``) imports ``PRELOAD`` (a ``Kind``'s preload) once, checks that no import started a thread (a fork copies
only the calling thread, so a lock another thread held would stay held in the child; torch's OpenMP pool starts on
the first parallel op, which the server never runs, and numpy's OpenBLAS pool is held at one thread until the child
sets its own), and then forks one child per request. The server never runs a cell, a student's or the course's:
every child starts from the same clean state.

A forked child is what a cold start would be (``_become``): a session and process group of its own (so an interrupt or
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

import ctypes
import importlib
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from lab_utils import processes

ADDRESS_VAR = "DTLABS_WARM_KERNEL_SERVER"  # a server's address and key, for the nbgrader runs of one grading


@dataclass(frozen=True)
class Kind:
    """What a server forks: ``python -m MODULE ARGV`` run as ``run(request)`` (``"module:function"``, returning an
    exit code) in the forked child, after the server imported ``preload`` and called ``prepare``."""

    name: str
    module: str
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
    "jupyter_client.session", "numpy", "torch", "torch.distributed", "torch.nn", "torch.optim", "cloudpickle",
    "psutil", "lab_utils.launcher.launch", "lab_utils.launcher.plaindata", "lab_utils.labkit.checks",
    "lab_utils.grading.split.proxy",
)
# Environment that decides what an import finds or how an extension initialises: a server serves only kernels whose
# values match those it imported under (OMP_NUM_THREADS included: libgomp reads it when torch loads it).
KEY_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE",
            "LD_PRELOAD", "LD_LIBRARY_PATH")
KEY_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "TORCH_")  # OPENBLAS_*: set in the kernel (_openblas_threads)
PAD_VAR = "DTLABS_WARM_ENV_ROOM"
ENV_ROOM = 1 << 16  # bytes of /proc/PID/environ a forked kernel can fill with its own environment
ARG_ROOM = 1 << 12  # and of /proc/PID/cmdline, for its own command line
START_TIMEOUT_S = 120.0
FORK_TIMEOUT_S = 60.0  # a first request waits for the server's imports too


def import_key(env: dict, executable: str = sys.executable) -> str:
    """What must match between a kernel's environment and its server's: the interpreter and ``KEY_VARS``."""
    items = {k: v for k, v in env.items() if k in KEY_VARS or k.startswith(KEY_PREFIXES)}
    return json.dumps([os.path.abspath(executable), sorted(items.items())])


KERNEL = Kind("kernel", "ipykernel_launcher", PRELOAD, "lab_utils.grading.split.warm:run_kernel",
              address_var=ADDRESS_VAR)


class Refused(RuntimeError):
    """No warm start for this kernel: the message says why (the provisioner starts it cold and says so)."""


# ------------------------------------------------------------------------------------------ the caller's side
class Server:
    """A warm server this process started: a child that ends when this process does (its control socket closes)."""

    def __init__(self, kind: Kind, env: dict, executable: str = sys.executable):
        self.kind = kind
        self.address = f"\0dtlabs-warm-{uuid.uuid4().hex}"
        self.key = import_key(env, executable)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(self.address)  # bound here, so a request made before the server is up waits in the backlog
        listener.listen(64)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server_env = {k: v for k, v in env.items() if "TOKEN" not in k and k != ADDRESS_VAR}
        server_env[PAD_VAR] = "x" * ENV_ROOM
        server_env["OPENBLAS_NUM_THREADS"] = "1"  # numpy's OpenBLAS starts its pool at import; a kernel sets its own
        fds = [theirs.fileno(), listener.fileno()]
        try:
            # -P -s: nothing before sys.path, no user site; a kernel's own path is set when it is forked (_become)
            self.proc = subprocess.Popen(
                [executable, "-P", "-s", "-c", "import sys; from lab_utils.grading.split.warm import serve; "
                 "serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])", *map(str, fds), _ref(kind), "#" * ARG_ROOM],
                pass_fds=fds, cwd="/", env=server_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, start_new_session=True)
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


def _ref(kind: Kind) -> str:
    """``"module:NAME"`` of a ``Kind`` defined at module level, for the server's command line."""
    for name, value in vars(sys.modules[kind.run.partition(":")[0]]).items():
        if value is kind:
            return f"{kind.run.partition(':')[0]}:{name}"
    raise ValueError(f"{kind.name}: a Kind must be a module-level name of the module of its run function")


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
    return {ADDRESS_VAR: json.dumps([server.address, server.key])}


def stop_servers(kind: Kind) -> None:
    """Stop this process's servers of ``kind`` (and so all they forked); the next request starts a new one."""
    with _LOCK:
        servers = [s for k, s in _SERVERS.items() if k[0] == kind.name]
        for k in [k for k in _SERVERS if k[0] == kind.name]:
            del _SERVERS[k]
    for s in servers:
        s.stop()


def fork(kind: Kind, argv: list, env: dict, cwd: str, fds=(0, 1, 2), executable: str = sys.executable) -> WarmChild:
    """Fork ``EXECUTABLE -m MODULE ARGV`` of ``kind`` from a warm server running ``executable``: the one
    ``kind.address_var`` names if it serves this environment, else this process's own. ``Refused`` says why not."""
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
    addresses.append(None)
    why = None
    for address in addresses:
        try:
            if address is None:
                address = own_server(kind, env, executable=executable).address
            return _request(address, argv, env, cwd, fds)
        except Refused as exc:
            why = exc
    raise why


def _request(address, argv, env, cwd, fds) -> WarmChild:
    request = {"argv": list(argv), "env": dict(env), "cwd": str(cwd),
               "umask": _umask(), "rlimits": _rlimits()}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(address)
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


# ------------------------------------------------------------------------------------------ the server's side
def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def serve(ctl_fd: int, listen_fd: int, kind_ref: str) -> None:
    """The server: import the kind's preload, say so on the control socket, then fork a child per request; exits,
    killing its children, when the control socket closes (the process that started it is gone)."""
    import selectors

    module, _, name = kind_ref.partition(":")
    kind = getattr(importlib.import_module(module), name)
    ctl = socket.socket(fileno=ctl_fd)
    listener = socket.socket(fileno=listen_fd)
    processes.set_name("dtlabs-warm")
    # what a cold kernel would find for libgomp's and MKL's thread counts: never initialised here (no parallel op)
    failed = []
    for name in kind.preload:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a child imports it again and reports what is wrong
            failed.append(f"{name}: {type(exc).__name__}")
        if _threads() > 1:
            ctl.send(json.dumps({"error": f"importing {name} started a thread: forking from it is unsafe"}).encode())
            os._exit(1)
    if kind.prepare:
        _call(kind.prepare)
    ctl.send(json.dumps({"ready": True, "failed": failed}).encode())
    key = import_key(os.environ)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    sel.register(listener, selectors.EVENT_READ, "listen")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    kids: dict[int, socket.socket] = {}  # pid -> the connection that asked for it
    me = os.getpid()
    while True:
        for sk, _ in sel.select():
            if sk.data == "ctl":
                if not ctl.recv(1):
                    for pid in kids:
                        processes.killpg_quiet(pid)
                    os._exit(0)
            elif sk.data == "listen":
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                pid = _fork_one(kind, conn, key, me, [ctl.fileno(), listener.fileno(), wake_r, wake_w,
                                                *(c.fileno() for c in kids.values())])
                if pid is None:
                    conn.close()
                else:
                    kids[pid] = conn
                    sel.register(conn, selectors.EVENT_READ, pid)
            elif sk.data == "child":
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                for pid, code in processes.reap_children():
                    conn = kids.pop(pid, None)
                    if conn is not None:
                        try:
                            sel.unregister(conn)
                        except (KeyError, ValueError):
                            pass  # its caller was gone first (below)
                        try:
                            conn.send(json.dumps({"code": code}).encode())
                        except OSError:
                            pass
                        conn.close()
            else:  # the caller closed its connection (shut down, or died): its kernel goes too
                pid = sk.data
                try:
                    gone = not sk.fileobj.recv(1)
                except OSError:
                    gone = True
                if gone:
                    sel.unregister(sk.fileobj)
                    processes.killpg_quiet(pid)
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass


def _fork_one(kind: Kind, conn: socket.socket, key: str, server: int, close_fds) -> int | None:
    """Read one request from ``conn`` and fork it; the child's pid once it leads its own session, else None."""
    conn.settimeout(5)
    try:
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[2]
        if uid != os.getuid():
            return None  # only its own user's processes may have it fork
        data, fds, _, _ = socket.recv_fds(conn, 1 << 22, 8)
        request = json.loads(data)
    except (OSError, ValueError):
        return None
    refusal = None
    if import_key(request["env"]) != key:
        refusal = f"the {kind.name}'s interpreter or import environment differs from the warm server's"
    elif len(_env_blob(request["env"])) > _area("env")[1] - _area("env")[0]:
        refusal = f"the {kind.name}'s environment is larger than a forked one can show in /proc/PID/environ"
    if refusal:
        for f in fds:
            os.close(f)
        conn.send(json.dumps({"error": refusal}).encode())
        return None
    ready_r, ready_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        code = 1
        try:
            _become(kind, request, fds, server, [*close_fds, conn.fileno()], ready_w)
            code = _call(kind.run, request)
        except SystemExit as exc:  # as the interpreter exits: an int, None (0) or a message on stderr (1)
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - reported as the interpreter would, then exit 1
            import traceback

            traceback.print_exc()
        finally:
            try:
                import atexit

                atexit._run_exitfuncs()
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(ready_w)
    for f in fds:
        os.close(f)
    ok = _wait_readable(ready_r, FORK_TIMEOUT_S) and os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    if not ok:
        processes.killpg_quiet(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        conn.send(json.dumps({"error": f"the forked {kind.name} failed to set itself up"}).encode())
        return None
    try:
        conn.send(json.dumps({"pid": pid}).encode())
    except OSError:  # the caller gave up waiting (and starts cold): this child must not run beside that one
        processes.killpg_quiet(pid)
        return None
    conn.settimeout(None)
    return pid


def _wait_readable(fd: int, timeout: float) -> bool:
    import select

    return bool(select.select([fd], [], [], timeout)[0])


def _area(kind: str) -> tuple[int, int]:
    """This process's original command line ("arg") or environment ("env") block: what /proc/PID/cmdline and
    /proc/PID/environ show (fields 48-51 of /proc/PID/stat)."""
    with open("/proc/self/stat") as fh:
        stat = fh.read()
    fields = stat[stat.rindex(")") + 2:].split()
    start, end = (int(fields[45]), int(fields[46])) if kind == "arg" else (int(fields[47]), int(fields[48]))
    return start, end


def _env_blob(env: dict) -> bytes:
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())


def _show(kind: str, blob: bytes) -> None:
    """Write ``blob`` over this process's original command line or environment block, what ``ps`` and psutil read
    (as setproctitle rewrites argv). Only the process's own memory: no privilege is needed."""
    start, end = _area(kind)
    blob = blob[: end - start - 1]
    ctypes.memmove(start, blob.ljust(end - start, b"\0"), end - start)


def _become(kind: Kind, request: dict, fds, server: int, close_fds, ready_w: int) -> None:
    """In the forked child: become the process a cold start would have made, then tell the server (``ready_w``)."""
    processes.die_with_parent(server)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for f in close_fds:
        try:
            os.close(f)
        except OSError:
            pass
    os.setsid()  # before the server replies: the caller signals this process group
    processes.set_name(os.path.basename(sys.executable))  # the name a cold start has, not the server's
    for target_fd, f in zip((0, 1, 2), fds):
        os.dup2(f, target_fd)
    for f in fds:
        if f > 2:
            os.close(f)
    os.umask(request["umask"])
    for name, (soft, hard) in request["rlimits"].items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError, AttributeError):
            pass  # a limit above the server's hard one stays the server's (lower)
    os.chdir(request["cwd"])
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    _show("env", _env_blob(env))
    _show("arg", b"\0".join(a.encode() for a in [sys.executable, "-m", kind.module, *request["argv"]]))
    import tempfile

    tempfile.tempdir = None  # found again from the kernel's TMPDIR
    # sys.path is the server's, built from the same PYTHONPATH (import_key) under -P -s; the kind's run adds the
    # folder as its cold start would. The user's site-packages come unless PYTHONNOUSERSITE says not (after the
    # site-packages, where a cold start puts them before).
    if not env.get("PYTHONNOUSERSITE"):
        import site

        user_site = site.getusersitepackages()
        if os.path.isdir(user_site):
            site.ENABLE_USER_SITE = True
            site.addsitedir(user_site)
    if "numpy" in sys.modules:  # numpy seeds its global generator at import: a fresh seed, as a cold kernel's
        sys.modules["numpy"].random.seed()
    _openblas_threads(env)
    if "torch" in sys.modules and env.get("OMP_NUM_THREADS", "").isdigit():
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
    sys.stdout.flush()
    os.write(ready_w, b"1")
    os.close(ready_w)


def _openblas_threads(env: dict) -> None:
    """Give numpy's OpenBLAS the threads a cold import would start with (the server imported it with one)."""
    wanted = next((env[v] for v in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
                   if env.get(v, "").isdigit()), None)
    n = int(wanted) if wanted else len(os.sched_getaffinity(0))
    if n <= 1:
        return
    with open("/proc/self/maps") as fh:
        libs = {line.split()[-1] for line in fh if "openblas" in line.rsplit("/", 1)[-1].lower()}
    for path in libs:
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads"):
            if hasattr(lib, name):
                getattr(lib, name)(n)
                break


def run_kernel(request: dict) -> int:
    """The kernel itself, as ``python -m ipykernel_launcher ARGV`` runs it. The folder: IPython puts '' before
    site-packages unless the kernel ignores it or runs under -P/PYTHONSAFEPATH, which it reads from sys.flags (the
    server's -P): done here as it would be."""
    import ipykernel_launcher  # noqa: F401 - only its path, for sys.argv[0] as runpy would set it
    from ipykernel import kernelapp

    if not os.environ.get("PYTHONSAFEPATH") and "--IPKernelApp.ignore_cwd=True" not in request["argv"]:
        at = next((i for i, p in enumerate(sys.path) if os.path.basename(p) in ("site-packages", "dist-packages")), 0)
        sys.path.insert(at, "")

    sys.argv = [ipykernel_launcher.__file__, *request["argv"]]
    # the two settings ipykernel reads from the environment when it is imported (the server's, without them)
    kernelapp.IPKernelApp.launch_instance(parent_handle=int(os.environ.get("JPY_PARENT_PID") or 0),
                                          interrupt=int(os.environ.get("JPY_INTERRUPT_EVENT") or 0))
    return 0
