"""What a submission can reach of the grader's processes where they are its own user's (unprotected grading): the
subject's Landlock domain (``lab_utils.grading.boundary.landlock``), shown against a control without it (the grader
there is the test's child's parent, as the grader kernel is the subject's), and the grader kernel's connection file,
gone before the subject starts."""
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


ANCESTOR_FILES = """
import json, os, psutil
found = {}
for p in psutil.Process().parents():
    argv = p.cmdline()
    if "-f" in argv[:-1]:
        found[argv[argv.index("-f") + 1]] = os.path.exists(argv[argv.index("-f") + 1])
open(OUT, "w").write(json.dumps(found))
"""


@pytest.mark.slow
def test_the_grader_kernels_connection_file_is_gone_before_the_subject_runs(synthetic_course, tmp_path, monkeypatch):
    """The file holds the key that signs every message to the kernel: read, it let a submission have the kernel run
    its code (grader/cheats/kernel_connection_file.py, where Landlock does not scope the kernel's sockets)."""
    import shutil

    import nbformat

    from helpers.synthetic import SYNTHETIC_LAB
    from lab_utils import grading

    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    rel = nbformat.read(str(root / "labs" / SYNTHETIC_LAB / f"{SYNTHETIC_LAB}.ipynb"), as_version=4)
    src = nbformat.read(str(root / "solutions" / SYNTHETIC_LAB / f"{SYNTHETIC_LAB}.ipynb"), as_version=4)
    out = tmp_path / "found.json"
    answer = next(c.source for c in src.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "add")
    probe = answer.replace("### BEGIN SOLUTION", "").replace("### END SOLUTION", "")
    probe += "\n\nOUT = " + repr(str(out)) + "\n" + ANCESTOR_FILES
    grading.submit(root, "probe", SYNTHETIC_LAB, grading.fill_solutions(rel, src, {"add": probe}))
    monkeypatch.setenv("DTLABS_SANDBOX", "unprotected")
    lines = []
    grading.grade([SYNTHETIC_LAB], course_root=root, jobs=1, feedback=False, out=lines.append, progress=False)
    found = json.loads(out.read_text())
    assert found, "the probe found no kernel with a connection file above it:\n" + "\n".join(lines)
    assert not any(found.values()), f"the subject could read the grader kernel's connection file: {found}"
