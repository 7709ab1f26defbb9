"""The grader kernel's IPython hooks while it grades: ``%%student`` (a cell that runs in the subject, its names bound
here as proxies or plain data), and before/after each cell (hidden tests noted, shared course cells run over there
first and their names remembered). Each hook works on the ``GradingSession`` it was installed for."""
from __future__ import annotations

import builtins
import functools

from lab_utils.grading.split import crossing
from lab_utils.grading.split.students import StudentProxy, StudentValue
from lab_utils.launcher import plaindata

_PROTECTED_EXTRA = {"In", "Out", "get_ipython", "exit", "quit"}


def install(shell, session) -> None:
    """``%%student`` and the cell hooks, for ``session``, in ``shell``."""
    shell.register_magic_function(functools.partial(student_cell, session), magic_kind="cell", magic_name="student")
    shell.events.register("pre_run_cell", functools.partial(before_cell, session))
    shell.events.register("post_run_cell", functools.partial(after_cell, session))


def bind_names(session, ns: dict, names: dict) -> None:
    """Bind what a student cell defined, unless the course's own cells own that name."""
    for name, info in names.items():
        if name.startswith("_") or name in _PROTECTED_EXTRA or hasattr(builtins, name) or not name.isidentifier():
            continue
        current = ns.get(name, None)
        if (name in ns and not isinstance(current, (StudentProxy, StudentValue))
                and name not in session.student_values):
            continue  # a course name (import, check, reference, test helper): never replaced
        if info.get("kind") in ("callable", "class"):
            ns[name] = StudentProxy(name, info["kind"], session)
            session.student_values.discard(name)
        elif "plain" in info:
            ns[name] = plaindata.decode(info["plain"])
            session.student_values.add(name)
        else:
            ns[name] = StudentValue(name, info.get("type", "?"), session)
            session.student_values.discard(name)


def student_cell(session, line, cell):
    """``%%student``: run this cell in the student's process (the grading executor adds it to answer cells)."""
    from IPython import get_ipython

    reply = session.running().request({"op": "run_cell", "source": cell})
    bind_names(session, get_ipython().user_ns, reply.get("names") or {})
    if not reply.get("ok"):
        exc = crossing.remote_exception(reply, session.hidden)
        raise exc.with_traceback(None) from None


def before_cell(session, info) -> None:
    """Note whether the cell holds hidden tests; a course cell that student code also needs (imports, parameters,
    helpers) runs over there first."""
    from lab_utils.grading.course import HIDDEN_MARKERS

    session.cell.hidden = session.cell.hidden or HIDDEN_MARKERS[0] in (info.raw_cell or "")
    session.cell.dropped = False
    if session.subject is None or info.raw_cell not in session.shared_sources:
        return
    from IPython import get_ipython

    before = session.shared_before
    before.clear()
    before.update({k: id(v) for k, v in get_ipython().user_ns.items()})
    before["__running__"] = 1
    reply = session.subject.request({"op": "run_cell", "source": info.raw_cell, "quiet": True})
    if not reply.get("ok"):  # what it said stays out once hidden tests have run: see crossing.remote_exception
        print("(in the student's process this cell failed" + (")" if session.hidden else
                                                              f": {reply.get('ename')}: {reply.get('evalue')})"))


def after_cell(session, result) -> None:
    """Remember what a shared cell defined here (see ``GradingSession.dumps``)."""
    if not session.shared_before.pop("__running__", None):
        return
    from IPython import get_ipython

    for k, v in get_ipython().user_ns.items():
        if not k.startswith("_") and session.shared_before.get(k) != id(v):
            session.shared_names.add(k)
