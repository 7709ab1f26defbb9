"""torchrun's agents, workers and rendezvous store listen where no other user can reach them: in the ranks' network
(the zygote's, ``lab_utils.netns``), wherever the machine lets an ordinary user make one. Tried as a classmate on
the same machine would: user ``nobody`` connects to every port the run listens on while it runs; the control, with
``c.DTLabs.private_network`` off, shows the same try reaching them."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from helpers import nobody
from lab_utils import netns
from lab_utils.labkit.torchrun import reaping, run_nodes
from lab_utils.launcher import zygote

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leaked_processes")]

HOLD = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    folder = sys.argv[1]
    rank = dist.get_rank()
    with open(os.path.join(folder, f"net{rank}"), "w") as f:
        f.write(os.readlink("/proc/self/ns/net"))
    while not os.path.exists(os.path.join(folder, "release")):
        time.sleep(0.05)
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)  # after the probe: the collectives' pairs are unharmed by it
    print("RESULT", rank, t.tolist(), flush=True)
    dist.destroy_process_group()
    """
)


def _namespaces_allowed() -> bool:
    return subprocess.run(["unshare", "--user", "--map-current-user", "--net", "true"], capture_output=True).returncode == 0


def _run_and_probe(tmp_path, private: bool, rdzv: str) -> dict:
    """Two agents of one worker each hold after their rendezvous; meanwhile ``nobody`` connects to every port any
    process of the run (agents, workers, the store) listens on."""
    if nobody.why_not():
        pytest.skip(nobody.why_not())
    os.environ["DTLABS_PRIVATE_NETWORK"] = "1" if private else "0"
    zygote.shutdown()  # the next zygote reads the setting
    script = tmp_path / "hold.py"
    script.write_text(HOLD)
    out: dict = {}

    def run():
        try:
            out["result"] = run_nodes(str(script), str(tmp_path), nnodes=2, rdzv=rdzv, timeout=120, quiet=True)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"net{r}").exists() for r in range(2)):
            assert t.is_alive(), f"the run ended before its workers held: {out}"
            assert time.monotonic() < deadline, "the workers did not reach their rendezvous within 90 s"
            time.sleep(0.1)
        time.sleep(0.2)
        ours = [p.pid for p in psutil.Process().children(recursive=True)]
        ports = set().union(*(nobody.listening_ports(pid) for pid in ours))
        if private:
            ports -= nobody.machine_ports()
        out["ports"] = ports
        out["probe"] = nobody.connect(ports)
        out["nets"] = {(tmp_path / f"net{r}").read_text() for r in range(2)}
        out["zygote_net"] = os.readlink(f"/proc/{zygote.get_zygote().proc.pid}/ns/net")
    finally:
        (tmp_path / "release").touch()
        t.join(120)
        os.environ.pop("DTLABS_PRIVATE_NETWORK", None)
        zygote.shutdown()
    assert "error" not in out, out["error"]
    return out


@pytest.mark.parametrize("rdzv", ["static", "c10d"])
def test_another_user_reaches_no_port_of_a_torchrun_run(tmp_path, rdzv):
    if not _namespaces_allowed():
        pytest.skip("this machine refuses an ordinary user new namespaces: agents stay on its loopback (the doctor says)")
    out = _run_and_probe(tmp_path, private=True, rdzv=rdzv)
    result = out["result"]
    assert result.ok and sorted(t for _, t in result.lines if t.startswith("RESULT")) == [
        "RESULT 0 [3.0, 3.0]", "RESULT 1 [3.0, 3.0]"], result.output()
    assert out["nets"] == {out["zygote_net"]} and out["zygote_net"] != os.readlink("/proc/self/ns/net"), out
    assert result.port in out["ports"], "the run's store (c10d) or master port (static) should listen while it runs"
    assert "connected" not in out["probe"].values(), f"another user reached the run: {out['probe']}"


def test_the_control_with_the_private_network_off_reaches_a_torchrun_run(tmp_path):
    """Proves the probe can see a leak: on the machine's loopback, ``nobody`` connects to the run's ports."""
    out = _run_and_probe(tmp_path, private=False, rdzv="c10d")
    assert out["result"].ok, out["result"].output()
    assert out["nets"] == {os.readlink("/proc/self/ns/net")}
    assert out["probe"].get(str(out["result"].port)) == "connected", out["probe"]


def test_a_port_another_process_holds_in_the_ranks_network_is_seen(tmp_path):
    """The static run's watch for a stranger on its master port reads the ranks' network, where it runs, not the
    machine's: a listener there is found (and named), and the machine's own listeners are not that network's."""
    z = zygote.get_zygote()
    if not z.ready.wait(120) or z.network != netns.PRIVATE:
        pytest.skip(f"the ranks share the machine's network here: {z.network}")
    env = {**os.environ, netns.JOIN_VAR: str(z.proc.pid)}
    listener = subprocess.Popen([sys.executable, "-c", "import socket, time; s = socket.socket(); "
                                 "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); "
                                 "time.sleep(120)"], stdout=subprocess.PIPE, text=True, env=env,
                                preexec_fn=netns.preexec(env))
    try:
        port = int(listener.stdout.readline())
        assert reaping._listeners(port, z.proc.pid) == {listener.pid}
        assert reaping.port_owners(port, [], [], "none", z.proc.pid) == ({listener.pid}, {listener.pid})
        assert listener.pid not in reaping._listeners(port), "the machine's table is not the ranks' network"
    finally:
        listener.kill()
        listener.wait()
