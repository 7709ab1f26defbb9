"""Running ``nbgrader`` for a course: the configuration it runs with, a wall-clock limit, nothing left behind.

``apply_nbgrader_config`` is the nbgrader configuration every course runs (the course's own
``grader/nbgrader_config.py`` calls it and adds its ``c.DTLabs`` settings; a folder without one, such as a scratch
course, runs the package's default in ``default_config/``).

nbgrader reads ``nbgrader_config.py`` only from the working directory or the Jupyter config path (``--config``
is ignored), so every call runs with ``JUPYTER_CONFIG_PATH`` at the course's ``grader/`` (``course.config_dir``);
``DTLABS_COURSE_ROOT`` points the same settings at a scratch course. Every run carries a fresh token in its environment; afterwards every process still
carrying it (a kernel, a torchrun agent a cell started in its own session) is killed. Processes without the
token are never touched. Submissions' own processes live in their sandbox and die with it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils import processes
from lab_utils.grading.course import CONFIG, WORK, find_course_root

DEFAULT_CONFIG_DIR = Path(__file__).resolve().parent / "default_config"

TOKEN_VAR = "DTLABS_GRADING_TOKEN"


def config_dir(course_root: Path | str | None) -> Path:
    """The folder whose ``nbgrader_config.py`` nbgrader reads for this course (``JUPYTER_CONFIG_PATH``)."""
    if course_root is not None and (Path(course_root) / CONFIG).is_file():
        return Path(course_root) / CONFIG.parent
    return DEFAULT_CONFIG_DIR


def load_config(course_root: Path | str | None):
    """The course's nbgrader configuration (a traitlets ``Config``), as nbgrader itself would read it."""
    from traitlets.config.loader import PyFileConfigLoader

    return PyFileConfigLoader(CONFIG.name, path=str(config_dir(course_root))).load_config()


def apply_nbgrader_config(c, default_root: Path | str) -> None:
    """Every nbgrader setting the course runs with, on config ``c`` (a course's ``grader/nbgrader_config.py`` and the
    package's default both call this). ``default_root``: the course folder unless ``c.DTLabs.course_root`` or
    ``DTLABS_COURSE_ROOT`` names another (a scratch course for one submission)."""
    from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import (
        AssignLatePenalties, CheckCellMetadata, GetGrades, IgnorePattern, LimitOutput, SaveAutoGrades,
    )

    from lab_utils import settings
    from lab_utils.grading.export.late import DueDates
    from lab_utils.grading.feedback import HideHiddenTests
    from lab_utils.grading.split.execute import SplitExecute, execution_config

    dt = settings.load(c)
    root = os.path.abspath(dt.course_root or default_root)
    c.CourseDirectory.root = root
    c.CourseDirectory.course_id = c.CourseDirectory.get("course_id", "dtlabs") or "dtlabs"
    c.CourseDirectory.source_directory = "solutions"
    c.CourseDirectory.release_directory = "labs"
    for name in ("submitted", "autograded", "feedback", "solution", "source_with_tests"):
        setattr(c.CourseDirectory, f"{name}_directory", str(WORK / name))
    c.CourseDirectory.db_url = "sqlite:///" + os.path.join(root, WORK, "gradebook.db")
    c.merge(execution_config(dt))
    # A submission for a student not yet in the gradebook is graded anyway (the student is created).
    c.Autograde.create_student = True
    # Split execution (split/execute.py): the cells a student can write run in a sandboxed subject process, the
    # tests in the kernel nbgrader starts, which never executes student code. nbgrader's default list, SplitExecute
    # in Execute's place. DueDates first: the lab's due date (c.DTLabs.due_dates) in the gradebook that
    # AssignLatePenalties reads (export/late.py).
    if not dt.unsafe_plain_execute:
        c.Autograde.autograde_preprocessors = [
            DueDates, SplitExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
            AssignLatePenalties, CheckCellMetadata,
        ]
    # Feedback must not show hidden tests (feedback.py); in the config, it applies to `nbgrader generate_feedback`
    # and the formgrader alike.
    c.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTests, CSSHTMLHeaderPreprocessor]


@dataclass
class NbgraderRun:
    args: list
    returncode: int
    output: str
    seconds: float
    timed_out: bool = False
    reaped: list = field(default_factory=list)


def nbgrader_env(course_root: Path | str, cell_timeout: int | None = None, config_root: Path | str | None = None) -> dict:
    """The environment nbgrader needs for ``course_root``: the configuration of ``config_root`` (the course whose
    settings apply; by default ``course_root`` itself) on the Jupyter config path, this venv's tools on PATH."""
    env = dict(os.environ)
    conf = config_dir(config_root if config_root is not None else course_root)
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (str(conf), env.get("JUPYTER_CONFIG_PATH")) if p)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # nbgrader runs `alembic`
    env["DTLABS_COURSE_ROOT"] = str(Path(course_root).resolve())
    if cell_timeout is not None:
        env["DTLABS_CELL_TIMEOUT"] = str(int(cell_timeout))
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return env


def reap(token: str, grace_s: float = 0.0, var: str = TOKEN_VAR) -> list[str]:
    """Kill every process carrying ``var=token``; returns what was killed."""
    return processes.reap_token(token, var, grace_s)


def processes_with_token(token: str, exclude=(), var: str = TOKEN_VAR) -> list:
    return processes.with_token(token, var, exclude)


def run_nbgrader(args, *, course_root=None, cell_timeout=None, timeout=None, echo=False, env_extra=None,
                 config_root=None) -> NbgraderRun:
    """``nbgrader ARGS`` for a course root (``find_course_root`` by default) with the settings of ``config_root``
    (default: the same course), under a wall-clock limit; every process it left is reaped."""
    course_root = find_course_root(course_root)
    (course_root / WORK).mkdir(parents=True, exist_ok=True)  # sqlite does not create folders
    token = uuid.uuid4().hex
    env = nbgrader_env(course_root, cell_timeout, config_root)
    env.update(env_extra or {})
    env[TOKEN_VAR] = token
    cmd = [sys.executable, "-m", "nbgrader", *map(str, args)]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=course_root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, errors="replace", start_new_session=True,
    )
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            lines.append(line)
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if proc.poll() is None:
            processes.killpg_quiet(proc.pid)
            proc.wait()
        t.join(timeout=5)
        reaped = reap(token, grace_s=1.0)
    return NbgraderRun(cmd[3:], proc.returncode, "".join(lines), time.monotonic() - start, timed_out, reaped)
