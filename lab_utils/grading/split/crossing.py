"""What crosses between the grader and the subject, as pure functions: a reply turned into the exception the grader
raises, objects pickled for the subject, the output of a subject that died turned into a reason."""
from __future__ import annotations

import builtins
import pickle

from lab_utils.launcher import launch as launcher

HIDDEN_MESSAGE = "the submission's code raised {} (hidden tests have run: its message is not shown)"

# what a process says when the address-space limit stops it: Python and C++, and the dynamic loader (an extension
# module or library that cannot be mapped: often the first thing to fail under a small limit, and what it says of a
# noexec mount too)
_OUT_OF_MEMORY = (b"MemoryError", b"Cannot allocate memory", b"bad_alloc", b"out of memory")
_UNMAPPABLE = (b"failed to map segment from shared object", b"cannot map zero-fill pages")


class StudentError(RuntimeError):
    """The student's code raised something that is not a built-in exception; the message says what."""


def remote_exception(reply: dict, hidden: bool) -> BaseException:
    """An exception for the grader to raise: the built-in type the student raised (ValueError stays ValueError,
    so a test can expect it), or StudentError; its cell traceback is the student's own. Once hidden tests have run
    (``hidden``) its message and traceback are the grader's (``lab_utils.grading.split.proxy``)."""
    ename, evalue = reply.get("ename", "Error"), reply.get("evalue", "")
    launch_info = reply.get("launch")
    if launch_info is not None:
        from lab_utils.launcher.diagnostics import LaunchError, RankFailedError, RankTimeoutError

        if ename == "RankTimeoutError":
            stuck = [r for r in launch_info.get("stuck_ranks", []) if isinstance(r, int)]
            exc = RankTimeoutError("ranks of the submission did not finish in time (hidden tests have run: the "
                                   "details are not shown)" if hidden
                                   else evalue, stuck, {})
        elif ename == "RankFailedError":
            rank = launch_info.get("rank")
            exc = RankFailedError(f"rank {rank} of the submission failed (hidden tests have run: its error is not "
                                  "shown)" if hidden and isinstance(rank, int) else
                                  "a rank of the submission failed (hidden tests have run: its error is not shown)"
                                  if hidden else evalue, rank)
        else:
            exc = LaunchError("the submission's ranks failed (hidden tests have run: the error is not shown)" if hidden
                              else evalue)
    else:
        cls = getattr(builtins, ename, None)
        if isinstance(cls, type) and issubclass(cls, BaseException) and cls not in (SystemExit, GeneratorExit):
            try:
                exc = cls(HIDDEN_MESSAGE.format(cls.__name__) if hidden else evalue)
            except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs more arguments
                exc = StudentError(HIDDEN_MESSAGE.format(cls.__name__) if hidden else f"{ename}: {evalue}")
        else:  # the class name is the student's to choose: not even that is shown from a hidden test
            exc = StudentError(HIDDEN_MESSAGE.format("an exception") if hidden else f"{ename}: {evalue}")
    stb = [str(line) for line in reply.get("traceback") or []]
    if stb and not hidden:
        exc._render_traceback_ = lambda: stb  # IPython shows these lines instead of the grader's frames
    return exc


def dumps(obj, shared: dict) -> bytes:
    """The launcher's pickler (``launcher.launch.pickler_class``) for the subject. An object whose id is in
    ``shared`` ({id: name}: a function or class a shared course cell defined) travels by name and becomes the
    subject's own copy (same source, defined there too, so ``inspect.getsource`` works on it, as torchrun scripts
    need); everything else as cloudpickle sends it."""
    import io

    from lab_utils.grading.split import subject

    class _Pickler(launcher.pickler_class()):
        def reducer_override(self, o):
            name = shared.get(id(o))
            if name is not None:
                return subject.resolve, (name,)
            return super().reducer_override(o)

    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def memory_reason(tail: bytes, memory_mb) -> str | None:
    """Why a subject stopped, when the last of its output says the address-space limit stopped it; else None."""
    if not any(m in tail for m in _OUT_OF_MEMORY + _UNMAPPABLE):
        return None
    reason = (f"memory limit: a process of the submission could not allocate memory under the sandbox's "
              f"limit ({memory_mb} MB)")
    if any(m in tail for m in _UNMAPPABLE):
        reason += " (a library could not be mapped; if the limit is generous, look for a noexec mount)"
    return reason


def course_uses_torch(shared_sources) -> bool:
    """Whether the course's shared cells (which run on both sides) import torch: then both sides import it at
    start-up, side by side, and the subject forks its rank server from itself (``lab_utils.grading.split.subject.main``)."""
    return any("torch" in src for src in shared_sources)
