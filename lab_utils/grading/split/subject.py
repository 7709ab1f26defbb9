"""The subject: the process where a submission's own cells run while it is graded (``channel.SUBJECT_ENTRY``).

The grader's kernel (``lab_utils.grading.split.channel``) starts it inside the sandbox and talks to it over one socket. The
grader's requests are trusted (it executes only the course's locked cells and tests); everything this process
sends back is treated as hostile and crosses only as plain data (``lab_utils.launcher.plaindata``). Student code runs in
an IPython shell, so magics such as ``%matplotlib inline`` or ``%%time`` behave as in JupyterLab; figures and
other displays travel back as PNG/plain text, and everything printed goes to the grader through a pipe.

Requests (``pickle``/``cloudpickle`` from the grader): ``run_cell`` (a cell's source), ``call`` (a student
function by name), ``run`` (a test's harness function, next to the student's live objects), ``launch`` (a
harness on N ranks through this process's own launcher), ``interrupt`` and ``stop``.
"""
from __future__ import annotations

import os
import pickle
import queue
import signal
import socket
import sys
import threading
import types

from lab_utils.launcher import plaindata, wire

_DISPLAY_TYPES = ("text/plain", "image/png", "image/jpeg")
_SKIP_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open"}


class Subject:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.send_lock = threading.Lock()
        self.requests: queue.Queue = queue.Queue()
        self.quiet = False
        self.shell = self._make_shell()
        self.captured_error = None

    # -------------------------------------------------------------------------------- plumbing
    def send(self, msg: dict) -> None:
        try:
            data = plaindata.encode(msg)
        except plaindata.NotPlainData as exc:  # the student's answer is not plain data: say what it was instead
            data = plaindata.encode({"op": "reply", "ok": False, "ename": "NotPlainData", "evalue": str(exc),
                                     "traceback": [f"NotPlainData: {exc}"]})
        with self.send_lock:
            wire.write_frame(self.sock.fileno(), data)

    def _reader(self) -> None:
        """Every frame from the grader; an interrupt is acted on at once, the rest wait for the main thread."""
        while True:
            data = wire.read_frame(self.sock.fileno())
            if data is None:
                os._exit(0)  # the grader is gone: nothing left to do
            req = pickle.loads(data)
            if req.get("op") == "interrupt":
                os.kill(os.getpid(), signal.SIGINT)
            else:
                self.requests.put(req)

    def _make_shell(self):
        from IPython.core.displaypub import DisplayPublisher
        from IPython.core.interactiveshell import InteractiveShell

        subject = self

        class Publisher(DisplayPublisher):
            def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kw):
                keep = {k: v for k, v in data.items() if k in _DISPLAY_TYPES}
                if keep and not subject.quiet:
                    sys.stdout.flush()
                    subject.send({"op": "display", "data": keep})

            def clear_output(self, wait=False):
                pass

        shell = InteractiveShell.instance(display_pub_class=Publisher, colors="NoColor")
        shell.enable_gui = lambda gui=None: None  # `%matplotlib inline` needs no event loop: figures go out as PNG

        def capture(etype, evalue, stb):
            self.captured_error = (etype.__name__ if etype else "Error", str(evalue), list(stb))

        shell._showtraceback = capture
        return shell

    # -------------------------------------------------------------------------------- requests
    def names_changed(self, before: dict) -> dict:
        """name -> description of what this cell (re)bound: kind, and the value itself when it is plain data."""
        import builtins

        out = {}
        for name, value in list(self.shell.user_ns.items()):
            if name.startswith("_") or name in _SKIP_NAMES or hasattr(builtins, name):
                continue
            if name in before and before[name] is value:
                continue
            if isinstance(value, types.ModuleType):
                continue
            info = {"kind": "class" if isinstance(value, type) else "callable" if callable(value) else "value",
                    "type": f"{type(value).__module__}.{type(value).__qualname__}"}
            nbytes = getattr(value, "nbytes", 0)  # tensors and arrays: skip the big ones before encoding them
            if info["kind"] == "value" and isinstance(nbytes, int) and nbytes <= 16 << 20:
                try:
                    data = plaindata.encode(value)
                    if len(data) <= 16 << 20:
                        info["plain"] = data
                except Exception:  # noqa: BLE001 - not plain data: the grader gets a placeholder
                    pass
            out[name] = info
        return out

    def run_cell(self, source: str, quiet: bool) -> dict:
        """Run a cell; ``quiet`` (a course cell the grader runs too) keeps its output here, so it shows once."""
        import contextlib
        import io

        before = dict(self.shell.user_ns)
        self.captured_error = None
        self.quiet = quiet
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext():
            result = self.shell.run_cell(source, store_history=True, silent=False)
            sys.stdout.flush()
            sys.stderr.flush()
        self.quiet = False
        reply = {"ok": result.success, "names": self.names_changed(before)}
        if not result.success:
            ename, evalue, stb = self.captured_error or ("Error", str(result.error_in_exec), [])
            reply.update(ename=ename, evalue=evalue, traceback=stb)
        return reply

    def _error_reply(self, exc: BaseException) -> dict:
        try:
            stb = self.shell.InteractiveTB.structured_traceback(type(exc), exc, exc.__traceback__)
        except Exception:  # noqa: BLE001
            stb = [f"{type(exc).__name__}: {exc}"]
        reply = {"ok": False, "ename": type(exc).__name__, "evalue": str(exc), "traceback": list(stb)}
        from lab_utils.launcher.diagnostics import LaunchError

        if isinstance(exc, LaunchError):
            reply["launch"] = {"rank": getattr(exc, "rank", None),
                               "stuck_ranks": list(getattr(exc, "stuck_ranks", []) or [])}
        return reply

    def handle(self, req: dict) -> dict:
        op = req["op"]
        if op == "run_cell":
            return self.run_cell(req["source"], req.get("quiet", False))
        try:
            if op == "call":
                import cloudpickle

                args, kwargs = cloudpickle.loads(req["payload"])
                fn = self.shell.user_ns[req["name"]]
                value = fn(*args, **kwargs)
            elif op == "run":
                import cloudpickle

                fn, args, kwargs = cloudpickle.loads(req["payload"])
                value = fn(*args, **kwargs)
            elif op == "launch":
                import cloudpickle

                from lab_utils.launcher.launch import launch

                fn, args, kwargs = cloudpickle.loads(req["payload"])
                options = dict(req["options"])
                address = options.pop("relay", None)
                if address:  # the grader counts this launch's messages: its relay is our ranks' process group
                    from lab_utils.launcher.relay import Endpoint

                    options["traffic"] = Endpoint(address)
                value = launch(fn, args=args, kwargs=kwargs, **options)
            elif op == "prewarm":
                from lab_utils.launcher.launch import prewarm

                value = prewarm()
            else:
                raise ValueError(f"unknown request {op!r}")
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt from an interrupt included
            return self._error_reply(exc)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        return {"ok": True, "value": value}  # encoded once, by send()

    def serve(self) -> None:
        threading.Thread(target=self._reader, daemon=True, name="dtlabs-subject-reader").start()
        self.send({"op": "ready", "pid": os.getpid()})
        while True:
            req = self.requests.get()
            if req["op"] == "stop":
                break
            try:
                reply = self.handle(req)
            except KeyboardInterrupt as exc:  # an interrupt that landed between requests
                reply = self._error_reply(exc)
            reply["op"] = "reply"
            self.send(reply)
        sys.stdout.flush()


def resolve(name: str):
    """What a grader-side proxy for ``name`` becomes when a harness arrives here: the student's live object."""
    return _SUBJECT.shell.user_ns[name]


_SUBJECT: Subject | None = None


def main(argv: list[str]) -> None:
    """``SUBJECT_ENTRY FD [--fork-zygote]``: serve the grader on socket ``FD``."""
    global _SUBJECT
    fd = int(argv[0])
    sys.stderr = sys.stdout  # one stream back to the grader (a stderr line would fail a graded cell)
    os.dup2(1, 2)
    # Before anything of the submission's runs, and before the rank server is forked (it inherits the domain): no
    # process of this submission may trace, signal or reach the grader's (landlock). Outside bubblewrap this process
    # was started in a domain already (sandbox._enter_boundary), and this one nests in it. Where the kernel has no Landlock
    # the other boundaries stand alone: bubblewrap's pid namespace, the separate user; unprotected grading says on
    # every grade that it has none.
    from lab_utils.grading.boundary import landlock

    landlock.scope_self()
    if "--fork-zygote" in argv[1:]:
        from lab_utils.launcher.zygote import fork_zygote

        # Before any thread or cell: a course whose cells import torch has this process import it anyway, so its
        # rank server is a fork of it rather than a second interpreter importing torch again. If that cannot be
        # done safely, the first launch starts a fresh rank server as a notebook's does: slower, never wrong.
        try:
            fork_zygote(close_fds=(fd,))
        except (ImportError, RuntimeError, OSError) as exc:
            print(f"dtlabs-subject: rank server not forked ({type(exc).__name__}: {exc}); a fresh one starts on "
                  "first use")
    if "torch" in sys.modules and not os.environ.get("OMP_NUM_THREADS", "").isdigit():
        from lab_utils import cgroups  # a cell's own torch threads: the CPU budget, not the machine's cores

        sys.modules["torch"].set_num_threads(cgroups.cpu_budget().cpus)
    _SUBJECT = Subject(socket.socket(fileno=fd))  # IPython now owns sys.modules["__main__"]
    sys.path.insert(0, os.getcwd())  # the student's own modules (utils.py beside the notebook), as in JupyterLab
    _SUBJECT.serve()
    # Graded: stop the rank server and leave without the interpreter's teardown (most of a second unloading
    # torch, which the grader would wait for) and without the submission's own atexit handlers.
    from lab_utils.launcher.zygote import shutdown

    shutdown()
    sys.stdout.flush()
    os._exit(0)

