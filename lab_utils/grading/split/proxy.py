"""The grader's side of split execution: student definitions seen across a process boundary.

In a student's own JupyterLab nothing is split and ``run_as_student(fn, *args)`` simply calls ``fn(*args)``.
Under grading (``dtlabs grade`` and ``dtlabs validate``, see ``lab_utils.grading.split.execute``) the kernel that runs
the course's locked cells and tests (the *grader*) starts a *subject* process (``lab_utils.grading.split.subject``) in the
sandbox and sends it every cell a student can write. After each such cell the names it defined appear here
as ``StudentProxy`` objects (or as their value, when it is plain data):

- calling a proxy runs the student's function in the subject and returns plain data (``lab_utils.launcher.plaindata``);
- a proxy captured by a harness that goes to ``launch``/``run_as_student`` travels as its *name* and becomes the
  student's live object on the other side, so student code never runs here;
- ``launch`` here runs the harness on ranks started by the subject's own launcher, inside the sandbox;
- names the course's own cells bound (imports, checks, references, tests) are never replaced by a student's.

Everything printed over there is streamed into the cell as it happens (subject stderr arrives as stdout: a
stderr line would fail a graded cell), and figures arrive as PNG. From the first cell with hidden tests on, nothing
the student's code produced reaches a cell: its prints and figures are dropped (the cell says so once), and an
exception it raised keeps its type but carries a message the grader wrote. A hidden call's arguments could be spelt
out in either, there or in any later cell (the student's process remembers them), and feedback and Gradescope show
the cells' output.
"""
from __future__ import annotations

import builtins
import os
import pickle
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab_utils.launcher import launch as launcher
from lab_utils.launcher import plaindata, wire

__all__ = ["StudentProxy", "StudentError", "start_grading", "stop_grading"]

INTERRUPT_GRACE_S = 3.0
_SESSION = None  # the active _Session in a grader kernel, else None
_HIDDEN = False  # a cell with hidden tests has run (or runs now): student text stays out (set by _before_cell)
_DROPPED = False  # this cell already said that it drops the student's output
HIDDEN_MESSAGE = "the submission's code raised {} (hidden tests have run: its message is not shown)"
DROPPED_NOTE = "(what the submission's code prints is not shown once hidden tests have run)\n"


class StudentError(RuntimeError):
    """The student's code raised something that is not a built-in exception; the message says what."""


class SubjectGone(RuntimeError):
    """The student's process is no longer there (killed by a limit, crashed, or stopped after a timeout)."""


def _remote_exception(reply: dict) -> BaseException:
    """An exception for the grader to raise: the built-in type the student raised (ValueError stays ValueError,
    so a test can expect it), or StudentError; its cell traceback is the student's own. Once hidden tests have run
    its message and traceback are the grader's (module docstring)."""
    ename, evalue = reply.get("ename", "Error"), reply.get("evalue", "")
    launch_info = reply.get("launch")
    hidden = _HIDDEN
    if launch_info is not None:
        from lab_utils.launcher.diagnostics import LaunchError, RankFailedError, RankTimeoutError

        if ename == "RankTimeoutError":
            stuck = [r for r in launch_info.get("stuck_ranks", []) if isinstance(r, int)]
            exc = RankTimeoutError("ranks of the submission did not finish in time (hidden tests have run: the "
                                   "details are not shown)" if hidden
                                   else evalue, stuck, {})
        elif ename == "RankFailedError":
            rank = launch_info.get("rank")
            exc = RankFailedError(f"rank {rank} of the submission failed (hidden tests have run: its error is not "
                                  "shown)" if hidden and isinstance(rank, int) else
                                  "a rank of the submission failed (hidden tests have run: its error is not shown)"
                                  if hidden else evalue, rank)
        else:
            exc = LaunchError("the submission's ranks failed (hidden tests have run: the error is not shown)" if hidden
                              else evalue)
    else:
        cls = getattr(builtins, ename, None)
        if isinstance(cls, type) and issubclass(cls, BaseException) and cls not in (SystemExit, GeneratorExit):
            try:
                exc = cls(HIDDEN_MESSAGE.format(cls.__name__) if hidden else evalue)
            except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs more arguments
                exc = StudentError(HIDDEN_MESSAGE.format(cls.__name__) if hidden else f"{ename}: {evalue}")
        else:  # the class name is the student's to choose: not even that is shown from a hidden test
            exc = StudentError(HIDDEN_MESSAGE.format("an exception") if hidden else f"{ename}: {evalue}")
    stb = [str(line) for line in reply.get("traceback") or []]
    if stb and not hidden:
        exc._render_traceback_ = lambda: stb  # IPython shows these lines instead of the grader's frames
    return exc


# what a process says when the address-space limit stops it: Python and C++, and the dynamic loader (an extension
# module or library that cannot be mapped: often the first thing to fail under a small limit, and what it says of a
# noexec mount too)
_OUT_OF_MEMORY = (b"MemoryError", b"Cannot allocate memory", b"bad_alloc", b"out of memory")
_UNMAPPABLE = (b"failed to map segment from shared object", b"cannot map zero-fill pages")
START_TIMEOUT_S = 120  # to start the subject (bubblewrap, Python, torch): the grader's time, never the student's
# The subject's program: its working directory (the submission's files) off the path before anything is imported, so
# a shipped torch.py or lab_utils/ cannot replace what the subject starts with (it is put back once the subject is
# up, for the student's own helper modules, as in JupyterLab).
SUBJECT_ENTRY = ("import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
                 "from lab_utils.grading.split.subject import main; main(sys.argv[1:])")


class _Session:
    """The subject process, its sandbox, and the request/reply loop that streams its output into the cell."""

    def __init__(self, workdir: Path, limits=None, report_path: str | None = None, fork_zygote: bool = False):
        from lab_utils.grading.boundary import sandbox

        self.workdir = Path(workdir)  # the subject's folder, at the same path on both sides
        self.report_path = report_path
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        argv = [sys.executable, "-c", SUBJECT_ENTRY, str(child.fileno())]
        if fork_zygote:  # see lab_utils.grading.split.subject.main
            argv.append("--fork-zygote")
        self.box = sandbox.start(argv, workdir, pass_fds=(child.fileno(),), limits=limits, stdout=out_w,
                                 count_caller=True)  # what this kernel holds of the submission's answers counts too
        os.close(out_w)
        child.close()
        self.out = os.fdopen(out_r, "rb", buffering=0)
        os.set_blocking(out_r, False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ, "msg")
        self.sel.register(self.out, selectors.EVENT_READ, "out")
        self.gone_reason: str | None = None
        self.mode = self.box.mode
        self.pid: int | None = None

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Block until the subject has started (imported torch, forked its rank server, made its shell)."""
        self.pid = self._wait_reply(timeout=timeout, expect="ready").get("pid")

    # ---------------------------------------------------------------------------- low level
    def _write_out(self, data: bytes) -> None:
        self._tail = (getattr(self, "_tail", b"") + data)[-4096:]  # for the reason, if the subject dies
        if _HIDDEN:  # what the student's code prints once hidden tests have run stays out of the cell
            global _DROPPED
            if not _DROPPED:
                _DROPPED = True
                sys.stdout.write(DROPPED_NOTE)
                sys.stdout.flush()
            return
        sys.stdout.write(data.decode("utf-8", "replace"))
        sys.stdout.flush()

    def _drain_output(self) -> None:
        while True:
            try:
                data = self.out.read(1 << 16)
            except (BlockingIOError, ValueError):
                return
            if not data:
                return
            self._write_out(data)

    def _read_msg(self) -> dict | None:
        data = wire.read_frame(self.sock.fileno(), max_bytes=plaindata.MAX_BYTES)
        if data is None:
            return None
        return plaindata.decode(data)

    def _dead(self) -> SubjectGone:
        self._drain_output()
        reason = self.box.reason or self.gone_reason
        if not reason:
            try:  # the socket closes a moment before the box exits, and its watchdog may be naming the cause
                code = self.box.popen.wait(timeout=3)
            except subprocess.TimeoutExpired:
                code = None
            reason = self.box.reason
        if not reason:
            tail = getattr(self, "_tail", b"")
            if any(m in tail for m in _OUT_OF_MEMORY + _UNMAPPABLE):
                reason = (f"memory limit: a process of the submission could not allocate memory under the sandbox's "
                          f"limit ({self.box.limits.memory_mb} MB)")
                if any(m in tail for m in _UNMAPPABLE):
                    reason += " (a library could not be mapped; if the limit is generous, look for a noexec mount)"
            else:
                # its exit status is the submission's to choose (and a grade line can reach the student): not named
                reason = "it exited before grading was over" if code is not None else "it stopped answering"
        self.gone_reason = reason
        self._report(reason)
        return SubjectGone(f"the student's process is gone ({reason}); nothing the submission defined can run")

    def _report(self, reason: str) -> None:
        """Tell the grading batch why the sandbox stopped (it puts the reason on the student's grade line)."""
        if self.report_path:
            try:
                with open(self.report_path, "a") as fh:
                    fh.write(reason.replace("\n", " ") + "\n")
            except OSError:
                pass

    def _wait_reply(self, timeout: float | None = None, expect: str = "reply",
                    on_timeout: str = "no answer from the student's process in time") -> dict:
        from IPython.display import publish_display_data

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.gone_reason:
                raise self._dead()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left == 0.0:
                self.box.kill(on_timeout)
                raise self._dead()
            events = self.sel.select(timeout=left if left is not None else 1.0)
            if not events and self.box.popen.poll() is not None:
                raise self._dead()
            for key, _ in events:
                if key.data == "out":
                    try:
                        data = self.out.read(1 << 16)
                    except BlockingIOError:
                        data = None
                    if data:
                        self._write_out(data)
                    elif data == b"":  # EOF: the subject closed its output
                        self.sel.unregister(self.out)
                    continue
                try:
                    msg = self._read_msg()
                except wire.FrameTooLarge as exc:  # refused unread: the grader's memory is not the student's
                    # the declared size is the submission's to choose: only the limit is named
                    self.box.kill(f"it sent an answer over the limit of {exc.limit >> 20} MB (refused unread)")
                    raise self._dead() from None
                except Exception:  # noqa: BLE001 - a malformed answer ends the session (which error it made the
                    self.box.kill("it sent something that is not plain data")  # decoder raise is its choice)
                    raise self._dead() from None
                if msg is None:
                    raise self._dead()
                if msg.get("op") == "display":
                    self._drain_output()
                    data = {k: v for k, v in (msg.get("data") or {}).items()
                            if k in ("text/plain", "image/png", "image/jpeg") and isinstance(v, str)}
                    if data and not _HIDDEN:
                        publish_display_data(data)
                    continue
                if msg.get("op") == expect:
                    self._drain_output()
                    return msg

    def request(self, msg: dict, timeout: float | None = None) -> dict:
        if self.gone_reason:
            raise self._dead()
        try:
            wire.write_frame(self.sock.fileno(), pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            raise self._dead() from None
        try:
            return self._wait_reply(timeout)
        except KeyboardInterrupt:
            # the cell was interrupted (the stop button, or nbgrader's per-cell timeout): pass it on, and stop the
            # student's process for good if it does not answer within the grace period
            try:
                wire.write_frame(self.sock.fileno(), pickle.dumps({"op": "interrupt"}))
                self._wait_reply(INTERRUPT_GRACE_S, on_timeout="it did not stop within "
                                 f"{INTERRUPT_GRACE_S:g} s of an interrupt (a cell ran past its time limit)")
            except (KeyboardInterrupt, SubjectGone, OSError):
                self.box.kill("it did not stop after an interrupt (a cell ran past its time limit)")
            raise

    def value(self, reply: dict):
        if not reply.get("ok"):
            raise _remote_exception(reply)
        return reply.get("value")

    def stop(self) -> None:
        if not self.gone_reason and self.box.popen.poll() is None and self.box.check():
            self.gone_reason = self.box.reason  # over a limit since the watchdog's last look: named all the same
            self._report(self.gone_reason)
        try:
            wire.write_frame(self.sock.fileno(), pickle.dumps({"op": "stop"}))
        except OSError:
            pass
        try:
            self.box.popen.wait(timeout=2)
        except Exception:  # noqa: BLE001
            pass
        self.box.close()
        self.sel.close()
        self.sock.close()
        self.out.close()


_SHARED_NAMES: set = set()  # names the course's shared cells bound: the subject has its own copies of them


def dumps(obj) -> bytes:
    """The launcher's pickler (``launcher.launch.pickler_class``) for the subject. A function or class that a
    shared course cell defined travels by name and becomes the subject's own copy (same source, defined there too,
    so ``inspect.getsource`` works on it, as torchrun scripts need); everything else as cloudpickle sends it."""
    import io
    import types

    from IPython import get_ipython

    from lab_utils.grading.split import subject

    shell = get_ipython()
    ns = shell.user_ns if shell is not None else {}
    by_id = {id(ns[n]): n for n in _SHARED_NAMES if isinstance(ns.get(n), (types.FunctionType, type))}

    class _Pickler(launcher.pickler_class()):
        def reducer_override(self, o):
            name = by_id.get(id(o))
            if name is not None:
                return subject.resolve, (name,)
            return super().reducer_override(o)

    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


class StudentProxy:
    """Stands in, in the grader, for a callable the student defined; see the module docstring."""

    def __init__(self, name: str, kind: str):
        self.__name__ = self.__qualname__ = name
        self._kind = kind

    def __call__(self, *args, **kwargs):
        payload = dumps((args, kwargs))
        return _session().value(_session().request({"op": "call", "name": self.__name__, "payload": payload}))

    def __reduce__(self):
        from lab_utils.grading.split import subject

        return subject.resolve, (self.__name__,)

    def __repr__(self):
        return f"<student {self._kind} {self.__name__}>"

    def __getattr__(self, attr):
        raise AttributeError(
            f"the test tried to use {self.__name__}.{attr}, but {self.__name__} is the student's {self._kind}, which "
            "lives in the student's process: use it inside a harness run with run_as_student() or launch()")


class StudentValue:
    """A value a student cell bound that is not plain data: using it says why instead of failing obscurely."""

    def __init__(self, name: str, type_name: str):
        self.__name__ = name
        self._type_name = type_name

    def __getattr__(self, attr):
        what = "a value" if _HIDDEN else f"a {self._type_name}"  # its type's name is the student's to choose
        raise TypeError(f"{self.__name__} is {what} in the student's process; the grader sees only "
                        "plain data: use it inside a harness run with run_as_student() or launch()")

    def __repr__(self):
        return f"<student value {self.__name__}: {self._type_name}>"


def _session() -> _Session:
    if _SESSION is None:
        raise RuntimeError("no student process: this is only available while grading")
    return _SESSION


class GraderRemote:
    """What ``launch`` and ``run_as_student`` do in the grader kernel while grading (``launcher.launch.set_remote``):
    the work goes to the student's process, as plain data and names, and only plain data comes back."""

    def run(self, fn, args, kwargs):
        payload = dumps((fn, args, kwargs))
        return _session().value(_session().request({"op": "run", "payload": payload}))

    def launch(self, fn, world_size, backend, timeout, args, kwargs, *, debug=False, quiet=False, traffic=None):
        """The subject's launcher starts the ranks inside the sandbox. With ``traffic``, the relay that counts
        their messages runs here, in the grader, listening in the folder the sandbox shares with us."""
        from lab_utils.launcher.group import validate

        validate(fn, world_size, timeout)
        session = _session()
        payload = dumps((fn, tuple(args), dict(kwargs or {})))
        options = {"world_size": world_size, "backend": backend, "timeout": timeout, "debug": debug, "quiet": quiet}
        relay = traffic.start(world_size, directory=str(session.workdir)) if traffic is not None else None
        if relay is not None:
            options["relay"] = relay.address
        try:
            reply = session.request({"op": "launch", "payload": payload, "options": options})
        finally:
            if relay is not None:
                relay.stop()
        if not reply.get("ok"):
            exc = _remote_exception(reply)
            raise exc.with_traceback(None) from None
        return reply.get("value")


# ------------------------------------------------------------------------------------------ the grader kernel
_PROTECTED_EXTRA = {"In", "Out", "get_ipython", "exit", "quit"}


def _bind_names(shell, names: dict) -> None:
    """Bind what a student cell defined, unless the course's own cells own that name."""
    ns = shell.user_ns
    for name, info in names.items():
        if name.startswith("_") or name in _PROTECTED_EXTRA or hasattr(builtins, name) or not name.isidentifier():
            continue
        current = ns.get(name, None)
        if name in ns and not isinstance(current, (StudentProxy, StudentValue)) and name not in _STUDENT_VALUES:
            continue  # a course name (import, check, reference, test helper): never replaced
        if info.get("kind") in ("callable", "class"):
            ns[name] = StudentProxy(name, info["kind"])
            _STUDENT_VALUES.discard(name)
        elif "plain" in info:
            ns[name] = plaindata.decode(info["plain"])
            _STUDENT_VALUES.add(name)
        else:
            ns[name] = StudentValue(name, info.get("type", "?"))
            _STUDENT_VALUES.discard(name)


_STUDENT_VALUES: set = set()  # names whose grader value is plain data that came from a student cell
_SHARED_SOURCES: set = set()


def _student_cell(line, cell):
    """``%%student``: run this cell in the student's process (the grading executor adds it to answer cells)."""
    from IPython import get_ipython

    reply = _session().request({"op": "run_cell", "source": cell})
    _bind_names(get_ipython(), reply.get("names") or {})
    if not reply.get("ok"):
        exc = _remote_exception(reply)
        raise exc.with_traceback(None) from None


_SHARED_BEFORE: dict = {}


def _before_cell(info) -> None:
    """Note whether the cell holds hidden tests; a course cell that student code also needs (imports, parameters,
    helpers) runs over there first."""
    global _HIDDEN, _DROPPED
    from lab_utils.grading.course import HIDDEN_MARKERS

    _HIDDEN = _HIDDEN or HIDDEN_MARKERS[0] in (info.raw_cell or "")
    _DROPPED = False
    if _SESSION is None or info.raw_cell not in _SHARED_SOURCES:
        return
    from IPython import get_ipython

    _SHARED_BEFORE.clear()
    _SHARED_BEFORE.update({k: id(v) for k, v in get_ipython().user_ns.items()})
    _SHARED_BEFORE["__running__"] = 1
    reply = _SESSION.request({"op": "run_cell", "source": info.raw_cell, "quiet": True})
    if not reply.get("ok"):
        print("(in the student's process this cell failed" + (")" if _HIDDEN else  # what it said: see _remote_exception
                                                              f": {reply.get('ename')}: {reply.get('evalue')})"))


def _after_cell(result) -> None:
    """Remember what a shared cell defined here (see ``dumps``)."""
    if not _SHARED_BEFORE.pop("__running__", None):
        return
    from IPython import get_ipython

    for k, v in get_ipython().user_ns.items():
        if not k.startswith("_") and _SHARED_BEFORE.get(k) != id(v):
            _SHARED_NAMES.add(k)


def _course_uses_torch(shared_sources) -> bool:
    """Whether the course's shared cells (which run on both sides) import torch: then both sides import it at
    start-up, side by side, and the subject forks its rank server from itself (``lab_utils.grading.split.subject.main``)."""
    return any("torch" in src for src in shared_sources)


def start_grading(shared_sources=(), workdir: str | None = None, report_path: str | None = None,
                  memory_mb: int | None = None, max_procs: int | None = None, work_root: str | None = None,
                  sandbox: str | None = None, disk_mb: int | None = None, subject_user: str | None = None) -> str:
    """Called by the grading executor's first (hidden) cell in the grader kernel: start the subject, install
    ``%%student`` and the shared-cell hook. Returns the sandbox mode. The subject's folder is made under
    ``work_root``, which the executor owns and removes once the kernel is gone (a killed kernel runs no cleanup)."""
    global _SESSION, _HIDDEN
    _HIDDEN = False  # a new student process: it has seen no hidden test yet
    from IPython import get_ipython

    from lab_utils.grading.boundary import sandbox as boxes

    shell = get_ipython()
    box_mode = boxes.require(sandbox, user=subject_user)
    if box_mode == "user":
        os.umask(0o002)  # what this kernel writes in the subject's folder (setgid, its group) stays the subject's to use
    elif box_mode == "unprotected" and report_path:  # said on the grade line, from where the subject really ran
        with open(report_path, "a") as fh:
            fh.write(boxes.UNPROTECTED + "\n")
    limits = boxes.Limits()
    if memory_mb:
        limits.memory_mb = int(memory_mb)
    if max_procs:
        limits.max_procs = int(max_procs)
    if disk_mb:
        limits.disk_mb = int(disk_mb)
    # The grader's import path is fixed before any student byte is on disk: nothing it imports later can come from
    # the submission's folder, the subject's folder or the kernel's working directory.
    import cloudpickle  # noqa: F401 - used by dumps, for every call that crosses
    from IPython.display import publish_display_data  # noqa: F401 - figures from the subject

    from lab_utils.grading.boundary.files import copy_submission

    work = Path(tempfile.mkdtemp(prefix="dtlabs-subject-", dir=work_root))
    student_dirs = [str(work)] + ([os.path.realpath(workdir)] if workdir else [])
    sys.path[:] = [p for p in sys.path if p not in ("", ".") and not any(
        os.path.realpath(p) == d or os.path.realpath(p).startswith(d + os.sep) for d in student_dirs)]
    if workdir:  # the submission's own files (data a student shipped) as regular files: never its notebooks, no link
        def skip(rel, is_dir):
            return (rel.suffix == ".ipynb" or rel.parts[0].startswith(".ipynb_checkpoints")
                    or (is_dir and work.is_relative_to(Path(workdir, rel).resolve())))  # our temp folder beside it

        copied = copy_submission(workdir, work, skip=skip)
        if copied.left_out and report_path:
            with open(report_path, "a") as fh:
                fh.write(copied.note() + "\n")
    _SHARED_SOURCES.clear()
    _SHARED_SOURCES.update(shared_sources)
    # course cells here and over there make temp files for each other (a checkpoint the ranks write and a test reads):
    # both sides use the submission's shared temp folder, at the same path on both sides. Tests read such files with
    # restricted loaders only (torch.load's weights_only default, json), as they would read anything else a
    # submission produced. This kernel stays in its own empty working directory.
    tmp = boxes.shared_tmp(work)
    tmp.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = str(tmp)
    session = None
    try:
        uses_torch = _course_uses_torch(shared_sources)
        session = _Session(work, limits, report_path, fork_zygote=uses_torch)
        if uses_torch:  # while the subject imports its own (about 1.7 s of the other core), not after it
            import torch  # noqa: F401
        session.wait_ready()
        session.box.rebase_caller()  # from here on, what this kernel grows by is what the submission sent it
        _SESSION = session
    except BaseException:  # an interrupt too: a subject that never became ready must not run on (the executor
        if session is not None:  # reports why: SplitExecute.preprocess_cell)
            session.stop()
        raise
    launcher.set_remote(GraderRemote())  # launch / run_as_student in test cells now reach the subject
    shell.register_magic_function(_student_cell, magic_kind="cell", magic_name="student")
    shell.events.register("pre_run_cell", _before_cell)
    shell.events.register("post_run_cell", _after_cell)
    import atexit

    atexit.register(stop_grading)
    return _SESSION.mode


def stop_grading() -> None:
    global _SESSION
    launcher.set_remote(None)
    if _SESSION is not None:
        s, _SESSION = _SESSION, None
        s.stop()
