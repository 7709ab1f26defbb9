"""The student's pre-submission check: nbgrader's Validator with split execution and a real verdict (an exit code).

``nbgrader validate`` exits 0 even when tests fail; ``validate`` here returns 1. It executes the notebook the
way grading does (``SplitExecute``: answers in a separate student process, tests in the kernel), so a student
sees the same verdict the autograder will give, and prints failure messages whole (nbgrader cuts them at 90
columns, which cuts off the tutor's hint at the end of our assertions). A notebook that runs longer than grading
allows one submission (``c.DTLabs.submission_timeout``) is stopped there, and told so, as grading would stop it.
"""
from __future__ import annotations

import os
import sys
import threading
import uuid
from pathlib import Path

from lab_utils.grading.course import is_course
from lab_utils.grading.nbgrader_run import TOKEN_VAR, course_settings, load_config, reap
from lab_utils.status import Status


def course_of(notebook) -> Path | None:
    """The course a notebook lives in (a clone of the course), else None: the package's defaults apply (a notebook
    fetched from an nbgrader exchange into a home folder)."""
    return next((d for d in Path(notebook).resolve().parents if is_course(d)), None)


def prestart_kernel(settings=None) -> None:
    """Start the warm server of validate's one grader kernel now, where ``settings`` (default: the environment's)
    leave warm kernels on: it imports torch while the caller imports nbgrader. A course that turns them off leaves
    the server unused; it ends with this process."""
    from lab_utils import settings as dtlabs_settings
    from lab_utils import warm

    if (settings if settings is not None else dtlabs_settings.load()).warm_kernels:
        warm.prestart(warm.KERNEL, dict(os.environ))


def validate(notebook, *, settings=None, stream=None) -> Status:
    """The student's pre-submission check: nbgrader's Validator, printed as nbgrader prints it, with an exit
    status (DONE: every test passes and no locked cell changed; INCOMPLETE: not so; REFUSED: cannot run), under the command's
    ``settings`` (default: those of the notebook's course, ``course_of``)."""
    prestart_kernel(settings)  # the kernel's server imports while nbgrader is imported here (once per process)
    from nbgrader.preprocessors import CheckCellMetadata, ClearOutput
    from nbgrader.validator import Validator
    from traitlets import List
    from traitlets.config import Config

    from lab_utils.grading.boundary import sandbox
    from lab_utils.grading.split.execute import SplitExecute, execution_config

    path = Path(notebook)
    if not path.is_file():
        print(f"no such notebook: {path}", file=sys.stderr)
        return Status.REFUSED
    course = course_of(path)
    dt = settings if settings is not None else course_settings(course)
    cfg = load_config(course)
    cfg.merge(Config({"DTLabs": {name: getattr(dt, name) for name in dt.given}}))  # the flags, for SplitExecute
    cfg.merge(execution_config(dt))
    if sandbox.mode(dt.sandbox) == "none":  # the student's own code on their own machine: no grade is at stake
        cfg.merge(Config({"DTLabs": {"sandbox": "unprotected"}}))
    cfg.merge(Config({"Validator": {"ignore_checksums": False}}))

    class _Validator(Validator):
        preprocessors = List([CheckCellMetadata, ClearOutput, SplitExecute])

        def validate(self, filename):
            self.results = super().validate(filename)
            return self.results

        def _print_error(self, source, error):
            # nbgrader cuts every line at `width` characters, which cuts off the tutor's message at the end of
            # our assertions (what, where, by how much, the hint): wrap the error instead, keep the cut for code.
            self.stream.write("\n" + "=" * self.width + "\n")
            self.stream.write("The following cell failed:\n\n")
            self.stream.write(self._indent(source) + "\n\n")
            self.stream.write("The error was:\n\n")
            self.stream.write(_wrap_error(error, self.indent, self.width) + "\n\n")

    v = _Validator(config=cfg)
    if stream is not None:
        v.stream = stream
    token = uuid.uuid4().hex
    os.environ[TOKEN_VAR] = token
    expired = threading.Event()

    def expire():  # what grading does past the limit: the kernel and everything the notebook started end
        expired.set()
        reap(token)

    timer = threading.Timer(dt.submission_timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        v.validate_and_print(str(path))
    except Exception as exc:  # noqa: BLE001 - a notebook nbgrader cannot read is a failed validation
        if not expired.is_set():
            print(f"cannot validate {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return Status.REFUSED
    finally:
        timer.cancel()
        os.environ.pop(TOKEN_VAR, None)
        reap(token, grace_s=1.0)
    if expired.is_set():
        print(f"stopped after {dt.submission_timeout:g} s: grading stops a submission that runs longer "
              "(c.DTLabs.submission_timeout); make the notebook faster before you submit it", file=sys.stderr)
        return Status.INCOMPLETE
    res = getattr(v, "results", {})
    return Status.INCOMPLETE if (res.get("type_changed") or res.get("changed") or res.get("failed")) else Status.DONE


def _wrap_error(text: str, indent: str, width: int) -> str:
    """Every line of ``text`` indented and wrapped (not cut) at ``width``; ANSI colours removed."""
    import textwrap

    from nbconvert.filters import strip_ansi

    out = []
    for line in strip_ansi(text).split("\n"):
        lead = line[: len(line) - len(line.lstrip())]
        out.extend(textwrap.wrap(line, width=width, initial_indent=indent, subsequent_indent=indent + lead + "  ",
                                 break_on_hyphens=False, drop_whitespace=True) or [indent.rstrip()])
    return "\n".join(out)
