"""A running group of ranks: forked from the zygote, joined in one process group, watched from the calling thread.

``RankGroup`` is the one object behind every way the launcher runs ranks: ``launch`` starts a group for one job and
closes it; ``%%distributed`` (``magic``) keeps a group of persistent ranks open and sends it one cell at a time.
It owns the rendezvous (a ``TCPStore`` on port 0 of the ranks' network, hosted by a process the zygote forks, so
notebooks on one machine never race for a port and, where the ranks have a network of their own, no other user
reaches it), the ranks' pipes and their reader threads, and the supervision loop: output is printed as it arrives, on
the calling thread (ipykernel routes output from background threads unreliably), results are collected in rank
order, and a failure or a timeout becomes the error ``diagnostics`` words.
"""
from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time

from lab_utils import cgroups, processes
from lab_utils.launcher import diagnostics, wire
from lab_utils.launcher.backend import MAX_LOCAL_WORLD_SIZE, choose_backend, loopback_ifname, threads_per_rank
from lab_utils.launcher.events import STDERR_TAIL_LINES, Eof, Exit, Line, Rank, RankState, Result, start_readers
from lab_utils.launcher.worker import CELL_END

MASTER_ADDR = "127.0.0.1"
FAILURE_GRACE_S = 0.3  # after a first failure, wait this long for the root cause (a signal death) to surface
EXIT_STATUS_WAIT_S = 3.0  # ... and at most this long for a dead rank's exit status from a warm zygote
# A zygote still importing WARM_IMPORTS reports exits only between two imports (torch._dynamo alone takes seconds with
# a CUDA build of torch): its exit statuses are waited for this long at most
EXIT_STATUS_BUSY_WAIT_S = 60.0
STACK_DUMP_WAIT_S = 1.5
FORK_WAIT_S = 120.0
# What a rank costs its memory cgroup at start, measured here (torch 2.13, gloo, CPU): a fresh rank of a 2-rank launch
# forked from a warm zygote had a PSS of 67 MB (smaps_rollup: RSS 257 MB, 236 MB of it shared with the zygote) and
# added 17.5 MB to the cgroup's charge (memory.usage_in_bytes of a child cgroup sampled during the launch). The PSS
# is the figure taken: what the rank owns of the pages it maps, before its function allocates anything.
RANK_FOOTPRINT = 64 << 20
OOM_FIX = ("Use fewer ranks (world_size) or smaller sizes (batch, model, tensors), or free memory in this notebook "
           "(del large tensors) before launching.")

__all__ = ["RankGroup", "validate", "rank_env", "MASTER_ADDR"]


def validate(fn, world_size, timeout) -> None:
    """Bad arguments raise here, before anything starts."""
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


def rank_env(rank, world_size, port, threads, backend="gloo") -> dict:
    """torchrun's variables, so code written for torchrun runs unchanged on our ranks.

    Ranks of a CPU backend (gloo, the relay) see no GPU: torch code that asks ``torch.cuda.is_available()`` would
    otherwise put CPU ranks on CUDA devices (FSDP2's default mesh calls ``set_device(LOCAL_RANK)`` past the last GPU;
    PowerSGD synchronises a CUDA device for CPU tensors).
    """
    env = dict(os.environ)
    if backend != "nccl":
        env["CUDA_VISIBLE_DEVICES"] = ""
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


class RankGroup:
    """``world_size`` ranks running ``payload`` (a cloudpickled ``(fn, args, kwargs)``) in one process group.

    ``persistent``: the ranks run ``worker.serve_cells`` and wait for requests (``send``) instead of returning
    after one job. ``relay``: a ``relay.Relay`` whose process group the ranks join instead of ``backend`` (every
    message then passes through this process and is counted there). ``env``: extra variables for every rank.
    """

    def __init__(self, world_size: int, backend: str = "auto", timeout: float | None = 120, *, payload: bytes,
                 debug: bool = False, persistent: bool = False, store_timeout: float | None = None,
                 env: dict | None = None, relay=None):
        self.world_size, self.timeout, self.debug = world_size, timeout, debug
        choice = choose_backend(world_size, backend)
        self.backend, self.reason = choice.backend, choice.reason
        if relay is not None:
            self.backend, self.reason = relay.BACKEND, f"{relay.BACKEND}: every message counted by the launcher"
        store_timeout = store_timeout or (timeout if timeout is not None else 3600)
        self.store_hold: int | None = None  # the rendezvous lives until this descriptor is closed
        threads = threads_per_rank(world_size)
        # the memory cgroup before the ranks: too little free refuses now; an OOM kill is counted against it later
        self.memory_before = cgroups.memory()
        short = cgroups.shortfall("rank(s)", world_size, RANK_FOOTPRINT, self.memory_before, OOM_FIX)
        if short:
            raise diagnostics.LaunchError(short)
        job = dict(
            payload=payload, world_size=world_size, backend=self.backend, master_addr=MASTER_ADDR,
            master_port=None, cwd=os.getcwd(), sys_path=list(sys.path), threads=threads, debug=debug,
            persistent=persistent, store_timeout=store_timeout,
            # the process group's own timeout fires after ours, so the student sees our stack dump
            pg_timeout=(timeout + 60) if timeout is not None else 1800,
            relay=relay.address if relay is not None else None,
        )
        # SimpleQueue: its get is C code that an interrupt (the kernel's stop button, SIGINT) leaves unlocked;
        # Queue.get's Python lock could stay held when KeyboardInterrupt landed inside it, and the next get (the
        # wait for interrupted ranks to settle) then deadlocked the kernel and every reader thread
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.ranks: list[Rank] = []
        self.readers: list[threading.Thread] = []
        self.closed = False
        from lab_utils.launcher import zygote  # not at import: `python -m lab_utils.launcher.zygote` must be its only copy

        with zygote.lock:
            z = zygote.get_zygote()
            self.zygote_warm = z.warm
            z.events = self.events
            try:
                job["master_port"] = self._store(z)
                self._start(z, lambda r: {**job, "rank": r, "env": {
                    **rank_env(r, world_size, job["master_port"], threads, self.backend), **(env or {})}})
            finally:
                z.events = None

    # ---------------------------------------------------------------------------------------------- start/stop
    def _store(self, z) -> int:
        """Start this launch's rendezvous on the ranks' network; its port."""
        hold_r, self.store_hold = os.pipe()
        try:
            return z.store(hold_r)
        except (OSError, queue.Empty) as exc:
            self.close()
            raise diagnostics.LaunchError(f"the rendezvous for the ranks did not start: {exc}") from None
        finally:
            os.close(hold_r)

    def _start(self, z, make_job) -> None:
        """Fork the ranks, send each its job, start its readers; on any error kill the ranks already forked."""
        import cloudpickle

        try:
            for r in range(self.world_size):
                job_r, job_w = os.pipe()
                out_r, out_w = os.pipe()
                err_r, err_w = os.pipe()
                res_r, res_w = os.pipe()
                self.ranks.append(Rank(r, job_w, out_r, err_r, res_r))
                try:
                    z.fork(r, [job_r, out_w, err_w, res_w])
                finally:
                    for fd in (job_r, out_w, err_w, res_w):
                        os.close(fd)
            for _ in range(self.world_size):
                msg = z.forked.get(timeout=FORK_WAIT_S)
                if msg is None:
                    raise diagnostics.LaunchError("the launcher's fork server died while starting ranks; run it again")
                self.ranks[msg["rank"]].pid = msg["pid"]
            for rk in self.ranks:
                data = cloudpickle.dumps(make_job(rk.rank))
                threading.Thread(target=_write_quietly, args=(rk.job_w, data), daemon=True).start()
                self.readers.extend(start_readers(rk, self.events))
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list:
        return [rk.pid for rk in self.ranks]

    def alive(self) -> bool:
        return not self.closed and all(rk.state is not RankState.EXITED for rk in self.ranks)

    def close(self, wait_s: float = 2.0) -> None:
        """Kill the ranks (and their process groups), print what they still wrote, close their pipes."""
        if self.closed:
            return
        self.closed = True
        for rk in self.ranks:
            processes.kill_group_and_pid(rk.pid)
        self._drain(wait_s)
        for rk in self.ranks:
            for fd in (rk.job_w, rk.out_r, rk.err_r, rk.result_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
        if self.store_hold is not None:
            os.close(self.store_hold)  # the rendezvous's process sees the end and exits
            self.store_hold = None

    # ---------------------------------------------------------------------------------------------- requests
    def targets(self, ranks=None) -> list[Rank]:
        if ranks is None:
            return list(self.ranks)
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"no rank {bad[0]} in a group of {self.world_size} (ranks 0..{self.world_size - 1})")
        return [self.ranks[r] for r in sorted(set(ranks))]

    def send(self, targets, data: bytes) -> None:
        """One request frame to each of ``targets`` (persistent ranks); their results come back as events."""
        for rk in targets:
            rk.state, rk.value, rk.error = RankState.RUNNING, None, None
            rk.cell_ends = set()
            try:
                wire.write_frame(rk.job_w, data)
            except OSError:
                rk.state = RankState.EXITED  # its exit status (or the crash digest) tells why

    def interrupt(self, targets) -> list[Rank]:
        """SIGINT to every target still running (KeyboardInterrupt in its code); returns them."""
        running = [rk for rk in targets if rk.state is RankState.RUNNING]
        for rk in running:
            try:
                os.kill(rk.pid, signal.SIGINT)
            except OSError:
                pass
        return running

    # ---------------------------------------------------------------------------------------------- supervision
    def supervise(self, targets=None, timeout: float | None = None, debug_hint: str = diagnostics.DEBUG_HINT) -> list:
        """Print output as it arrives until every target returned (their values, in order) or one failed
        (``RankFailedError``) or ``timeout`` passed (``RankTimeoutError``, with where each stuck rank waits).
        The other ranks of the group are bystanders: their output and exit are still recorded."""
        targets = self.ranks if targets is None else targets
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        starvation = diagnostics.Starvation([rk.pid for rk in targets], timeout, start)  # busy is not stuck
        first_failure = status_wait_from = None
        while True:
            try:
                ev = self.events.get(timeout=0.05)
            except queue.Empty:
                ev = None
            while ev is not None:
                self._handle(ev)
                try:
                    ev = self.events.get_nowait()
                except queue.Empty:
                    ev = None
            sys.stdout.flush()
            sys.stderr.flush()
            if all(rk.state is RankState.OK for rk in targets):
                return [rk.value for rk in targets]
            failed = [rk for rk in targets if rk.state in (RankState.ERROR, RankState.EXITED)]
            now = time.monotonic()
            if failed:
                first_failure = first_failure or now
                status_wait_from = status_wait_from or now
                # A rank that died without a result is the likeliest root cause: wait for its exit status, and
                # for its stderr to reach end of file (its C++ message and stack may still be in the pipe).
                codes_known = all(rk.exit_code is not None and "stderr" in rk.closed
                                  for rk in targets if rk.state is RankState.EXITED)
                settled = all(rk.state is not RankState.RUNNING for rk in targets) and codes_known
                waited = now - first_failure
                if not self.zygote_warm.is_set():  # the wait for exit statuses starts once the zygote listens
                    status_wait_from = now
                gave_up = now - status_wait_from > EXIT_STATUS_WAIT_S or waited > EXIT_STATUS_BUSY_WAIT_S
                if settled or (waited > FAILURE_GRACE_S and codes_known) or gave_up:
                    raise diagnostics.failure_error(targets, self.oom_words(targets))
            if deadline is not None and now > deadline:
                deadline = starvation.extended(now)  # the ranks waited for a CPU meanwhile: look again later
                if deadline is not None:
                    continue
                stuck = [rk for rk in targets if rk.state is RankState.RUNNING]
                raise diagnostics.timeout_error(targets, stuck, self._collect_stacks(stuck), timeout, debug_hint,
                                                starved_s=starvation.last)

    def oom_words(self, targets) -> str | None:
        """Which ranks the out-of-memory killer ended: those that died by SIGKILL while the memory cgroup counted
        OOM kills since the group started (``cgroups.oom_words``: the limit, the use, what to change); else None."""
        killed = [f"rank {rk.rank}" for rk in targets
                  if rk.state is RankState.EXITED and rk.exit_code == -signal.SIGKILL]
        return cgroups.oom_words(killed, self.memory_before, OOM_FIX)

    def settle(self, targets, wait_s: float) -> None:
        """Handle events until no target is running, for at most ``wait_s``."""
        until = time.monotonic() + wait_s
        while any(rk.state is RankState.RUNNING for rk in targets) and time.monotonic() < until:
            try:
                self._handle(self.events.get(timeout=0.05))
            except queue.Empty:
                pass
        sys.stdout.flush()

    def wait_cell_ends(self, targets, wait_s: float = 5.0) -> None:
        """After every target returned, print what is still in flight until each says its output ended (bounded)."""
        deadline = time.monotonic() + wait_s
        while any(len(rk.cell_ends) < 2 for rk in targets if rk.state is not RankState.EXITED):
            if time.monotonic() > deadline:
                return
            try:
                self._handle(self.events.get(timeout=0.05))
            except queue.Empty:
                continue
        sys.stdout.flush()
        sys.stderr.flush()

    def _collect_stacks(self, stuck) -> dict:
        """Ask each stuck rank for a faulthandler dump of its threads (SIGUSR1) and collect it from its stderr."""
        dumps = {rk.rank: [] for rk in stuck}
        for rk in stuck:
            try:
                os.kill(rk.pid, signal.SIGUSR1)
            except (ProcessLookupError, TypeError):
                pass
        until = time.monotonic() + STACK_DUMP_WAIT_S
        while time.monotonic() < until:
            try:
                ev = self.events.get(timeout=0.05)
            except queue.Empty:
                continue
            if isinstance(ev, Line) and ev.stream == "stderr" and ev.rank in dumps:
                dumps[ev.rank].append(ev.text)  # captured for the error, not streamed twice
            else:
                self._handle(ev)
        return dumps

    def _handle(self, ev) -> None:
        import cloudpickle

        rk = self.ranks[ev.rank] if 0 <= ev.rank < len(self.ranks) else None
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
        elif isinstance(ev, Eof):
            rk.closed.add(ev.stream)
        elif isinstance(ev, Exit):
            rk.exit_code = ev.status
            if rk.state is RankState.RUNNING:
                rk.state = RankState.EXITED

    def _drain(self, wait_s: float) -> None:
        """Print what the ranks wrote before they were stopped."""
        until = time.monotonic() + wait_s
        for t in self.readers:
            t.join(timeout=max(0.0, until - time.monotonic()))
        while True:
            try:
                ev = self.events.get_nowait()
            except queue.Empty:
                break
            if isinstance(ev, Line):
                self._handle(ev)
        sys.stdout.flush()
        sys.stderr.flush()


def _write_quietly(fd, data) -> None:
    try:
        wire.write_frame(fd, data)
    except OSError:
        pass  # the rank died before reading its job; its exit status tells the story
