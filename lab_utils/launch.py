"""Run a function on N local ranks of a real ``torch.distributed`` process group, from a notebook cell.

    results = launch(fn, world_size=2, backend="auto", timeout=120, args=(), kwargs={})

What it promises, and how:
- Notebook-defined functions work: ``fn`` and its arguments travel by value with cloudpickle.
- Fast and fork-safe: ranks are forked from a warm *zygote* (``_worker.py``) that imported torch but never
  CUDA, never runs student code and holds no threads; the notebook process itself is never forked.
- No port races: this process hosts the rendezvous ``TCPStore`` on port 0 and hands the bound port to the
  ranks, so any number of notebooks on one machine launch at once.
- torchrun's environment: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT`` (and ``TORCHELASTIC_USE_AGENT_STORE`` so ``env://`` code joins our store).
- Output streams live into the cell as ``[rank k] ...``, printed from the calling thread (ipykernel routes
  output from background threads unreliably).
- Failures are loud and short: a rank that raises stops the others at once and the call raises
  ``RankFailedError`` naming the root-cause rank with its remote traceback; a rank stuck past ``timeout``
  gets its Python stack dumped (faulthandler) into ``RankTimeoutError`` before everything is killed.
- Nothing survives: each rank is its own process group (killed with ``killpg``), ranks die with the zygote
  and the zygote dies with this process (``PR_SET_PDEATHSIG`` on Linux, a parent watchdog elsewhere).
"""
from __future__ import annotations

import atexit
import linecache
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from lab_utils import _wire
from lab_utils.env import MAX_LOCAL_WORLD_SIZE, choose_backend, loopback_ifname, threads_per_rank

__all__ = ["launch", "prewarm", "shutdown", "LaunchError", "RankFailedError", "RankTimeoutError"]

MASTER_ADDR = "127.0.0.1"
FAILURE_GRACE_S = 0.3  # after a first failure, wait this long for the root cause (a signal death) to surface
EXIT_STATUS_WAIT_S = 3.0  # ... and at most this long for a dead rank's exit status from the zygote
STACK_DUMP_WAIT_S = 1.5
_PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


# ------------------------------------------------------------------------------------------ the zygote
class _Zygote:
    """The warm fork server, one per launching process."""

    def __init__(self):
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_PARENT, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("OMP_NUM_THREADS", "1")  # the zygote computes nothing; ranks set their own
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lab_utils._worker", str(child_sock.fileno()), str(os.getpid())],
            pass_fds=[child_sock.fileno()],
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a Ctrl-C / kernel interrupt reaches us, not the zygote
        )
        child_sock.close()
        self.sock = parent_sock
        self.owner_pid = os.getpid()
        self.ready = threading.Event()
        self.warm = threading.Event()
        self.forked: queue.Queue = queue.Queue()
        self.events: queue.Queue | None = None  # the running launch's event queue
        self.pid_owner: dict[int, tuple] = {}
        self.send_lock = threading.Lock()
        self.dead = threading.Event()
        threading.Thread(target=self._read, name="dtlabs-zygote-reader", daemon=True).start()

    def _read(self):
        try:
            while True:
                msg, _ = _wire.recv_json(self.sock)
                if msg is None:
                    break
                op = msg["op"]
                if op == "ready":
                    self.ready.set()
                elif op == "warm":
                    self.warm.set()
                elif op == "forked":
                    # an exit notice must reach the launch that forked the pid, never a later one
                    self.pid_owner[msg["pid"]] = (self.events, msg["rank"])
                    self.forked.put(msg)
                elif op == "exit":
                    events, rank = self.pid_owner.pop(msg["pid"], (None, None))
                    if events is not None:
                        events.put(("exit", rank, msg["status"]))
        except OSError:
            pass
        finally:
            self.dead.set()
            self.forked.put(None)

    def alive(self) -> bool:
        return not self.dead.is_set() and self.proc.poll() is None and self.owner_pid == os.getpid()

    def fork(self, rank: int, fds) -> None:
        with self.send_lock:
            _wire.send_json(self.sock, {"op": "fork", "rank": rank}, fds=fds)

    def stop(self):
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.sock.close()


_zygote: _Zygote | None = None
_zygote_lock = threading.RLock()


def _get_zygote() -> _Zygote:
    global _zygote
    with _zygote_lock:
        if _zygote is None or not _zygote.alive():
            if _zygote is not None:
                _zygote.stop()
            _zygote = _Zygote()
        return _zygote


def prewarm(wait: bool = False, timeout: float = 120) -> bool:
    """Start the warm fork server now; it imports torch and the distributed stack in the background.

    Call it in a notebook's first cell so the first ``launch`` is quick. ``wait=True`` blocks until every
    warm-up import is done (benchmarks use it). Returns whether the server is fully warm.
    """
    from lab_utils import proxy

    if proxy.session_active():  # grading: this kernel starts no ranks (the student's process warms its own)
        return False
    zygote = _get_zygote()
    if wait:
        zygote.warm.wait(timeout)
    return zygote.warm.is_set()


def shutdown() -> None:
    """Stop the fork server. Called at exit; a later ``launch`` starts a new one."""
    global _zygote
    with _zygote_lock:
        if _zygote is not None:
            _zygote.stop()
            _zygote = None


atexit.register(shutdown)


# ------------------------------------------------------------------------------------------ one launch
@dataclass
class _Rank:
    rank: int
    job_w: int
    out_r: int
    err_r: int
    result_r: int
    pid: int | None = None
    status: str = "running"  # running | ok | error | exited
    value: object = None
    error: dict | None = None
    exit_code: int | None = None
    stderr_tail: list = field(default_factory=list)
    crashing: bool = False  # its stderr turned into a C++/faulthandler crash dump: summarised, not streamed


def _validate(fn, world_size, timeout):
    if not callable(fn):
        raise TypeError(f"launch() needs a function to run on every rank, got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {world_size!r}")
    if not 1 <= world_size <= MAX_LOCAL_WORLD_SIZE:
        raise ValueError(
            f"world_size={world_size} is out of range: use 1..{MAX_LOCAL_WORLD_SIZE} local ranks "
            "(2-4 is plenty to learn with on a laptop)"
        )
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")


def _pickle_payload(fn, args, kwargs) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
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
):
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks of an initialised process group.

    Returns the per-rank return values in rank order (tensors come back on the CPU). ``debug=True`` sets
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, which reports mismatched collectives at once instead of hanging.
    Raises ``RankFailedError`` or ``RankTimeoutError``; bad arguments raise before anything starts.
    """
    kwargs = {} if kwargs is None else kwargs
    from lab_utils import proxy

    if proxy.session_active():  # grading: the ranks start inside the submission's sandbox, never from here
        return proxy.remote_launch(fn, world_size, backend, timeout, args, kwargs, debug=debug, quiet=quiet)
    _validate(fn, world_size, timeout)
    choice = choose_backend(world_size, backend)
    payload = _pickle_payload(fn, args, kwargs)
    if not quiet and (choice.backend, choice.reason) not in _banner_seen:
        _banner_seen.add((choice.backend, choice.reason))
        print(f"[launch] {world_size} ranks, {choice.reason}", flush=True)

    import torch.distributed as dist
    from datetime import timedelta

    store_timeout = timeout if timeout is not None else 3600
    store = dist.TCPStore(
        MASTER_ADDR, 0, world_size=None, is_master=True, timeout=timedelta(seconds=store_timeout),
        wait_for_workers=False,
    )
    with _zygote_lock:
        zygote = _get_zygote()
        events: queue.Queue = queue.Queue()
        zygote.events = events
        try:
            return _run(zygote, events, payload, world_size, choice.backend, store.port, timeout, debug)
        except LaunchError as exc:
            # End the cell's traceback at the student's `launch(...)` line: the supervisor's frames teach nothing,
            # and the message already carries the failing rank's own traceback.
            raise exc.with_traceback(None) from None
        finally:
            zygote.events = None
            del store


def _rank_env(rank, world_size, port, threads):
    env = dict(os.environ)
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(world_size), MASTER_ADDR=MASTER_ADDR,
        MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True", OMP_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
    )
    ifname = loopback_ifname()
    if ifname and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = ifname
    return env


def _run(zygote, events, payload, world_size, backend, port, timeout, debug):
    import cloudpickle

    threads = threads_per_rank(world_size)
    ranks: list[_Rank] = []
    readers: list[threading.Thread] = []
    start = time.monotonic()
    try:
        for r in range(world_size):
            job_r, job_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            res_r, res_w = os.pipe()
            rk = _Rank(r, job_w, out_r, err_r, res_r)
            ranks.append(rk)
            try:
                zygote.fork(r, [job_r, out_w, err_w, res_w])
            finally:
                for fd in (job_r, out_w, err_w, res_w):
                    os.close(fd)
        for _ in range(world_size):
            msg = zygote.forked.get(timeout=120)
            if msg is None:
                raise LaunchError("the launcher's fork server died while starting ranks; run launch() again")
            ranks[msg["rank"]].pid = msg["pid"]
        for rk in ranks:
            job = dict(
                payload=payload, rank=rk.rank, world_size=world_size, backend=backend, master_addr=MASTER_ADDR,
                master_port=port, env=_rank_env(rk.rank, world_size, port, threads), cwd=os.getcwd(),
                sys_path=list(sys.path), threads=threads, debug=debug,
                store_timeout=timeout if timeout is not None else 3600,
                # the process group's own timeout fires after ours, so the student sees our stack dump
                pg_timeout=(timeout + 60) if timeout is not None else 1800,
            )
            data = cloudpickle.dumps(job)
            t = threading.Thread(target=_write_job, args=(rk.job_w, data), daemon=True)
            t.start()
            for fd, stream in ((rk.out_r, "stdout"), (rk.err_r, "stderr")):
                readers.append(_start(_read_lines, fd, rk.rank, stream, events))
            readers.append(_start(_read_result, rk.result_r, rk.rank, events))
        return _supervise(ranks, events, start, timeout)
    finally:
        _kill(ranks)
        _drain(ranks, events, readers)
        for rk in ranks:
            for fd in (rk.job_w, rk.out_r, rk.err_r, rk.result_r):
                try:
                    os.close(fd)
                except OSError:
                    pass


def _start(target, *args):
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def _write_job(fd, data):
    try:
        _wire.write_frame(fd, data)
    except OSError:
        pass  # the rank died before reading its job; its exit status tells the story


def _read_lines(fd, rank, stream, events):
    buf = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            events.put(("line", rank, stream, line.decode(errors="replace")))
    if buf:
        events.put(("line", rank, stream, buf.decode(errors="replace")))
    events.put(("eof", rank, stream, None))


def _read_result(fd, rank, events):
    try:
        data = _wire.read_frame(fd)
    except OSError:
        data = None
    events.put(("result", rank, data))


def _supervise(ranks, events, start, timeout):
    """Print output as it arrives and decide when the launch is over. Runs on the calling thread."""
    import cloudpickle

    deadline = None if timeout is None else start + timeout
    first_failure = None
    while True:
        try:
            ev = events.get(timeout=0.05)
        except queue.Empty:
            ev = None
        while ev is not None:
            _handle(ev, ranks, cloudpickle)
            try:
                ev = events.get_nowait()
            except queue.Empty:
                ev = None
        sys.stdout.flush()
        sys.stderr.flush()
        if all(rk.status == "ok" for rk in ranks):
            return [rk.value for rk in ranks]
        failed = [rk for rk in ranks if rk.status in ("error", "exited")]
        now = time.monotonic()
        if failed:
            first_failure = first_failure or now
            # A rank that died without a result is the likeliest root cause: wait for its exit status.
            codes_known = all(rk.exit_code is not None for rk in ranks if rk.status == "exited")
            settled = all(rk.status != "running" for rk in ranks) and codes_known
            waited = now - first_failure
            if settled or (waited > FAILURE_GRACE_S and codes_known) or waited > EXIT_STATUS_WAIT_S:
                raise _failure_error(ranks)
        if deadline is not None and now > deadline:
            raise _timeout_error(ranks, events, timeout, cloudpickle)


def _handle(ev, ranks, cloudpickle):
    kind, rank = ev[0], ev[1]
    rk = ranks[rank]
    if kind == "line":
        _, _, stream, text = ev
        if stream == "stderr":
            rk.stderr_tail = (rk.stderr_tail + [text])[-STDERR_TAIL_LINES:]
            if not rk.crashing and _CRASH_START.match(text):
                rk.crashing = True  # the rest is a C++ message and a thread dump: the error summarises it
            if rk.crashing:
                return
        print(f"[rank {rank}] {text}", file=sys.stderr if stream == "stderr" else sys.stdout)
    elif kind == "result":
        data = ev[2]
        if data is None:
            if rk.status == "running":
                rk.status = "exited"  # no result: wait for the exit status to say why
            return
        status, value = cloudpickle.loads(data)
        if status == "ok":
            rk.status, rk.value = "ok", value
        else:
            rk.status, rk.error = "error", value
    elif kind == "exit":
        rk.exit_code = ev[2]
        if rk.status == "running":
            rk.status = "exited"


def _signal_name(code):
    try:
        return signal.Signals(-code).name
    except (ValueError, TypeError):
        return f"signal {-code}"


def _failure_error(ranks):
    crashed = [rk for rk in ranks if rk.status == "exited"]
    crashed.sort(key=lambda rk: not _crash_digest(rk.stderr_tail))  # a rank whose dump we can read first
    by_signal = [rk for rk in crashed if rk.exit_code is not None and rk.exit_code < 0]
    errors = sorted((rk for rk in ranks if rk.status == "error"), key=lambda rk: rk.error["time"])
    others = lambda root: ", ".join(  # noqa: E731
        f"rank {rk.rank} {'returned' if rk.status == 'ok' else 'stopped'}" for rk in ranks if rk is not root
    )
    if crashed:  # died without a result (a signal, os._exit): its peers' errors are only symptoms
        root = (by_signal or crashed)[0]
        digest = _crash_digest(root.stderr_tail)
        if root.exit_code is not None and root.exit_code < 0:
            how = f"was killed by {_signal_name(root.exit_code)}"
        elif root.exit_code is None and digest:
            how = f"crashed ({digest['fatal'].lower()})"
        else:
            how = f"exited with code {root.exit_code} before returning a result"
        msg = f"rank {root.rank} {how} ({others(root)})."
        if digest:
            msg += "\n" + _explain_crash(root, digest, [rk for rk in crashed if rk is not root])
            return RankFailedError(msg, rank=root.rank, remote_traceback=digest["stack"])
        tail = "\n".join(root.stderr_tail[-20:])
        if tail:
            msg += f"\nLast stderr of rank {root.rank}:\n{tail}"
        return RankFailedError(msg, rank=root.rank, remote_traceback=tail)
    root = errors[0]
    err = dict(root.error, message=_clean_message(root.error["message"]))
    tb = _format_remote_traceback(err)
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


STDERR_TAIL_LINES = 300
# How a rank's stderr turns into a crash dump: an uncaught C++ exception (gloo's size checks) or a fatal signal.
_CRASH_START = re.compile(r"terminate called after throwing|Fatal Python error: ")
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


def _op_name(op: str) -> str:
    return _OP_NAMES.get(op, op.lower())


def _clean_message(message: str) -> str:
    """torch's collective-mismatch report (debug=True), rewritten to read cleanly; other messages unchanged.

    torch prints e.g. ``CollectiveFingerPrint(SequenceNumber=0OpType=BARRIER) ... Op type: BARRIERvs GATHER``.
    """
    if "Detected mismatch between collectives on ranks" not in message:
        return message
    calls = []
    for m in _FINGERPRINT.finditer(message):
        call = f"rank {m['rank']} called {_op_name(m['op'])} (its collective #{int(m['seq']) + 1})"
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
            part = re.sub(r"\b[A-Z_]{3,}\b", lambda m: _op_name(m.group(0)) if m.group(0) in _OP_NAMES else m.group(0),
                          part)
            aspects.append(part[0].lower() + part[1:])
    if not calls:
        return re.sub(r"(\S)vs ", r"\1 vs ", message)
    text = "collective mismatch: the ranks called different collectives at the same point: " + "; ".join(calls)
    if aspects:
        text += ". They differ in " + "; ".join(aspects)
    return text


def _dump_threads(lines):
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


def _is_user_frame(frame) -> bool:
    f = frame["file"]
    return ("site-packages" not in f and "/lab_utils/" not in f and "torch/" not in f
            and not f.startswith("<frozen") and "/lib/python" not in f)


def _crash_digest(lines):
    """What a crashed rank's stderr says, without the dump: the C++ error, the torch call, the student's frames."""
    if not any(_CRASH_START.match(line) for line in lines):
        return None
    start = max(i for i, line in enumerate(lines) if _CRASH_START.match(line) and "terminate called" in line) \
        if any("terminate called" in line for line in lines) else 0
    lines = lines[start:]
    what = next((line.split("what():", 1)[1].strip() for line in lines if "what():" in line), "")
    fatal = next((line.split("Fatal Python error:", 1)[1].strip() for line in lines if "Fatal Python error:" in line),
                 "aborted")
    threads = _dump_threads(lines)
    # the thread that was inside torch.distributed (gloo aborts from its own C++ thread, which has no Python frames)
    chosen = next((frames for _, frames in threads if any("torch/distributed" in f["file"] for f in frames)), None)
    if chosen is None:
        chosen = next((frames for current, frames in threads if current), None)
    if chosen is None:
        chosen = next((frames for _, frames in threads if any(_is_user_frame(f) for f in frames)), [])
    op = next((f["func"] for f in chosen if "torch/distributed" in f["file"] and f["func"] != "wrapper"), None)
    user = [f for f in chosen if _is_user_frame(f)][:4]
    stack = []
    for f in user:
        entry = f"  {_cell_name(f['file'])}, line {f['line']}, in {f['func']}"
        src = linecache.getline(f["file"], int(f["line"])).strip()
        stack.append(entry + (f"\n    {src}" if src else ""))
    return {"what": what, "fatal": fatal, "op": op, "stack": "\n".join(stack)}


def _describe_what(what: str) -> str:
    """gloo's enforce message, minus its build path; sizes spelled out."""
    text = _ENFORCE_PREFIX.sub("", what)
    m = _GLOO_SIZES.search(text)
    if m:
        got, room = int(m[1]), int(m[2])
        text = (f"a message of {got} bytes arrived where the receiving tensor holds {room} bytes "
                f"(gloo: {_GLOO_SIZES.sub('', text).strip().rstrip('.')})")
    return text.replace(" Is there a distributed collective mismatch in your code?", "")


def _explain_crash(root, digest, others):
    op = f"torch.distributed.{digest['op']}" if digest["op"] else "a torch.distributed call"
    lines = []
    if digest["what"]:
        lines.append(f"It aborted inside {op}: {_describe_what(digest['what'])}.")
    else:
        lines.append(f"It died ({digest['fatal']})" + (f" inside {op}." if digest["op"] else "."))
    for rk in others:
        d = _crash_digest(rk.stderr_tail)
        if d and d["what"]:
            where = f"in torch.distributed.{d['op']}" if d["op"] else ""
            lines.append(f"Rank {rk.rank} aborted too {where}: {_describe_what(d['what'])}.")
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


def _cell_name(filename):
    """'Cell In[5]' for code typed into a notebook cell, as IPython itself names it."""
    try:
        ip = get_ipython()  # type: ignore[name-defined]  # noqa: F821
        count = ip.compile._filename_map.get(filename)
        if count is not None:
            return f"Cell In[{count}]"
    except Exception:  # noqa: BLE001 - outside IPython, or an IPython without the map
        pass
    return f'File "{filename}"'


def _format_remote_traceback(err) -> str:
    """The rank's traceback, minus launcher frames, with notebook source lines filled in from this kernel."""
    ours = os.path.dirname(os.path.abspath(__file__))
    lines = ["Traceback (most recent call last):"]
    for filename, lineno, name, line in err["frames"]:
        if os.path.dirname(os.path.abspath(filename)) == ours:
            continue
        if not line:
            line = linecache.getline(filename, lineno).strip()
        lines.append(f"  {_cell_name(filename)}, line {lineno}, in {name}")
        if line:
            lines.append(f"    {line}")
    lines.append(f"{err['type']}: {err['message']}")
    return "\n".join(lines)


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def _where_waiting(stack_lines):
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
    where = f"{_cell_name(caller['file'])}, line {caller['line']}, in {caller['func']}" if caller else "?"
    if caller:
        src = linecache.getline(caller["file"], int(caller["line"])).strip()
        where += f": {src}" if src else ""
    return collective, where


def _main_thread_stack(lines):
    """The stuck thread's frames, innermost first, without the launcher's own frames."""
    out, in_main = [], False
    ours = os.path.dirname(os.path.abspath(__file__))
    for line in lines:
        if line.startswith("Current thread") or line.startswith("Thread"):
            in_main = line.startswith("Current thread")
            continue
        m = _FRAME.search(line)
        if in_main and m and not m["file"].startswith(ours) and not m["file"].startswith("<frozen"):
            out.append(f"  {_cell_name(m['file'])}, line {m['line']} in {m['func']}")
    return "\n".join(out) or "\n".join(lines)


def _timeout_error(ranks, events, timeout, cloudpickle):
    stuck = [rk for rk in ranks if rk.status == "running"]
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
        if ev[0] == "line" and ev[2] == "stderr" and ev[1] in dumps:
            dumps[ev[1]].append(ev[3])  # captured for the error, not streamed twice
        else:
            _handle(ev, ranks, cloudpickle)
    finished = [rk.rank for rk in ranks if rk.status == "ok"]
    parts = []
    for rk in stuck:
        collective, where = _where_waiting(dumps[rk.rank])
        what = f"waiting in {collective}" if collective else "still running"
        parts.append(f"rank {rk.rank} is {what} at {where}")
    msg = (
        f"{len(stuck)} of {len(ranks)} ranks did not finish within {timeout} s"
        + (f" (rank(s) {finished} had already returned)" if finished else "")
        + ":\n  " + "\n  ".join(parts)
        + "\nA rank that waits in a collective that another rank never calls waits forever: check that every "
        "rank runs the same collectives in the same order (launch(..., debug=True) reports mismatches at once)."
    )
    stacks = {r: _main_thread_stack(lines) for r, lines in dumps.items()}
    msg += "".join(f"\n\nStack of rank {r} (innermost call first):\n{s}" for r, s in stacks.items() if s)
    return RankTimeoutError(msg, stuck_ranks=[rk.rank for rk in stuck], stacks=stacks)


def _kill(ranks):
    for rk in ranks:
        if rk.pid is None:
            continue
        try:
            os.killpg(rk.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(rk.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _drain(ranks, events, readers, wait_s=2.0):
    """Print what the ranks wrote before they were stopped, then forget the launch."""
    until = time.monotonic() + wait_s
    for t in readers:
        t.join(timeout=max(0.0, until - time.monotonic()))
    import cloudpickle

    while True:
        try:
            ev = events.get_nowait()
        except queue.Empty:
            break
        if ev[0] == "line":
            _handle(ev, ranks, cloudpickle)
    sys.stdout.flush()
    sys.stderr.flush()
