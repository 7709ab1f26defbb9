"""lab_utils.grading.boundary.sandbox: the subject's file system is right wherever the course, the venv and the scratch
folders live (under /tmp, behind a link, in a path with spaces and non-ASCII letters), and nothing of a course is
bound into it."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lab_utils.grading.boundary import mounts, sandbox

ODD = "dtlabs sandbox ü"  # a space and a non-ASCII letter


def _covered(path: str, by: str) -> bool:
    return path == by or path.startswith(by.rstrip("/") + "/")


def test_the_private_tmp_comes_before_every_bind_and_no_bind_hides_another():
    steps = mounts.mounts("/tmp/x y/z")
    kinds = [m.kind for m in steps]
    assert kinds[0] == "tmpfs" and steps[0].dest == "/tmp"
    assert kinds[-1] == "rw" and steps[-1].dest == "/tmp/x y/z", "the submission's folder is bound last, writable"
    made = []
    for m in steps:
        for earlier in made:  # a later tmpfs or bind over an earlier bind's folder would hide it
            assert not (m.kind in ("tmpfs", "ro", "rw") and _covered(earlier.dest, m.dest) and earlier.dest != m.dest), (
                f"{m.kind} {m.dest} hides {earlier.kind} {earlier.dest}")
        made.append(m)


def test_what_the_subject_sees_is_the_interpreter_the_installation_and_the_package(monkeypatch, tmp_path):
    course = tmp_path / "course"
    (course / "solutions").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(course))  # a course on the path (PYTHONPATH) must never be bound
    binds = [m.dest for m in mounts.mounts(tmp_path / "work") if m.kind == "ro"]
    assert str(course) not in binds and not any(_covered(str(course), b) for b in binds if b != "/")
    real = os.path.realpath
    assert any(_covered(real(sys.prefix), b) for b in binds), "the venv is not bound"
    assert any(_covered(str(mounts.PKG_DIR), b) for b in binds), "the course package is not bound"
    assert any(_covered(real(sys.base_prefix), b) for b in binds), "the Python installation is not bound"


@pytest.fixture
def odd_site(monkeypatch):
    """A folder of installed modules under /tmp, reached through a symbolic link, in a path with a space and a
    non-ASCII letter: the layout that once hid the venv from the subject (--tmpfs /tmp after the binds)."""
    base = Path(tempfile.mkdtemp(prefix="dtlabs-odd-", dir="/tmp"))
    real = base / ODD / "real" / "site-packages"
    real.mkdir(parents=True)
    (real / "dtlabs_probe_module.py").write_text("WHERE = __file__\n")
    link = base / ODD / "link"
    link.symlink_to(real.parent)
    monkeypatch.syspath_prepend(str(link / "site-packages"))
    yield link / "site-packages"
    import shutil

    shutil.rmtree(base, ignore_errors=True)


def _boxed(argv, workdir, env):
    box = sandbox.start(argv, workdir, env=env, stdout=subprocess.PIPE)
    try:
        out = box.popen.stdout.read().decode()
        box.popen.wait(timeout=60)
        return box.popen.returncode, out
    finally:
        box.close()


@pytest.mark.skipif(not sandbox.bwrap_path(), reason="bubblewrap cannot build a sandbox here")
def test_modules_under_tmp_behind_a_link_import_inside_bubblewrap(odd_site, tmp_path):
    work = Path(tempfile.mkdtemp(prefix="dtlabs-work-", dir="/tmp"))
    try:
        code, out = _boxed([sys.executable, "-c", "import dtlabs_probe_module as m, lab_utils; print('ok', m.WHERE)"],
                           work, {"PYTHONPATH": str(odd_site)})
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    assert code == 0 and out.startswith("ok"), f"inside the sandbox: exit {code}\n{out}"
    assert ODD in out


@pytest.mark.skipif(not sandbox.bwrap_path(), reason="bubblewrap cannot build a sandbox here")
def test_the_sandbox_shows_no_course_and_nothing_of_the_homes_but_what_it_binds(tmp_path):
    repo = Path(__file__).resolve().parents[3]
    probe = ("import json, os; print(json.dumps({p: sorted(os.listdir(p)) if os.path.isdir(p) else None "
             f"for p in ('/home', '/root', {str(repo / 'solutions')!r}, {str(repo / 'grader')!r})}}))")
    code, out = _boxed([sys.executable, "-c", probe], tmp_path, {})
    assert code == 0, out
    import json

    seen = json.loads(out.strip().splitlines()[-1])
    assert seen[str(repo / "solutions")] is None and seen[str(repo / "grader")] is None, seen
    binds = [m.dest for m in mounts.mounts(tmp_path) if m.kind in ("ro", "rw")]
    for home in ("/home", "/root"):  # only the folders on the way to a bind exist there
        for name in seen[home] or []:
            assert any(_covered(b, f"{home}/{name}") for b in binds), f"{home}/{name} is visible: {seen}"


def test_the_fallback_runs_in_the_submission_folder_with_a_private_copy_of_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("DTLABS_SANDBOX", "off")
    code, out = _boxed([sys.executable, "-c", "import os, lab_utils; print(os.getcwd()); print(lab_utils.__file__)"],
                       tmp_path, {})
    cwd, pkg = out.split()
    assert code == 0 and Path(cwd) == tmp_path.resolve()
    private = sandbox._private_package(tmp_path)
    assert Path(pkg).is_relative_to(private), "the fallback's lab_utils should be the private copy"
    assert not private.is_relative_to(tmp_path.resolve()), "the private copy must lie outside the submission's folder"


SHIPPED = ("sitecustomize.py", "usercustomize.py", "torch.py", "cloudpickle.py", ".dtlabs_pkg/sitecustomize.py",
           ".dtlabs_pkg/lab_utils/__init__.py", "lab_utils/__init__.py")


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_nothing_the_submission_shipped_runs_when_the_subject_starts(mode, monkeypatch, tmp_path):
    """The subject's interpreter starts isolated (``channel.SUBJECT_FLAGS``) with the private package first: a
    sitecustomize.py, a torch.py, a lab_utils/ beside the notebook or in the folder the private package once had
    (``.dtlabs_pkg``, on PYTHONPATH) are never imported by it. Each would write a marker file."""
    from lab_utils.grading.split import channel

    monkeypatch.setenv("DTLABS_SANDBOX", mode)
    for rel in SHIPPED:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"open({str(tmp_path / 'RAN')!r}, 'a').write({rel!r} + '\\n')\n")
    start = channel.SUBJECT_ENTRY.split("from lab_utils")[0]
    probe = start + "import lab_utils, torch, cloudpickle; print(lab_utils.__file__, torch.__file__)"
    code, out = _boxed([sys.executable, *channel.SUBJECT_FLAGS, "-c", probe], tmp_path, {})
    assert code == 0, out
    assert not (tmp_path / "RAN").exists(), f"shipped files ran at the subject's start: {(tmp_path / 'RAN').read_text()}"
    assert not any(Path(p).is_relative_to(tmp_path.resolve()) for p in out.split()), out


@pytest.mark.skipif(sandbox.landlock.abi().version < 6, reason="Landlock's signal scoping needs ABI 6 (Linux 6.12)")
def test_outside_bubblewrap_every_thread_of_the_subject_is_in_its_landlock_domain_from_its_first_instruction(
        monkeypatch, tmp_path):
    """Landlock binds the thread that enters a domain and what it starts afterwards. The subject enters it between
    fork and exec, so a thread started by the first line the subject runs (or by a shipped sitecustomize, were one
    imported) is bound too: it cannot signal the grader (a process outside the domain)."""
    monkeypatch.setenv("DTLABS_SANDBOX", "off")
    probe = ("import os, sys, threading\n"
             "def poke(out):\n"
             "    try:\n"
             "        os.kill(int(sys.argv[1]), 0); out.append('reached')\n"
             "    except PermissionError:\n"
             "        out.append('refused')\n"
             "main, thread = [], []\n"
             "t = threading.Thread(target=poke, args=(thread,)); t.start(); t.join(); poke(main)\n"
             "print(main[0], thread[0])\n")
    code, out = _boxed([sys.executable, "-I", "-c", probe, str(os.getpid())], tmp_path, {})
    assert code == 0 and out.split() == ["refused", "refused"], out


def test_requiring_bubblewrap_where_it_cannot_run_says_why(monkeypatch):
    monkeypatch.setattr(sandbox, "_probe", lambda: (None, "bwrap is not installed (test)"))
    with pytest.raises(sandbox.SandboxUnavailable, match="bwrap is not installed"):
        sandbox.require("bwrap")
    assert sandbox.require("unprotected") == "unprotected"  # only by name
    monkeypatch.setenv("DTLABS_SUBJECT_USER", "dtlabs-no-such-user")
    with pytest.raises(sandbox.SandboxUnavailable, match="(?s)does not exist.*--unprotected"):
        sandbox.require(None)  # auto, with neither boundary: refused, never graded without one


@pytest.mark.parametrize("env", [{}, {"XDG_CACHE_HOME": "xdg cache"}, {"MPLCONFIGDIR": "mpl config"}])
def test_the_font_cache_copied_in_is_the_one_matplotlib_uses(env, tmp_path, monkeypatch):
    """The grader finds matplotlib's cache folder without importing matplotlib; a fresh interpreter's
    ``matplotlib.get_cachedir()`` must name the same folder, or every submission rebuilds the font cache."""
    monkeypatch.delenv("MPLCONFIGDIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for key, sub in env.items():
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(key, str(tmp_path / sub))
    matplotlib_says = subprocess.run([sys.executable, "-c", "import matplotlib; print(matplotlib.get_cachedir())"],
                                     capture_output=True, text=True, check=True).stdout.strip()
    assert Path(matplotlib_says).resolve() == mounts.matplotlib_cache().resolve()


MODE_UNDER_SECCOMP = """
import json, os, sys
from lab_utils.grading.boundary import sandbox
from helpers.no_namespaces import refuse_namespaces
refuse_namespaces()
if sys.argv[1] != "root":  # everything imported first: an unprivileged user may not reach this interpreter's files
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
try:
    sandbox.require(None)
    print(json.dumps([sandbox.mode(), ""]))
except sandbox.SandboxUnavailable as exc:
    print(json.dumps([sandbox.mode(), str(exc)]))
"""


@pytest.mark.parametrize("who", ["root", "an ordinary user"])
def test_where_namespaces_are_refused_root_grades_as_a_separate_user_and_anyone_else_is_refused(who):
    """Docker's default seccomp profile (tests/helpers/no_namespaces.py) stops bubblewrap, root's included: root then runs
    submissions as the separate user; an ordinary user gets no grade, and the refusal says why and how to opt in."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it switches to another user, as a grading service in a container would be root")
    pytest.importorskip("pyseccomp", reason="needs the pyseccomp binding (the test extra) and libseccomp")
    env = {**os.environ, "DTLABS_SUBJECT_USER": "nobody", "DTLABS_SANDBOX": "auto",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", MODE_UNDER_SECCOMP, "root" if who == "root" else "user"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    import json

    mode, refusal = json.loads(run.stdout.strip().splitlines()[-1])
    if who == "root":
        assert mode == "user", refusal
        # refused only where this Python lies where that user cannot go (a venv from a Python under /root, mode 700)
        assert refusal == "" or "could not run as 'nobody'" in refusal, refusal
    else:
        assert mode == "none"
        assert "bwrap cannot build a sandbox here" in refusal and "not root" in refusal and "--unprotected" in refusal


def test_a_separate_user_who_cannot_run_this_python_is_a_refusal_not_a_grade(monkeypatch):
    """As the separate user, the boundary is checked by that user itself; where it cannot even start the grader's
    Python (a venv under /root, mode 700) nothing is graded, and the reason says so."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    monkeypatch.setattr(sandbox, "_probe", lambda: (None, "no namespaces (test)"))
    monkeypatch.setattr(sandbox, "_checked", {})
    monkeypatch.setenv("DTLABS_SUBJECT_USER", "nobody")
    found = sandbox.exposure([str(Path(__file__).resolve().parents[3] / "solutions")])
    reachable = not any("could not run" in f for f in found)
    if reachable:  # this Python is open to others: the check itself ran and judged the folders
        assert all(f.startswith(("readable: ", "writable: ")) for f in found), found
    else:
        with pytest.raises(sandbox.SandboxUnavailable, match="could not run as 'nobody'"):
            sandbox.require("user", course_root=Path(__file__).resolve().parents[3])



def test_a_file_gone_while_the_disk_is_measured_hides_nothing_else_of_its_folder(tmp_path, monkeypatch):
    """The disk limit's measure (watchdog.folder_bytes): an entry that vanishes between the folder's listing and its
    stat (a file the submission keeps replacing) is skipped, and the flood beside it still counts; it once cost the
    rest of the folder."""
    from lab_utils.grading.boundary import watchdog

    (tmp_path / "a_gone").write_bytes(b"x")
    (tmp_path / "flood.bin").write_bytes(b"\0" * (3 << 20))
    scandir = os.scandir

    class Gone:
        def __init__(self, entry):
            self.entry, self.path, self.name = entry, entry.path, entry.name

        def is_dir(self, **kw):
            return False

        def is_file(self, **kw):
            return True

        def stat(self, **kw):
            raise FileNotFoundError(self.path)

    class Listing:
        def __init__(self, path):
            self.it = scandir(path)

        def __iter__(self):  # the vanishing entry listed first
            return (Gone(e) if e.name == "a_gone" else e for e in sorted(self.it, key=lambda e: e.name))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.it.close()

    monkeypatch.setattr(watchdog.os, "scandir", Listing)
    assert watchdog.folder_bytes(tmp_path, stop_at=1 << 20) > 1 << 20


def test_a_folder_the_grader_makes_for_the_separate_user_never_follows_a_link(tmp_path):
    """As the separate user the grader's kernel (root) makes folders in the subject's own folder for its ranks (a
    checkpoint folder): group-shared, and made on descriptors, so a link the subject put on the way is refused
    instead of followed (a chmod through it once made root open a root-only file to the subject)."""
    from lab_utils.grading.boundary.files import group_mkdtemp

    subject, victim = tmp_path / "subject", tmp_path / "victim"
    (subject / ".tmp").mkdir(parents=True)
    victim.mkdir(mode=0o700)
    mkdtemp = group_mkdtemp(str(subject))
    made = Path(mkdtemp(prefix="lab03-", dir=str(subject / ".tmp")))
    assert made.parent == subject / ".tmp" and made.name.startswith("lab03-")
    assert made.stat().st_mode & 0o7777 == 0o2770
    (subject / ".tmp").rename(subject / "moved")
    (subject / ".tmp").symlink_to(victim)  # the subject swaps its temp folder for a link to a folder of root's
    with pytest.raises(OSError):
        mkdtemp(dir=str(subject / ".tmp"))
    assert victim.stat().st_mode & 0o7777 == 0o700 and not list(victim.iterdir()), "a link was followed"
    outside = Path(mkdtemp(dir=str(tmp_path)))  # elsewhere: mkdtemp's own folder, this user's alone
    assert outside.stat().st_mode & 0o7777 == 0o700
