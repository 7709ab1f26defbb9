"""The grading pipeline an instructor runs: nbgrader's own steps, composed for this course and made safe to trust.

| module / package | its one job                                                                              |
|------------------|------------------------------------------------------------------------------------------|
| course           | where a course keeps things; which labs exist                                            |
| nbgrader_run     | run the ``nbgrader`` command for a course root, with limits, leaving no process          |
| release          | ``labs/`` from ``solutions/`` (generate_assignment), reproducible notebooks              |
| build            | submissions built from the source (solution filled in, one answer swapped)              |
| batch            | ``dtlabs grade``: one sandbox and scratch course per submission, ``--jobs N``            |
| gradebook        | scores in, scores out; a scratch result merged into the course's gradebook               |
| guard            | without bubblewrap: what a submission changed in the course, put back and named          |
| sandbox          | the box a submission's code runs in: bubblewrap, or the fallback, with its limits        |
| feedback         | feedback HTML without hidden tests                                                       |
| validate         | the student's pre-submission check, with an exit code                                    |
| split/           | split execution: answers in the sandboxed subject, tests in the grader kernel            |
| quality/         | tests of the tests: answer swaps, mutation testing, stress under load                    |

May import ``lab_utils.launcher`` and ``lab_utils.labkit``; neither imports this package.
"""
from lab_utils.grading.batch import autograde, grade, grade_submission, prepare_template
from lab_utils.grading.build import fill_solutions, solution_cells, strip_solution_markers, submit, without_demos
from lab_utils.grading.course import (
    GRADER_DIR, HIDDEN_MARKERS, LAB_ID, REPO_ROOT, SOLUTION_MARKERS, WORK, GradingError, discover_labs, submissions,
)
from lab_utils.grading.gradebook import cell_scores, merge, read_grades_csv, register_students
from lab_utils.grading.nbgrader_run import TOKEN_VAR, NbgraderRun, nbgrader_env, processes_with_token, reap, run_nbgrader
from lab_utils.grading.release import notebook_problems, release
from lab_utils.grading.validate import validate


def __getattr__(name):  # the nbgrader preprocessors import nbgrader: only when asked for
    if name == "HideHiddenTests":
        from lab_utils.grading.feedback import HideHiddenTests

        return HideHiddenTests
    if name == "SplitExecute":
        from lab_utils.grading.split.execute import SplitExecute

        return SplitExecute
    raise AttributeError(f"module 'lab_utils.grading' has no attribute {name!r}")


__all__ = [
    "discover_labs", "release", "autograde", "grade", "grade_submission", "prepare_template", "validate", "reap",
    "processes_with_token", "run_nbgrader", "nbgrader_env", "NbgraderRun", "fill_solutions", "strip_solution_markers",
    "solution_cells", "submit", "without_demos", "cell_scores", "merge", "register_students", "read_grades_csv",
    "submissions", "notebook_problems", "GradingError", "HideHiddenTests", "SplitExecute", "REPO_ROOT", "GRADER_DIR",
    "WORK", "TOKEN_VAR", "LAB_ID", "SOLUTION_MARKERS", "HIDDEN_MARKERS",
]
