"""torchrun's agents and workers forked from warm servers (``lab_utils.warm``) instead of started as fresh
interpreters.

Every agent is ``python -m lab_utils.labkit.torchrun.agent``, and every worker torchrun starts ``python -u SCRIPT
ARGS``: fresh interpreters that import torch before they do anything (about a CPU-second each; a run that restarts
starts its workers again, and a lab starts dozens of both). The harness (``nodes``) keeps two servers per import
environment in its own process, each of which imported torch once: it forks its agents from one (``start_agent``),
and names the other to them (``ADDRESS_VAR``), and each agent (``agent``) has torchrun's ``SubprocessHandler`` ask
that one to fork its workers. A child becomes what the cold start would have made (``warm.forked._become``: a session of
its own, the streams it was given (the harness's pipe; the agent's, or torchrun's log files), its working directory,
environment (in /proc too, the run's marker included), command line, umask and limits), then runs the agent's main
(``agent.run_forked``) or the script as ``python -u`` would (``run_worker``). The harness and torchrun keep what they
use of a ``Popen``: the pid, ``poll``, ``wait``, and ``os.killpg`` on a restart, a stop or a reaping.

What differs from a cold start: the parent is the server. A forked agent dies with the server, which dies with the
harness (a cold one gets SIGTERM when the harness dies), and a forked worker dies when its agent does (the
connection that asked for it closes), where a cold one would be left for the harness to reap. Anything else starts
cold, as it always did: ``--no-python`` or ``-m`` workers, a NUMA wrapper, an environment a server did not import
under, a server that cannot run, c.DTLabs.warm_torchrun off.
"""
from __future__ import annotations

import io
import os
import sys

from lab_utils import warm
from lab_utils.labkit.torchrun.reaping import MARKER


ADDRESS_VAR = "DTLABS_WARM_TORCHRUN_SERVER"
# What a worker script imports first. Never the script itself: only packages.
PRELOAD = ("numpy", "torch", "torch.distributed", "torch.nn", "torch.nn.parallel", "torch.optim")
WORKER = warm.Kind("torchrun-worker", None, PRELOAD, "lab_utils.labkit.torchrun.warmstart:run_worker",
                   address_var=ADDRESS_VAR)
# What an agent imports before torchrun's main runs (not torch.distributed.run itself: runpy runs it as __main__).
AGENT = warm.Kind("torchrun-agent", "lab_utils.labkit.torchrun.agent",
                  ("torch", "torch.distributed.launcher.api", "lab_utils.labkit.torchrun.agent"),
                  "lab_utils.labkit.torchrun.agent:run_forked")


def _on() -> bool:
    from lab_utils import settings

    return settings.load().warm_torchrun and sys.platform.startswith("linux")


def _server_env(agent_env: dict) -> dict:
    """A run's agents' environment without its marker: a server outlives the run, whose end reaps what carries it."""
    return {k: v for k, v in agent_env.items() if k != MARKER}


def start_agent(argv: list, env: dict, cwd: str | None, agent_env: dict):
    """``python -m lab_utils.labkit.torchrun.agent ARGV`` with ``env`` (the run's ``agent_env`` and the node's own
    variables) forked from this process's agent server, its stdin empty and its stdout and stderr one pipe: (the
    ``Popen``-like child, the pipe's read end, which the caller closes), or None where warm starts are off or no
    server can fork it (the caller starts it cold)."""
    if not _on():
        return None
    try:
        warm.own_server(AGENT, _server_env(agent_env), wait=False)  # keyed as env is: fork finds it
        return warm.fork_with_pipe(AGENT, argv, env, cwd or os.getcwd())
    except warm.Refused:
        return None


def shared_env(agent_env: dict) -> dict:
    """``{ADDRESS_VAR: ...}`` naming this process's server for the workers of agents started with ``agent_env``
    (started now if need be: it imports while the agents start); empty where warm workers are off or no server can
    run here, and the workers start cold."""
    if not _on():
        return {}
    # With what torchrun adds to a worker's environment that an import reads (warm.import_key).
    env = _server_env(agent_env)
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = agent_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    try:
        server = warm.own_server(WORKER, env, wait=False)
    except warm.Refused:
        return {}
    return {ADDRESS_VAR: server.named}


def fork_workers_in_this_agent() -> None:
    """In an agent whose harness named a server: torchrun's ``SubprocessHandler`` forks ``python -u SCRIPT`` workers
    from it, and starts any other, or any the server refuses, as it always does."""
    if not os.environ.get(ADDRESS_VAR):
        return
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    cold = subprocess_handler.SubprocessHandler._popen

    def _popen(self, args, env):
        argv = [str(a) for a in args]
        if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-u" and not argv[2].startswith("-"):
            fds = (0, (self._stdout or sys.stdout).fileno(), (self._stderr or sys.stderr).fileno())
            try:
                return warm.fork(WORKER, argv[1:], env, os.getcwd(), fds=fds, own=False)
            except warm.Refused:
                pass
        return cold(self, args, env)

    subprocess_handler.SubprocessHandler._popen = _popen


def run_worker(request: dict) -> None:
    """``python -u SCRIPT ARGS``, in the forked child: unbuffered streams, the script's folder first on the path,
    the script run as ``__main__``."""
    import runpy

    script, args = request["argv"][1], request["argv"][2:]
    for name, fd in (("stdout", 1), ("stderr", 2)):  # as -u makes them, whatever the server's were
        old = getattr(sys, name)
        setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=old.encoding,
                                            errors=old.errors, write_through=True))
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    runpy.run_path(script, run_name="__main__")
