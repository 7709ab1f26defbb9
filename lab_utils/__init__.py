"""Helpers every lab notebook imports: start real process groups from a cell, check answers, draw pictures.

``from lab_utils import launch`` is all most cells need; see ``lab_utils.launch`` for what it guarantees.
``%load_ext lab_utils`` adds ``%dist`` and ``%%distributed``: ranks that keep their variables across cells
(``lab_utils.distributed_magic``).
"""
from lab_utils.launch import LaunchError, RankFailedError, RankTimeoutError, launch, prewarm, shutdown
from lab_utils.proxy import run_as_student

__all__ = ["launch", "prewarm", "shutdown", "run_as_student", "LaunchError", "RankFailedError", "RankTimeoutError"]
__version__ = "0.1.0"


def load_ipython_extension(ipython):
    """``%load_ext lab_utils``: the ``%dist``, ``%%distributed`` and ``%%rank`` magics."""
    from lab_utils import distributed_magic

    distributed_magic.load_ipython_extension(ipython)


def unload_ipython_extension(ipython):
    from lab_utils import distributed_magic

    distributed_magic.unload_ipython_extension(ipython)
