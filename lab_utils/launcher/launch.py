"""Run a function on N local ranks of a real ``torch.distributed`` process group, from a notebook cell.

    results = launch(fn, world_size=2, backend="auto", timeout=120, args=(), kwargs={})

What it promises, and how:
- Notebook-defined functions work: ``fn`` and its arguments travel by value with cloudpickle.
- Fast and fork-safe: ranks are forked from a warm *zygote* (``zygote``) that imported torch but never CUDA,
  never runs student code and holds no threads; the notebook process itself is never forked.
- No port races: this process hosts the rendezvous ``TCPStore`` on port 0 and hands the bound port to the ranks
  (``group.RankGroup``), so any number of notebooks on one machine launch at once.
- torchrun's environment: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT`` (and ``TORCHELASTIC_USE_AGENT_STORE`` so ``env://`` code joins our store).
- Output streams live into the cell as ``[rank k] ...``, printed from the calling thread.
- Failures are loud and short (``diagnostics`` words them): a rank that raises stops the others at once and the
  call raises ``RankFailedError`` naming the root-cause rank with its remote traceback; a rank stuck past
  ``timeout`` gets its Python stack dumped into ``RankTimeoutError`` before everything is killed.
- Nothing survives: ranks are their own process groups, die with the zygote, and the zygote dies with this process.
- ``traffic=Traffic()``: the ranks' process group is the launcher's relay (``relay``), so every message they send
  is counted here, in a process that runs none of their code.

Grading runs ranks elsewhere: it installs a *remote* (``set_remote``) and ``launch`` / ``run_as_student`` hand their
work to it. The launcher never imports grading code.
"""
from __future__ import annotations

from lab_utils.launcher.diagnostics import LaunchError, RankFailedError, RankTimeoutError
from lab_utils.launcher.group import RankGroup, validate

__all__ = ["launch", "prewarm", "shutdown", "run_as_student", "set_remote", "remote",
           "LaunchError", "RankFailedError", "RankTimeoutError"]



def shutdown() -> None:
    """Stop this process's fork server (it also stops at exit); a later ``launch`` starts a new one."""
    from lab_utils.launcher import zygote

    zygote.shutdown()

# ------------------------------------------------------------------------------------------ the remote hook
_remote = None


def set_remote(remote) -> None:
    """Hand every later ``launch`` and ``run_as_student`` of this process to ``remote`` (None: run them here).

    ``remote`` has ``launch(fn, world_size, backend, timeout, args, kwargs, debug=, quiet=, traffic=)`` and
    ``run(fn, args, kwargs)``. Grading installs one in its kernel, so that ranks start inside the submission's
    sandbox and harnesses run next to the student's objects, never in the grader."""
    global _remote
    _remote = remote


def remote():
    """The installed remote, or None."""
    return _remote


def run_as_student(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` where the student's code lives; return its (plain-data) result.

    Use it in test cells for anything stateful with student objects (instantiate a student class, let a student
    function change a model in place): write a top-level harness that does the work and returns tensors,
    numbers, strings or lists/tuples/dicts of them, and take the verdict on what comes back. Outside grading it is
    a plain call.
    """
    if _remote is None:
        return fn(*args, **kwargs)
    return _remote.run(fn, args, kwargs)


# ------------------------------------------------------------------------------------------ launching
def prewarm(wait: bool = False, timeout: float = 120) -> bool:
    """Start the warm fork server now; it imports torch and the distributed stack in the background.

    Call it in a notebook's first cell so the first ``launch`` is quick. ``wait=True`` blocks until every
    warm-up import is done (benchmarks use it). Returns whether the server is fully warm.
    """
    if _remote is not None:  # grading: this kernel starts no ranks (the student's process warms its own)
        return False
    from lab_utils.launcher import zygote

    z = zygote.get_zygote()
    if wait:
        z.warm.wait(timeout)
    return z.warm.is_set()


def pickler_class():
    """cloudpickle's pickler, keeping each code object's file name.

    cloudpickle 3.1.3 and later rename every function it sends by value to ``<dynamic-code>`` (for deterministic
    payloads); a rank's traceback would then show no line of the student's cell. Ours keeps the real name, so the
    rank's tracebacks and stack dumps point at ``Cell In[N], line L``."""
    import types
    from collections import ChainMap

    import cloudpickle
    from cloudpickle import cloudpickle as impl

    def code_reduce(code):
        make, args = impl._code_reduce(code)
        return make, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)

    class Pickler(cloudpickle.CloudPickler):
        dispatch_table = ChainMap({types.CodeType: code_reduce}, cloudpickle.CloudPickler.dispatch_table)

    return Pickler


def dumps(obj) -> bytes:
    """``obj`` pickled by ``pickler_class()``."""
    import io
    import pickle

    buf = io.BytesIO()
    pickler_class()(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def pickle_payload(fn, args, kwargs) -> bytes:
    """``(fn, args, kwargs)`` as the ranks receive them, or a TypeError that says what cannot travel."""
    try:
        return dumps((fn, tuple(args), dict(kwargs)))
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same thing to a student
        name = getattr(fn, "__name__", repr(fn))
        raise TypeError(
            f"cannot send {name}() and its arguments to the ranks: {type(exc).__name__}: {exc}. "
            "Everything a rank needs travels by pickle: define it in a cell or a module, and create open "
            "files, locks, sockets or CUDA tensors inside the function instead of capturing them."
        ) from exc


_banner_seen: set = set()


def launch(
    fn,
    world_size: int = 2,
    backend: str = "auto",
    timeout: float | None = 120,
    args=(),
    kwargs=None,
    *,
    debug: bool = False,
    quiet: bool = False,
    traffic=None,
):
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks of an initialised process group.

    Returns the per-rank return values in rank order (tensors come back on the CPU). ``debug=True`` sets
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, which reports mismatched collectives at once instead of hanging.
    ``traffic``: a ``Traffic`` that records every message the ranks send (their process group is then the
    launcher's relay instead of ``backend``). Raises ``RankFailedError`` or ``RankTimeoutError``; bad arguments
    raise before anything starts.
    """
    kwargs = {} if kwargs is None else kwargs
    if _remote is not None:  # grading: the ranks start inside the submission's sandbox, never from here
        return _remote.launch(fn, world_size, backend, timeout, args, kwargs, debug=debug, quiet=quiet,
                              traffic=traffic)
    validate(fn, world_size, timeout)
    payload = pickle_payload(fn, args, kwargs)
    relay = traffic.start(world_size) if traffic is not None else None
    try:
        group = RankGroup(world_size, backend, timeout, payload=payload, debug=debug, relay=relay)
        if not quiet and (group.backend, group.reason) not in _banner_seen:
            _banner_seen.add((group.backend, group.reason))
            print(f"[launch] {world_size} ranks, {group.reason}", flush=True)
        try:
            return group.supervise(timeout=timeout)
        except LaunchError as exc:
            # End the cell's traceback at the student's `launch(...)` line: the supervisor's frames teach nothing,
            # and the message already carries the failing rank's own traceback.
            raise exc.with_traceback(None) from None
        finally:
            group.close()
    finally:
        if relay is not None:
            relay.stop()
