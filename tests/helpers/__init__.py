"""What the tests share besides fixtures: process-leak checks, the synthetic course and its graded class, the
lab summary, the order xdist runs the long tests in, and the helpers of the launcher, browser, cheat and known-wrong
tests. ``tests/`` is on pytest's ``pythonpath`` (pyproject.toml), so a test imports ``helpers.<module>``."""
from lab_utils import grading

REPO = grading.REPO_ROOT
