"""Why a launch failed, in words a student can act on.

Turns what the ranks left behind (a remote exception, a C++ abort or faulthandler dump on stderr, a stack dump
taken at the timeout) into short messages: which rank is the root cause, which ``torch.distributed`` call it was
in, and which line of the student's cell. Shared by ``launch`` and the ``%%distributed`` magic (both through ``group.RankGroup``).

Busy is not stuck: on a shared machine (a class on one server, cgroup CPU quotas) a rank can be slow because it waits
for a CPU, not for a peer. ``Starvation`` measures that wait (the kernel's run-queue delay of each rank's threads,
which includes the time a cgroup's quota throttled them) so that the supervisor extends a timeout by it before it
names a rank stuck: the timeout counts the time the ranks could run, not the time others ran instead.
"""
from __future__ import annotations

import linecache
import os
import re
import signal

from lab_utils.launcher.events import RankState


class LaunchError(RuntimeError):
    """A launch did not return results from every rank."""


class RankFailedError(LaunchError):
    """A rank raised, crashed or exited early. ``rank`` is the root cause, not a peer that lost it."""

    def __init__(self, message, rank, exc_type=None, remote_traceback="", exception=None):
        super().__init__(message)
        self.rank = rank
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback
        self.exception = exception


class RankTimeoutError(LaunchError, TimeoutError):
    """Ranks were still running at the timeout: almost always a collective that not every rank entered."""

    def __init__(self, message, stuck_ranks, stacks):
        super().__init__(message)
        self.stuck_ranks = stuck_ranks
        self.stacks = stacks


DEBUG_HINT = "launch(..., debug=True) reports mismatches at once"


def signal_name(code):
    try:
        return signal.Signals(-code).name
    except (ValueError, TypeError):
        return f"signal {-code}"


def failure_error(ranks, oom: str | None = None):
    """The error for a launch in which a rank raised, crashed or exited early: the root cause named first; ``oom``:
    the words for ranks the out-of-memory killer ended (``group.RankGroup.oom_words``), if it did."""
    crashed = [rk for rk in ranks if rk.state is RankState.EXITED]
    crashed.sort(key=lambda rk: not crash_digest(rk.stderr_tail))  # a rank whose dump we can read first
    by_signal = [rk for rk in crashed if rk.exit_code is not None and rk.exit_code < 0]
    errors = sorted((rk for rk in ranks if rk.state is RankState.ERROR), key=lambda rk: rk.error["time"])
    others = lambda root: ", ".join(  # noqa: E731
        f"rank {rk.rank} {'returned' if rk.state is RankState.OK else 'stopped'}" for rk in ranks if rk is not root
    )
    if crashed:  # died without a result (a signal, os._exit): its peers' errors are only symptoms
        root = (by_signal or crashed)[0]
        digest = crash_digest(root.stderr_tail)
        oom = oom if root.exit_code == -signal.SIGKILL else None
        if root.exit_code is not None and root.exit_code < 0:
            how = f"was killed by {'the out-of-memory killer (SIGKILL)' if oom else signal_name(root.exit_code)}"
        elif root.exit_code is None and digest:
            how = f"crashed ({digest['fatal'].lower()})"
        else:
            how = f"exited with code {root.exit_code} before returning a result"
        msg = f"rank {root.rank} {how} ({others(root)})." + (f"\n{oom}" if oom else "")
        if digest:
            msg += "\n" + explain_crash(root, digest, [rk for rk in crashed if rk is not root])
            return RankFailedError(msg, rank=root.rank, remote_traceback=digest["stack"])
        tail = "\n".join(root.stderr_tail[-20:])
        if tail:
            msg += f"\nLast stderr of rank {root.rank}:\n{tail}"
        return RankFailedError(msg, rank=root.rank, remote_traceback=tail)
    root = errors[0]
    err = dict(root.error, message=clean_message(root.error["message"]))
    tb = format_remote_traceback(err)
    exc = None
    if err.get("pickled"):
        import cloudpickle

        try:
            exc = cloudpickle.loads(err["pickled"])
        except Exception:  # noqa: BLE001
            exc = None
    msg = (
        f"rank {root.rank} raised {err['type']}: {err['message']} ({others(root)}).\n\n"
        f"Remote traceback of rank {root.rank}:\n{tb}"
    )
    return RankFailedError(msg, rank=root.rank, exc_type=err["type"], remote_traceback=tb, exception=exc)


# How a rank's stderr turns into a crash dump: an uncaught C++ exception (gloo's size checks) or a fatal signal.
CRASH_START = re.compile(r"terminate called after throwing|Fatal Python error: ")
_ENFORCE_PREFIX = re.compile(r"\[enforce fail at [^\]]*\]\s*")
_GLOO_SIZES = re.compile(r"op\.preamble\.length <= op\.nbytes\.\s*(\d+) vs (\d+)\.?\s*")
_DUMP_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_OP_NAMES = {
    "ALLREDUCE": "all_reduce", "ALLREDUCE_COALESCED": "all_reduce_coalesced", "BROADCAST": "broadcast",
    "BARRIER": "barrier", "REDUCE": "reduce", "ALLGATHER": "all_gather", "_ALLGATHER_BASE": "all_gather_into_tensor",
    "ALLGATHER_COALESCED": "all_gather_coalesced", "GATHER": "gather", "SCATTER": "scatter",
    "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor",
    "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all_single", "SEND": "send", "RECV": "recv",
    "RECVANYSOURCE": "recv (any source)", "MONITORED_BARRIER": "monitored_barrier",
}
_FINGERPRINT = re.compile(
    r"Rank (?P<rank>\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(?P<seq>\d+),?\s*"
    r"OpType=(?P<op>\w+)(?:, TensorShape=\[(?P<shape>[^\]]*)\])?(?:, TensorDtypes=(?P<dtype>\w+))?"
)


def op_name(op: str) -> str:
    return _OP_NAMES.get(op, op.lower())


def clean_message(message: str) -> str:
    """torch's collective-mismatch report (debug=True), rewritten to read cleanly; other messages unchanged.

    torch prints e.g. ``CollectiveFingerPrint(SequenceNumber=0OpType=BARRIER) ... Op type: BARRIERvs GATHER``.
    """
    if "Detected mismatch between collectives on ranks" not in message:
        return message
    calls = []
    for m in _FINGERPRINT.finditer(message):
        call = f"rank {m['rank']} called {op_name(m['op'])} (its collective #{int(m['seq']) + 1})"
        if m["shape"] is not None:
            call += f" on a tensor of shape [{m['shape']}]" + (f", dtype {m['dtype'].lower()}" if m["dtype"] else "")
        calls.append(call)
    diff = message.split("Collectives differ in the following aspects:", 1)
    aspects = []
    if len(diff) == 2:
        for part in re.split(r"\s{2,}|\t|\n", diff[1]):
            part = part.strip().rstrip(".")
            if not part:
                continue
            part = re.sub(r"(\S)vs ", r"\1 vs ", part).replace("Tensor Tensor", "Tensor")
            part = re.sub(r"\b[A-Z_]{3,}\b", lambda m: op_name(m.group(0)) if m.group(0) in _OP_NAMES else m.group(0),
                          part)
            aspects.append(part[0].lower() + part[1:])
    if not calls:
        return re.sub(r"(\S)vs ", r"\1 vs ", message)
    text = "collective mismatch: the ranks called different collectives at the same point: " + "; ".join(calls)
    if aspects:
        text += ". They differ in " + "; ".join(aspects)
    return text


def dump_threads(lines):
    """A faulthandler dump as [(is_current, frames innermost first)]; frames are dicts file/line/func."""
    threads = []
    for line in lines:
        if line.startswith("Current thread") or line.startswith("Thread 0x"):
            threads.append((line.startswith("Current thread"), []))
            continue
        m = _DUMP_FRAME.search(line)
        if m and threads:
            threads[-1][1].append(m.groupdict())
    return threads


def is_user_frame(frame) -> bool:
    f = frame["file"]
    return ("site-packages" not in f and "/lab_utils/" not in f and "torch/" not in f
            and not f.startswith("<frozen") and "/lib/python" not in f)


def crash_digest(lines):
    """What a crashed rank's stderr says, without the dump: the C++ error, the torch call, the student's frames."""
    if not any(CRASH_START.match(line) for line in lines):
        return None
    start = max(i for i, line in enumerate(lines) if CRASH_START.match(line) and "terminate called" in line) \
        if any("terminate called" in line for line in lines) else 0
    lines = lines[start:]
    what = next((line.split("what():", 1)[1].strip() for line in lines if "what():" in line), "")
    fatal = next((line.split("Fatal Python error:", 1)[1].strip() for line in lines if "Fatal Python error:" in line),
                 "aborted")
    threads = dump_threads(lines)
    # the thread that was inside torch.distributed (gloo aborts from its own C++ thread, which has no Python frames)
    chosen = next((frames for _, frames in threads if any("torch/distributed" in f["file"] for f in frames)), None)
    if chosen is None:
        chosen = next((frames for current, frames in threads if current), None)
    if chosen is None:
        chosen = next((frames for _, frames in threads if any(is_user_frame(f) for f in frames)), [])
    op = next((f["func"] for f in chosen if "torch/distributed" in f["file"] and f["func"] != "wrapper"), None)
    user = [f for f in chosen if is_user_frame(f)][:4]
    stack = []
    for f in user:
        entry = f"  {cell_name(f['file'])}, line {f['line']}, in {f['func']}"
        src = linecache.getline(f["file"], int(f["line"])).strip()
        stack.append(entry + (f"\n    {src}" if src else ""))
    return {"what": what, "fatal": fatal, "op": op, "stack": "\n".join(stack)}


def describe_what(what: str) -> str:
    """gloo's enforce message, minus its build path; sizes spelled out."""
    text = _ENFORCE_PREFIX.sub("", what)
    m = _GLOO_SIZES.search(text)
    if m:
        got, room = int(m[1]), int(m[2])
        text = (f"a message of {got} bytes arrived where the receiving tensor holds {room} bytes "
                f"(gloo: {_GLOO_SIZES.sub('', text).strip().rstrip('.')})")
    return text.replace(" Is there a distributed collective mismatch in your code?", "")


def explain_crash(root, digest, others):
    op = f"torch.distributed.{digest['op']}" if digest["op"] else "a torch.distributed call"
    lines = []
    if digest["what"]:
        lines.append(f"It aborted inside {op}: {describe_what(digest['what'])}.")
    else:
        lines.append(f"It died ({digest['fatal']})" + (f" inside {op}." if digest["op"] else "."))
    for rk in others:
        d = crash_digest(rk.stderr_tail)
        if d and d["what"]:
            where = f"in torch.distributed.{d['op']}" if d["op"] else ""
            lines.append(f"Rank {rk.rank} aborted too {where}: {describe_what(d['what'])}.")
    if digest["stack"]:
        lines.append(f"Where rank {root.rank} was (innermost call first):\n{digest['stack']}")
    if _GLOO_SIZES.search(digest["what"]) or digest["op"] in ("send", "recv", "isend", "irecv"):
        lines.append(
            "Every send must be matched by a recv of the same size on the rank it names, and the other way round: "
            "the ranks disagree on who sends which tensor to whom (in a ring, rank r sends to (r + 1) % N and "
            "receives from (r - 1) % N; on 2 ranks both neighbours are the same rank, so a swapped pair only shows "
            "from 3 ranks on)."
        )
    elif digest["op"]:
        lines.append("Every rank must make the same collective calls, in the same order, with tensors of the same "
                     "size: launch(..., debug=True) checks that and names the first difference.")
    return "\n".join(lines)


def cell_name(filename):
    """'Cell In[5]' for code typed into a notebook cell, as IPython itself names it."""
    try:
        ip = get_ipython()  # type: ignore[name-defined]  # noqa: F821
        count = ip.compile._filename_map.get(filename)
        if count is not None:
            return f"Cell In[{count}]"
    except Exception:  # noqa: BLE001 - outside IPython, or an IPython without the map
        pass
    return f'File "{filename}"'


def format_remote_traceback(err) -> str:
    """The rank's traceback, minus launcher frames, with notebook source lines filled in from this kernel."""
    ours = os.path.dirname(os.path.abspath(__file__))
    lines = ["Traceback (most recent call last):"]
    for filename, lineno, name, line in err["frames"]:
        if os.path.dirname(os.path.abspath(filename)) == ours:
            continue
        if not line:
            line = linecache.getline(filename, lineno).strip()
        lines.append(f"  {cell_name(filename)}, line {lineno}, in {name}")
        if line:
            lines.append(f"    {line}")
    lines.append(f"{err['type']}: {err['message']}")
    return "\n".join(lines)


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def where_waiting(stack_lines):
    """From a faulthandler dump of the main thread: which torch.distributed call, called from where."""
    frames = []
    in_main = False
    for line in stack_lines:
        if line.startswith("Current thread") or line.startswith("Thread"):
            in_main = line.startswith("Current thread")
            continue
        m = _FRAME.search(line)
        if m and in_main:
            frames.append(m.groupdict())
    # faulthandler lists the innermost frame first
    collective = next((f["func"] for f in frames if "torch/distributed" in f["file"]), None)
    caller = next(
        (f for f in frames if "site-packages" not in f["file"] and "/lab_utils/" not in f["file"]
         and "torch/" not in f["file"]),
        None,
    )
    where = f"{cell_name(caller['file'])}, line {caller['line']}, in {caller['func']}" if caller else "?"
    if caller:
        src = linecache.getline(caller["file"], int(caller["line"])).strip()
        where += f": {src}" if src else ""
    return collective, where


def main_thread_stack(lines):
    """The stuck thread's frames, innermost first, without the launcher's own frames."""
    out, in_main = [], False
    ours = os.path.dirname(os.path.abspath(__file__))
    for line in lines:
        if line.startswith("Current thread") or line.startswith("Thread"):
            in_main = line.startswith("Current thread")
            continue
        m = _FRAME.search(line)
        if in_main and m and not m["file"].startswith(ours) and not m["file"].startswith("<frozen"):
            out.append(f"  {cell_name(m['file'])}, line {m['line']} in {m['func']}")
    return "\n".join(out) or "\n".join(lines)


# ------------------------------------------------------------------------------------------ busy is not stuck
# A timeout is extended by the time the ranks waited for a CPU, up to this many times the timeout on top of it: a
# rank in an endless loop on a saturated machine is still named, at the latest after (1 + this) * timeout.
STARVED_EXTENSION_MAX = 9.0
STARVED_RECHECK_S = 1.0  # an extended timeout is looked at again no sooner than this
PROC = "/proc"  # tests point it at a fake /proc


def run_delays(pid, proc=None) -> dict:
    """{thread id: seconds it has waited runnable for a CPU} for every thread of ``pid`` (``/proc/PID/task/TID/
    schedstat``, second field, in ns: the run-queue delay, which includes the time a cgroup's quota throttled it).
    Empty when the process is gone or the kernel keeps no such counts."""
    base = f"{proc or PROC}/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return {}
    out = {}
    for tid in tids:
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                out[tid] = int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return out


class Starvation:
    """How long a group's ranks have waited for a CPU since it was made: what a timeout does not count.

    ``waited()`` is, over the ranks, the largest run-queue delay of any one of a rank's threads since the start (a
    thread waiting for a CPU holds up its rank; threads that wait at once overlap, so they are not added up). A rank
    waiting in a collective for a peer sleeps and adds nothing; a rank that computes on a shared or throttled CPU
    adds the time it was kept off it, and so does a peer that is late because of it. ``deadline()``: when the
    timeout now falls (at most ``STARVED_EXTENSION_MAX`` timeouts later); ``extended(now)``: asked at the timeout."""

    def __init__(self, pids, timeout: float | None, start: float, proc=None):
        self.pids = [p for p in pids if p]
        self.timeout, self.start, self.proc = timeout, start, proc
        self.base = {pid: run_delays(pid, proc) for pid in self.pids}
        self.last = 0.0

    def add(self, pids) -> None:
        """Count processes born since the start too (torchrun's agents and workers come and go): all they waited."""
        self.pids += [p for p in dict.fromkeys(pids) if p and p not in self.pids]

    def waited(self) -> float:
        worst = self.last  # a rank that has ended since keeps what it waited
        for pid in self.pids:
            now = run_delays(pid, self.proc)
            before = self.base.get(pid, {})
            waits = [d - before.get(tid, 0.0) for tid, d in now.items()]
            if waits:
                worst = max(worst, max(waits))
        self.last = worst
        return worst

    def deadline(self) -> float | None:
        """``start + timeout`` plus the time the ranks waited for a CPU (capped); None without a timeout."""
        if self.timeout is None:
            return None
        return self.start + self.timeout + min(self.waited(), STARVED_EXTENSION_MAX * self.timeout)

    def extended(self, now: float) -> float | None:
        """At the timeout: when to look again, where the ranks waited for a CPU meanwhile (busy, not stuck); None
        where they did not, or the extension is used up: then the ranks still running are stuck."""
        later = self.deadline()
        return None if later is None or later <= now else max(later, now + STARVED_RECHECK_S)


def timeout_error(ranks, stuck, dumps, timeout, debug_hint=DEBUG_HINT, starved_s: float = 0.0):
    """The error for ranks still running at the timeout; ``dumps`` holds each stuck rank's faulthandler lines.
    ``starved_s``: how long the ranks waited for a CPU, by which the timeout was extended."""
    finished = [rk.rank for rk in ranks if rk.state is RankState.OK]
    parts = []
    for rk in stuck:
        collective, where = where_waiting(dumps[rk.rank])
        what = f"waiting in {collective}" if collective else "still running"
        parts.append(f"rank {rk.rank} is {what} at {where}")
    msg = (
        f"{len(stuck)} of {len(ranks)} ranks did not finish within {timeout} s"
        + (f" (and the {starved_s:.0f} s they waited for a CPU on a busy machine)" if starved_s >= 1 else "")
        + (f" (rank(s) {finished} had already returned)" if finished else "")
        + ":\n  " + "\n  ".join(parts)
        + "\nA rank that waits in a collective that another rank never calls waits forever: check that every "
        f"rank runs the same collectives in the same order ({debug_hint})."
    )
    stacks = {r: main_thread_stack(lines) for r, lines in dumps.items()}
    msg += "".join(f"\n\nStack of rank {r} (innermost call first):\n{s}" for r, s in stacks.items() if s)
    return RankTimeoutError(msg, stuck_ranks=[rk.rank for rk in stuck], stacks=stacks)
