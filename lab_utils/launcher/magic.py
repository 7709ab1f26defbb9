"""``%%distributed``: persistent ranks that keep their variables from one notebook cell to the next.

    %load_ext lab_utils
    %dist start -n 2            # [--backend auto] [--timeout 60] [--debug]
    %%distributed               # runs the cell on every rank; `rank`, `world_size`, `torch`, `dist` are predefined
    t = torch.ones(2) * rank
    dist.all_reduce(t)
    t                           # the last expression is shown per rank
    %%rank 0                    # only on the ranks listed
    %dist pull t                # [t on rank 0, t on rank 1] (plain data: tensors, numbers, lists, dicts)
    %dist status | %dist restart | %dist stop

The ranks are a ``group.RankGroup``, forked from the launcher's warm zygote like ``launch``'s, so they are as
fork-safe; each runs ``worker.serve_cells``: receive a cell, run it in the rank's own namespace, send the result back.
Output streams live as ``[rank k] ...``; figures a rank draws come back as PNG. Failures say what happened to
the group:
- Interrupt (the kernel's stop button) sends SIGINT to every rank: Python code stops with KeyboardInterrupt
  and the variables are kept; a rank that does not stop within 2 s (stuck in a collective, inside C++) means
  the group is torn down and restarted, and every rank's variables are lost (said in the cell).
- A rank that raises: its traceback, as ``launch`` shows it; ranks still running are interrupted the same way.
- A rank that waits past the cell's timeout (a collective not every rank entered) is named with the
  operation and the line; the group is then restarted (state lost), since a rank stuck in gloo cannot be freed.
- A rank that dies: its exit is reported and the group is stopped; ``%dist start`` or ``%dist restart``.
"""
from __future__ import annotations

import argparse
import atexit
import shlex
import time

from lab_utils.launcher import diagnostics
from lab_utils.launcher.diagnostics import LaunchError, RankFailedError, RankTimeoutError
from lab_utils.launcher.events import RankState
from lab_utils.launcher.group import RankGroup

DEFAULT_TIMEOUT = 60.0
START_TIMEOUT = 120.0
INTERRUPT_WAIT_S = 2.0
DEBUG_HINT = "%dist restart --debug reports mismatches at once"

__all__ = ["DistributedGroup", "load_ipython_extension", "unload_ipython_extension"]


def _say(text: str) -> None:
    print(f"[dist] {text}", flush=True)


class DistributedGroup:
    """``world_size`` persistent ranks in one process group (a ``RankGroup`` running ``worker.serve_cells``),
    each with its own namespace; what to do when a cell fails, is interrupted or hangs."""

    def __init__(self, world_size: int = 2, backend: str = "auto", timeout: float | None = DEFAULT_TIMEOUT,
                 debug: bool = False):
        import cloudpickle

        from lab_utils.launcher import worker
        from lab_utils.launcher.group import validate

        validate(worker.serve_cells, world_size, timeout)
        self.world_size, self.requested_backend, self.timeout, self.debug = world_size, backend, timeout, debug
        payload = cloudpickle.dumps((worker.serve_cells, (), {}))
        self.group = RankGroup(world_size, backend, timeout, payload=payload, debug=debug, persistent=True,
                               store_timeout=START_TIMEOUT,
                               env={"MPLBACKEND": "Agg"})  # figures are drawn off-screen and sent back as PNG
        self.reason = self.group.reason
        try:
            self.group.supervise(timeout=START_TIMEOUT)  # each rank says "ready"
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------------------------------ requests
    @property
    def ranks(self):
        return self.group.ranks

    @property
    def pids(self) -> list:
        return self.group.pids

    @property
    def closed(self) -> bool:
        return self.group.closed

    def alive(self) -> bool:
        return self.group.alive()

    def run_cell(self, source: str, ranks=None, timeout: float | None = None, filename: str | None = None):
        """Run ``source`` on ``ranks`` (default: all); returns each rank's {"repr", "figures"} in rank order."""
        filename = filename or f"<distributed-cell-{time.monotonic_ns()}>"
        return self._request(ranks, {"op": "exec", "source": source, "filename": filename}, timeout)

    def pull(self, name: str, ranks=None, timeout: float | None = None) -> list:
        """The value of ``name`` on each rank (plain data only: tensors, numbers, strings, lists/dicts of them)."""
        from lab_utils.launcher import plaindata

        return [plaindata.decode(v) for v in self._request(ranks, {"op": "pull", "name": name}, timeout)]

    def _targets(self, ranks):
        return self.group.targets(ranks)

    def _request(self, ranks, req, timeout):
        import cloudpickle

        if not self.alive():
            raise LaunchError("the group is stopped: run %dist start (or %dist restart) for a fresh one")
        targets = self._targets(ranks)
        timeout = self.timeout if timeout is None else timeout
        self.group.send(targets, cloudpickle.dumps(req))
        try:
            values = self.group.supervise(targets, timeout, DEBUG_HINT)
            self.group.wait_cell_ends(targets)
            return values
        except KeyboardInterrupt:
            self._interrupt(targets, "interrupted")
            raise
        except RankTimeoutError:
            self.restart("ranks stuck in a collective cannot be freed")
            raise
        except RankFailedError:
            if any(rk.state is RankState.EXITED for rk in self.ranks):
                self.close()
                _say("a rank died, so the group was stopped: %dist start (or %dist restart) starts a fresh one.")
            else:
                self._interrupt(targets, "stopped after the failure")
            raise

    # ------------------------------------------------------------------------------------------ recovery
    def _interrupt(self, targets, why: str) -> None:
        """SIGINT to every rank still running; restart the group if one does not stop within 2 s."""
        running = self.group.interrupt(targets)
        try:
            self.group.settle(targets, INTERRUPT_WAIT_S)
        except KeyboardInterrupt:  # a second press while we wait: stop waiting
            pass
        stuck = [rk.rank for rk in targets if rk.state is RankState.RUNNING]
        for rk in running:
            if rk.state is RankState.ERROR and rk.error and rk.error.get("type") == "KeyboardInterrupt":
                _say(f"rank {rk.rank} {why} at {_where(rk.error)}")
        if stuck:
            self.restart(f"rank(s) {stuck} did not stop within {INTERRUPT_WAIT_S:g} s (stuck in a collective "
                         "or in C code)")
        elif running:
            _say("every rank stopped; their variables are kept.")

    def close(self) -> None:
        if hasattr(self, "group"):
            self.group.close(wait_s=1.0)

    def restart(self, reason: str | None = None) -> None:
        self.close()
        self.__init__(self.world_size, self.requested_backend, self.timeout, self.debug)
        if reason:
            _say(f"{reason}: the group was torn down and restarted with {self.world_size} fresh ranks; "
                 "every rank's variables were lost.")

    def status(self) -> str:
        lines = [f"{self.world_size} ranks, {self.reason}, cell timeout {self.timeout} s"
                 + ("" if self.alive() else " (stopped)")]
        for rk in self.ranks:
            lines.append(f"  rank {rk.rank}: pid {rk.pid}, {'alive' if rk.state is not RankState.EXITED else 'dead'}")
        return "\n".join(lines)


def _where(err: dict) -> str:
    frames = [f for f in err.get("frames", []) if "/lab_utils/" not in f[0]]
    if not frames:
        return "?"
    filename, lineno, name, _ = frames[-1]
    return f"{diagnostics.cell_name(filename)}, line {lineno}, in {name}"


# ---------------------------------------------------------------------------------------------- the magics
_group: DistributedGroup | None = None


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, add_help=False, exit_on_error=False)
    p.add_argument("-n", "--world-size", type=int, default=None)
    p.add_argument("--backend", default=None)
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--debug", action="store_true")
    return p


def _usage(msg: str):
    from IPython.core.error import UsageError

    return UsageError(msg)


def _show(results, ranks) -> None:
    try:
        from IPython.display import Image, display
    except ImportError:  # pragma: no cover - IPython is a dependency
        display = None
    for rk, res in zip(ranks, results):
        if res.get("repr") is not None:
            text = f"[rank {rk}] {res['repr']}"
            if display is not None:
                display({"text/plain": text}, raw=True)
            else:
                print(text)
        for png in res.get("figures", []):
            print(f"[rank {rk}] figure:", flush=True)
            if display is not None:
                display(Image(data=png, format="png"))


def _need_group() -> DistributedGroup:
    if _group is None:
        raise _usage("no ranks are running: start them with %dist start -n 2")
    return _group


def _short(exc: BaseException) -> BaseException:
    """End the cell's traceback at the magic: the supervisor's frames teach nothing (as ``launch`` does)."""
    return exc.with_traceback(None)


def dist_magic(line: str):
    """%dist start -n N [--backend auto] [--timeout S] [--debug] | stop | restart | status | pull NAME [--rank K ...]"""
    global _group
    words = shlex.split(line)
    if not words:
        raise _usage("usage: %dist start -n N | stop | restart | status | pull NAME")
    cmd, rest = words[0], words[1:]
    if cmd in ("start", "restart"):
        try:
            opts = _parser(f"%dist {cmd}").parse_args(rest)
        except (argparse.ArgumentError, SystemExit) as exc:
            raise _usage(f"%dist {cmd}: {exc}") from None
        old = _group
        if cmd == "start" and old is not None and old.alive():  # a re-run notebook: keep them, say so
            _say(f"{old.world_size} ranks are already running (pids {old.pids}): %dist restart replaces them, "
                 "%dist stop ends them")
            return None
        n = opts.world_size or (old.world_size if old else 2)
        backend = opts.backend or (old.requested_backend if old else "auto")
        timeout = opts.timeout or (old.timeout if old else DEFAULT_TIMEOUT)
        debug = opts.debug or (old.debug if old and not rest else False)
        if old is not None:
            old.close()
            _group = None
        try:
            _group = DistributedGroup(n, backend, timeout, debug)
        except LaunchError as exc:
            raise _short(exc) from None
        _say(f"{n} ranks started ({_group.reason}); pids {_group.pids}")
        return None
    if cmd == "stop":
        if _group is not None:
            _group.close()
            _group = None
            _say("ranks stopped")
        return None
    if cmd == "status":
        print(_group.status() if _group is not None else "[dist] no ranks running (%dist start -n 2)")
        return None
    if cmd == "pull":
        p = argparse.ArgumentParser(prog="%dist pull", add_help=False, exit_on_error=False)
        p.add_argument("name")
        p.add_argument("--rank", type=int, nargs="+", default=None)
        try:
            opts = p.parse_args(rest)
        except (argparse.ArgumentError, SystemExit) as exc:
            raise _usage(f"%dist pull: {exc}") from None
        try:
            return _need_group().pull(opts.name, opts.rank)
        except LaunchError as exc:
            raise _short(exc) from None
    raise _usage(f"%dist: unknown command {cmd!r} (start, stop, restart, status, pull)")


def _run_cell_magic(ranks, line: str, cell: str):
    p = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    p.add_argument("--timeout", type=float, default=None)
    try:
        opts, extra = p.parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, SystemExit) as exc:
        raise _usage(str(exc)) from None
    if extra:
        raise _usage(f"unexpected arguments {extra}")
    group = _need_group()
    source = "\n" + cell  # line 1 is the magic's line: error line numbers match the cell as shown
    filename = None
    try:
        ip = get_ipython()  # type: ignore[name-defined]  # noqa: F821
        filename = ip.compile.cache(source, ip.execution_count, raw_code=source)  # tracebacks say Cell In[N]
    except Exception:  # noqa: BLE001 - outside IPython
        pass
    targets = group._targets(ranks)
    try:
        results = group.run_cell(source, ranks, opts.timeout, filename)
    except LaunchError as exc:
        raise _short(exc) from None
    _show(results, [rk.rank for rk in targets])


def distributed_magic(line: str, cell: str):
    """%%distributed [--timeout S]: run the cell on every rank, in each rank's own persistent namespace."""
    _run_cell_magic(None, line, cell)


def rank_magic(line: str, cell: str):
    """%%rank 0 2 [--timeout S]: run the cell on the listed ranks only."""
    words = shlex.split(line)
    ranks = []
    while words and words[0].lstrip("-").isdigit() and not words[0].startswith("-"):
        ranks.append(int(words.pop(0)))
    if not ranks:
        raise _usage("%%rank needs the ranks to run on, e.g. %%rank 0 or %%rank 0 2")
    _run_cell_magic(ranks, " ".join(words), cell)


def _stop_at_exit() -> None:
    global _group
    if _group is not None:
        _group.close()
        _group = None


def load_ipython_extension(ipython) -> None:
    ipython.register_magic_function(dist_magic, "line", "dist")
    ipython.register_magic_function(distributed_magic, "cell", "distributed")
    ipython.register_magic_function(rank_magic, "cell", "rank")
    atexit.register(_stop_at_exit)


def unload_ipython_extension(ipython) -> None:
    _stop_at_exit()
