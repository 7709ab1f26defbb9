"""What each agent runs: ``python -m lab_utils.labkit.torchrun.agent PARENT_PID <torchrun args>``, torchrun's own
main in a process that dies with the harness, and node 0 of a static run staying until the others are gone. No
module of the package imports it: ``-m`` runs it as ``__main__``."""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time

from lab_utils import processes
from lab_utils.labkit.torchrun.nodes import AGENT_STORE, EXITED_KEY
from lab_utils.labkit.torchrun.warmstart import fork_workers_in_this_agent

HOST_WAIT_S = 60.0  # how long a static run's node 0 waits for the other agents to exit


def run_forked(request: dict) -> None:
    """The agent forked by the harness's warm server (``warmstart.start_agent``): it already dies with the server,
    which dies with the harness (``warm.forked._become``)."""
    _agent_main(request["argv"], forked=True)


def _agent_main(argv, forked: bool = False):
    """``PARENT_PID <torchrun args>``: torchrun that dies with its parent."""
    if not forked:
        processes.die_with_parent(int(argv[0]), signal.SIGTERM)  # torchrun stops its workers on SIGTERM
    import runpy

    with processes.collector_off_while_importing():
        import torch.distributed.launcher.api  # noqa: F401 - what torchrun's main imports (not itself: runpy runs it)
    fork_workers_in_this_agent()
    sys.argv = ["torchrun", *argv[1:]]
    try:
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
    finally:
        _remove_log_dir(argv[1:])  # first: a node 0 left waiting below may yet be killed
        _wait_for_other_agents(os.environ.get(AGENT_STORE))


def _remove_log_dir(args):
    """This node's ``--log-dir`` (the harness's run folder holds one per node), and the run folder once empty: the
    harness removes both too, but not when it was killed, and then its agents are the last to know the path."""
    path = next((a.split("=", 1)[1] for a in args if a.startswith("--log-dir=")), None)
    if path:
        shutil.rmtree(path, ignore_errors=True)
        try:
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass  # another node's folder is still there: its agent (or the harness) removes it


def _wait_for_other_agents(spec):
    """The agent hosting a static run's store: stay until the harness has seen the other agents exit."""
    if not spec:
        return
    from datetime import timedelta

    from torch.distributed import TCPStore

    host, port, others = spec.rsplit(":", 2)
    deadline = time.monotonic() + HOST_WAIT_S
    try:
        store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=3))
        while store.add(EXITED_KEY, 0) < int(others) and time.monotonic() < deadline:
            time.sleep(0.05)
    except Exception:  # the harness is gone (it reaps us anyway) or a store error: nothing left to wait for
        pass


if __name__ == "__main__" and len(sys.argv) > 1:
    _agent_main(sys.argv[1:])
