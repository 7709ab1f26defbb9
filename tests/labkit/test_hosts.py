"""Hosts of their own on one machine (``lab_utils.labkit.torchrun.hosts``): torchrun's agents meet across two host
addresses by the first host's name, as on a cluster; a host whose own name resolves to 127.0.1.1 (Debian's
/etc/hosts) fails the way it fails on a cluster, and says where; a firewall on the first host stops the job; and
nothing of the hosts is left afterwards."""
from __future__ import annotations

import os
import subprocess
import textwrap

import psutil
import pytest

from lab_utils.labkit.torchrun import TorchrunTimeout, run_nodes
from lab_utils.labkit.torchrun.hosts import Hosts

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leaked_processes")]

WHY_NOT = Hosts.why_not()
needs_hosts = pytest.mark.skipif(WHY_NOT is not None, reason=f"no hosts can be made here: {WHY_NOT}")

ALL_REDUCE = textwrap.dedent(
    """
    import os, socket
    from datetime import timedelta
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=timedelta(seconds=8))
    t = torch.full((2,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    name = socket.gethostname()
    print("RESULT", dist.get_rank(), name, socket.gethostbyname(name), os.environ["MASTER_ADDR"], t.tolist(), flush=True)
    dist.destroy_process_group()
    """
)


def _script(tmp_path):
    path = tmp_path / "all_reduce.py"
    path.write_text(ALL_REDUCE)
    return str(path)


def _gone(hosts) -> None:
    """Every keeper of the hosts has exited: their namespaces, links and bridge went with the last process in them."""
    pids = [p.pid for p in hosts.hosts] + [hosts.switch.pid]
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not os.path.exists(hosts.folder), "the hosts' /etc/hosts files were left"


@needs_hosts
@pytest.mark.parametrize("rdzv", ["static", "c10d"])
def test_agents_meet_across_two_host_addresses(tmp_path, rdzv):
    with Hosts(2) as hosts:
        names = [subprocess.run(["hostname"], preexec_fn=hosts.preexec(i), capture_output=True, text=True).stdout
                 for i in range(2)]
        result = run_nodes(_script(tmp_path), nnodes=2, rdzv=rdzv, hosts=hosts, timeout=120, quiet=True)
    _gone(hosts)
    assert names == ["node0\n", "node1\n"]
    got = sorted(t for _, t in result.lines if t.startswith("RESULT"))
    assert got == ["RESULT 0 node0 10.77.0.1 node0 [3.0, 3.0]", "RESULT 1 node1 10.77.0.2 node0 [3.0, 3.0]"], \
        result.output()
    assert all(f"node0:{result.port}" in " ".join(cmd) or f"--master-addr=node0" in cmd for cmd in result.commands)


@needs_hosts
def test_a_host_name_on_127_0_1_1_fails_as_on_a_cluster_and_says_where(tmp_path):
    """Debian's installer maps the machine's own name to 127.0.1.1: gloo then tells its peers to connect there."""
    with Hosts(2, own_name_on_loopback=True) as hosts:
        result = run_nodes(_script(tmp_path), nnodes=2, rdzv="static", hosts=hosts, timeout=120, quiet=True,
                           check=False)
    _gone(hosts)
    assert not result.ok and "127.0.1.1" in result.output() and "RESULT" not in result.output(), result.output()


@needs_hosts
def test_a_firewall_on_the_first_host_stops_the_job(tmp_path):
    with Hosts(2) as hosts:
        hosts.firewall(0, "1024-65535")  # the rendezvous and every port gloo would listen on
        with pytest.raises(TorchrunTimeout) as failed:
            run_nodes(_script(tmp_path), nnodes=2, rdzv="c10d", hosts=hosts, timeout=20, quiet=True)
    _gone(hosts)
    assert "RESULT" not in failed.value.result.output()


LISTEN = "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 29400)); s.listen(); print('up', flush=True); " \
         "time.sleep(120)"


def _doctor(hosts, i, *args, env=None):
    import sys

    done = subprocess.run([sys.executable, "-m", "lab_utils.cli", "doctor", "--nodes", *args], capture_output=True,
                          text=True, preexec_fn=hosts.preexec(i), env={**os.environ, **(env or {})}, timeout=120)
    return done.returncode, done.stdout


@needs_hosts
def test_doctor_nodes_names_each_failure_before_a_job():
    """``dtlabs doctor --nodes`` on node1: its own name on 127.0.1.1, the master's port open, then dropped by a
    firewall on node0, and GLOO_SOCKET_IFNAME naming an interface that does not reach the master."""
    import sys

    with Hosts(2, own_name_on_loopback=True) as hosts:
        listener = hosts.run(0, [sys.executable, "-c", LISTEN], stdout=subprocess.PIPE, text=True)
        try:
            assert listener.stdout.readline().strip() == "up"
            code, said = _doctor(hosts, 1, "node0", "node1", "--port", "29400")
            assert code == 1 and "node1 = 127.0.1.1" in said and "a loopback address" in said, said
            assert "master      node0 = 10.77.0.1; this node reaches it from 10.77.0.2 (eth0)" in said, said
            assert "port        node0:29400 open" in said, said
            code, said = _doctor(hosts, 1, "node0", "--port", "29400")
            assert code == 0 and "PROBLEM" not in said, said
            code, said = _doctor(hosts, 1, "node0", env={"GLOO_SOCKET_IFNAME": "lo"})
            assert code == 1 and "GLOO_SOCKET_IFNAME=lo, but this node reaches node0 through eth0" in said, said
            hosts.firewall(0, "29400")
            code, said = _doctor(hosts, 1, "node0", "--port", "29400")
            assert code == 1 and "node0:29400 no answer" in said and "a firewall drops it" in said, said
        finally:
            listener.kill()
            listener.wait()
    _gone(hosts)


@needs_hosts
def test_agents_that_disagree_on_nnodes_wait_until_the_rendezvous_times_out(tmp_path):
    """One agent told --nnodes=2, the other --nnodes=3, at the same endpoint: no error names the mismatch; the
    rendezvous times out on one and is closed on the other, as silent as a firewall (Lab 05, Exercise 5)."""
    import sys

    from lab_utils.labkit.torchrun import agent_command

    script = _script(tmp_path)
    with Hosts(2) as hosts:
        agents = []
        try:
            for i, nnodes in enumerate((2, 3)):
                cmd = agent_command(script, nnodes=nnodes, rdzv="c10d", master_addr=hosts.names[0], port=29400,
                                    run_id="mismatch", python=sys.executable,
                                    rdzv_conf={"join_timeout": 10, "is_host": "true" if i == 0 else "false"})
                agents.append(hosts.run(i, cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}))
            outs = [agent.communicate(timeout=90)[0] for agent in agents]
        finally:
            for agent in agents:
                if agent.poll() is None:
                    agent.kill()
                    agent.wait()
    _gone(hosts)
    said = "\n".join(outs)
    assert [a.returncode for a in agents] == [1, 1] and "RESULT" not in said, said[-3000:]
    assert "RendezvousTimeoutError" in said, said[-3000:]
