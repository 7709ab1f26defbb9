"""lab_utils.processes: a tree of processes found from its root down is the tree a scan of the whole machine finds."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from lab_utils import processes

# a parent with a child started by its main thread, one started by a thread that has ended, one by a thread that
# still runs, and a grandchild
PARENT = r"""
import subprocess, threading, time
kids = []
def start(): kids.append(subprocess.Popen(["sleep", "60"]))
t = threading.Thread(target=start); t.start(); t.join()
live = threading.Thread(target=lambda: (start(), time.sleep(60)), daemon=True); live.start()
kids.append(subprocess.Popen(["bash", "-c", "sleep 60 & wait"]))
time.sleep(0.5)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def family():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        # the family alone: the worker's other children (a warm server, another test's processes) are not ours to
        # kill, and one of them may exit between a listing and a kill
        processes.kill_procs(processes.tree(proc.pid))
        proc.wait()


def _scan(pid):
    return sorted([pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)])


def test_a_tree_found_from_its_root_is_the_tree_a_scan_of_every_process_finds(family):
    deadline = time.monotonic() + 10
    while len(_scan(family.pid)) < 5 and time.monotonic() < deadline:  # parent, 2 sleeps, bash and its sleep
        time.sleep(0.05)
    assert len(_scan(family.pid)) == 5
    assert sorted(p.pid for p in processes.tree(family.pid)) == _scan(family.pid)


def test_without_the_kernels_lists_of_children_the_machine_is_scanned(family, monkeypatch):
    monkeypatch.setattr(processes, "_descendant_pids", lambda pid: None)
    time.sleep(0.2)
    assert sorted(p.pid for p in processes.tree(family.pid)) == _scan(family.pid)


def test_a_zombie_is_not_part_of_a_live_tree():
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        assert child.pid in [p.pid for p in processes.descendants(os.getpid())]
        assert child.pid not in [p.pid for p in processes.tree(os.getpid())]
    finally:
        child.wait()
