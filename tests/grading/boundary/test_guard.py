"""lab_utils.grading.boundary.guard: what a submission changed in the course while graded without bubblewrap is put back.

The end-to-end proof is the fallback cheat corpus (tests/grading/boundary/test_cheats.py); these tests take each kind of change
on its own: an edit, a deletion, a new file, a file or a folder swapped for a symbolic link, and a file that
cannot be put back.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from lab_utils.grading.boundary.guard import Guard, GuardError, StartupWatch


@pytest.fixture
def course(tmp_path):
    root = tmp_path / "course"
    (root / "work" / "submitted" / "alice").mkdir(parents=True)
    (root / "work" / "submitted" / "bob").mkdir(parents=True)
    (root / "work" / "gradebook.db").write_bytes(b"grades")
    (root / "work" / "submitted" / "alice" / "lab.ipynb").write_text("alice's work")
    (root / "work" / "submitted" / "bob" / "lab.ipynb").write_text("bob's work")
    (root / "work" / "autograded").mkdir()
    (root / "solutions").mkdir()
    (root / "solutions" / "lab.ipynb").write_text("the answers")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    guard = Guard([root / "work" / "gradebook.db", root / "work" / "submitted", root / "solutions"])
    guard.snapshot()
    return root, elsewhere, guard


def test_nothing_changed_means_nothing_reported(course):
    root, _, guard = course
    assert guard.restore() == []


def test_an_edit_a_deletion_and_a_new_file_are_undone_and_named(course):
    root, _, guard = course
    (root / "work" / "gradebook.db").write_bytes(b"manual_score = 100")
    (root / "work" / "submitted" / "bob" / "lab.ipynb").unlink()
    (root / "work" / "submitted" / "mallory").mkdir()
    (root / "work" / "submitted" / "mallory" / "lab.ipynb").write_text("a submission nobody made")
    touched = {Path(p).relative_to(root).as_posix() for p in guard.restore()}
    assert touched == {"work/gradebook.db", "work/submitted/bob/lab.ipynb", "work/submitted/mallory/lab.ipynb"}
    assert (root / "work" / "gradebook.db").read_bytes() == b"grades"
    assert (root / "work" / "submitted" / "bob" / "lab.ipynb").read_text() == "bob's work"
    assert not (root / "work" / "submitted" / "mallory" / "lab.ipynb").exists()
    assert guard.restore() == [], "a second check must find the course whole"


def test_a_file_or_folder_swapped_for_a_link_is_put_back_in_the_course_not_through_the_link(course):
    root, elsewhere, guard = course
    decoy = elsewhere / "decoy.ipynb"
    decoy.write_text("the attacker's file")
    alice = root / "work" / "submitted" / "alice" / "lab.ipynb"
    alice.unlink()
    alice.symlink_to(decoy)
    bob = root / "work" / "submitted" / "bob"
    (elsewhere / "bob").mkdir()
    (elsewhere / "bob" / "lab.ipynb").write_text("the empty release")
    for f in bob.iterdir():
        f.unlink()
    bob.rmdir()
    bob.symlink_to(elsewhere / "bob", target_is_directory=True)
    touched = {Path(p).relative_to(root).as_posix() for p in guard.restore()}
    assert {"work/submitted/alice/lab.ipynb", "work/submitted/bob/lab.ipynb"} <= touched
    assert not alice.is_symlink() and alice.read_text() == "alice's work"
    assert not bob.is_symlink() and (bob / "lab.ipynb").read_text() == "bob's work"
    assert decoy.read_text() == "the attacker's file", "the guard wrote through a link it should have removed"
    assert (elsewhere / "bob" / "lab.ipynb").read_text() == "the empty release"


def test_a_link_to_a_folder_planted_in_the_course_is_removed_and_one_that_was_there_is_kept(course):
    """A link is a path like a file: os.walk lists a link to a folder among the folders and never enters it, so a
    planted one (a fake student's submission, served from anywhere) must be looked for as such."""
    root, elsewhere, guard = course
    (elsewhere / "shared").mkdir()
    (root / "solutions" / "data").symlink_to(elsewhere / "shared", target_is_directory=True)
    guard.snapshot()
    (elsewhere / "forged").mkdir()
    (elsewhere / "forged" / "lab.ipynb").write_text("a submission nobody made")
    (root / "work" / "submitted" / "mallory").symlink_to(elsewhere / "forged", target_is_directory=True)
    (root / "solutions" / "data").unlink()
    (root / "solutions" / "data").symlink_to(elsewhere / "forged", target_is_directory=True)
    touched = {Path(p).relative_to(root).as_posix() for p in guard.restore()}
    assert touched == {"work/submitted/mallory", "solutions/data"}
    assert not os.path.lexists(root / "work" / "submitted" / "mallory")
    assert os.readlink(root / "solutions" / "data") == str(elsewhere / "shared")
    assert (elsewhere / "forged" / "lab.ipynb").exists(), "removing a link must not remove what it points to"
    assert guard.restore() == []


def test_unguarded_folders_are_left_alone(course):
    root, _, guard = course
    (root / "work" / "autograded" / "out.ipynb").write_text("an output, rebuilt from the gradebook")
    assert guard.restore() == []


def test_a_file_that_cannot_be_put_back_stops_with_its_name(course, monkeypatch):
    root, _, guard = course
    (root / "solutions" / "lab.ipynb").write_text("no-op tests")
    real = Path.write_bytes

    def refuse(self, data):
        if self.name == "lab.ipynb" and self.parent.name == "solutions":
            raise PermissionError("read-only file system")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", refuse)
    with pytest.raises(GuardError, match=r"solutions/lab\.ipynb.*read-only"):
        guard.restore()


@pytest.fixture
def startup(tmp_path):
    """A venv's site-packages, a home's IPython folder and a course's ``grader/`` on the Jupyter config path (holding
    the grading records that every grading writes beside the course's nbgrader config)."""
    venv = tmp_path / "venv" / "site-packages"
    venv.mkdir(parents=True)
    (venv / "torch.py").write_text("")
    ipython = tmp_path / "home" / ".ipython" / "profile_default" / "startup"
    ipython.mkdir(parents=True)
    grader = tmp_path / "course" / "grader"
    (grader / "work").mkdir(parents=True)
    (grader / "kernels" / "python3").mkdir(parents=True)
    (grader / "nbgrader_config.py").write_text("c = get_config()")
    (grader / "kernels" / "python3" / "kernel.json").write_text("{}")
    (grader / "work" / "graded.json").write_text("{}")
    watch = StartupWatch([venv.parent], [tmp_path / "home" / ".ipython"], [grader])
    watch.snapshot()
    return venv, ipython, grader, watch


def test_a_new_pth_file_or_startup_script_is_removed_and_named(startup):
    venv, ipython, _, watch = startup
    (venv / "backdoor.pth").write_text("import os")
    (ipython / "00-backdoor.py").write_text("import os")
    added = watch.check()
    assert sorted(Path(p).name for p in added) == ["00-backdoor.py", "backdoor.pth"]
    assert not (venv / "backdoor.pth").exists() and not (ipython / "00-backdoor.py").exists()


def test_grading_scans_the_startup_folders_once_per_submission(startup, tmp_path, monkeypatch):
    """After each submission grading puts the course back and re-baselines it (``restore``, then
    ``snapshot(watch=False)``): the startup folders are scanned once there, by the check (a scan costs about a second
    per hundred thousand files), and what the next submission plants is still caught."""
    venv, ipython, _, watch = startup
    scans = []
    scan = watch._scan
    monkeypatch.setattr(watch, "_scan", lambda: scans.append(1) or scan())
    guard = Guard([tmp_path / "course" / "grader" / "work"], watch=watch)
    guard.snapshot(watch=False)
    (venv / "backdoor.pth").write_text("import os")
    (venv / "__pycache__").mkdir()
    (venv / "__pycache__" / "torch.cpython-311.pyc").write_bytes(b"rebuilt by Python")
    assert [Path(p).name for p in guard.restore()] == ["backdoor.pth"]
    guard.snapshot(watch=False)
    assert len(scans) == 1
    (ipython / "00-backdoor.py").write_text("import os")
    assert [Path(p).name for p in guard.restore()] == ["00-backdoor.py"]
    guard.snapshot(watch=False)
    (venv / "torch.py").write_text("evil = 1")
    with pytest.raises(GuardError, match=r"torch\.py"):
        guard.restore()
    assert len(scans) == 3


def test_a_changed_kernel_spec_or_package_stops_grading(startup):
    venv, _, grader, watch = startup
    (grader / "kernels" / "python3" / "kernel.json").write_text('{"argv": ["sh"]}')
    (venv / "torch.py").write_text("evil = 1")
    with pytest.raises(GuardError, match=r"kernel\.json.*torch\.py"):
        watch.check()


def test_a_package_rewritten_at_its_size_with_its_time_put_back_stops_grading(startup):
    """What a careful backdoor does: the same number of bytes, and ``os.utime`` back to the old modification time.
    The inode's change time (set by the kernel on the write and on ``utime``) still differs."""
    venv, _, _, watch = startup
    (venv / "torch.py").write_text("one = 1\n")
    watch.snapshot()
    st = os.stat(venv / "torch.py")
    time.sleep(0.01)  # a later change time on file systems that keep coarse times
    (venv / "torch.py").write_text("evil = 1")
    os.utime(venv / "torch.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    now = os.stat(venv / "torch.py")
    assert (now.st_size, now.st_mtime_ns, now.st_ino, now.st_mode) == (st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode)
    with pytest.raises(GuardError, match=r"torch\.py"):
        watch.check()


def test_a_link_to_a_folder_planted_in_site_packages_or_a_jupyter_folder_is_removed_and_named(startup, tmp_path):
    """``sitecustomize`` may be a package: a link to a folder of the student's, planted in site-packages, would run in
    every later Python; a ``kernels`` link in a Jupyter folder would choose the next grading's kernel."""
    venv, _, grader, watch = startup
    evil = tmp_path / "evil"
    (evil / "python3").mkdir(parents=True)
    (evil / "__init__.py").write_text("import os")
    (evil / "python3" / "kernel.json").write_text('{"argv": ["sh"]}')
    (venv / "sitecustomize").symlink_to(evil, target_is_directory=True)
    (grader / "kernels").rename(tmp_path / "kernels-away")
    (grader / "kernels").symlink_to(evil, target_is_directory=True)
    with pytest.raises(GuardError, match=r"kernel\.json"):  # the spec that was there is gone: a reinstall's job
        watch.check()
    assert not os.path.lexists(venv / "sitecustomize") and not os.path.lexists(grader / "kernels")
    assert (evil / "__init__.py").exists()


def test_a_new_link_to_a_folder_alone_is_removed_and_named(startup, tmp_path):
    venv, _, grader, watch = startup
    (tmp_path / "evil").mkdir()
    (venv / "sitecustomize").symlink_to(tmp_path / "evil", target_is_directory=True)
    assert [Path(p).name for p in watch.check()] == ["sitecustomize"]
    assert not os.path.lexists(venv / "sitecustomize")


def test_grading_records_beside_a_jupyter_config_folder_are_not_startup_code(startup):
    """Another grading of the course on the Jupyter config path writes its records there while this one runs."""
    _, _, grader, watch = startup
    (grader / "work" / "graded.json").write_text('{"alice": 1}')
    (grader / "work" / "grading-outcomes.json").write_text("{}")
    assert watch.check() == []
