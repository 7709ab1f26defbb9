"""nbgrader's configuration for a folder without one of its own (a scratch course, a notebook outside a course):
the course package's defaults (``lab_utils.grading.nbgrader_run.apply_nbgrader_config``), rooted at the working directory
unless ``DTLABS_COURSE_ROOT`` names the course."""
import os

from lab_utils.grading.nbgrader_run import apply_nbgrader_config

c = get_config()  # noqa: F821 - provided by traitlets when it executes this file
apply_nbgrader_config(c, os.getcwd())
