"""Running ``nbgrader`` for a course: the configuration it runs with, a wall-clock limit, nothing left behind.

``apply_nbgrader_config`` is the nbgrader configuration every course runs (the course's own
``grader/nbgrader_config.py`` calls it and adds its ``c.DTLabs`` settings; a folder without one, such as a scratch
course, runs the package's default in ``default_config/``).

nbgrader reads ``nbgrader_config.py`` only from the working directory or the Jupyter config path (``--config``
is ignored), so every call runs with ``JUPYTER_CONFIG_PATH`` at the course's ``grader/`` (``course.config_dir``).
What the run's command decided beyond that config travels on nbgrader's command line, as configuration
(``child_config``): the course folder it works on (a scratch course for one submission) and the settings that came
from ``dtlabs`` flags. Every run carries a fresh token in its environment; afterwards every process still
carrying it (a kernel, a torchrun agent a cell started in its own session) is killed. Processes without the
token are never touched. Submissions' own processes live in their sandbox and die with it.

Runs start warm (``c.DTLabs.warm_nbgrader``): nbgrader's imports (nbconvert, SQLAlchemy, traitlets) are a large
share of what a small submission costs, so each grading process keeps one server that imports them once,
in a clean folder with nothing prepended to ``sys.path``, and forks every run from that state (the fork server of
``lab_utils.warm``, which grader kernels start from too). The child takes the run's environment,
folder, arguments and output pipe, and calls nbgrader's own entry point as ``python -m nbgrader`` would there; the
server runs nothing else, so no run sees another's state. Where the server cannot start, a run starts cold.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils import processes
from lab_utils.grading.course import CONFIG, WORK, find_course_root
from lab_utils.grading import scratch as grading_scratch
from lab_utils import warm

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


def course_settings(course_root: Path | str | None, **flags):
    """The settings of one command (``settings.DTLabs``): the course's config, then the environment, then ``flags``
    (None: not given)."""
    from lab_utils import settings

    return settings.load(load_config(course_root), **flags)


def course_directory(root: Path | str) -> dict:
    """nbgrader's ``CourseDirectory`` settings that depend on the course folder ``root``."""
    return {"root": str(root), "db_url": "sqlite:///" + os.path.join(root, WORK, "gradebook.db")}


def child_config(course_root: Path | str, settings=None) -> tuple[list[str], list[str]]:
    """(nbgrader command-line configuration, environment variables to leave out) for a run on ``course_root`` for a
    command whose settings are ``settings``: the course folder, and every setting that came from a flag (with the
    nbgrader setting it decides), whose environment variable the run must not see: the flag overrides it."""
    from lab_utils import settings as settings_module

    args = [f"--CourseDirectory.{k}={v}" for k, v in course_directory(Path(course_root).resolve()).items()]
    drop = [settings_module.env_var("course_root")]
    for name, value in (settings_module.given(settings) if settings is not None else {}).items():
        args.append(f"--DTLabs.{name}={value}")
        if name == "cell_timeout":  # Execute.timeout is set from it when the config is read (execution_config)
            args.append(f"--Execute.timeout={value}")
        drop.append(settings_module.env_var(name))
    return args, [v for v in drop if v]


def apply_nbgrader_config(c, default_root: Path | str) -> None:
    """Every nbgrader setting the course runs with, on config ``c`` (a course's ``grader/nbgrader_config.py`` and the
    package's default both call this). ``default_root``: the course folder unless ``c.DTLabs.course_root`` or
    ``DTLABS_COURSE_ROOT`` names another; a run ``run_nbgrader`` starts names its own (``child_config``)."""
    from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import (
        AssignLatePenalties, CheckCellMetadata, GetGrades, IgnorePattern, LimitOutput, SaveAutoGrades,
    )

    from lab_utils import settings
    from lab_utils.grading.export.csvfile import GradesCsvExporter
    from lab_utils.grading.boundary.inert import InertNotebook
    from lab_utils.grading.export.late import DueDates
    from lab_utils.grading.feedback import HideHiddenTests
    from lab_utils.grading.split.execute import SplitExecute, execution_config

    dt = settings.load(c)
    for key, value in course_directory(os.path.abspath(dt.course_root or default_root)).items():
        setattr(c.CourseDirectory, key, value)
    c.CourseDirectory.course_id = c.CourseDirectory.get("course_id", "dtlabs") or "dtlabs"
    c.CourseDirectory.source_directory = "solutions"
    c.CourseDirectory.release_directory = "labs"
    for name in ("submitted", "autograded", "feedback", "solution", "source_with_tests"):
        setattr(c.CourseDirectory, f"{name}_directory", str(WORK / name))
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
            AssignLatePenalties, CheckCellMetadata, InertNotebook,
        ]
    # Feedback must not show hidden tests (feedback.py); in the config, it applies to `nbgrader generate_feedback`
    # and the formgrader alike.
    c.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTests, InertNotebook, CSSHTMLHeaderPreprocessor]
    # Feedback pages carry a Content-Security-Policy that runs no script (the formgrader's responses get theirs from
    # the server extension in grader/jupyter_server_config.d/dtlabs.json): boundary/inert.py
    c.GenerateFeedback.exporter_class = "lab_utils.grading.feedback.FeedbackPage"
    # Nothing a submission wrote runs in a page (boundary/inert.py): autograded/ is inert (InertNotebook, last in
    # autograde above), and every page nbgrader renders from it (the formgrader's, the feedback) makes it inert again
    # and has nbconvert clean its outputs.
    c.HTMLExporter.preprocessors = [InertNotebook]
    c.HTMLExporter.sanitize_html = True
    # `nbgrader export` (grades.csv): every field quoted, no cell a spreadsheet formula (export/csvfile.py); nbgrader's
    # CsvExportPlugin quotes nothing, so an id with a comma and a newline forged a row
    c.ExportApp.plugin_class = GradesCsvExporter


@dataclass
class NbgraderRun:
    args: list
    returncode: int
    output: str
    seconds: float
    timed_out: bool = False
    reaped: list = field(default_factory=list)


def nbgrader_env(course_root: Path | str, config_root: Path | str | None = None, leave_out=()) -> dict:
    """The environment nbgrader needs for ``course_root``: the configuration of ``config_root`` (the course whose
    settings apply; by default ``course_root`` itself) on the Jupyter config path, this venv's tools on PATH, and
    none of ``leave_out`` (``child_config``)."""
    env = {k: v for k, v in os.environ.items() if k not in leave_out}
    conf = config_dir(config_root if config_root is not None else course_root)
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (str(conf), env.get("JUPYTER_CONFIG_PATH")) if p)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # nbgrader runs `alembic`
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return env


def reap(token: str, grace_s: float = 0.0, var: str = TOKEN_VAR) -> list[str]:
    """Kill every process carrying ``var=token``; returns what was killed."""
    return processes.reap_token(token, var, grace_s)


def processes_with_token(token: str, exclude=(), var: str = TOKEN_VAR) -> list:
    return processes.with_token(token, var, exclude)


def run_nbgrader(args, *, course_root=None, settings=None, timeout=None, echo=False, env_extra=None,
                 config_root=None) -> NbgraderRun:
    """``nbgrader ARGS`` for a course root (``find_course_root`` by default) with the settings of ``config_root``
    (default: the same course) and those of the command's ``settings`` that came from flags, under a wall-clock
    limit; every process it left is reaped. Without ``settings`` (no command: a test, a tool), nbgrader reads its
    own from the config and the environment, and this process reads none of the course's config."""
    from lab_utils import settings as dtlabs

    course_root = find_course_root(course_root)
    (course_root / WORK).mkdir(parents=True, exist_ok=True)  # sqlite does not create folders
    token = uuid.uuid4().hex
    flags, leave_out = child_config(course_root, settings)
    env = nbgrader_env(course_root, config_root, leave_out)
    env.update(env_extra or {})
    env[TOKEN_VAR] = token
    # The run's own temp folder, removed below: a run killed at its limit never gets to remove what it made there
    # (the kernel's and the subject's folders, SplitExecute.split). What a grading killed outright left (this folder,
    # and its other scratch folders) the next run removes first.
    grading_scratch.remove_orphans(env.get("TMPDIR"))
    run_tmp = grading_scratch.make("dtlabs-run-", dir=env.get("TMPDIR"))
    env["TMPDIR"] = run_tmp
    dt = settings if settings is not None else dtlabs.load()  # load: the environment's
    if dt.warm_kernels and args and str(args[0]) in ("autograde", "validate"):  # kernels fork from our server
        from lab_utils.warm import shared_env

        env.update(shared_env(env))
    cmd = [sys.executable, "-m", "nbgrader", *map(str, args), *flags]
    start = time.monotonic()
    proc = _warm_run(cmd[3:], env, str(course_root), dt.warm_nbgrader)
    if proc is None:
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
        shutil.rmtree(run_tmp, ignore_errors=True)
    return NbgraderRun(cmd[3:], proc.returncode, "".join(lines), time.monotonic() - start, timed_out, reaped)


# ------------------------------------------------------------------------------------------ warm start
# Imported once by the server: nbgrader's entry point and what the course's config and SplitExecute import.
_PRELOAD = ("nbgrader.apps.nbgraderapp", "nbgrader.preprocessors", "nbconvert.preprocessors",
            "lab_utils.grading.split.execute", "lab_utils.grading.feedback", "lab_utils.grading.export.late",
            "lab_utils.grading.export.csvfile")


NBGRADER = warm.Kind("nbgrader", "nbgrader", _PRELOAD, "lab_utils.grading.nbgrader_run:run_forked",
                     prepare="lab_utils.grading.nbgrader_run:_alembic_head_once")


def stop_warm_server() -> None:
    """Stop this process's warm nbgrader server, if any (the next run starts a fresh one); runs in flight stop too."""
    warm.stop_servers(NBGRADER)


def _warm_run(args, env: dict, cwd: str, enabled: bool) -> warm.WarmChild | None:
    """``nbgrader ARGS`` forked by this process's warm server (``lab_utils.warm``, started on first
    use), or None: warm start is off (``enabled``: ``c.DTLabs.warm_nbgrader``), or the server cannot run (the caller
    then starts nbgrader cold). The run leads its own session, so ``killpg(pid)`` stops it and what it started, as
    with ``start_new_session=True``."""
    if not enabled or sys.version_info < (3, 11) or not sys.platform.startswith("linux"):
        return None  # -P (nothing before sys.path) is 3.11's; /proc and PR_SET_PDEATHSIG are Linux's
    try:
        run, r = warm.fork_with_pipe(NBGRADER, list(args), env, cwd)
    except warm.Refused:
        return None
    run.stdout = open(r, "r", errors="replace")
    return run


def alembic_head() -> str:
    """The schema revision nbgrader stamps a new gradebook with, from alembic's API: what ``alembic heads`` prints
    first, which nbgrader's ``get_alembic_version`` runs as a whole process for every gradebook it creates."""
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR

    return ScriptDirectory(ALEMBIC_DIR).get_current_head()


def _alembic_head_once() -> None:
    """Runs forked from the server create gradebooks (a new course's first ``generate_assignment``) with the head the
    server found once, instead of an ``alembic`` process each; where nbgrader's hook is missing, it is left alone."""
    try:
        import nbgrader.api

        if callable(getattr(nbgrader.api, "get_alembic_version", None)):
            head = alembic_head()
            nbgrader.api.get_alembic_version = lambda: head
    except Exception:  # noqa: BLE001 - a run then asks alembic itself, as nbgrader does
        pass


def run_forked(request: dict) -> None:
    """In the child the warm server forked: ``python -m nbgrader ARGS`` in the run's folder (first on ``sys.path``,
    as ``-m`` puts it) and environment (set by ``warm.forked._become``); it ends as nbgrader does (SystemExit)."""
    from nbgrader.apps.nbgraderapp import NbGraderApp

    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    sys.path.insert(0, request["cwd"])
    sys.argv = ["nbgrader", *request["argv"]]
    NbGraderApp.launch_instance(request["argv"])
