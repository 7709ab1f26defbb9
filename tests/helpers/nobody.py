"""Another local user of the machine: ``eavesdrop.py`` run as user ``nobody`` on a Python that user can run (the course
venv's interpreter may live in a folder only root can enter, as /root/.pyenv does)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

EAVESDROP = Path(__file__).resolve().with_name("eavesdrop.py")
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
NOBODY = 65534


def why_not() -> str | None:
    """Why no process can be run as ``nobody`` here; None when one can."""
    if os.geteuid() != 0 or not SYSTEM_PYTHON:
        return "needs root (to run a process as nobody) and /usr/bin/python3 (a Python nobody can run)"
    return None


def eavesdrop(seconds: float, *needles: str) -> subprocess.Popen:
    """Start ``eavesdrop.py SECONDS NEEDLE...`` as ``nobody`` (its text on the command line: the checkout may be closed
    to that user); ``heard(proc)`` reads its verdict."""
    return subprocess.Popen([SYSTEM_PYTHON, "-I", "-c", EAVESDROP.read_text(), str(seconds), *needles], user=NOBODY,
                            group=NOBODY, extra_groups=[], cwd="/", stdout=subprocess.PIPE, text=True)


def heard(proc: subprocess.Popen, timeout: float = 60) -> dict:
    """The JSON ``eavesdrop.py`` printed: ``reached``, ``heard``, ``bytes``, ``uid``."""
    out, _ = proc.communicate(timeout=timeout)
    return json.loads(out)
