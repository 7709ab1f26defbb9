"""Due dates from the course config into the gradebook, so nbgrader's own late-submission plugin charges penalties.

nbgrader keeps a lab's due date in its gradebook (``nbgrader db assignment add LAB --duedate=...``), and every
submission is graded in a scratch course whose gradebook is a copy (``dtlabs grade``) or freshly made (``grade-one``
on a Slurm array, the Gradescope bundle), where a due date set by hand would be missing. ``DueDates`` runs first in
``Autograde.autograde_preprocessors`` (``nbgrader_run.apply_nbgrader_config``): it writes ``c.DTLabs.due_dates[lab]``
into the gradebook autograde uses, so nbgrader's ``AssignLatePenalties``, a few steps later, measures the
submission's ``timestamp.txt`` against it and asks the course's ``LateSubmissionPlugin`` for the penalty.
``gradebook.merge`` carries penalty and due date into the course's gradebook, where every export reads them.
"""
from __future__ import annotations

from nbgrader.preprocessors import NbGraderPreprocessor


def due_date(settings, lab: str):
    """``c.DTLabs.due_dates[lab]`` of ``settings`` (a ``settings.DTLabs``), parsed as nbgrader parses dates (None when
    the lab has none); a date nbgrader cannot read is a clear error."""
    from nbgrader.utils import parse_utc

    due = settings.due_dates.get(lab) if lab else None
    if not due:
        return None
    try:
        return parse_utc(due)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"c.DTLabs.due_dates[{lab!r}] = {due!r} is not a date nbgrader reads "
                         f"(e.g. '2025-10-01 23:59:00 UTC'): {exc}") from None


class DueDates(NbGraderPreprocessor):
    """Sets the lab's due date (``c.DTLabs.due_dates``) in the gradebook autograde is using."""

    def preprocess(self, nb, resources):
        from nbgrader.api import Gradebook

        info = resources.get("nbgrader") or {}
        lab, db_url = info.get("assignment"), info.get("db_url")
        from lab_utils import settings

        when = due_date(settings.load(self.config), lab)  # the run's config: the course's, and its flags
        if when and db_url:
            with Gradebook(db_url) as gb:
                gb.update_or_create_assignment(lab, duedate=when)
        return nb, resources

    def preprocess_cell(self, cell, resources, cell_index):
        return cell, resources
