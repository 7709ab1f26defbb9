"""Hosts of their own on one machine: N network, UTS and mount namespaces, each with its own address on a bridge,
its own host name and its own /etc/hosts, so that torchrun's agents meet across real addresses, as on a cluster.

    with Hosts(2) as hosts:                      # node0 = 10.77.0.1, node1 = 10.77.0.2
        run_nodes("train.py", nnodes=2, hosts=hosts)

Why: on 127.0.0.1 the failures students meet on a real cluster cannot happen: a host name that resolves to
127.0.1.1 (Debian's /etc/hosts line for the machine's own name), gloo on the wrong interface, a firewall that drops
the job's ports, a host that disappears. On these hosts they do (``Hosts(..., own_name_on_loopback=True)``,
``firewall``, ``remove``).

How: a keeper process per namespace holds it open. The *switch* is a user namespace (the user mapped to root in it,
as ``unshare -Ur`` maps) with a network namespace holding the bridge; each host joins that user namespace and makes
its network, UTS and mount namespaces, names itself, and mounts its own /etc/hosts over the machine's (in its mount
namespace only). A veth pair joins each host's ``eth0`` to the bridge. Processes join a host between fork and exec
(``preexec``). Every keeper dies with the process that made them (``PR_SET_PDEATHSIG``), and the namespaces with
their last process: nothing is left on the machine. Needs ``ip`` (iproute2) and a machine that lets this user make
user namespaces (or root); ``Hosts.why_not()`` says why not, and the labs then stay on loopback and say so.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys

from lab_utils import tempdirs
from lab_utils.netns import CLONE_NEWNET as NEWNET, CLONE_NEWNS as NEWNS, CLONE_NEWUSER as NEWUSER, \
    CLONE_NEWUTS as NEWUTS, join

HOST_NAMESPACES = ("user", "net", "uts", "mnt")  # what a process joins to run on a host
SUBNET = "10.77.0"  # host i has SUBNET.(i + 1)/24
PREFIX = "dtlabs-hosts-"

_KEEP = """import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the keeper goes with the process that made the hosts
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
if len(sys.argv) > 2:  # a host: its name, and its own /etc/hosts over the machine's (in its mount namespace only)
    name = sys.argv[2].encode()
    if libc.sethostname(name, len(name)) != 0 or libc.mount(b"none", b"/", None, 16384 | (1 << 18), None) != 0 \\
            or libc.mount(sys.argv[3].encode(), b"/etc/hosts", None, 4096, None) != 0:
        print("error", os.strerror(ctypes.get_errno()), flush=True)
        os._exit(1)
print("ready", flush=True)
sys.stdin.read()
"""


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class Hosts:
    """``n`` hosts named ``names`` (node0, node1, ...) at ``addresses`` on one bridge. ``own_name_on_loopback``: each
    host's /etc/hosts maps its own name to 127.0.1.1, as Debian's installer writes it (the other hosts' names to
    their addresses)."""

    def __init__(self, n: int, names=None, own_name_on_loopback: bool = False):
        why = self.why_not()
        if why:
            raise OSError(why)
        self.names = list(names or [f"node{i}" for i in range(n)])
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(n)]
        self.keepers: list = []
        self.folder = tempdirs.owned_tempdir(PREFIX)
        try:
            self.switch = self._keeper([], lambda: _check(_libc().unshare(NEWUSER | NEWNET), "a new namespace"))
            uid, gid = os.getuid(), os.getgid()
            for name, text in (("uid_map", f"0 {uid} 1"), ("setgroups", "deny"), ("gid_map", f"0 {gid} 1")):
                with open(f"/proc/{self.switch.pid}/{name}", "w") as fh:
                    fh.write(text)
            self._ready(self.switch)
            self._ip(self.switch.pid, ["net"], "link", "add", "br0", "type", "bridge")
            self._ip(self.switch.pid, ["net"], "link", "set", "br0", "up")
            self.hosts = []
            for i, name in enumerate(self.names):
                lines = ["127.0.0.1 localhost"] + [f"{a} {h}" for a, h in zip(self.addresses, self.names)
                                                   if not (own_name_on_loopback and h == name)]
                if own_name_on_loopback:
                    lines.insert(1, f"127.0.1.1 {name}")
                path = os.path.join(self.folder, f"hosts-{name}")
                with open(path, "w") as fh:
                    fh.write("\n".join(lines) + "\n")

                def enter(switch=self.switch.pid):
                    join(switch, ("user",))
                    _check(_libc().unshare(NEWNET | NEWUTS | NEWNS), "a host's namespaces")

                host = self._keeper([name, path], enter)
                self._ready(host)
                self.hosts.append(host)
                self._ip(self.switch.pid, ["net"], "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
                         "netns", str(host.pid))
                self._ip(self.switch.pid, ["net"], "link", "set", f"v{i}", "master", "br0", "up")
                self._ip(host.pid, ["net"], "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
                self._ip(host.pid, ["net"], "link", "set", "eth0", "up")
                self._ip(host.pid, ["net"], "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def why_not() -> str | None:
        """Why no hosts can be made here (None where they can)."""
        if not sys.platform.startswith("linux"):
            return f"{sys.platform} has no network namespaces"
        if not shutil.which("ip"):
            return "no `ip` command (iproute2) to make the hosts' links"
        probe = subprocess.run([sys.executable, "-c", "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
                                "os._exit(0 if libc.unshare(0x10000000 | 0x40000000) == 0 else ctypes.get_errno())"],
                               capture_output=True)
        if probe.returncode != 0:
            return f"this machine refuses this user new namespaces ({os.strerror(probe.returncode)})"
        return None

    def _keeper(self, args, preexec) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-I", "-c", _KEEP, str(os.getpid()), *args], preexec_fn=preexec,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        self.keepers.append(proc)
        return proc

    @staticmethod
    def _ready(proc) -> None:
        said = proc.stdout.readline().strip()
        if said != "ready":
            raise OSError(f"a host could not be set up: {said or 'its keeper died'}")

    def _ip(self, pid: int, kinds, *args) -> None:
        done = subprocess.run(["ip", *args], preexec_fn=lambda: join(pid, ("user", *kinds)), capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise OSError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")

    # ------------------------------------------------------------------------------------------------ use them
    def __len__(self) -> int:
        return len(self.names)

    def pid(self, i: int) -> int:
        """The keeper of host ``i``: the process whose namespaces a process joins to run there."""
        return self.hosts[i].pid

    def preexec(self, i: int):
        """A ``preexec_fn`` that runs the new process on host ``i``."""
        return lambda pid=self.pid(i): join(pid, HOST_NAMESPACES)

    def run(self, i: int, argv, **popen) -> subprocess.Popen:
        """Start ``argv`` on host ``i``."""
        return subprocess.Popen(argv, preexec_fn=self.preexec(i), **popen)

    def firewall(self, i: int, ports: str, action: str = "drop") -> None:
        """nftables on host ``i``: incoming TCP to ``ports`` ("29500" or "20000-65535") is dropped (or rejected)."""
        pid = self.pid(i)
        for rule in (["add", "table", "inet", "dtlabs"],
                     ["add", "chain", "inet", "dtlabs", "input", "{ type filter hook input priority 0; }"],
                     ["add", "rule", "inet", "dtlabs", "input", "iifname", "eth0", "tcp", "dport", ports, action]):
            done = subprocess.run(["nft", *rule], preexec_fn=lambda: join(pid, ("user", "net")), capture_output=True,
                                  text=True)
            if done.returncode != 0:
                raise OSError(f"`nft {' '.join(rule)}` failed: {done.stderr.strip()}")

    def remove(self, i: int) -> None:
        """Host ``i`` disappears, as a machine that loses power: its keeper is killed, and its namespaces go with the
        last process in them (the caller kills those: its agents and workers)."""
        keeper = self.hosts[i]
        if keeper.poll() is None:
            keeper.send_signal(signal.SIGKILL)
            keeper.wait()

    def close(self) -> None:
        """Every keeper killed; the namespaces, links and bridge go with them."""
        for proc in self.keepers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream:
                    stream.close()
        self.keepers = []
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
