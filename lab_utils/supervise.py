"""Watching running ranks from the calling thread: stream their output, collect results, decide when it is over.

Reader threads turn each rank's pipes into typed events on one queue (``Line``, ``Eof``, ``Result``; the
zygote client adds ``Exit``); ``supervise`` consumes them on the calling thread (ipykernel routes output from
background threads unreliably), moves each ``Rank`` through its ``RankState`` and returns the results or
raises the error ``diagnostics`` builds. Used by ``launch`` (one job per rank) and by the ``%%distributed``
magic (one cell at a time on persistent ranks).
"""
from __future__ import annotations

import enum
import queue
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from lab_utils import _wire, diagnostics, processes

FAILURE_GRACE_S = 0.3  # after a first failure, wait this long for the root cause (a signal death) to surface
EXIT_STATUS_WAIT_S = 3.0  # ... and at most this long for a dead rank's exit status from the zygote
STACK_DUMP_WAIT_S = 1.5
STDERR_TAIL_LINES = 300
# A persistent rank ends each cell's output with this on stdout and stderr (``_worker.serve_cells``): its result
# frame travels on another pipe and can arrive before the last lines, which would then print in the next cell.
CELL_END = "\x1edtlabs-cell-end"


# ------------------------------------------------------------------------------------------------ events
class Line(NamedTuple):
    """One line a rank wrote to ``stream`` ("stdout" or "stderr")."""
    rank: int
    stream: str
    text: str


class Eof(NamedTuple):
    """A rank's ``stream`` closed."""
    rank: int
    stream: str


class Result(NamedTuple):
    """A result frame from a rank (cloudpickled ``(status, value)``); ``data`` is None when the pipe closed."""
    rank: int
    data: bytes | None


class Exit(NamedTuple):
    """The zygote reaped a rank: its exit code, or -signum if a signal killed it."""
    rank: int
    status: int


class RankState(enum.Enum):
    RUNNING = "running"
    OK = "ok"  # returned a result
    ERROR = "error"  # raised; ``Rank.error`` describes the exception
    EXITED = "exited"  # died without a result (signal, os._exit, crash)


@dataclass
class Rank:
    rank: int
    job_w: int
    out_r: int
    err_r: int
    result_r: int
    pid: int | None = None
    state: RankState = RankState.RUNNING
    value: object = None
    error: dict | None = None
    exit_code: int | None = None
    stderr_tail: list = field(default_factory=list)
    crashing: bool = False  # its stderr turned into a C++/faulthandler crash dump: summarised, not streamed
    cell_ends: set = field(default_factory=set)  # the streams on which this cell's output has ended (CELL_END)


# ------------------------------------------------------------------------------------------------ readers
def start_readers(rk: Rank, events: queue.Queue) -> list:
    """Threads that turn a rank's stdout, stderr and result pipes into events."""
    import threading

    threads = [
        processes.pump_lines(fd, lambda text, s=stream: events.put(Line(rk.rank, s, text)),
                             lambda s=stream: events.put(Eof(rk.rank, s)))
        for fd, stream in ((rk.out_r, "stdout"), (rk.err_r, "stderr"))
    ]

    def results():
        while True:
            try:
                data = _wire.read_frame(rk.result_r)
            except OSError:
                data = None
            events.put(Result(rk.rank, data))
            if data is None:
                return

    t = threading.Thread(target=results, name="dtlabs-results", daemon=True)
    t.start()
    return [*threads, t]


# ------------------------------------------------------------------------------------------------ supervision
def supervise(ranks, events, start, timeout, debug_hint=diagnostics.DEBUG_HINT, bystanders=()):
    """Print output as it arrives until every rank in ``ranks`` returned (their values, in order) or one failed
    (``RankFailedError``) or ``timeout`` passed (``RankTimeoutError``, with where each stuck rank waits).
    ``bystanders``: other ranks of the group whose output and exit are still recorded."""
    import cloudpickle

    by_rank = {rk.rank: rk for rk in (*bystanders, *ranks)}
    deadline = None if timeout is None else start + timeout
    first_failure = None
    while True:
        try:
            ev = events.get(timeout=0.05)
        except queue.Empty:
            ev = None
        while ev is not None:
            handle(ev, by_rank, cloudpickle)
            try:
                ev = events.get_nowait()
            except queue.Empty:
                ev = None
        sys.stdout.flush()
        sys.stderr.flush()
        if all(rk.state is RankState.OK for rk in ranks):
            return [rk.value for rk in ranks]
        failed = [rk for rk in ranks if rk.state in (RankState.ERROR, RankState.EXITED)]
        now = time.monotonic()
        if failed:
            first_failure = first_failure or now
            # A rank that died without a result is the likeliest root cause: wait for its exit status.
            codes_known = all(rk.exit_code is not None for rk in ranks if rk.state is RankState.EXITED)
            settled = all(rk.state is not RankState.RUNNING for rk in ranks) and codes_known
            waited = now - first_failure
            if settled or (waited > FAILURE_GRACE_S and codes_known) or waited > EXIT_STATUS_WAIT_S:
                raise diagnostics.failure_error(ranks)
        if deadline is not None and now > deadline:
            stuck = [rk for rk in ranks if rk.state is RankState.RUNNING]
            dumps = collect_stacks(stuck, by_rank, events, cloudpickle)
            raise diagnostics.timeout_error(ranks, stuck, dumps, timeout, debug_hint)


def collect_stacks(stuck, by_rank, events, cloudpickle):
    """Ask each stuck rank for a faulthandler dump of its threads (SIGUSR1) and collect it from its stderr."""
    import os

    dumps = {rk.rank: [] for rk in stuck}
    for rk in stuck:
        try:
            os.kill(rk.pid, signal.SIGUSR1)
        except (ProcessLookupError, TypeError):
            pass
    until = time.monotonic() + STACK_DUMP_WAIT_S
    while time.monotonic() < until:
        try:
            ev = events.get(timeout=0.05)
        except queue.Empty:
            continue
        if isinstance(ev, Line) and ev.stream == "stderr" and ev.rank in dumps:
            dumps[ev.rank].append(ev.text)  # captured for the error, not streamed twice
        else:
            handle(ev, by_rank, cloudpickle)
    return dumps


def handle(ev, by_rank, cloudpickle):
    rk = by_rank.get(ev.rank)
    if rk is None:
        return
    if isinstance(ev, Line):
        if ev.text.endswith(CELL_END):
            rk.cell_ends.add(ev.stream)
            ev = ev._replace(text=ev.text[: -len(CELL_END)])
            if not ev.text:
                return
        if ev.stream == "stderr":
            rk.stderr_tail = (rk.stderr_tail + [ev.text])[-STDERR_TAIL_LINES:]
            if not rk.crashing and diagnostics.CRASH_START.match(ev.text):
                rk.crashing = True  # the rest is a C++ message and a thread dump: the error summarises it
            if rk.crashing:
                return
        print(f"[rank {ev.rank}] {ev.text}", file=sys.stderr if ev.stream == "stderr" else sys.stdout)
    elif isinstance(ev, Result):
        if ev.data is None:
            if rk.state is RankState.RUNNING:
                rk.state = RankState.EXITED  # no result: wait for the exit status to say why
            return
        status, value = cloudpickle.loads(ev.data)
        if status == "ok":
            rk.state, rk.value = RankState.OK, value
        else:
            rk.state, rk.error = RankState.ERROR, value
    elif isinstance(ev, Exit):
        rk.exit_code = ev.status
        if rk.state is RankState.RUNNING:
            rk.state = RankState.EXITED


def wait_cell_ends(ranks, events, by_rank, wait_s: float = 5.0) -> None:
    """After every rank returned, print what is still in flight until each says its output ended (bounded)."""
    import cloudpickle

    deadline = time.monotonic() + wait_s
    while any(len(rk.cell_ends) < 2 for rk in ranks if rk.state is not RankState.EXITED):
        if time.monotonic() > deadline:
            return
        try:
            handle(events.get(timeout=0.05), by_rank, cloudpickle)
        except queue.Empty:
            continue
    sys.stdout.flush()
    sys.stderr.flush()


def kill(ranks):
    for rk in ranks:
        processes.kill_group_and_pid(rk.pid)


def drain(ranks, events, readers, wait_s=2.0):
    """Print what the ranks wrote before they were stopped, then forget them."""
    import cloudpickle

    until = time.monotonic() + wait_s
    for t in readers:
        t.join(timeout=max(0.0, until - time.monotonic()))
    by_rank = {rk.rank: rk for rk in ranks}
    while True:
        try:
            ev = events.get_nowait()
        except queue.Empty:
            break
        if isinstance(ev, Line):
            handle(ev, by_rank, cloudpickle)
    sys.stdout.flush()
    sys.stderr.flush()
