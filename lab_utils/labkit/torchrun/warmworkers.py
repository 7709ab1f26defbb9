"""torchrun's workers forked from a warm server (``lab_utils.warm``) instead of started as fresh interpreters.

Every worker torchrun starts is ``python -u SCRIPT ARGS``: a fresh interpreter that imports torch before the script
does anything (about a CPU-second each; a run that restarts starts its workers again, and a lab starts dozens). The
harness (``nodes``) starts a server per import environment in its own process, which imports torch once, and names
it to its agents (``ADDRESS_VAR``); each agent (``agent``) has torchrun's ``SubprocessHandler`` ask that server to
fork the worker instead. The child becomes what the cold start would have made (``warm.forked._become``: a session of
its own, the agent's streams or torchrun's log files, its working directory, environment (in /proc too, the run's
marker included), command line, umask and limits), then runs the script as ``python -u`` would (``run_worker``).
torchrun keeps what it uses of a ``Popen``: the pid, ``poll``, ``wait``, and ``os.killpg`` on a restart or a stop.

What differs from a cold worker: its parent is the server, and it dies when its agent does (the connection that asked
for it closes), where a cold one would be left for the harness to reap. Anything else starts cold, as torchrun would:
``--no-python`` or ``-m``, a NUMA wrapper, an environment the server did not import under, a server that cannot run,
c.DTLabs.warm_workers off.
"""
from __future__ import annotations

import io
import json
import os
import sys

from lab_utils import warm
from lab_utils.labkit.torchrun.reaping import MARKER

ADDRESS_VAR = "DTLABS_WARM_TORCHRUN_SERVER"
# What a worker script imports first. Never the script itself: only packages.
PRELOAD = ("numpy", "torch", "torch.distributed", "torch.nn", "torch.nn.parallel", "torch.optim")
WORKER = warm.Kind("torchrun-worker", None, PRELOAD, "lab_utils.labkit.torchrun.warmworkers:run_worker",
                   address_var=ADDRESS_VAR)


def shared_env(agent_env: dict) -> dict:
    """``{ADDRESS_VAR: ...}`` naming this process's server for the workers of agents started with ``agent_env``
    (started now if need be: it imports while the agents start); empty where warm workers are off or no server can
    run here, and the workers start cold."""
    from lab_utils import settings

    if not settings.load().warm_workers or not sys.platform.startswith("linux"):
        return {}
    # Not the run's marker: the server outlives the run, whose end reaps every process that carries it. With what
    # torchrun adds to a worker's environment that an import reads (warm.import_key).
    env = {k: v for k, v in agent_env.items() if k != MARKER}
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = agent_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    try:
        server = warm.own_server(WORKER, env, wait=False)
    except warm.Refused:
        return {}
    return {ADDRESS_VAR: json.dumps([server.address, server.key])}


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
