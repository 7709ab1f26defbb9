"""lab_utils.processes: a tree of processes found from its root down is the tree a scan of the whole machine finds."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from lab_utils import processes, tempdirs

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


def test_a_killed_owners_temp_folders_are_removed_later_and_no_one_elses(monkeypatch, tmp_path):
    """``owned_tempdir``: a process killed before its cleanup (a grading's subjects' folder, a torchrun harness's log
    folder) leaves its folder; ``remove_orphaned_tempdirs`` removes those of dead owners of this pid namespace, and
    nothing else: not a live owner's, not another container's, not a stranger's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    prefix = "dtlabs-test-owned-"
    made = subprocess.run(  # an owner that made its folder and died without removing it
        [sys.executable, "-c", "import sys, tempfile; tempfile.tempdir = sys.argv[1]; from lab_utils import tempdirs;"
         "print(tempdirs.owned_tempdir(sys.argv[2], tag='run7'))", str(tmp_path), prefix],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": processes.python_path()})
    dead = Path(made.stdout.strip())
    (dead / "student").mkdir()
    (dead / "student" / "answers.ipynb").write_text("{}")
    assert dead.name[len(prefix):].split("-")[2] == "run7", dead.name
    live = Path(tempdirs.owned_tempdir(prefix))  # this process's: alive
    ns, pid = dead.name[len(prefix):].split("-")[:2]
    other_container = tmp_path / f"{prefix}{int(ns) + 1}-{pid}-x"
    stranger = tmp_path / f"{prefix}of-someone"
    for folder in (other_container, stranger):
        folder.mkdir()
    assert tempdirs.remove_orphaned_tempdirs(prefix) == [str(dead)] and not dead.exists()
    assert live.is_dir() and other_container.is_dir() and stranger.is_dir(), os.listdir(tmp_path)
