"""Nothing of a run survives: every agent's process group, every descendant seen, every process with the run's
marker is killed; a node that leaves is killed at once; the run's port is watched for strangers."""
from __future__ import annotations

import os
import subprocess

from lab_utils import processes

MARKER = "DTLABS_RUN_ID"


def processes_of(run_id: str) -> list:
    """Live processes that carry ``DTLABS_RUN_ID=run_id`` (agents and workers of one run)."""
    return processes.with_token(run_id, MARKER)


def reap(procs, seen, run_id) -> int:
    """SIGKILL every agent's process group, every descendant seen, every process with our marker."""
    import psutil

    victims = {p.pid: p for p in seen}
    for proc in procs:
        try:
            for child in processes.descendants(proc.pid):
                victims.setdefault(child.pid, child)
        except psutil.Error:
            pass
    for p in processes_of(run_id):
        victims.setdefault(p.pid, p)
    for proc in procs:
        if proc.poll() is None:  # once reaped, its pid (= its group id) may belong to someone else
            processes.killpg_quiet(proc.pid)
    for p in victims.values():
        if p.is_running():  # psutil compares creation times: a reused pid is not ours
            processes.kill_leader(p)  # torchrun's workers lead their own session
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    # an agent may have started a worker (in its own session) after the scan above and before it was killed:
    # with every agent dead nothing new can start, so the marker finds the last of them
    for _ in range(3):
        late = [p for p in processes_of(run_id) if p.pid not in victims]
        if not late:
            break
        for p in late:
            victims[p.pid] = p
            processes.kill_leader(p)
    _, alive = psutil.wait_procs(list(victims.values()), timeout=5)
    return len([v for v in victims.values() if v not in alive])


def kill_node(proc) -> None:
    """SIGKILL one agent and its workers (each in its own session) now: a node that fails."""
    import psutil

    try:
        victims = processes.descendants(proc.pid)
    except psutil.Error:
        victims = []
    processes.killpg_quiet(proc.pid)
    for p in victims:
        processes.kill_leader(p)


def _listeners(port: int, network: int | None = None) -> set:
    """Pids listening on ``port`` on this machine's network, or in the network of process ``network`` (the ranks'
    own, ``lab_utils.netns``: its socket table is /proc/PID/net, which psutil does not read). None stands for a
    process this user may not see."""
    import psutil

    if network is None:
        try:
            return {c.pid for c in psutil.net_connections(kind="tcp")
                    if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
        except psutil.Error:
            return set()
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{network}/net/{table}") as fh:
                rows = [line.split() for line in fh.readlines()[1:]]
        except OSError:
            continue
        inodes |= {row[9] for row in rows if len(row) > 9 and row[3] == "0A" and int(row[1].rsplit(":", 1)[1], 16) == port}
    owners = set()
    for pid in psutil.pids() if inodes else ():
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if links & {f"socket:[{inode}]" for inode in inodes}:
            owners.add(pid)
    return owners or ({None} if inodes else set())


def port_owners(port, procs, seen, run_id, network=None) -> tuple:
    """Who listens on the run's port (in process ``network``'s network, if given): (every owner, those not of this
    run). psutil maps a socket to its process
    from a scan of /proc/*/fd taken *before* it reads the socket table, so a socket our agent opened during the
    scan comes back with pid None: an owner nobody can name is looked at once more before it counts as a stranger
    (still None then: a process this user may not see). A process carrying the run's marker is ours even when
    no scan of ``procs``' children has caught it yet."""
    for _ in range(2):  # a second look only while the one stranger is nameless
        owners = _listeners(port, network)
        ours = {p.pid for p in procs} | {p.pid for p in seen}
        if owners - ours:
            ours |= {p.pid for p in processes_of(run_id)}
        strangers = owners - ours
        if strangers != {None}:
            break
    return owners, strangers


def remember_children(procs, seen):
    """Note workers while their agent lives: once an agent is killed, its workers are orphans."""
    import psutil

    known = {p.pid for p in seen}
    for proc in procs:
        try:
            for child in processes.descendants(proc.pid):
                if child.pid not in known:
                    seen.append(child)
                    known.add(child.pid)
        except psutil.Error:
            pass
