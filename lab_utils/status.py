"""How a command ended: ``Status``, what every command's function returns, and ``Refused``, what it raises.

A function behind a ``dtlabs`` command says what happened (a ``Status``) or raises a typed error; only
``cli.main`` turns that into the process's exit code (``cli.ExitCode``), as nbgrader's apps and torch elastic's
launcher keep the exit code at the edge. Shared by every layer: the launcher's ``doctor`` returns one too.
"""
from __future__ import annotations

import enum


class Status(enum.Enum):
    """How a command ended."""

    DONE = "done"  # everything asked was done, and passed
    INCOMPLETE = "incomplete"  # done as far as it could be, and something did not pass: a submission NOT GRADED,
    #                            a failing test, a check that found a problem
    REFUSED = "refused"  # nothing (more) was done: bad input, no course, a machine that cannot grade


class Refused(RuntimeError):
    """A command cannot do what was asked; the message says why and what to do (``Status.REFUSED``)."""
