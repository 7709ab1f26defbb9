"""What the launcher hears from its ranks: the record of each rank, its states, and the events its pipes become.

Reader threads turn each rank's stdout, stderr and result pipes into typed events on one queue (``Line``, ``Eof``,
``Result``; the zygote adds ``Exit``); ``group.RankGroup`` consumes them on the calling thread and moves each
``Rank`` through its ``RankState``; ``diagnostics`` words a failure from the same records.
"""
from __future__ import annotations

import enum
import queue
from dataclasses import dataclass, field
from typing import NamedTuple

from lab_utils import processes
from lab_utils.launcher import wire

STDERR_TAIL_LINES = 300  # the end of a rank's stderr kept for a crash summary


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
    cell_ends: set = field(default_factory=set)  # the streams on which this cell's output has ended (worker.CELL_END)
    closed: set = field(default_factory=set)  # the streams that reached end of file (all it wrote has been read)


# ------------------------------------------------------------------------------------------------ readers
def start_readers(rk: Rank, events: queue.SimpleQueue) -> list:
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
                data = wire.read_frame(rk.result_r)
            except OSError:
                data = None
            events.put(Result(rk.rank, data))
            if data is None:
                return

    t = threading.Thread(target=results, name="dtlabs-results", daemon=True)
    t.start()
    return [*threads, t]
