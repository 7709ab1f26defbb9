"""The run's own rendezvous store, where its agents can reach it and no other user of the machine can: hosted by
the launcher's zygote in the ranks' network, or on the first of ``hosts.Hosts``, or, where neither can be joined,
by the harness on the machine's loopback."""
from __future__ import annotations

import os
import queue
import subprocess
import sys

from lab_utils import netns

HOST = "127.0.0.1"


# what hosts a run's store on a host of ``hosts.Hosts``: the launcher's own rendezvous keeper, on all its addresses
_HOST_STORE = """import os, socket, sys
from lab_utils.launcher.worker import keep_store
listener = socket.socket()
listener.bind(("0.0.0.0", 0))
listener.listen(128)
print(listener.getsockname()[1], flush=True)
keep_store(listener, int(sys.argv[1]), os.getppid())
"""


class RunStore:
    """The run's own TCPStore: c10d's rendezvous store, and where a static run's node 0 learns that the other agents
    are gone. The launcher's fork server hosts it (``worker.keep_store``) in the ranks' network, and where that
    network is the ranks' own (``lab_utils.netns``) the agents join it (``join``: the zygote's pid), so no other user
    of the machine reaches the store, the agents or the workers. Where they cannot join it (the zygote is not
    dumpable, or the fork server did not start), this process hosts the store on the machine's loopback instead.
    Either way on a port the OS hands out while it binds."""

    def __init__(self, hosts=None):
        from lab_utils.launcher import zygote

        self.join, self._hold, self._store = None, None, None
        if hosts is not None:  # on the first host, as a cluster's first node would host it
            self.port, self.join = self._on_host(hosts), hosts.pid(0)
            return
        try:
            with zygote.lock:
                z = zygote.get_zygote()
                hold_r, hold_w = os.pipe()
                try:
                    port = z.store(hold_r)
                finally:
                    os.close(hold_r)
        except (OSError, queue.Empty):
            port, z = None, None
        if z is not None and (z.network != netns.PRIVATE or netns.joinable(z.proc.pid)):
            self.port, self._hold = port, hold_w
            self.join = z.proc.pid if z.network == netns.PRIVATE else None
            return
        if port is not None:
            os.close(hold_w)  # the fork server's store is out of the agents' reach
        from datetime import timedelta

        from torch.distributed import TCPStore

        self._store = TCPStore(HOST, 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                               timeout=timedelta(seconds=30))
        self.port = self._store.port

    def _on_host(self, hosts) -> int:
        """Host the store on host 0 (``hosts``), on every address of it, until the hold pipe ends: its port."""
        hold_r, self._hold = os.pipe()
        try:
            proc = hosts.run(0, [sys.executable, "-c", _HOST_STORE, str(hold_r)], pass_fds=[hold_r],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                             env={"TORCH_CPP_LOG_LEVEL": netns.LOG_LEVEL, **os.environ})
        finally:
            os.close(hold_r)
        port = proc.stdout.readline().strip()
        proc.stdout.close()
        if not port.isdigit():
            raise OSError("the run's store did not start on the first host")
        return int(port)

    def count(self, key: str) -> None:
        """Add 1 to ``key``."""
        if self._store is not None:
            self._store.add(key, 1)
        else:
            os.write(self._hold, key.encode() + b"\n")

    def close(self) -> None:
        """The store goes (only once every agent is gone)."""
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None
        self._store = None
