"""A tiny synthetic nbgrader course (no torch: seconds to grade) and a class graded on it with a late policy, by
``dtlabs grade`` and by a Slurm-style ``grade-one`` + ``merge``: what the grading, export and report tests use."""
from __future__ import annotations

from pathlib import Path

from helpers import REPO
from helpers.known_wrong import read_known_wrong
from lab_utils import grading
from lab_utils.status import Status

SYNTHETIC_LAB = "00_synthetic"
HIDDEN_SOURCE = "add(-1, 1) == 0 and add(0.5, 0.25) == 0.75"  # must never reach a student


def make_synthetic_course(root: Path) -> Path:
    """A course with one tiny lab (no torch: seconds to grade) shaped like AUTHORING.md asks.

    ``add`` is the solution cell; ``test_add`` (2 points) has a visible and a hidden check (the hidden one's
    source line is HIDDEN_SOURCE, so tests can look for leaks); ``test_twice`` (1 point) checks ``twice``.
    The known-wrong ``ignores_sign`` passes the visible check and fails only the hidden one.
    """
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    def meta(gid, **kw):
        return {"nbgrader": {"schema_version": 3, "grade_id": gid, **kw}}

    cells = [
        new_markdown_cell("# Synthetic lab\nAfter this lab you can add two numbers.", id="intro"),
        new_code_cell(
            'WORLD_SIZE = 2\nBACKEND = "auto"\nSTEPS = 1\nSEED = 0', id="parameters",
            metadata={"tags": ["parameters"], **meta("parameters", grade=False, solution=False, locked=True)},
        ),
        new_code_cell(
            "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION\n\n\n"
            "def twice(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
            id="add-solution", metadata=meta("add", grade=False, solution=True, locked=False),
        ),
        new_code_cell(
            "assert add(1, 2) == 3, 'add(1, 2) should be 3'\n"
            "### BEGIN HIDDEN TESTS\n"
            f"assert {HIDDEN_SOURCE}, 'add is wrong for negative or fractional numbers'\n"
            "### END HIDDEN TESTS",
            id="test-add", metadata=meta("test_add", grade=True, solution=False, locked=True, points=2),
        ),
        new_code_cell(
            "assert twice(3) == 6, 'twice(3) should be 6'", id="test-twice",
            metadata=meta("test_twice", grade=True, solution=False, locked=True, points=1),
        ),
        new_markdown_cell("## Summary\nYou added numbers. Why does the order not matter?", id="summary"),
    ]
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    })
    d = Path(root) / "solutions" / SYNTHETIC_LAB
    d.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(d / f"{SYNTHETIC_LAB}.ipynb"))
    kw = Path(root) / "grader" / "known_wrong" / SYNTHETIC_LAB
    kw.mkdir(parents=True, exist_ok=True)
    (kw / "ignores_sign.py").write_text(
        "# replaces: add\n# loses: test_add\n# mistake: adds absolute values (right only for positive numbers)\n"
        "def add(a, b):\n    return abs(a) + abs(b)\n\n\ndef twice(x):\n    return 2 * x\n"
    )
    return Path(root)


LATE_POLICY = '''
import math
from nbgrader.plugins import LateSubmissionPlugin


class OnePointPerStartedDay(LateSubmissionPlugin):
    """The course's late policy: one point per started day past the due date."""

    def late_submission_penalty(self, student_id, score, total_seconds_late):
        return float(math.ceil(total_seconds_late / 86400))


c.AssignLatePenalties.plugin_class = OnePointPerStartedDay
c.DTLabs.due_dates = {"00_synthetic": "2030-01-10 12:00:00 UTC"}
'''
CLASS = {  # student -> (what they submitted, timestamp.txt or None, how it is graded)
    "ann": ("solution", "2030-01-09 10:00:00 UTC", "grade"),
    "cat": ("ignores_sign", "2030-01-10 11:00:00 UTC", "grade"),
    "dan": ("unreadable", None, "grade"),
    "eve": ("solution", "2030-01-10 18:00:00 UTC", "grade"),  # 6 hours late: one point
    "bob": ("release", None, "grade-one"),  # graded as a Slurm array task, then merged
}


def grade_class(base: Path) -> Path:
    """The synthetic course with a late policy in its config, and a class graded by `dtlabs grade` (four students)
    and `dtlabs grade-one` + `dtlabs merge` (bob): what the exports and the report are built from. Read only."""
    import shutil

    import nbformat

    from lab_utils import cli

    root = make_synthetic_course(base / "course")
    (root / "grader" / "nbgrader_config.py").write_text((REPO / "grader" / "nbgrader_config.py").read_text()
                                                        + LATE_POLICY)
    grading.release([SYNTHETIC_LAB], root=root)
    rel = nbformat.read(str(root / "labs" / SYNTHETIC_LAB / f"{SYNTHETIC_LAB}.ipynb"), as_version=4)
    src = nbformat.read(str(root / "solutions" / SYNTHETIC_LAB / f"{SYNTHETIC_LAB}.ipynb"), as_version=4)
    wrong = read_known_wrong(root / "grader" / "known_wrong" / SYNTHETIC_LAB / "ignores_sign.py")
    answers = {"solution": grading.fill_solutions(rel, src), "release": rel,
               "ignores_sign": grading.fill_solutions(rel, src, {wrong.replaces: wrong.source})}
    inbox, array = base / "inbox", base / "array"
    for student, (what, stamp, how) in CLASS.items():
        folder = (inbox if how == "grade" else array) / student / SYNTHETIC_LAB
        folder.mkdir(parents=True)
        if what == "unreadable":
            (folder / f"{SYNTHETIC_LAB}.ipynb").write_text("{ this is not a notebook")
        else:
            nbformat.write(answers[what], str(folder / f"{SYNTHETIC_LAB}.ipynb"))
    # the submission times come from the instructor (the LMS's), never from a student's own timestamp.txt
    times = base / "times.csv"
    times.write_text("student,timestamp\n" + "".join(f"{s},{stamp}\n" for s, (_, stamp, how) in CLASS.items()
                                                      if stamp and how == "grade"))
    lines = []
    code = grading.grade([SYNTHETIC_LAB], course_root=root, submissions_dir=inbox, feedback=False, out=lines.append,
                         progress=False, timestamps=times)
    assert code is Status.INCOMPLETE, "dan's notebook is unreadable: grade must say so\n" + "\n".join(lines)
    shutil.copytree(array, root / "grader" / "work" / "submitted", dirs_exist_ok=True)
    results = base / "results"
    array_students = [s for s, (*_, how) in CLASS.items() if how == "grade-one"]
    assert cli.main(["prepare-array", SYNTHETIC_LAB, *array_students, "--out", str(results),
                     "--course-root", str(root)]) == 0
    for task in range(len(array_students)):
        assert cli.main(["grade-one", SYNTHETIC_LAB, "--task", str(task), "--out", str(results),
                         "--course-root", str(root)]) == 0
    assert cli.main(["merge", str(results), "--course-root", str(root)]) == 0
    shutil.rmtree(results)
    return root
