"""The course package: real process groups from a notebook cell, the helpers the labs share, and the grading.

Three layers, each a subpackage named for its job; imports point one way (grading may use the launcher and the
lab kit, the launcher uses neither):

- ``lab_utils.launcher``: what a student's notebook imports to run ranks (``launch``, ``%%distributed``).
- ``lab_utils.labkit``: what the labs share (checks that explain, synthetic data and models, cost models, widgets,
  torchrun agents on loopback).
- ``lab_utils.grading``: what an instructor runs (nbgrader pipeline, split execution, sandbox, quality tools).

``from lab_utils import launch`` is all most cells need; ``%load_ext lab_utils`` adds ``%dist`` and
``%%distributed`` (``lab_utils.launcher.magic``). Importing this package loads no grading code.
"""
from lab_utils.launcher.diagnostics import LaunchError, RankFailedError, RankTimeoutError
from lab_utils.launcher.launch import launch, prewarm, run_as_student, shutdown
from lab_utils.launcher.relay import Traffic

__all__ = ["launch", "prewarm", "shutdown", "run_as_student", "Traffic", "LaunchError", "RankFailedError",
           "RankTimeoutError"]
__version__ = "0.1.0"


def load_ipython_extension(ipython):
    """``%load_ext lab_utils``: the ``%dist``, ``%%distributed`` and ``%%rank`` magics."""
    from lab_utils.launcher import magic

    magic.load_ipython_extension(ipython)


def unload_ipython_extension(ipython):
    from lab_utils.launcher import magic

    magic.unload_ipython_extension(ipython)
