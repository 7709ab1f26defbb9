"""The grading pipeline an instructor runs: nbgrader's own steps, composed for this course and made safe to trust.

| module / package | its one job                                                                              |
|------------------|------------------------------------------------------------------------------------------|
| course           | where a course keeps things; which labs exist                                            |
| nbgrader_run     | run the ``nbgrader`` command for a course root, with limits, leaving no process          |
| release          | ``labs/`` from ``solutions/`` (generate_assignment), reproducible notebooks              |
| submission       | one submission graded in a scratch course of its own                                     |
| batch            | ``dtlabs grade``: a class, ``--jobs N`` at a time, behind the canary; merged, exported  |
| jobarray         | a class as a job array: prepare once, ``grade-one`` per task, one ``merge``              |
| canary           | the lab's solution and empty release graded first: a machine that cannot grade refuses  |
| gradebook        | scores in, scores out; a scratch result merged into the course's gradebook               |
| outcomes         | what a grading run said: reasons typed by whose they are; each run's record kept         |
| feedback         | feedback HTML without hidden tests                                                       |
| validate         | the student's pre-submission check, with an exit code                                    |
| scratch          | a grading's temp folders, named for their maker: the next run removes a killed one's     |
| boundary/        | the submission kept in: files copied as data, the sandbox, the unprotected mode's guard  |
| export/          | grades out: Gradescope autograder, Canvas CSV, late penalties, the class report          |
| split/           | split execution: answers in the sandboxed subject, tests in the grader kernel            |
| quality/         | tests of the tests: answer swaps, mutation testing, stress under load                    |

May import ``lab_utils.launcher`` and ``lab_utils.labkit``; neither imports this package.
"""
from lab_utils.grading.batch import autograde, grade
from lab_utils.grading.quality.build import fill_solutions, solution_cells, strip_solution_markers, submit, without_demos
from lab_utils.grading.course import (
    HIDDEN_MARKERS, LAB_ID, REPO_ROOT, SOLUTION_MARKERS, WORK, GradingError, discover_labs, find_course_root,
    submissions,
)
from lab_utils.grading.gradebook import cell_scores, merge, read_grades_csv, register_students
from lab_utils.grading.nbgrader_run import (
    TOKEN_VAR, NbgraderRun, config_dir, load_config, nbgrader_env, processes_with_token, reap, run_nbgrader,
)
from lab_utils.grading.release import notebook_problems, release
from lab_utils.grading.submission import grade_submission, prepare_template
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
    "submissions", "notebook_problems", "GradingError", "HideHiddenTests", "SplitExecute", "REPO_ROOT",
    "find_course_root", "config_dir", "load_config",
    "WORK", "TOKEN_VAR", "LAB_ID", "SOLUTION_MARKERS", "HIDDEN_MARKERS",
]
