"""Grading where namespaces are refused the way Docker's default seccomp profile refuses them (Gradescope's autograder
containers, many HPC containers): ``tests/helpers/no_namespaces.py`` around every grading command, so bubblewrap cannot run,
root's included. Each command runs from the instructor's course venv (a Python every user can run).

- The instructor (an ordinary user) gets no grade: ``dtlabs grade`` refuses with the reason and writes nothing;
  with ``--unprotected`` it grades, and every grade line says the grade was taken without a boundary.
- Root grades as the separate user: a course open to others is refused with what that user could reach, ``dtlabs
  doctor --grading --fix`` closes it, and then the cheat corpus (the attacks whose defence depends on the mode,
  tests/helpers/cheat_corpus.py) gains nothing, changes nothing of the course and writes nothing into the venv.
- Root grades every lab but Lab 10 (its frameworks are not in the deploy venv) as the separate user at full marks,
  the relay labs (01, 03, 05, 07, 08, 09) among them, while ``nobody`` listens for their hidden tests.
- Lab 01's Gradescope bundle (a relay lab), built from a clone of the course, set up (``setup.sh``: its canary grades
  the solution and the release as the separate user and must pass) and run (``run_autograder``) as root, as Gradescope
  runs it: its subject is the separate user; the solution scores full marks; the known-wrong ring all-reduce under the
  venv backdoor scores no more than that answer alone (the test cells its header says it loses), and the backdoor
  does not reach the autograder's venv; the empty release graded after it still scores 0; and the separate user
  cannot list the bundle's hidden tests.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import nbformat
import psutil
import pytest

from deploy_helpers import APART, COURSE_PARENT, TEACHER, TIMINGS, copy_course, report, run_as, teacher_env

from lab_utils import grading
from lab_utils.grading.boundary import separate_user

pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group(APART)]
TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
from helpers import cheat_corpus, nobody  # noqa: E402 - tests/ is not this folder
from helpers.synthetic import make_synthetic_course  # noqa: E402

LAB = cheat_corpus.SYNTHETIC_LAB
SUBJECT = "dtlabs-subject"


def _refusing(course: Path, *argv) -> list:
    """``argv`` (a program of the course's venv and its arguments) with namespaces refused."""
    venv = course / ".venv" / "bin"
    return [str(venv / "python"), str(TESTS / "helpers" / "no_namespaces.py"), str(venv / argv[0]), *map(str, argv[1:])]


def _root_env(course: Path, **extra) -> dict:
    return {"PATH": f"{course / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
            "DTLABS_CACHE_DIR": str(COURSE_PARENT / "boundary cache"), **{k: str(v) for k, v in extra.items()}}


def _small_class(root: Path) -> Path:
    """The synthetic lab with a good and an empty submission."""
    make_synthetic_course(root)
    grading.release([LAB], root=root)
    rel = nbformat.read(str(root / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    src = nbformat.read(str(root / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    grading.submit(root, "good", LAB, grading.fill_solutions(rel, src))
    grading.submit(root, "empty", LAB, rel)
    return root


@pytest.mark.timeout(600)
def test_an_ordinary_user_gets_no_grade_without_a_boundary_unless_they_say_so(course):
    root = COURSE_PARENT / "boundary class"
    shutil.rmtree(root, ignore_errors=True)
    _small_class(root)
    subprocess.run(["chown", "-R", f"{TEACHER}:", str(root)], check=True)
    env = teacher_env(course, DTLABS_CACHE_DIR=str(root / ".cache"))
    refused = run_as(TEACHER, _refusing(course, "dtlabs", "grade", LAB, "--no-feedback", "--course-root", root),
                     cwd=root, env=env, check=False, timeout=300)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "no boundary between a submission and this machine" in refused.stdout, refused.stdout
    assert "--unprotected" in refused.stdout and "not root" in refused.stdout, refused.stdout
    assert not (root / "grader" / "work" / "autograded").exists(), "a refused grading graded someone"
    t0 = time.monotonic()
    graded = run_as(TEACHER, _refusing(course, "dtlabs", "grade", LAB, "--no-feedback", "--unprotected",
                                       "--course-root", root), cwd=root, env=env, check=False, timeout=600)
    TIMINGS["no namespaces: --unprotected, canary + 2 synthetic submissions"] = time.monotonic() - t0
    assert graded.returncode == 0, graded.stdout + graded.stderr
    lines = [x for x in graded.stdout.splitlines() if x.startswith("   ") and f"/{LAB}" in x]
    assert len(lines) == 2 and all("taken without a boundary" in x for x in lines), graded.stdout
    csv = (root / "grader" / "work" / "grades.csv").read_text()
    assert "good" in csv


def _site_packages(venv_bin: Path) -> Path:
    out = subprocess.run([str(venv_bin / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@pytest.mark.timeout(1200)
def test_root_grades_the_cheat_corpus_as_the_separate_user(course):
    root = COURSE_PARENT / "boundary corpus" / "course"
    shutil.rmtree(root.parent, ignore_errors=True)
    root.mkdir(parents=True)
    run = cheat_corpus.Run("user", cheat_corpus.SYNTHETIC)
    cheat_corpus.submit_corpus(root, run, search_root=root.parent)
    subprocess.run(["chown", "-R", f"{TEACHER}:", str(root.parent)], check=True)
    os.chmod(root.parent, 0o755)
    token = uuid.uuid4().hex
    env = _root_env(course, DTLABS_TEST_TOKEN=token, DTLABS_MEMORY_MB=4096, DTLABS_MAX_PROCS=64, DTLABS_DISK_MB=256)
    cheat_corpus.PWNED.unlink(missing_ok=True)

    refused = subprocess.run(_refusing(course, "dtlabs", "grade", LAB, "--no-feedback", "--course-root", root),
                             env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "could reach what a submission must not" in refused.stdout, refused.stdout
    assert f"readable: {root / 'solutions'}" in refused.stdout, refused.stdout

    fixed = subprocess.run(_refusing(course, "dtlabs", "doctor", "--grading", LAB, "--fix", "--course-root", root),
                           env=env, capture_output=True, text=True, timeout=600)
    assert "boundary    user" in fixed.stdout and "chmod o-rwx" in fixed.stdout, fixed.stdout + fixed.stderr
    assert f"{LAB}: can be graded here" in fixed.stdout, fixed.stdout

    site = _site_packages(course / ".venv" / "bin")
    pth_before = sorted(p.name for p in site.glob("*.pth"))
    before = cheat_corpus.tree_digest(root)
    t0 = time.monotonic()
    with nobody.listening(nobody.hidden_lines(root, LAB)) as ear:  # another user of the machine, all along
        graded = subprocess.run(_refusing(course, "dtlabs", "grade", LAB, "--no-feedback", "--jobs", "2",
                                          "--course-root", root), env=env, capture_output=True, text=True, timeout=1100)
    TIMINGS["no namespaces: the corpus as the separate user"] = time.monotonic() - t0
    out = graded.stdout
    assert "sandbox: user" in out and "taken without a boundary" not in out, out
    scores = {s: grading.cell_scores(root, LAB, s) for s in ["honest", "zz_victim"] +
              [f"cheat_{p.stem}" for p in cheat_corpus.attacks(run)]}
    t = run.target
    assert scores["honest"].get(t.test) == t.honest_score, out
    assert scores["zz_victim"].get(t.test) == t.full_score, out
    honest = scores["honest"]
    gained = {s: got for s, got in scores.items() if s.startswith("cheat_")
              and any(v[0] > honest.get(g, (0, 0))[0] for g, v in got.items())}
    assert not gained, f"cheats gained as the separate user: {gained}\n{out}"
    assert cheat_corpus.tree_digest(root) == before, "grading as the separate user changed the course's files"
    assert sorted(p.name for p in site.glob("*.pth")) == pth_before, "a submission wrote into the venv"
    assert not [s for s in grading.gradebook.schema(root / "grader" / "work" / "gradebook.db") if s[0] == "trigger"]
    assert not cheat_corpus.PWNED.exists(), "a hostile return value ran code in the grader"
    left = subprocess.run(["pgrep", "-u", SUBJECT], capture_output=True, text=True).stdout.split()
    assert not left, f"processes of the separate user outlived grading: {left}"
    assert not ear["heard"], f"another user heard the hidden tests: {ear['heard']}"
    report(f"[no namespaces] nobody listened through the corpus's grading: {len(ear['reached'])} endpoints reached, "
           f"{ear['bytes']} bytes, no hidden test heard")


RELAY_LABS = ("01_ddp_setup", "03_fsdp_zero", "05_multi_node", "07_model_parallel", "08_comm_efficiency",
              "09_async_elastic")  # the labs whose tests count what the ranks send (the relay) or a lock's grants
# ... and every other lab but Lab 10, whose framework tests need DeepSpeed, Ray and TensorFlow, which the deploy
# course's venv leaves out (FRAMEWORKS=0: the biggest install of all); Lab 11 compiles its kernels there too
EVERY_LAB_BUT_10 = RELAY_LABS + ("02_grad_accumulation", "04_mixed_precision", "06_profiling", "11_gpu_kernels")


@pytest.mark.timeout(1500)
def test_root_grades_every_lab_as_the_separate_user_at_full_marks(course):
    """The relay and the counted lock listen in the grader kernel (root) and the subject's ranks (the separate user)
    connect to them: in the folder the grader makes for the subject's sockets, root's, in that user's group. With the
    sockets root's alone, the subject's ranks were refused and Lab 01's solution scored 7 of 10. ``dtlabs doctor
    --grading`` grades each lab's solution and empty release as a class would be graded, here the real labs of a
    clone closed to that user by ``--fix`` (every lab but Lab 10: see EVERY_LAB_BUT_10)."""
    root = COURSE_PARENT / "boundary labs" / "course"
    shutil.rmtree(root.parent, ignore_errors=True)
    copy_course(root, TEACHER)
    os.chmod(root.parent, 0o755)
    env = _root_env(course, DTLABS_TEST_TOKEN=uuid.uuid4().hex)
    t0 = time.monotonic()
    needles = [line for lab in EVERY_LAB_BUT_10 for line in nobody.hidden_lines(root, lab)]
    with nobody.listening(needles) as ear:  # another user of the machine, through every lab's grading
        doctor = subprocess.run(_refusing(course, "dtlabs", "doctor", "--grading", *EVERY_LAB_BUT_10, "--fix",
                                          "--course-root", root), env=env, capture_output=True, text=True, timeout=1400)
    TIMINGS["no namespaces: every lab's canary but Lab 10's as the separate user"] = time.monotonic() - t0
    out = doctor.stdout + doctor.stderr
    assert "boundary    user" in out, out
    for lab in EVERY_LAB_BUT_10:
        assert f"{lab}: can be graded here (solution " in out, f"{lab} cannot be graded as the separate user:\n{out}"
    assert not subprocess.run(["pgrep", "-u", SUBJECT], capture_output=True, text=True).stdout.split()
    assert not ear["heard"], f"another user heard the hidden tests: {ear['heard']}"
    report(f"[no namespaces] nobody listened through ten labs' gradings: {len(ear['reached'])} endpoints "
           f"reached, {ear['bytes']} bytes, none of {len(needles)} hidden test lines heard")


def _subject_folders() -> set:
    return {p for p in Path("/tmp").glob(f"{separate_user.WORK_ROOT_PREFIX}*")}


def _owner(folder: Path, prefix: str = separate_user.WORK_ROOT_PREFIX) -> int:
    """The pid a folder of ``tempdirs.owned_tempdir(prefix)`` is named for, 0 if none."""
    parts = folder.name[len(prefix):].split("-")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0


def _scratch_folders(pids: set) -> set:
    """The grading's own scratch folders in /tmp (``lab_utils.grading.scratch``) made by one of ``pids``."""
    from lab_utils.grading import scratch

    return {p for prefix in scratch.PREFIXES for p in Path("/tmp").glob(f"{prefix}*") if _owner(p, prefix) in pids}


def _holds_a_folder(folder: Path) -> bool:
    try:
        return any(p.is_dir() for p in folder.iterdir())
    except OSError:
        return False


@pytest.mark.timeout(900)
def test_a_grading_killed_as_the_separate_user_leaves_nothing_past_the_next(course):
    """A grading killed outright (a scheduler's time limit, an OOM kill) runs none of its cleanup: its subjects'
    folder, the separate user's files with a student's submission in them, and its own scratch folders stayed in /tmp
    for good. The next grading on the machine removes them (its own subject's folder before its subject starts)."""
    root = COURSE_PARENT / "boundary killed" / "course"
    shutil.rmtree(root.parent, ignore_errors=True)
    root.mkdir(parents=True)
    _small_class(root)
    subprocess.run(["chown", "-R", f"{TEACHER}:", str(root.parent)], check=True)
    os.chmod(root.parent, 0o755)
    env = _root_env(course, DTLABS_MEMORY_MB=4096, DTLABS_MAX_PROCS=64, DTLABS_DISK_MB=256)
    fixed = subprocess.run(_refusing(course, "dtlabs", "doctor", "--grading", LAB, "--fix", "--course-root", root),
                           env=env, capture_output=True, text=True, timeout=600)
    assert f"{LAB}: can be graded here" in fixed.stdout, fixed.stdout + fixed.stderr
    grade = _refusing(course, "dtlabs", "grade", LAB, "--no-feedback", "--course-root", root)
    log = root.parent / "killed grading.log"
    with open(log, "w") as fh:
        victim = subprocess.Popen(grade, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    # its own subjects' folder (named for the pid of a process of its tree), once a subject's folder is in it
    deadline, mine = time.monotonic() + 240, None
    while mine is None:
        assert victim.poll() is None and time.monotonic() < deadline, (
            f"the grading made no subject folder in 240 s (exit {victim.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
        try:
            tree = {p.pid for p in psutil.Process(victim.pid).children(recursive=True)}
        except psutil.Error:
            continue
        mine = next((f for f in _subject_folders() if _owner(f) in tree and _holds_a_folder(f)), None)
    scratch = _scratch_folders(tree | {victim.pid})  # and the grader's own: the submission's copy, the template, nbgrader's
    os.killpg(victim.pid, 9)  # the grading and its kernels, at once: no finally runs
    victim.wait(timeout=30)
    graded = subprocess.run(grade, env=env, capture_output=True, text=True, timeout=600)
    assert graded.returncode == 0 and "sandbox: user" in graded.stdout, graded.stdout + graded.stderr
    # removed by the next grading to take the separate user's lock: this one, or another test's
    assert not mine.exists(), f"a killed grading's subject folder outlived the next grading: {mine}"
    assert scratch and not [f for f in scratch if f.exists()], (
        f"a killed grading's scratch folders outlived the next grading: {sorted(map(str, scratch))}")
    assert not subprocess.run(["pgrep", "-u", SUBJECT], capture_output=True, text=True).stdout.split()


GRADESCOPE_LAB = "01_ddp_setup"  # a relay lab: as the separate user its solution once scored 7 of 10


@pytest.mark.timeout(1800)
def test_the_gradescope_bundle_grades_lab01_as_the_separate_user(course):
    """Lab 01's bundle, built from a clone of the course, set up (``setup.sh``, whose canary grades the solution and
    the release as the separate user) and run (``run_autograder``) as root with namespaces refused, as Gradescope
    runs it. Lab 01's tests count what the ranks send through the relay, which listens in the grader kernel (root):
    with its socket closed to the separate user, the canary refused the image (the solution scored 7 of 10)."""
    import json

    from helpers.known_wrong import read_known_wrong
    from lab_utils.grading.export import gradescope

    lab = GRADESCOPE_LAB
    work = COURSE_PARENT / "boundary gradescope"
    shutil.rmtree(work, ignore_errors=True)
    course_root = work / "course"
    copy_course(course_root, TEACHER)  # the real labs, as a clone has them (the bundle reads its solution folder)
    bundle = gradescope.build(lab, work / "out", course_root=course_root,
                              wheel=gradescope.build_wheel(work / "wheel"), out=lambda *_: None)
    gs = work / "autograder"
    (gs / "source").mkdir(parents=True)
    (gs / "submission").mkdir()
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(gs / "source")
    manifest = json.loads((gs / "source" / "dtlabs-autograder.json").read_text())
    points = {t["grade_id"]: t["points"] for t in manifest["tests"]}
    total = sum(points.values())
    # the bound on the dishonest submission, from what the repository records (not from this run): the known-wrong
    # answer's header names the test cells it loses, every other cell being the solution's
    honest = read_known_wrong(cheat_corpus.REPO / "grader" / "known_wrong" / lab / cheat_corpus.LAB01.honest)
    assert honest.replaces == cheat_corpus.LAB01.answer and set(honest.loses) <= set(points), (honest, points)
    honest_bound = total - sum(points[g] for g in honest.loses)
    assert 0 < honest_bound < total, (honest_bound, total)

    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8", "DTLABS_AUTOGRADER_ROOT": str(gs),
           "DTLABS_TORCH_INDEX_URL": "https://pypi.org/simple", "DTLABS_CACHE_DIR": str(work / "cache"),
           **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}}
    py = course / ".venv" / "bin" / "python"
    t0 = time.monotonic()
    setup = subprocess.run([str(py), str(TESTS / "helpers" / "no_namespaces.py"), "bash", str(gs / "source" / "setup.sh")],
                           env=env, capture_output=True, text=True, timeout=1200)
    TIMINGS["no namespaces: Gradescope setup.sh (venv, torch, the wheel, Lab 01's canary)"] = time.monotonic() - t0
    said = setup.stdout[-3000:] + setup.stderr[-3000:]
    assert setup.returncode == 0, said
    assert f"{lab}: this image can grade it (solution {total:g}/{total:g}, release 0/{total:g})" in setup.stdout, said
    denied = subprocess.run(["runuser", "-u", SUBJECT, "--", "ls", str(gs / "source")], capture_output=True, text=True)
    assert denied.returncode != 0, f"the separate user can list the bundle's hidden tests: {denied.stdout}"

    rel = nbformat.read(str(course_root / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    src = nbformat.read(str(course_root / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    backdoor = (cheat_corpus.REPO / "grader" / "cheats" / "venv_backdoor.py").read_text()
    site = _site_packages(gs / "dtlabs-venv" / "bin")
    results = {}
    for name, nb in (("solution", grading.without_demos(grading.fill_solutions(rel, src))),
                     ("backdoor", grading.without_demos(grading.fill_solutions(
                         rel, src, {honest.replaces: honest.source + "\n\n\n" + backdoor}))),
                     ("release", rel)):
        for p in (gs / "submission").iterdir():
            p.unlink()
        nbformat.write(nb, str(gs / "submission" / f"{lab}.ipynb"))
        t0 = time.monotonic()
        res = subprocess.run([str(py), str(TESTS / "helpers" / "no_namespaces.py"), "bash", str(gs / "source" / "run_autograder")],
                             env={**env, "DTLABS_TEST_TOKEN": "gradescope-" + name}, capture_output=True, text=True,
                             timeout=600)
        TIMINGS[f"no namespaces: Gradescope run_autograder, Lab 01's {name}"] = time.monotonic() - t0
        results[name] = (res.returncode, res.stdout + res.stderr, json.loads((gs / "results" / "results.json").read_text()))
        assert res.returncode == 0 and "sandbox: user" in results[name][1], results[name][1]
        assert not (site / "zz_dtlabs_backdoor.pth").exists(), "the backdoor reached the autograder's venv"
        assert not os.path.lexists(site / "sitecustomize"), "the linked sitecustomize reached the autograder's venv"
    scores = {name: r[2]["score"] for name, r in results.items()}
    TIMINGS["no namespaces: Gradescope Lab 01 scores solution/backdoor/release"] = (
        f"{scores['solution']:g}/{total:g} {scores['backdoor']:g}/{total:g} (known-wrong alone {honest_bound:g}) "
        f"{scores['release']:g}/{total:g}")
    assert scores["solution"] == total, f"Lab 01's solution lost points as the separate user: {results['solution']}"
    assert scores["backdoor"] <= honest_bound, results["backdoor"]  # the known-wrong answer's points at most
    lost = [t for t in results["backdoor"][2]["tests"] if any(t["name"].endswith(f"({g})") for g in honest.loses)]
    assert lost and all(t["score"] == 0 for t in lost), results["backdoor"]
    assert scores["release"] == 0, f"the release graded after the backdoor scored: {results['release']}"
