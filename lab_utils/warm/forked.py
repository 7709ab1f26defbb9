"""The warm server's side (``lab_utils.warm``): import a ``Kind``'s preload, then fork a child per
request and make it the process a cold start would have made (``_become``), then run it (``run_kernel``, or the
kind's own run)."""
from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import resource
import signal
import socket
import struct
import sys

from lab_utils import cgroups, processes
from lab_utils.warm import FORK_TIMEOUT_S, Kind, _call, import_key


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def serve(ctl_fd: int, listen_fd: int, kind_json: str, folder: str | None = None) -> None:
    """The server: import the kind's preload, say so on the control socket, then fork a child per request; exits,
    killing its children and removing its socket's ``folder``, when the control socket closes (the process that
    started it is gone)."""
    import selectors

    fields = json.loads(kind_json)
    kind = Kind(**{**fields, "preload": tuple(fields["preload"])})
    ctl = socket.socket(fileno=ctl_fd)
    listener = socket.socket(fileno=listen_fd)
    processes.set_name("dtlabs-warm")
    gc.disable()  # a fork server: no collection over what it imports (30 % of torch's import); children turn it on
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
    # Every object imported so far goes to the collector's permanent generation: a child's collections would
    # otherwise walk them all, writing to each one's header and so copying every page the imports filled.
    gc.collect()
    gc.freeze()
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
                    if folder:
                        import shutil

                        shutil.rmtree(folder, ignore_errors=True)
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


def _trusted(pid: int) -> bool:
    """Whether ``pid`` may have this server fork: a descendant of the process that started it (or that process), by a
    line of processes none of which is a Jupyter kernel. A kernel runs notebooks, and in unprotected grading (no pid
    namespace, one user) what a kernel starts includes the submission's subject: a fork asked for by it would run
    outside its Landlock domain, where it could trace the grader's processes. The line is read from ``/proc`` (the
    subject can neither rename nor re-parent the kernel above it)."""
    owner = os.getppid()
    try:
        while pid != owner:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"ipykernel_launcher" in fh.read():
                    return False
            with open(f"/proc/{pid}/stat", "rb") as fh:
                pid = int(fh.read().rpartition(b")")[2].split()[1])  # the field after the state: the parent's pid
            if pid <= 1:
                return False
    except (OSError, ValueError, IndexError):
        return False
    return True


def _fork_one(kind: Kind, conn: socket.socket, key: str, server: int, close_fds) -> int | None:
    """Read one request from ``conn`` and fork it; the child's pid once it leads its own session, else None."""
    conn.settimeout(5)
    try:
        peer, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))  # pid, uid, gid
        if uid != os.getuid() or not _trusted(peer):
            return None  # only its own user's processes may have it fork, and none a kernel started
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
            _call(kind.run, request)  # returns as the interpreter would end: exit status 0
            code = 0
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
    gc.enable()  # the server runs without the collector; a kernel or a run does not
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
    command = [sys.executable, *(("-m", kind.module) if kind.module else ()), *request["argv"]]
    _show("arg", b"\0".join(a.encode() for a in command))
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


def mapped_files(maps_lines, needle: str) -> set[str]:
    """The files of ``/proc/PID/maps`` lines whose name holds ``needle``: each line is address, perms, offset, dev,
    inode and the path, which may hold spaces (a course under "/tmp/my course")."""
    fields = (line.rstrip("\n").split(maxsplit=5) for line in maps_lines)
    return {f[5] for f in fields if len(f) == 6 and needle in f[5].rsplit("/", 1)[-1].lower()}


def _openblas_threads(env: dict) -> None:
    """Give numpy's OpenBLAS the threads a cold import would start with (the server imported it with one)."""
    wanted = next((env[v] for v in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
                   if env.get(v, "").isdigit()), None)
    n = int(wanted) if wanted else cgroups.cpu_budget().cpus  # a cold import counts the CPUs; we, the budget
    if n <= 1:
        return
    with open("/proc/self/maps") as fh:
        libs = mapped_files(fh, "openblas")
    for path in libs:
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads"):
            if hasattr(lib, name):
                getattr(lib, name)(n)
                break


def run_kernel(request: dict) -> None:
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
