"""Helpers every lab notebook imports: start real process groups from a cell, check answers, draw pictures.

``from lab_utils import launch`` is all most cells need; see ``lab_utils.launch`` for what it guarantees.
"""
from lab_utils.launch import LaunchError, RankFailedError, RankTimeoutError, launch, prewarm, shutdown
from lab_utils.proxy import run_as_student

__all__ = ["launch", "prewarm", "shutdown", "run_as_student", "LaunchError", "RankFailedError", "RankTimeoutError"]
__version__ = "0.1.0"
