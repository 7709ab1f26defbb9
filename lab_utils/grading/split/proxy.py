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

This module starts and stops the grading of one submission in the grader kernel (``start_grading``, called by
the executor's first cell; one ``GradingSession`` at a time); the package docstring says where each part lives.
"""
from __future__ import annotations

import os

from lab_utils.grading.split import hooks
from lab_utils.grading.split.channel import START_TIMEOUT_S
from lab_utils.grading.split.crossing import StudentError
from lab_utils.grading.split.session import GradingSession
from lab_utils.grading.split.students import GraderRemote, StudentProxy
from lab_utils.launcher import launch as launcher

__all__ = ["StudentProxy", "StudentError", "start_grading", "stop_grading", "START_TIMEOUT_S"]

_SESSION: GradingSession | None = None  # the grading under way in this grader kernel, else None


def start_grading(shared_sources=(), workdir: str | None = None, report_path: str | None = None,
                  memory_mb: int | None = None, max_procs: int | None = None, work_root: str | None = None,
                  sandbox: str | None = None, disk_mb: int | None = None, subject_user: str | None = None) -> str:
    """Called by the grading executor's first (hidden) cell in the grader kernel: start the subject, install
    ``%%student`` and the shared-cell hook. Returns the sandbox mode. The subject's folder is made under
    ``work_root``, which the executor owns and removes once the kernel is gone (a killed kernel runs no cleanup)."""
    global _SESSION
    from IPython import get_ipython

    shell = get_ipython()
    _forget_connection_file()
    session = GradingSession()  # a new student process: it has seen no hidden test yet
    mode = session.start(shared_sources, workdir=workdir, report_path=report_path, memory_mb=memory_mb,
                         max_procs=max_procs, work_root=work_root, sandbox=sandbox, disk_mb=disk_mb,
                         subject_user=subject_user)
    _SESSION = session
    launcher.set_remote(GraderRemote(session))  # launch / run_as_student in test cells now reach the subject
    hooks.install(shell, session)
    import atexit

    atexit.register(stop_grading)
    return mode


def _forget_connection_file() -> None:
    """Remove this kernel's connection file before the subject starts. It holds the key that signs every message to
    this kernel, and its path is on the kernel's command line: unprotected, the subject is this user's and could read
    it and have this kernel run its code (where Landlock cannot keep it from the kernel's sockets). The kernel read it
    at start, its client keeps it in memory, and jupyter_client writes it again should the kernel restart."""
    try:
        from ipykernel.kernelapp import IPKernelApp

        if IPKernelApp.initialized():
            os.unlink(IPKernelApp.instance().abs_connection_file)
    except (ImportError, AttributeError, OSError):
        pass


def stop_grading() -> None:
    global _SESSION
    launcher.set_remote(None)
    if _SESSION is not None:
        s, _SESSION = _SESSION, None
        s.stop()
