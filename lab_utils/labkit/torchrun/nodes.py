"""``run_nodes``: N torchrun agents on loopback, their output streamed, ports retried, events fired (see the
package docstring)."""
from __future__ import annotations

import inspect
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass, field

from lab_utils import cgroups, netns, processes, tempdirs
from lab_utils.labkit.torchrun import warmstart
from lab_utils.labkit.torchrun.store import HOST, RunStore
from lab_utils.labkit.torchrun.reaping import (MARKER, kill_node, port_owners, processes_of, reap,
                                               remember_children)
from lab_utils.launcher.diagnostics import Starvation

LOG_PREFIX = "dtlabs-torchrun-"


def remove_stale_log_folders() -> list[str]:
    """The log folders of runs whose harness was killed, with its agents, before either could remove them."""
    return tempdirs.remove_orphaned_tempdirs(LOG_PREFIX)


AGENT_STORE = "DTLABS_AGENT_STORE"  # host:port:n of the run's store, for the agent that must wait for n others
EXITED_KEY = "dtlabs_agents_exited"
PORT_RETRIES = 3
# once an agent has given up (exit code != 0), the job has failed: the others get this long to finish their output,
# then they are stopped (they would wait at torchrun's exit barrier or in a rendezvous for minutes)
FAILED_GRACE_S = 10.0
_PORT_IN_USE = ("EADDRINUSE", "address already in use", "Address already in use")


@dataclass
class TorchrunResult:
    """What a multi-node run left: each agent's exit code and every line it printed, tagged with its node."""

    returncodes: list
    lines: list = field(default_factory=list)  # (node, text)
    seconds: float = 0.0
    port: int = 0
    run_id: str = ""  # the DTLABS_RUN_ID marker its agents and workers carried
    commands: list = field(default_factory=list)  # each agent's torchrun command line
    left: list = field(default_factory=list)  # nodes that left on purpose (an ``events`` "leave")
    events: list = field(default_factory=list)  # (seconds, marker, "leave" or "join", node), in order

    @property
    def ok(self) -> bool:
        """Every agent exited 0, except the nodes that left on purpose (they were killed)."""
        return all(code == 0 for node, code in enumerate(self.returncodes) if node not in self.left)

    def output(self, node: int | None = None) -> str:
        return "\n".join(text for n, text in self.lines if node is None or n == node)


class TorchrunError(RuntimeError):
    """An agent exited with a non-zero code (its workers failed more often than --max-restarts allows)."""

    def __init__(self, message, result):
        super().__init__(message)
        self.result = result


class TorchrunTimeout(TorchrunError, TimeoutError):
    """The run did not finish within ``timeout``; every agent and worker has been killed."""


def free_port() -> int:
    """A port nobody listens on right now (another process may still take it: ``run_nodes`` retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def agent_command(script, script_args=(), *, nnodes=2, nproc_per_node=1, node_rank=0, rdzv="static",
                  master_addr=HOST, port=29500, run_id="dtlabs", max_restarts=0, python=None,
                  rdzv_conf=None, min_nodes=None) -> list:
    """The torchrun command line for one node. On real machines ``master_addr`` is the first node's hostname.

    ``rdzv="static"``: every node is told its ``--node-rank`` and the master's address and port; node 0
    hosts the store. ``rdzv="c10d"``: nodes meet at ``--rdzv-endpoint`` and the rendezvous hands out the
    node ranks (``GROUP_RANK``), which is what lets torchrun restart or replace nodes. ``rdzv_conf``: extra
    rendezvous settings, e.g. ``{"is_host": "false"}`` for a c10d agent that joins a store it does not host.
    ``min_nodes``: an elastic job, ``--nnodes=MIN:MAX`` with ``nnodes`` as MAX (c10d only): the job runs on any
    number of nodes in that range and restarts its workers when a node leaves or joins.
    """
    if rdzv not in ("static", "c10d"):
        raise ValueError(f"rdzv must be 'static' or 'c10d', got {rdzv!r}")
    if min_nodes is not None and (rdzv != "c10d" or not 1 <= min_nodes <= nnodes):
        raise ValueError(f"an elastic job needs c10d rendezvous and 1 <= min_nodes <= nnodes, got rdzv={rdzv!r}, "
                         f"min_nodes={min_nodes}, nnodes={nnodes}")
    span = nnodes if min_nodes is None else f"{min_nodes}:{nnodes}"
    cmd = [python or sys.executable, "-m", "torch.distributed.run", f"--nnodes={span}",
           f"--nproc-per-node={nproc_per_node}"]
    if rdzv == "static":
        cmd += [f"--node-rank={node_rank}", f"--master-addr={master_addr}", f"--master-port={port}"]
    else:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={master_addr}:{port}", f"--rdzv-id={run_id}"]
    if rdzv_conf:
        cmd.append("--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in dict(rdzv_conf).items()))
    cmd += [f"--max-restarts={max_restarts}", "--monitor-interval=0.1", str(script), *map(str, script_args)]
    return cmd


_HARD_EXIT = """import os as _os, sys as _sys  # written by lab_utils.labkit.torchrun.write_script: see its docstring
_sys.stdout.flush()
_sys.stderr.flush()
_os._exit(0)"""
_COLLECTOR_OFF = """import gc as _gc  # written by lab_utils.labkit.torchrun.write_script: see its docstring
_gc.disable()"""
_COLLECTOR_ON = """_gc.freeze()
_gc.enable()"""


def write_script(path, *functions, main: str, header: str = "") -> str:
    """Write notebook-defined functions into a script torchrun can run: ``header``, each function's source,
    then ``main`` under ``if __name__ == "__main__":``, then a hard exit once ``main`` returned. Returns the path.

    The header's imports (torch's) run with Python's cyclic collector off, and what they made is then frozen
    (``processes.collector_off_while_importing``: 30 % of ``import torch``'s CPU in every worker torchrun starts
    and restarts); the functions and ``main`` run with it on. The hard exit (``os._exit(0)`` after flushing) skips
    interpreter teardown: under load, torch's C++ threads sometimes abort it even after ``destroy_process_group``
    (SIGABRT, "terminate called without an active exception"), and torchrun counts that finished worker as failed. An
    exception in ``main`` still exits 1."""
    parts = []
    if header.strip():
        lines = textwrap.dedent(header).strip().splitlines()
        future = [line for line in lines if line.startswith("from __future__")]  # must stay the file's first
        rest = [line for line in lines if not line.startswith("from __future__")]
        parts.append("\n".join([*future, _COLLECTOR_OFF, *rest, _COLLECTOR_ON]) + "\n")
    for fn in functions:
        parts.append(textwrap.dedent(inspect.getsource(fn)).rstrip() + "\n")
    parts.append('if __name__ == "__main__":\n' + textwrap.indent(textwrap.dedent(main).strip() + "\n" + _HARD_EXIT,
                                                                  "    ") + "\n")
    with open(path, "w") as f:
        f.write("\n\n".join(parts))
    return str(path)


def _agent_env(run_id, nranks, env, join=None, hosts=None):
    from lab_utils.launcher.backend import loopback_ifname, threads_per_rank

    out = dict(os.environ)
    if join is not None and hosts is None:  # agents and workers start in the ranks' network (``store``)
        out[netns.JOIN_VAR] = str(join)
    if join is not None:  # quiet as the ranks are: c10d cannot name its peers where no DNS server answers
        out.setdefault("TORCH_CPP_LOG_LEVEL", netns.LOG_LEVEL)
    out.update({
        MARKER: run_id,
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # pytorch#135712: restarts with gloo otherwise hang
        "OMP_NUM_THREADS": str(threads_per_rank(nranks)),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": processes.python_path(os.environ.get("PYTHONPATH")),
    })
    ifname = loopback_ifname()
    if ifname and hosts is None:  # on hosts, gloo finds its interface as on a cluster: from the host's own name
        out.setdefault("GLOO_SOCKET_IFNAME", ifname)
    out.update({k: str(v) for k, v in (env or {}).items()})
    return out


def _once(script, script_args, nnodes, nproc_per_node, rdzv, max_restarts, timeout, env, cwd, quiet, port,
          min_nodes=None, max_nodes=None, rdzv_conf=None, events=None, hosts=None):
    run_id = uuid.uuid4().hex[:12]
    max_nodes = max_nodes or nnodes
    # torchrun's log folder (its workers' error.json files): without --log-dir each agent makes a torchelastic_*
    # folder in /tmp and never removes it; this one goes when the run does (the finally below), or, where this
    # process was killed first and its agents in turn, with the next run's start
    remove_stale_log_folders()
    logs = tempdirs.owned_tempdir(LOG_PREFIX, tag=run_id)
    store = None
    try:
        store = RunStore(hosts)
        agent_env = _agent_env(run_id, max_nodes * nproc_per_node, env, store.join, hosts)
        if hosts is None:  # (on hosts every agent and worker starts cold: a warm server runs on one network)
            agent_env.update(warmstart.shared_env(agent_env))
    except BaseException:
        if store is not None:
            store.close()
        shutil.rmtree(logs, ignore_errors=True)
        raise
    queued: queue.Queue = queue.Queue()
    procs, seen, lines, commands = [], [], [], []
    fired, left = [], set()  # (seconds, marker, action, node) of each event; nodes that left on purpose
    pending = dict(events or {})
    clash = False
    conf = {}
    if rdzv == "c10d":  # every agent joins the run's store; none hosts it, so none can take it away
        port, conf = store.port, {"is_host": "false"}
    conf.update(rdzv_conf or {})
    exited = set()
    failed_at = None  # when the first agent exited with a non-zero code (a node that left does not count)
    port_ok = False  # a static run: node 0's agent is listening on the master port
    start = next_scan = time.monotonic()
    # busy is not stuck: the timeout is extended by the time the run's processes waited for a CPU (a shared machine,
    # a cgroup's quota), as a launch's is (diagnostics.Starvation); a run that hangs without wanting a CPU still stops
    starvation, deadline = Starvation([], timeout, start), None if timeout is None else start + timeout

    def start_agent(node):
        cmd = agent_command(script, script_args, nnodes=max_nodes, nproc_per_node=nproc_per_node, node_rank=node,
                            rdzv=rdzv, port=port, run_id=run_id, max_restarts=max_restarts, rdzv_conf=conf,
                            min_nodes=min_nodes, master_addr=hosts.names[0] if hosts is not None else HOST)
        node_env = agent_env
        if rdzv == "static" and node == 0 and nnodes > 1:  # node 0 hosts the static store: it leaves last
            node_env = {**agent_env, AGENT_STORE: f"{HOST}:{store.port}:{nnodes - 1}"}
        # run torchrun's own main through our tiny shim, which first asks Linux to SIGTERM it if we die; forked
        # from a warm server where one can run (warmstart), else a fresh interpreter
        shim = [str(os.getpid()), f"--log-dir={os.path.join(logs, f'node{node}')}", *cmd[3:]]
        forked = warmstart.start_agent(shim, node_env, cwd, agent_env) if hosts is None else None
        if forked:
            proc, out = forked
            done = lambda n=node, fd=out: (os.close(fd), queued.put((n, None)))  # noqa: E731
        else:
            proc = subprocess.Popen([sys.executable, "-m", "lab_utils.labkit.torchrun.agent", *shim],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    env=node_env, cwd=cwd, start_new_session=True,
                                    preexec_fn=netns.preexec(node_env) if hosts is None else
                                    hosts.preexec(node % len(hosts)))
            out, done = proc.stdout.fileno(), lambda n=node: queued.put((n, None))
        procs.append(proc)
        commands.append(cmd)
        processes.pump_lines(out, lambda text, n=node: queued.put((n, text)), done)

    try:
        for node in range(nnodes):
            start_agent(node)
        open_streams = nnodes
        while open_streams or any(p.poll() is None for p in procs):
            for node, proc in enumerate(procs):
                if node not in exited and proc.poll() is not None:
                    exited.add(node)
                    if node > 0:
                        store.count(EXITED_KEY)
                    if proc.returncode != 0 and failed_at is None and node not in left:
                        failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > FAILED_GRACE_S and any(
                    p.poll() is None for p in procs):
                gave_up = [n for n, p in enumerate(procs) if p.poll() not in (None, 0) and n not in left]
                waiting = [n for n, p in enumerate(procs) if p.poll() is None]
                lines.append((gave_up[0], f"the agent of node {gave_up[0]} exited with code "
                              f"{procs[gave_up[0]].returncode}; the agents of nodes {waiting} were still waiting for "
                              f"it {FAILED_GRACE_S:g} s later (torchrun's exit barrier or a rendezvous): stopped them"))
                break
            if deadline is not None and time.monotonic() > deadline:
                # the agents, and the workers (a warm server's children, not the agent's: found by the run's marker)
                starvation.add([p.pid for p in (*procs, *seen, *processes_of(run_id))])
                deadline = starvation.extended(time.monotonic())
            if timeout is not None and deadline is None:
                result = TorchrunResult([p.poll() for p in procs], lines, time.monotonic() - start, port, run_id,
                                        commands, sorted(left), fired)
                waited = f" (and the {starvation.last:.0f} s it waited for a CPU)" if starvation.last >= 1 else ""
                raise TorchrunTimeout(
                    f"torchrun did not finish within {timeout} s{waited}: every agent and worker has been killed. "
                    "A worker that waits for a peer which never comes (a rank that died outside a restartable "
                    "failure, a missed collective, a node that never joined) looks exactly like this.", result)
            if time.monotonic() > next_scan:  # a scan reads /proc: not too often
                remember_children(procs, seen)
                next_scan = time.monotonic() + 1.0
                if rdzv == "static" and not port_ok:  # torch notices a taken port only after a minute of retries
                    owners, strangers = port_owners(port, procs, seen, run_id, store.join)
                    if strangers:
                        lines.append((0, f"port {port} is taken by another process (pid {sorted(map(str, strangers))})"))
                        clash = True
                        break
                    port_ok = bool(owners)
            try:
                node, text = queued.get(timeout=0.05)
            except queue.Empty:
                continue
            if text is None:
                open_streams -= 1
                continue
            lines.append((node, text))
            if any(s in text for s in _PORT_IN_USE):  # someone took our port: the other agents would wait forever
                clash = True
                break
            if not quiet:
                print(f"[node {node}] {text}", flush=True)
            for marker in [m for m in pending if m in text]:
                action = pending.pop(marker)
                seconds = round(time.monotonic() - start, 2)
                if action == "leave":  # the node fails as a machine does: agent and workers gone at once
                    left.add(node)
                    remember_children(procs, seen)
                    kill_node(procs[node])
                    fired.append((seconds, marker, "leave", node))
                    msg = f"node {node} left the job (its agent and workers were killed)"
                else:
                    start_agent(len(procs))
                    open_streams += 1
                    fired.append((seconds, marker, "join", len(procs) - 1))
                    msg = f"node {len(procs) - 1} joins the job (a new agent)"
                lines.append((node, f"[torchrun harness] {msg}"))
                if not quiet:
                    print(f"[torchrun harness] {msg}", flush=True)
        return TorchrunResult([p.poll() for p in procs], lines, time.monotonic() - start, port, run_id, commands,
                              sorted(left), fired), clash
    finally:
        reap(procs, seen, run_id)
        for proc in procs:
            if proc.stdout:
                proc.stdout.close()
        store.close()  # only now: every agent is gone
        shutil.rmtree(logs, ignore_errors=True)


def run_nodes(script, *script_args, nnodes=2, nproc_per_node=1, rdzv="static", max_restarts=0, timeout=60,
              env=None, cwd=None, check=True, quiet=False, min_nodes=None, max_nodes=None, rdzv_conf=None,
              events=None, hosts=None) -> TorchrunResult:
    """Run ``script`` under ``nnodes`` torchrun agents on loopback, each with ``nproc_per_node`` workers.

    Returns a ``TorchrunResult``. Raises ``TorchrunTimeout`` past ``timeout`` seconds (plus the time its processes
    waited for a CPU) and, with ``check``,
    ``TorchrunError`` when an agent fails. In every case, including ``KeyboardInterrupt``, every agent and
    worker of the run is dead when this returns or raises. ``env`` adds variables for agents and workers.

    ``max_restarts`` (how often torchrun restarts every worker after a failure) needs ``rdzv="c10d"``.

    Elastic jobs (c10d): ``min_nodes`` and ``max_nodes`` (default ``nnodes``) give every agent
    ``--nnodes=MIN:MAX``; ``rdzv_conf`` adds rendezvous settings (``last_call_timeout``, ``keep_alive_interval``,
    ...); ``events`` maps a marker to ``"leave"`` or ``"join"``: the first line containing the marker kills the
    node that printed it, or starts one more agent (module docstring).

    ``hosts`` (``hosts.Hosts``): node i's agent runs on host i (modulo their number), each with its own address and
    name, and the agents meet at the first host's name, as on a cluster; without, every agent runs on loopback.
    """
    for marker, action in (events or {}).items():
        if action not in ("leave", "join") or not marker:
            raise ValueError(f"events map a marker to 'leave' or 'join', got {marker!r}: {action!r}")
    if (min_nodes is not None or events) and rdzv != "c10d":
        raise ValueError("an elastic job (min_nodes, events) needs rdzv='c10d'")
    if max_restarts and rdzv != "c10d":
        raise ValueError(
            "restarts (max_restarts > 0) need rdzv='c10d', as torch's docs launch a fault-tolerant job: a static "
            "rendezvous keeps one store for every attempt, so restarted gloo workers can read the old workers' "
            "addresses and fail ('Connection refused'), and it never tells the other nodes' agents to restart")
    if max_nodes is not None and max_nodes < nnodes:
        raise ValueError(f"max_nodes={max_nodes} is less than the {nnodes} nodes started")
    if not os.path.exists(os.path.join(cwd or ".", str(script))):
        raise FileNotFoundError(f"no script {script!r} to run (write it first, e.g. with write_script)")
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError(f"need at least one node and one process per node, got {nnodes} x {nproc_per_node}")
    before = cgroups.memory()  # the out-of-memory kills counted from here are this run's
    for attempt in range(1, PORT_RETRIES + 1):
        port = free_port()
        result, clash = _once(script, script_args, nnodes, nproc_per_node, rdzv, max_restarts, timeout, env, cwd,
                              quiet, port, min_nodes, max_nodes, rdzv_conf, events, hosts)
        if not clash or attempt == PORT_RETRIES:
            break
        print(f"[torchrun] port {port} was taken by another process; retrying on a new port", flush=True)
    if check and not result.ok:
        codes = ", ".join(f"node {n}: {c}" for n, c in enumerate(result.returncodes) if n not in result.left)
        oom = _out_of_memory(result, before)
        if quiet:  # nothing was printed: the error carries the first failure itself
            raise TorchrunError(f"torchrun failed (exit codes {codes}); the first failure in its output:\n"
                                f"{first_failure(result.lines)}{oom}", result)
        raise TorchrunError(f"torchrun failed (exit codes {codes}); the output above shows which rank failed "
                            f"first (look for the first Traceback).{oom}", result)
    return result


def _out_of_memory(result, before) -> str:
    """Words for workers the out-of-memory killer stopped (torchrun reports them as ``exitcode : -9``), from the
    memory cgroup's own count of its kills since ``before``; empty where it counted none."""
    text = "\n".join(t for _, t in result.lines)
    killed = [f"worker rank {m[1]}" for m in re.finditer(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*exitcode\s*:\s*-9\b",
                                                        text)]
    words = cgroups.oom_words(killed or ["a torchrun worker"], before,
                              "Use fewer workers (nproc_per_node, nnodes) or smaller sizes (batch, model, tensors).")
    return f"\n{words}" if words else ""


def first_failure(lines, context: int = 40) -> str:
    """The first Traceback in a run's (node, text) lines and what follows it on that node, else the last lines."""
    start = next((i for i, (_, text) in enumerate(lines) if "Traceback" in text), None)
    if start is None:
        picked = lines[-context // 2:]
    else:
        picked = [(n, t) for n, t in lines[start:] if n == lines[start][0]][:context]
    return "\n".join(f"[node {n}] {t}" for n, t in picked) or "(the agents printed nothing)"
