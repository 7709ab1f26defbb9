"""A grading's scratch folders in the temp folder (a submission's copy, the class's gradebook template, nbgrader's
run, the canary's course, a Gradescope run's): each named for the process that made it (``tempdirs.owned_tempdir``),
so that where a grading is killed outright (a scheduler's time limit, the OOM killer: no cleanup runs), the next one
removes what it left (``remove_orphans``, at the start of every nbgrader run) and nothing a live grading still uses."""
from __future__ import annotations

from lab_utils import tempdirs

PREFIXES = ("dtlabs-run-", "dtlabs-grade-", "dtlabs-template-", "dtlabs-canary-", "dtlabs-gradescope-")


def make(prefix: str, tag: str = "", dir: str | None = None) -> str:
    """A new scratch folder ``PREFIX<pid namespace>-<pid>-[TAG-]...``, 0700; its maker removes it when done."""
    if prefix not in PREFIXES:
        raise ValueError(f"{prefix!r} is not one of the grading's scratch prefixes {PREFIXES}")
    return tempdirs.owned_tempdir(prefix, tag, dir)


def remove_orphans(parent: str | None = None) -> list[str]:
    """Remove the scratch folders, in ``parent`` (default: the temp folder), of gradings of this pid namespace that
    are no longer running; returns what was removed."""
    return tempdirs.remove_orphaned_tempdirs(PREFIXES, [parent] if parent else None)
