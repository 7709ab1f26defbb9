"""The zygote: a warm fork server that forks a clean rank process per rank per launch.

Why: a fresh interpreter per rank pays ``import torch`` (2-3 s) on every launch, and forking the notebook itself
is unsafe once CUDA or threads are live (pytorch#20375, accelerate#940). The zygote imports torch (never CUDA),
stays single-threaded and forks a rank in about a millisecond; ranks are used once and exit, and the zygote never
runs student code. One zygote per launching process: a fresh interpreter (``python -m
lab_utils.launcher.zygote``; nothing imports this module at ``import lab_utils``, so runpy runs its only copy)
started on first use, or, where the launching process is itself single-threaded and
imports torch anyway (the grading subject), a fork of it (``fork_zygote``).

Both sides of its protocol live here (one Unix socket, JSON frames, see ``wire``):
  launcher -> zygote  {"op": "fork", "rank": k}  + fds [job_r, out_w, err_w, result_w]
  zygote -> launcher  {"op": "forked", "rank": k, "pid": p}
  launcher -> zygote  {"op": "store"}  + fds [hold_r]
  zygote -> launcher  {"op": "store", "pid": p, "port": n}     (a launch's rendezvous, up until hold_r ends)
  zygote -> launcher  {"op": "exit", "pid": p, "status": s}   (waitpid status, signal as -signum)
  zygote -> launcher  {"op": "ready", "modules": [...], "network": why}  (torch imported: forks can start)
  zygote -> launcher  {"op": "warm"}                           (every WARM_IMPORTS module imported)
What a forked rank then does is ``worker``'s.

The ranks' network is the zygote's: it enters a network namespace of its own first where the machine allows
(``netns``), and each launch's ``TCPStore`` rendezvous is hosted in it, by a process the zygote forks for the
launch (``worker.keep_store``), so no other user's process can reach a rank's port.

Nothing survives: the zygote is the child subreaper of everything under it, kills what a rank started when the
rank ends (a rank marks its environment with ``RANK_MARK``), dies with its launcher (``PR_SET_PDEATHSIG`` plus a
watchdog) and, on SIGTERM, kills every descendant before it exits.
"""
from __future__ import annotations

import atexit
import gc
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading

from lab_utils import netns, processes, settings
from lab_utils.launcher import wire
from lab_utils.launcher.events import Exit
from lab_utils.launcher.worker import RANK_MARK, keep_store, rank_after_fork

# Imported right away (a cold launch waits for these) ...
CORE_IMPORTS = ["torch", "torch.distributed", "cloudpickle"]
# ... then one at a time while the zygote is idle, so later launches of DDP/FSDP code start warm
# (the first DDP() pulls in torch._dynamo, and FSDP's modules take seconds more to import: ARCHITECTURE.md §7).
WARM_IMPORTS = [
    "torch.nn.parallel",
    "torch.distributed.algorithms.ddp_comm_hooks",
    "torch._dynamo",
    "torch.distributed.fsdp",
    "torch.distributed.optim",
    "torch.distributed.checkpoint",
    "torch.profiler",
    "torch.distributed.device_mesh",  # Lab 07's meshes and tensor parallel: the first DTensor launch is 4 s cold
    "torch.distributed.tensor.parallel",
    "torch.utils.data",
    "torch.optim",
    "numpy",
]


# ------------------------------------------------------------------------------------ the launcher's side
class Zygote:
    """The launching process's handle on its zygote: fork ranks, hear when they exit, stop it."""

    def __init__(self, fork_here: bool = False, close_fds=()):
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if fork_here:  # see fork_zygote
            self.proc = processes.ForkedChild(
                _forked_zygote, child_sock.fileno(), os.getpid(), (parent_sock.fileno(), *close_fds)
            )
        else:
            env = dict(os.environ)
            env["PYTHONPATH"] = processes.python_path(env.get("PYTHONPATH"))
            env["PYTHONUNBUFFERED"] = "1"
            env.setdefault("OMP_NUM_THREADS", "1")  # the zygote computes nothing; ranks set their own
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lab_utils.launcher.zygote", str(child_sock.fileno()), str(os.getpid())],
                pass_fds=[child_sock.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a Ctrl-C / kernel interrupt reaches us, not the zygote
            )
        child_sock.close()
        self.sock = parent_sock
        self.owner_pid = os.getpid()
        self.ready = threading.Event()
        self.network = "unknown: the fork server has not started"  # netns.enter's answer, from the zygote
        self.warm = threading.Event()
        self.forked: queue.SimpleQueue = queue.SimpleQueue()  # as RankGroup.events: safe to interrupt a get
        self.events: queue.SimpleQueue | None = None  # the running launch's event queue
        self.pid_owner: dict[int, tuple] = {}
        self.send_lock = threading.Lock()
        self.dead = threading.Event()
        threading.Thread(target=self._read, name="dtlabs-zygote-reader", daemon=True).start()

    def _read(self):
        try:
            while True:
                msg, _ = wire.recv_json(self.sock)
                if msg is None:
                    break
                op = msg["op"]
                if op == "ready":
                    self.network = msg.get("network", self.network)
                    self.ready.set()
                elif op == "warm":
                    self.warm.set()
                elif op == "store":
                    self.forked.put(msg)
                elif op == "forked":
                    # an exit notice must reach the launch that forked the pid, never a later one
                    self.pid_owner[msg["pid"]] = (self.events, msg["rank"])
                    self.forked.put(msg)
                elif op == "exit":
                    events, rank = self.pid_owner.pop(msg["pid"], (None, None))
                    if events is not None:
                        events.put(Exit(rank, msg["status"]))
        except OSError:
            pass
        finally:
            self.dead.set()
            self.forked.put(None)

    def alive(self) -> bool:
        return not self.dead.is_set() and self.proc.poll() is None and self.owner_pid == os.getpid()

    def fork(self, rank: int, fds) -> None:
        with self.send_lock:
            wire.send_json(self.sock, {"op": "fork", "rank": rank}, fds=fds)

    def store(self, hold_r: int) -> int:
        """A rendezvous store on the ranks' network, up until ``hold_r``'s other end is closed: its port."""
        with self.send_lock:
            wire.send_json(self.sock, {"op": "store"}, fds=[hold_r])
        msg = self.forked.get(timeout=120)
        if msg is None or msg.get("op") != "store":
            raise OSError("the launcher's fork server died before the rendezvous was up; run it again")
        return msg["port"]

    def stop(self):
        """SIGTERM first: the zygote kills every process under it (ranks and whatever they started), then exits."""
        for sig, wait_s in ((signal.SIGTERM, 3), (signal.SIGKILL, 5)):
            try:
                self.proc.send_signal(sig)
                self.proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
            except OSError:
                break
        self.sock.close()


def _forked_zygote(sock_fd: int, launcher_pid: int, close_fds) -> None:
    """The child side of ``fork_zygote``: drop the parent's descriptors, leave its session, serve forks."""
    for fd in close_fds:
        os.close(fd)
    os.setsid()  # as start_new_session: a Ctrl-C / interrupt reaches the launcher, not the zygote
    zygote_main(sock_fd, launcher_pid)


_zygote: Zygote | None = None
lock = threading.RLock()


def fork_zygote(close_fds=()) -> None:
    """Make this process's zygote by forking this process, after importing what a zygote imports first.

    Saves a fresh interpreter's ``import torch`` (about 1.7 s of CPU) where the launching process will import
    torch anyway: the grading subject, which calls this at start-up, before it starts a thread or runs a cell,
    so the fork is clean (no threads, no CUDA, no student code). ``close_fds``: descriptors the zygote must not
    keep (the subject's socket to the grader, whose end-of-file tells the grader the subject is gone). Anywhere
    else (a notebook kernel has threads) the zygote is a fresh interpreter, started on first use.
    """
    global _zygote
    with processes.collector_off_while_importing():
        for name in CORE_IMPORTS:
            __import__(name)
    if threading.active_count() > 1:
        raise RuntimeError("fork_zygote() needs a single-threaded process; launch() starts a fresh zygote instead")
    with lock:
        if _zygote is not None:
            _zygote.stop()
        _zygote = Zygote(fork_here=True, close_fds=close_fds)


def get_zygote() -> Zygote:
    global _zygote
    with lock:
        if _zygote is None or not _zygote.alive():
            if _zygote is not None:
                _zygote.stop()
            _zygote = Zygote()
        return _zygote


def shutdown() -> None:
    """Stop the fork server. Called at exit; a later ``launch`` starts a new one."""
    global _zygote
    with lock:
        if _zygote is not None:
            _zygote.stop()
            _zygote = None


atexit.register(shutdown)


# ------------------------------------------------------------------------------------- the zygote's side
def zygote_main(sock_fd: int, launcher_pid: int) -> None:
    """The zygote's life: import torch, then warm up while serving forks until the launcher goes."""
    # first, while nothing else runs: every process forked from here on shares its network
    network = netns.enter() if settings.load().private_network else "shared: c.DTLabs.private_network is off"
    if network == netns.PRIVATE:  # read once, by the import of torch below, for every rank forked from here
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", netns.LOG_LEVEL)
    gc.disable()  # a fork server: no collection over what it imports (30 % of torch's import); ranks turn it on
    import psutil  # noqa: F401 - before the SIGTERM handler can run: it kills with psutil, mid-import would fail
    processes.set_name("dtlabs-zygote")
    # Every process under us stays ours: orphaned rank children (own-session ones included) re-parent to the
    # zygote, which kills them when their rank is gone and kills everything under it before it exits.
    processes.become_subreaper()
    signal.signal(signal.SIGTERM, _exit_with_descendants)
    processes.die_with_parent(launcher_pid, sig=signal.SIGTERM)  # the launcher died: clean up, then exit
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a kernel interrupt is the launcher's to handle
    sock = socket.socket(fileno=sock_fd)
    for name in CORE_IMPORTS:
        __import__(name)
    wire.send_json(sock, {"op": "ready", "modules": CORE_IMPORTS, "network": network})
    pending_imports = list(WARM_IMPORTS) if settings.load().warm_imports else []
    if not pending_imports:
        wire.send_json(sock, {"op": "warm"})
    children: set[int] = set()
    stores: set[int] = set()  # processes hosting a launch's rendezvous (reaped silently)
    try:
        while True:
            # Reap exited ranks and report their status (the launcher cannot waitpid on our children).
            # Adopted orphans are reaped here too, silently.
            rank_ended = False
            for pid, code in processes.reap_children():
                if pid in stores:
                    stores.discard(pid)
                    rank_ended = True
                if pid not in children:
                    continue
                children.discard(pid)
                rank_ended = True
                wire.send_json(sock, {"op": "exit", "pid": pid, "status": code})
            if rank_ended:
                _kill_orphans(children | stores)
            if os.getppid() != launcher_pid:
                break
            timeout = 0.0 if pending_imports else 0.05
            readable, _, _ = select.select([sock], [], [], timeout)
            if not readable:
                if pending_imports:
                    name = pending_imports.pop(0)
                    try:
                        __import__(name)
                    except Exception:  # optional extras: absence only costs warm-up time
                        pass
                    if threading.active_count() > 1:  # pragma: no cover - would make fork unsafe
                        print(f"dtlabs-zygote: importing {name} started a thread", file=sys.stderr)
                    if not pending_imports:
                        wire.send_json(sock, {"op": "warm"})
                continue
            msg, fds = wire.recv_json(sock, maxfds=4)
            if msg is None:
                break
            if msg.get("op") == "store":
                stores.add(_fork_store(sock, fds[0]))
                continue
            if msg.get("op") == "fork":
                sys.stdout.flush()
                sys.stderr.flush()
                gc.freeze()  # the rank's collections skip (and so leave uncopied) every object the zygote made
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    rank_after_fork(msg["rank"], fds, zygote_pid=os.getppid(), launcher_pid=launcher_pid)
                    os._exit(0)  # not reached
                children.add(pid)
                for fd in fds:
                    os.close(fd)
                wire.send_json(sock, {"op": "forked", "rank": msg["rank"], "pid": pid})
            elif msg.get("op") == "stop":
                break
    finally:
        for pid in children | stores:
            processes.killpg_quiet(pid)
        processes.kill_descendants()


def _fork_store(sock, hold_r: int) -> int:
    """Fork the process that hosts one launch's rendezvous on a port of this network; tell the launcher the port."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        sock.close()
        keep_store(listener, hold_r, zygote_pid=os.getppid())
        os._exit(0)  # not reached
    listener.close()
    os.close(hold_r)
    wire.send_json(sock, {"op": "store", "pid": pid, "port": port})
    return pid


def _exit_with_descendants(signum, frame):
    """SIGTERM (the launcher's death or ``shutdown``): no rank, nor anything a rank started, outlives us."""
    processes.kill_descendants()
    os._exit(0)


def _kill_orphans(live_ranks: set) -> None:
    """Kill the adopted orphans (and their trees) whose rank has ended.

    A rank marks its environment with ``DTLABS_RANK_PID``, so the programs it starts carry its pid; an orphan
    without the mark (a forked-only child that left the rank's session) is killed once no rank is running."""
    import psutil

    try:
        orphans = [p for p in psutil.Process().children() if p.pid not in live_ranks]
    except psutil.Error:
        return
    doomed = []
    for p in orphans:
        try:
            owner = p.environ().get(RANK_MARK)
        except (psutil.Error, OSError):
            owner = None
        if (owner is None and not live_ranks) or (owner is not None and int(owner) not in live_ranks):
            doomed.append(p)
    if doomed:
        processes.kill_procs([q for p in doomed for q in processes.tree(p.pid)], wait_s=0)


if __name__ == "__main__":  # a fresh zygote (``Zygote``); the package's import of lab_utils does not load this module
    zygote_main(int(sys.argv[1]), int(sys.argv[2]))
