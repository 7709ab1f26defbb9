"""nbgrader configuration for the course: ``solutions/`` is the source, ``labs/`` the release.

nbgrader 0.9 reads ``nbgrader_config.py`` only from the working directory or the Jupyter config path
(``--config`` is ignored), so ``dtlabs`` (``lab_utils/grading/``) runs nbgrader with
``JUPYTER_CONFIG_PATH=<repo>/grader`` and every command works from the repo root. To run plain ``nbgrader``
yourself: ``JUPYTER_CONFIG_PATH=grader nbgrader <command> ...`` from the repo root.

Layout (relative to the course root, the repository by default):
  solutions/NN_topic/NN_topic.ipynb     source (solutions + hidden tests)
  labs/NN_topic/NN_topic.ipynb          release (committed)
  grader/work/                          git-ignored instructor state:
    submitted/<student>/NN_topic/       collected submissions (nbgrader's layout)
    autograded/ feedback/ gradebook.db  nbgrader's outputs
``c.DTLabs.course_root`` (or ``DTLABS_COURSE_ROOT``) points the same layout at another folder (the tests grade in
a temporary course).
"""
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    from lab_utils import settings
except ImportError:  # run outside the course venv: use the package beside this folder
    sys.path.insert(0, _REPO)
    from lab_utils import settings

c = get_config()  # noqa: F821 - provided by traitlets when it executes this file

# The course's own settings (lab_utils/settings.py lists them all; `dtlabs settings` prints them), e.g.:
# c.DTLabs.memory_mb = 8192        # memory of one submission's processes while it is graded
# c.DTLabs.max_procs = 96          # processes one submission may have at once
# c.DTLabs.sandbox = "bwrap"       # refuse to grade where bubblewrap cannot build a sandbox
_dt = settings.load(c)  # with the environment's overrides (DTLABS_COURSE_ROOT for a scratch course, ...)
ROOT = os.path.abspath(_dt.course_root or _REPO)
WORK = os.path.join("grader", "work")

c.CourseDirectory.root = ROOT
c.CourseDirectory.course_id = "dtlabs"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "labs"
c.CourseDirectory.submitted_directory = os.path.join(WORK, "submitted")
c.CourseDirectory.autograded_directory = os.path.join(WORK, "autograded")
c.CourseDirectory.feedback_directory = os.path.join(WORK, "feedback")
c.CourseDirectory.solution_directory = os.path.join(WORK, "solution")
c.CourseDirectory.source_with_tests_directory = os.path.join(WORK, "source_with_tests")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(ROOT, WORK, "gradebook.db")

# Per-cell execution limit for autograde and validate. nbgrader 0.9 reads Execute.timeout and ignores
# ExecutePreprocessor.timeout (nbgrader#1463). Lab cells call launch(..., timeout<=60), so a hanging rank
# is reported by the launcher well before this fires; this catches a hang in the kernel itself.
c.Execute.timeout = _dt.cell_timeout
# A cell that ran past its limit must cost that cell, not the notebook: nbgrader would otherwise drop the whole
# submission when the interrupted kernel's last outputs arrive late (seen on a loaded grader: 0/11 for Lab 05).
c.Execute.raise_on_iopub_timeout = False
c.Execute.interrupt_on_timeout = True
c.Execute.execute_retries = 0

# A submission for a student not yet in the gradebook is graded anyway (the student is created).
c.Autograde.create_student = True

# Split execution (lab_utils/grading/execute.py): the cells a student can write run in a sandboxed subject process,
# the tests in the kernel nbgrader starts, which never executes student code. Same list as nbgrader's default with
# SplitExecute in Execute's place.
# Feedback must not show hidden tests: nbgrader's feedback HTML renders the autograded cells, hidden regions
# included. HideHiddenTests (lab_utils/grading/feedback.py) strips them and redacts them from error output; being in
# the config, it applies to `nbgrader generate_feedback` and the formgrader alike.
from lab_utils.grading.feedback import HideHiddenTests
from lab_utils.grading.split.execute import SplitExecute
from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import (
    AssignLatePenalties, CheckCellMetadata, GetGrades, IgnorePattern, LimitOutput, SaveAutoGrades,
)

# DTLABS_BENCH_BASELINE=1 (benchmarks/bench_grading.py only) measures the old, unsafe path for comparison.
if not os.environ.get("DTLABS_BENCH_BASELINE"):
    c.Autograde.autograde_preprocessors = [
        SplitExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades, AssignLatePenalties,
        CheckCellMetadata,
    ]
c.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTests, CSSHTMLHeaderPreprocessor]
