"""``GradingSession``: one grading of one submission in a grader kernel, and everything it remembers between cells.

``start`` prepares the kernel (its import path pinned, the submission's files copied, a shared temp folder) and
starts the subject; the proxies, the IPython hooks and ``GraderRemote`` all reach the subject through the session
they were made for. What it remembers: whether hidden tests have run (``cell.hidden``), which names the course's
shared cells bound here (they travel by name), which names hold plain data that came from a student cell.
"""
from __future__ import annotations

import os
import sys
import tempfile
import types
from pathlib import Path

from lab_utils import sockets
from lab_utils.grading.split import crossing
from lab_utils.grading.split.channel import CellOutput, SubjectProcess


class GradingSession:
    """The subject process of one grading (``subject``, None once stopped) and the state of the grader kernel's
    cells around it."""

    def __init__(self):
        self.subject: SubjectProcess | None = None
        self.cell = CellOutput()  # what of the subject's output the running cell shows; ``hidden`` lives here
        self.shared_sources: set = set()  # the course's shared cells: they run in the subject first
        self.shared_names: set = set()  # names the shared cells bound here: the subject has its own copies of them
        self.student_values: set = set()  # names whose value here is plain data that came from a student cell
        self.shared_before: dict = {}  # while a shared cell runs: the namespace before it, {name: id(value)}

    @property
    def hidden(self) -> bool:
        return self.cell.hidden

    def start(self, shared_sources=(), workdir: str | None = None, report_path: str | None = None,
              memory_mb: int | None = None, max_procs: int | None = None, work_root: str | None = None,
              sandbox: str | None = None, disk_mb: int | None = None, subject_user: str | None = None) -> str:
        """Start the subject (see ``lab_utils.grading.split.proxy.start_grading``); returns the sandbox mode."""
        from lab_utils.grading.boundary import sandbox as boxes

        box_mode = boxes.require(sandbox, user=subject_user)
        if box_mode == "user":  # what this kernel writes in the subject's folder (setgid, its group) stays the
            os.umask(0o002)  # subject's to use
            note = boxes.network.grade_note(boxes.subject_user()[0].pw_uid)  # the network closed, else said
            if note and report_path:
                with open(report_path, "a") as fh:
                    fh.write(note + "\n")
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

        from lab_utils.grading.boundary.files import copy_submission, group_mkdtemp

        work = Path(tempfile.mkdtemp(prefix="dtlabs-subject-", dir=work_root))
        student_dirs = [str(work)] + ([os.path.realpath(workdir)] if workdir else [])
        sys.path[:] = [p for p in sys.path if p not in ("", ".") and not any(
            os.path.realpath(p) == d or os.path.realpath(p).startswith(d + os.sep) for d in student_dirs)]
        if workdir:  # the submission's own files (data a student shipped) as regular files: no notebook, no link
            def skip(rel, is_dir):
                return (rel.suffix == ".ipynb" or rel.parts[0].startswith(".ipynb_checkpoints")
                        or (is_dir and work.is_relative_to(Path(workdir, rel).resolve())))  # our temp folder beside it

            copied = copy_submission(workdir, work, skip=skip)
            if copied.left_out and report_path:
                with open(report_path, "a") as fh:
                    fh.write(copied.note() + "\n")
        self.shared_sources.clear()
        self.shared_sources.update(shared_sources)
        # course cells here and over there make temp files for each other (a checkpoint the ranks write and a test
        # reads): both sides use the submission's shared temp folder, at the same path on both sides. Tests read such
        # files with restricted loaders only (torch.load's weights_only default, json), as they would read anything
        # else a submission produced. This kernel stays in its own empty working directory.
        tmp = boxes.shared_tmp(work)
        tmp.mkdir(exist_ok=True)
        if box_mode == "user":  # a folder a course cell makes here is the subject's group's too, made safely
            tempfile.mkdtemp = group_mkdtemp(str(work))
        os.environ["TMPDIR"] = str(tmp)
        tempfile.tempdir = str(tmp)
        subject = None
        try:
            uses_torch = crossing.course_uses_torch(shared_sources)
            subject = SubjectProcess(work, limits, report_path, fork_zygote=uses_torch, output=self.cell)
            if uses_torch:  # while the subject imports its own (about 1.7 s of the other core), not after it
                import torch  # noqa: F401
            subject.wait_ready()
            subject.box.rebase_caller()  # from here on, what this kernel grows by is what the submission sent it
            os.environ[sockets.SOCKETS_VAR] = str(subject.sockets)  # a test cell's CountedLock listens there
            self.subject = subject
        except BaseException:  # an interrupt too: a subject that never became ready must not run on (the executor
            if subject is not None:  # reports why: SplitExecute.preprocess_cell)
                subject.stop()
            raise
        return subject.mode

    def stop(self) -> None:
        if self.subject is not None:
            s, self.subject = self.subject, None
            s.stop()

    def running(self) -> SubjectProcess:
        """The subject, or the error a test cell gets when no grading is under way."""
        if self.subject is None:
            raise RuntimeError("no student process: this is only available while grading")
        return self.subject

    def call(self, msg: dict):
        """Send one request to the subject and return its value (plain data), or raise what the student raised."""
        subject = self.running()
        return subject.value(subject.request(msg))

    def dumps(self, obj) -> bytes:
        """``obj`` pickled for the subject, the functions and classes the shared cells defined by name
        (``crossing.dumps``)."""
        from IPython import get_ipython

        shell = get_ipython()
        ns = shell.user_ns if shell is not None else {}
        return crossing.dumps(obj, {id(ns[n]): n for n in self.shared_names
                                    if isinstance(ns.get(n), (types.FunctionType, type))})
