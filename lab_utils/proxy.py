"""The grader's side of split execution: student definitions seen across a process boundary.

In a student's own JupyterLab nothing is split: ``run_as_student(fn, *args)`` simply calls ``fn(*args)``.
Under grading (``dtlabs grade`` / ``dtlabs validate``) the cells a student can write run in a separate
*subject* process, and ``run_as_student`` ships ``fn`` (a test's harness, defined in a test cell) there, runs
it next to the student's live objects and returns its result as plain data.
"""
from __future__ import annotations

__all__ = ["run_as_student"]


def run_as_student(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` where the student's code lives; return its (plain-data) result.

    Use it in test cells for anything stateful with student objects (instantiate a student class, let a
    student function change a model in place): write a top-level harness that does the work and returns
    tensors, numbers, strings or lists/tuples/dicts of them, and take the verdict on what comes back.
    """
    return fn(*args, **kwargs)
