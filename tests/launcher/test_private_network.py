"""A student's ranks listen where no other user can reach them: their ``TCPStore`` rendezvous and gloo's pairs are
in a network namespace of the zygote's own (``lab_utils.netns``), wherever the machine lets an ordinary
user make one. Tried as a classmate on the same machine would: user ``nobody`` connects to every port the ranks
listen on, while they run; the control, with ``c.DTLabs.private_network`` off, shows the same try reaching them."""
from __future__ import annotations

import os
import subprocess
import threading

import psutil
import pytest

from helpers import launch as h
from helpers import nobody
from lab_utils import launch
from lab_utils import netns
from lab_utils.launcher import zygote

def _namespaces_allowed() -> bool:
    probe = subprocess.run(["unshare", "--user", "--map-current-user", "--net", "true"], capture_output=True)
    return probe.returncode == 0


def _probe_while_held(tmp_path, private: bool) -> dict:
    """Launch 2 ranks that all-reduce and hold; meanwhile ``nobody`` connects to every port they listen on."""
    if nobody.why_not():
        pytest.skip(nobody.why_not())
    os.environ["DTLABS_PRIVATE_NETWORK"] = "1" if private else "0"
    zygote.shutdown()  # the next launch starts a zygote that reads the setting
    flag = tmp_path / "release"
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(result=launch(h.all_reduce_then_hold, world_size=2,
                                                                 args=(str(flag), 7.25), timeout=120, quiet=True)))
    t.start()
    try:
        ranks = h.wait_for_ranks(2, timeout=90)
        store = [p.pid for p in psutil.Process().children(recursive=True) if p.name() == "dtlabs-store"]
        ports = set().union(*(nobody.listening_ports(pid) for pid in ranks + store))
        if private:  # the same numbers may be another program's on the machine's loopback: not the ranks'
            ports -= nobody.machine_ports()
        out["probe"] = nobody.connect(ports)
        out["ports"] = ports
    finally:
        flag.touch()
        t.join(120)
        os.environ.pop("DTLABS_PRIVATE_NETWORK", None)
        zygote.shutdown()
    return out


@pytest.mark.slow
def test_another_user_reaches_no_port_of_the_ranks_and_the_run_is_unharmed(tmp_path):
    if not _namespaces_allowed():
        pytest.skip("this machine refuses an ordinary user new namespaces: ranks stay on its loopback (the doctor says)")
    out = _probe_while_held(tmp_path, private=True)
    (s0, net0), (s1, net1) = out["result"]
    assert s0 == s1 == [14.5] * 4 and net0 == net1 != os.readlink("/proc/self/ns/net"), out
    assert out["ports"], "the ranks' rendezvous should listen"  # (gloo's pairs listen only until they are connected)
    assert "connected" not in out["probe"].values(), f"another user reached the ranks: {out['probe']}"


@pytest.mark.slow
def test_the_control_with_the_private_network_off_reaches_them(tmp_path):
    """Proves the probe can see a leak: on the machine's loopback, ``nobody`` connects to the ranks' ports."""
    out = _probe_while_held(tmp_path, private=False)
    (s0, net0), _ = out["result"]
    assert s0 == [14.5] * 4 and net0 == os.readlink("/proc/self/ns/net")
    assert "connected" in out["probe"].values(), out["probe"]


def test_enter_says_why_when_the_machine_refuses():
    """In a process where unshare is refused (a child with a seccomp filter is overkill here: a second thread makes
    unshare(CLONE_NEWUSER) fail with EINVAL), ``enter`` leaves the process as it was and says why."""
    before = os.readlink("/proc/self/ns/net")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        threading.Thread(target=threading.Event().wait, daemon=True).start()  # unshare(CLONE_NEWUSER) needs one thread
        why = netns.enter()
        os.write(w, f"{why}\n{os.readlink('/proc/self/ns/net')}".encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        why, net = fh.read().split("\n")
    os.waitpid(pid, 0)
    assert why.startswith("shared: ") and net == before, why
