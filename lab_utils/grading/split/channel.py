"""The subject process from the grader's side: started in the sandbox, sent one request at a time over its socket,
its prints and figures streamed into the running cell, and, when it is gone, why."""
from __future__ import annotations

import os
import pickle
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path

from lab_utils.grading.split import crossing
from lab_utils.launcher import plaindata, wire

INTERRUPT_GRACE_S = 3.0
START_TIMEOUT_S = 120  # to start the subject (bubblewrap, Python, torch): the grader's time, never the student's
# The subject's program, run isolated (``-I``: no PYTHONPATH, no user site, no working directory on the path; ``-u``
# and ``-B`` for what -I ignores of its environment): nothing of the submission's folder is on the path it starts
# with, so a shipped sitecustomize.py, torch.py or lab_utils/ is never imported by it; outside bubblewrap the private
# package (``DTLABS_SUBJECT_PKG``, the grader's, read-only to it) comes first. The submission's folder goes on the path
# once the subject serves cells, for the student's own helper modules, as in JupyterLab.
SUBJECT_FLAGS = ("-I", "-u", "-B")
SUBJECT_ENTRY = ("import os, sys; pkg = os.environ.get('DTLABS_SUBJECT_PKG'); sys.path[:0] = [pkg] if pkg else []; "
                 "from lab_utils.grading.split.subject import main; main(sys.argv[1:])")
DROPPED_NOTE = "(what the submission's code prints is not shown once hidden tests have run)\n"


class SubjectGone(RuntimeError):
    """The student's process is no longer there (killed by a limit, crashed, or stopped after a timeout)."""


class CellOutput:
    """Where the subject's prints and figures go: into the running cell, until a cell with hidden tests has run.
    From then on nothing the student's code produced reaches a cell (the cell says so once): a hidden call's
    arguments could be spelt out in it."""

    def __init__(self):
        self.hidden = False  # a cell with hidden tests has run (or runs now): student text stays out
        self.dropped = False  # this cell already said that it drops the student's output

    def write(self, data: bytes) -> None:
        if self.hidden:
            if not self.dropped:
                self.dropped = True
                sys.stdout.write(DROPPED_NOTE)
                sys.stdout.flush()
            return
        sys.stdout.write(data.decode("utf-8", "replace"))
        sys.stdout.flush()

    def display(self, data: dict) -> None:
        from IPython.display import publish_display_data

        if not self.hidden:
            publish_display_data(data)


class SubjectProcess:
    """The subject process, its sandbox, and the request/reply loop that streams its output into the cell
    (``output``: a ``CellOutput``, which decides what of it the cell shows)."""

    def __init__(self, workdir: Path, limits=None, report_path: str | None = None, fork_zygote: bool = False,
                 output: CellOutput | None = None):
        from lab_utils.grading.boundary import sandbox

        self.workdir = Path(workdir)  # the subject's folder, at the same path on both sides
        self.sockets = sandbox.sockets_folder(workdir)  # where this side makes the sockets the subject reaches
        self.report_path = report_path
        self.output = output if output is not None else CellOutput()
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        argv = [sys.executable, *SUBJECT_FLAGS, "-c", SUBJECT_ENTRY, str(child.fileno())]
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
        self.output.write(data)

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
        if not reason:  # the kernel's out-of-memory killer, from the memory cgroup's counters (Box.oom_reason)
            reason = self.box.oom_reason()
        if not reason:
            reason = crossing.memory_reason(getattr(self, "_tail", b""), self.box.limits.memory_mb)
        if not reason:
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
                    if data:
                        self.output.display(data)
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
            raise crossing.remote_exception(reply, self.output.hidden)
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
