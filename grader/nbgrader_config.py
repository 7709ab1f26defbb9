"""nbgrader configuration for this course: ``solutions/`` is the source, ``labs/`` the release.

nbgrader 0.9 reads ``nbgrader_config.py`` only from the working directory or the Jupyter config path (``--config``
is ignored), so ``dtlabs`` runs nbgrader with ``JUPYTER_CONFIG_PATH=<course>/grader``. To run plain ``nbgrader``
yourself: ``JUPYTER_CONFIG_PATH=grader nbgrader <command> ...`` from the course folder.

Layout (relative to the course folder, the one holding this grader/ folder):
  solutions/NN_topic/NN_topic.ipynb     source (solutions + hidden tests)
  labs/NN_topic/NN_topic.ipynb          release (committed)
  grader/work/                          git-ignored instructor state:
    submitted/<student>/NN_topic/       collected submissions (nbgrader's layout)
    autograded/ feedback/ gradebook.db  nbgrader's outputs
Every nbgrader setting the course needs (split execution, feedback without hidden tests, limits) is set by
``apply_nbgrader_config``; this file adds the course's own choices.
"""
import os
import sys

_COURSE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    from lab_utils.grading.nbgrader_run import apply_nbgrader_config
except ImportError:  # run outside the course venv: use the package in this course's checkout
    sys.path.insert(0, _COURSE)
    from lab_utils.grading.nbgrader_run import apply_nbgrader_config

c = get_config()  # noqa: F821 - provided by traitlets when it executes this file

# The course's settings (all of them, with their meaning: `dtlabs settings`), for example:
# c.DTLabs.cell_timeout = 180      # seconds a cell may run under autograde, validate and mutate
# c.DTLabs.memory_mb = 8192        # memory of one submission's processes while it is graded
# c.DTLabs.max_procs = 96          # processes one submission may have at once
# c.DTLabs.sandbox = "bwrap"       # refuse to grade where bubblewrap cannot build a sandbox
c.CourseDirectory.course_id = "dtlabs"

apply_nbgrader_config(c, _COURSE)
# sqlite creates no folder: plain `nbgrader collect` in a fresh clone would fail "unable to open database file"
try:
    os.makedirs(os.path.join(c.CourseDirectory.root, "grader", "work"), exist_ok=True)
except OSError:  # a course this user cannot write: nbgrader says what it cannot open
    pass
