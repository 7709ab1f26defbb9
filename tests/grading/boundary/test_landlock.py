"""The subject's Landlock domain (``lab_utils.grading.boundary.landlock``): what a process of the same user can do to
the grader's processes without it, and cannot with it. The grader here is this test's child's parent, as the grader
kernel is the subject's parent when grading runs unprotected."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lab_utils.grading.boundary import landlock

CHILD = r"""
import ctypes, json, os, sys
from lab_utils.grading.boundary import landlock
parent = os.getppid()
entered = landlock.scope_self() if sys.argv[1] == "scoped" else None
seen = {}
try:
    with open(f"/proc/{parent}/mem", "rb"):
        seen["memory"] = "opened"
except OSError as exc:
    seen["memory"] = exc.strerror
try:
    os.kill(parent, 0)
    seen["signal"] = "sent"
except OSError as exc:
    seen["signal"] = exc.strerror
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(0x4206, parent, 0, 0) == 0:  # PTRACE_SEIZE: traced without stopping it
    seen["trace"] = "attached"
    libc.ptrace(17, parent, 0, 0)  # PTRACE_DETACH
else:
    seen["trace"] = os.strerror(ctypes.get_errno())
print(json.dumps({"entered": list(entered) if entered else None, "seen": seen}))
"""


def _child(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_subject_in_its_domain_can_neither_trace_nor_signal_the_grader():
    version, why = landlock.abi()
    if not version:
        pytest.skip(why)
    control = _child("open")["seen"]
    assert control == {"memory": "opened", "signal": "sent", "trace": "attached"}, (
        f"without the domain a child of the same user reaches its parent: the control should show it ({control})")
    scoped = _child("scoped")
    assert scoped["entered"] == [version, None], scoped
    assert scoped["seen"]["memory"] != "opened" and scoped["seen"]["trace"] != "attached", scoped
    if version >= 6:
        assert scoped["seen"]["signal"] != "sent", scoped


def test_the_subject_enters_its_domain_before_any_cell_runs():
    """The subject's entry point, read: scope_self comes before the rank server is forked and the shell exists."""
    import inspect

    from lab_utils.grading.split import subject

    src = inspect.getsource(subject.main)
    assert "landlock.scope_self()" in src
    assert src.index("landlock.scope_self()") < src.index("fork_zygote(") < src.index("Subject(")


@pytest.mark.slow
def test_doctor_grading_says_whether_the_subject_gets_its_domain(synthetic_course, tmp_path, monkeypatch):
    import shutil

    from helpers.synthetic import SYNTHETIC_LAB
    from lab_utils.grading import canary

    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    monkeypatch.setenv("DTLABS_SANDBOX", "unprotected")
    lines = []
    assert canary.doctor([SYNTHETIC_LAB], course_root=root, out=lines.append), "\n".join(lines)
    version, why = landlock.abi()
    expected = f"landlock    ABI {version}:" if version else f"landlock    none ({why})"
    assert any(line.startswith(expected) for line in lines), "\n".join(lines)
