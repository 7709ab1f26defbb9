"""Running the ``nbgrader`` command for a course root: its config found, a wall-clock limit, nothing left behind.

nbgrader reads ``nbgrader_config.py`` only from the working directory or the Jupyter config path (``--config``
is ignored), so every call runs with ``JUPYTER_CONFIG_PATH=grader/``; ``DTLABS_COURSE_ROOT`` points the same
layout at a scratch course. Every run carries a fresh token in its environment; afterwards every process still
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
from lab_utils.grading.course import GRADER_DIR, REPO_ROOT, WORK

TOKEN_VAR = "DTLABS_GRADING_TOKEN"


@dataclass
class NbgraderRun:
    args: list
    returncode: int
    output: str
    seconds: float
    timed_out: bool = False
    reaped: list = field(default_factory=list)


def nbgrader_env(course_root: Path | str | None = None, cell_timeout: int | None = None) -> dict:
    """The environment nbgrader needs: our config on the Jupyter config path, this venv's tools on PATH."""
    env = dict(os.environ)
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (str(GRADER_DIR), env.get("JUPYTER_CONFIG_PATH")) if p)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # nbgrader runs `alembic`
    env["DTLABS_COURSE_ROOT"] = str(Path(course_root or REPO_ROOT).resolve())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    if cell_timeout is not None:
        env["DTLABS_CELL_TIMEOUT"] = str(int(cell_timeout))
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return env


def reap(token: str, grace_s: float = 0.0, var: str = TOKEN_VAR) -> list[str]:
    """Kill every process carrying ``var=token``; returns what was killed."""
    return processes.reap_token(token, var, grace_s)


def processes_with_token(token: str, exclude=(), var: str = TOKEN_VAR) -> list:
    return processes.with_token(token, var, exclude)


def run_nbgrader(args, *, course_root=None, cell_timeout=None, timeout=None, echo=False, env_extra=None) -> NbgraderRun:
    """``nbgrader ARGS`` for a course root, with a wall-clock limit; every process it left is reaped."""
    course_root = Path(course_root or REPO_ROOT).resolve()
    (course_root / WORK).mkdir(parents=True, exist_ok=True)  # sqlite does not create folders
    token = uuid.uuid4().hex
    env = nbgrader_env(course_root, cell_timeout)
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
