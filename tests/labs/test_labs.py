"""Every lab, proved the same way (AUTHORING.md, "What CI proves for every lab"), discovered from solutions/*/:

1. the solution runs under papermill with parameters injected (CPU, gloo), cwd at the notebook's folder;
2. graded the way autograde grades (sandboxed subject, split execution, hidden tests in place), the solution
   without its demo cells gets full marks, the untouched release scores zero and finishes, and each known-wrong
   answer (grader/known_wrong/NN_topic/*.py) loses points on every cell it names;
3. nothing the notebooks started (ranks, zygotes, torchrun agents and workers, kernels) survives.

Point 2 runs in one ``check_swaps`` session per lab (lab_utils/grading/quality/swaps.py): one kernel and subject for
every answer instead of one each (a swap re-runs a few cells; a submission starts a kernel and a subject, each
importing torch), and each solution runs twice in all: with its demos under papermill, without them in the
session. DTLABS_FULL=1 (the GPU and nightly jobs) grades the solution with its demos and every other answer as its
own submission in a real ``nbgrader autograde`` run instead, as a student's would be.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import uuid

import nbformat
import pytest
from helpers.processes import TEST_TOKEN_VAR, assert_no_leftovers
from helpers.summary import record_lab

from lab_utils import grading
from lab_utils.grading.quality import mutate
from lab_utils.grading.quality.swaps import Swap, check_swaps, release_swap
from lab_utils.grading.split.kernels import PrivateSocketKernelManager
from helpers.known_wrong import known_wrong

REPO = grading.REPO_ROOT
# Under pytest-xdist (make test: --dist loadgroup) the tests that share a lab's grading run on the worker that grades
# it (LABS); the papermill runs share nothing and go to any worker (LAB_NAMES).
LAB_NAMES = grading.discover_labs(REPO)
LABS = [pytest.param(lab, marks=pytest.mark.xdist_group(f"lab-{lab}")) for lab in LAB_NAMES]
FULL_AUTOGRADE = os.environ.get("DTLABS_FULL", "") not in ("", "0")  # the nightly job: every answer graded alone
# Per push every lab's known-wrong answers are graded except those marked `# nightly: <why>` (a second or third
# wrong answer to an exercise whose grading re-runs a framework for a minute); the nightly job grades them all, and
# test_every_cell_a_known_wrong_targets_is_proved_on_every_push keeps at least one per cell on every push.
WRONG = [pytest.param(lab, kw.name, marks=pytest.mark.xdist_group(f"lab-{lab}"))
         for lab in LAB_NAMES for kw in known_wrong(lab, REPO, per_push=not FULL_AUTOGRADE)]
PARAMETERS = {"WORLD_SIZE": 2, "BACKEND": "gloo"}
LAB_AUTOGRADE_LIMIT_S = float(os.environ.get("DTLABS_LAB_AUTOGRADE_LIMIT_S", "1500"))
# A known-wrong answer is graded up to the last cell it must lose points on (the cells after it cannot change that
# verdict) and without the demo cells (student-writable cells that are neither answers nor course cells), which no
# test may depend on: the solution without demos proves that, by keeping full marks.
# Each cell has the per-cell limit `dtlabs grade` gives a student (the course's c.DTLabs.cell_timeout, 180 s, which
# check_swaps takes by default): Lab 10's Ray Train cell (one TorchTrainer.fit, six Ray processes starting on 2 cores)
# needs much of it on a shared, loaded machine.
# Each push grades a fixed sample (seed 0) of `dtlabs mutate`'s single-change mutants of every lab in its session;
# each must lose a point (the bar is 90% killed; of 3, that is all). `make mutate` grades more.
MUTANTS_PER_LAB = int(os.environ.get("DTLABS_MUTANTS_PER_LAB", "3"))


def _source(lab):
    return nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)


def _meta(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def _last_cell(nb, grade_ids) -> int:
    idx = [i for i, c in enumerate(nb.cells) if _meta(c).get("grade_id") in set(grade_ids)]
    return max(idx) if idx else len(nb.cells) - 1


# ------------------------------------------------------------------------------------------ cheap checks
@pytest.mark.parametrize("lab", LABS)
def test_lab_follows_the_authoring_contract(lab):
    nb = _source(lab)
    assert (nb.nbformat, nb.nbformat_minor) >= (4, 5), "nbformat 4.5 (cell ids) is required"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    ids = [c.get("id") for c in nb.cells]
    assert all(ids) and len(set(ids)) == len(ids), "every cell needs a fixed, unique id"
    made = [i for i in ids if re.fullmatch(r"[0-9a-f]{8}", i)]  # what nbformat.v4.new_*_cell makes up
    assert not made, f"cells with made-up ids {made}: give each a readable one (AUTHORING.md)"
    params = nb.cells[1]
    assert "parameters" in params.metadata.get("tags", []), "cell 2 must be the papermill parameters cell"
    assert _meta(params).get("grade_id") == "parameters" and _meta(params).get("locked")
    for name in ("WORLD_SIZE", "BACKEND", "STEPS", "SEED"):
        assert f"{name} =" in params.source, f"the parameters cell must set {name}"
    assert any(_meta(c).get("solution") for c in nb.cells), "no solution cells"
    assert any(_meta(c).get("grade") and _meta(c).get("points") for c in nb.cells), "no graded test cells"


@pytest.mark.parametrize("lab,name", WRONG)
def test_known_wrong_submission_names_real_cells(lab, name):
    kw = next(k for k in known_wrong(lab, REPO) if k.name == name)
    nb = _source(lab)
    solutions = {_meta(c)["grade_id"] for c in nb.cells if _meta(c).get("solution")}
    tests = {_meta(c)["grade_id"] for c in nb.cells if _meta(c).get("grade") and _meta(c).get("points")}
    assert kw.replaces in solutions, f"{kw.path.name}: '# replaces: {kw.replaces}' is not a solution cell {sorted(solutions)}"
    unknown = [t for t in kw.loses if t not in tests]
    assert not unknown, f"{kw.path.name}: '# loses:' names {unknown}, not graded cells of {lab}: {sorted(tests)}"
    assert kw.source.strip(), f"{kw.path.name} has no code under its header"


# ------------------------------------------------------------------------------------------ papermill
def spaced_kernel(tmp_path, monkeypatch) -> str:
    """A kernelspec whose Python is this venv reached through a folder named "My Courses" (a student's course under
    a path with a space): its name, found through JUPYTER_PATH. There, without Lab 10's ray_instance() workaround,
    Ray Train's fit hangs (Ray starts its workers through `bash -c` with their paths unquoted)."""
    venv = tmp_path / "My Courses" / "venv"
    venv.parent.mkdir()
    venv.symlink_to(sys.prefix)
    spec = tmp_path / "jupyter" / "kernels" / "dtlabs-spaced"
    spec.mkdir(parents=True)
    argv = [str(venv) + sys.executable[len(sys.prefix):], "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3 (My Courses)",
                                                  "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(filter(None, [str(tmp_path / "jupyter"),
                                                                      os.environ.get("JUPYTER_PATH")])))
    return "dtlabs-spaced"


def _papermill(lab, tmp_path, parameters, timing_key, node, kernel_name="python3"):
    """Execute the solution beside a copy of its folder (a lab may write files); return the executed notebook."""
    import papermill

    work = tmp_path / lab
    shutil.copytree(REPO / "solutions" / lab, work)
    out = tmp_path / f"{lab}.{timing_key}.ipynb"
    start = time.monotonic()
    papermill.execute_notebook(
        str(work / f"{lab}.ipynb"), str(out), parameters=parameters, cwd=str(work), kernel_name=kernel_name,
        progress_bar=False, log_output=False, execution_timeout=300,
        kernel_manager_class=PrivateSocketKernelManager,  # no kernel port race with other tests' ranks
    )
    record_lab(node, lab, {timing_key: time.monotonic() - start})
    return nbformat.read(str(out), as_version=4)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("lab", LAB_NAMES)
def test_solution_runs_under_papermill(lab, tmp_path, no_leaked_processes, request, monkeypatch):
    """The kernel runs from the venv reached through a path with a space, as a course kept under "My Courses"."""
    executed = _papermill(lab, tmp_path, PARAMETERS, "papermill_s", request.node, spaced_kernel(tmp_path, monkeypatch))
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "BACKEND = \"gloo\"" in injected[0].source, "papermill did not inject the parameters"


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()  # counts devices without creating a CUDA context in this process


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("lab", LAB_NAMES)
def test_solution_runs_with_nccl_on_a_gpu_runner(lab, tmp_path, no_leaked_processes, request):
    """GPU runners: the same solution with BACKEND="auto", one rank per GPU (up to 4), so launch() picks NCCL."""
    if "launch(" not in "".join(c.source for c in _source(lab).cells):
        pytest.skip(f"{lab} starts no ranks (its GPU run: tests/labs/test_gpu_kernels.py)")
    gpus = _gpus()
    if gpus < 2:
        pytest.skip(f"needs 2 CUDA GPUs for NCCL with one GPU per rank (found {gpus})")
    executed = _papermill(lab, tmp_path, {"WORLD_SIZE": min(gpus, 4), "BACKEND": "auto"}, "papermill_gpu_s",
                          request.node)
    text = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", [])
                   if o.get("output_type") == "stream")
    assert "nccl" in text.lower(), "launch() did not report NCCL on a machine with a GPU per rank"


# ------------------------------------------------------------------------------------------ autograde
class LabGrades:
    """A lab's verdicts. By default one ``check_swaps`` session (lab_utils/grading/quality/swaps.py: the split execution and
    sandbox of autograde, one kernel and subject for every answer) grades the solution without its demo cells, the
    release and each known-wrong answer; the demo cells run in the papermill test, and nbgrader's own pipeline
    around split execution is graded for real by test_cheats.py (Lab 01) and test_grading_cli.py. With
    DTLABS_FULL=1 (GPU and nightly jobs) every one of them, and the solution with its demos, is its own
    submission in a real ``nbgrader autograde`` run instead."""

    def __init__(self, lab, root):
        self.lab, self.root = lab, root
        self.wrong = {kw.name: kw for kw in known_wrong(lab, REPO, per_push=not FULL_AUTOGRADE)}
        self.graded_alone = []
        if FULL_AUTOGRADE:
            self.graded_alone = ["solution", "solution_without_demos", "release"] + [f"wrong_{n}" for n in self.wrong]
        self.run = None
        self.session = None
        self.scores = {}
        self.timed_out = {}
        self.mutants = []
        self.timings = {}
        self.leftovers = None

    def grade(self):
        token = uuid.uuid4().hex
        os.environ[TEST_TOKEN_VAR] = token
        try:
            if FULL_AUTOGRADE:
                self._autograde()
            else:
                self._session()
        finally:
            os.environ.pop(TEST_TOKEN_VAR, None)
        try:
            assert_no_leftovers(token)
            self.leftovers = []
        except AssertionError as exc:
            self.leftovers = [str(exc)]
        return self

    @property
    def points(self) -> dict:
        return {s: self._points(s) for s in self.scores}

    def _autograde(self):
        shutil.copytree(REPO / "solutions" / self.lab, self.root / "solutions" / self.lab)
        grading.release([self.lab], root=self.root)  # fills this course's gradebook with the hidden tests
        rel = nbformat.read(str(self.root / "labs" / self.lab / f"{self.lab}.ipynb"), as_version=4)
        src = _source(self.lab)
        grading.submit(self.root, "solution", self.lab, grading.fill_solutions(rel, src))
        grading.submit(self.root, "solution_without_demos", self.lab, grading.without_demos(grading.fill_solutions(rel, src)))
        grading.submit(self.root, "release", self.lab, rel)
        for name, kw in self.wrong.items():
            nb = grading.without_demos(grading.fill_solutions(rel, src, {kw.replaces: kw.source}))
            nb.cells = nb.cells[: _last_cell(nb, kw.loses) + 1]
            grading.submit(self.root, f"wrong_{name}", self.lab, nb)
        self.run = grading.autograde(self.lab, course_root=self.root, timeout=LAB_AUTOGRADE_LIMIT_S)
        for s in self.graded_alone:
            self.scores[s] = grading.cell_scores(self.root, self.lab, s)
        self.timings.update(autograde_s=self.run.seconds, graded_alone=len(self.graded_alone),
                            reaped=len(self.run.reaped))

    def _session(self):
        swaps = [release_swap(self.lab)] + [Swap(f"wrong_{n}", {kw.replaces: kw.source}, until=_last_loses(kw))
                                            for n, kw in self.wrong.items()]
        accepted = mutate.load_accepted(self.lab, REPO)
        pool = [m for m in mutate.lab_mutants(_source(self.lab)) if m.id not in accepted]
        self.mutants = mutate.sample(pool, MUTANTS_PER_LAB, seed=0)
        swaps += [Swap(f"mutant_{m.id}", {m.grade_id: m.source}, first_loss=True) for m in self.mutants]
        self.session = check_swaps(self.lab, swaps)
        self.scores["solution"] = self.scores["solution_without_demos"] = self.session.baseline.scores
        self.scores["control"] = self.session.control.scores
        for name, res in self.session.results.items():
            self.scores[name] = res.scores
            self.timed_out[name] = res.timed_out
        self.timings.update(swap_session_s=round(self.session.seconds, 1), swaps=len(swaps),
                            slowest_swap=max(((round(r.seconds, 1), n) for n, r in self.session.results.items()),
                                             default=None))

    def _points(self, student) -> str:
        """'7/10' for a whole submission; for a known-wrong one, its points on the cells it must lose."""
        sc = self.scores.get(student) or {}
        if student.startswith("wrong_"):
            kw = self.wrong[student[len("wrong_"):]]
            return ", ".join(f"{t} {sc.get(t, (0, 0))[0]:g}/{sc.get(t, (0, 0))[1]:g}" for t in kw.loses)
        return f"{sum(e or 0 for e, _ in sc.values()):g}/{sum(m for _, m in sc.values()):g}"

    def explain(self, student):
        if student in self.graded_alone:
            return f"{student}: {self.scores.get(student)}\nnbgrader log tail:\n{self.run.output[-3000:]}"
        res = self.session.results.get(student) or self.session.baseline
        return (f"{student}: {self.scores.get(student)} (graded in the swap session, sandbox {self.session.mode})\n"
                + "\n".join(f"  {gid}: {err}" for gid, err in res.errors.items()))


def _last_loses(kw):
    nb = _source(kw.path.parent.name)
    return max(kw.loses, key=lambda gid: max(i for i, c in enumerate(nb.cells) if _meta(c).get("grade_id") == gid))


_GRADED: dict = {}


@pytest.fixture
def graded(tmp_path_factory, request):
    def get(lab) -> LabGrades:
        if lab not in _GRADED:
            _GRADED[lab] = g = LabGrades(lab, tmp_path_factory.mktemp(f"course-{lab}")).grade()
            record_lab(request.node, lab, g.timings, g.points)
        return _GRADED[lab]
    return get


TIMEOUT = int(LAB_AUTOGRADE_LIMIT_S + 300)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("lab", LABS)
def test_solution_gets_full_marks(lab, graded):
    g = graded(lab)
    assert not (g.run and g.run.timed_out), f"autograde of {lab} ran past {LAB_AUTOGRADE_LIMIT_S} s"
    scores = g.scores["solution"]
    assert scores, "the solution was not graded\n" + g.explain("solution")
    short = {gid: s for gid, s in scores.items() if s[0] < s[1]}
    assert not short, f"the solution loses points on {short}\n" + g.explain("solution")


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("lab", LABS)
def test_no_test_depends_on_a_demo_cell(lab, graded):
    """Known-wrong submissions leave the demo cells out; that is only sound if the solution without them keeps
    full marks (and it is what a student who deleted the demos must get)."""
    g = graded(lab)
    scores = g.scores["solution_without_demos"]
    short = {gid: s for gid, s in scores.items() if s[0] < s[1]}
    assert scores and not short, (f"without its demo cells the solution loses {short}: a test depends on a demo "
                                  "cell; move what it needs into a locked cell\n" + g.explain("solution_without_demos"))


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("lab", LABS)
def test_untouched_release_gets_zero_and_finishes(lab, graded):
    g = graded(lab)
    assert not (g.run and g.run.timed_out), f"autograde of {lab} ran past {LAB_AUTOGRADE_LIMIT_S} s: a stub hangs?"
    assert not g.timed_out.get("release"), f"on the release stub, {g.timed_out['release']} ran past the cell limit"
    scores = g.scores["release"]
    assert scores, "the release stub was not graded\n" + g.explain("release")
    earned = {gid: s for gid, s in scores.items() if s[0] > 0}
    assert not earned, f"the untouched release earns points on {earned}\n" + g.explain("release")


@pytest.mark.parametrize("lab", LAB_NAMES)
def test_every_cell_a_known_wrong_targets_is_proved_on_every_push(lab):
    """A known-wrong answer marked `# nightly:` may wait for the nightly job only if another, graded on every push,
    targets each cell it loses points on (no exercise's hidden tests go unproved between nightly runs)."""
    every, per_push = known_wrong(lab, REPO), known_wrong(lab, REPO, per_push=True)
    covered = {cell for kw in per_push for cell in kw.loses}
    bare = {cell: kw.name for kw in every for cell in kw.loses if cell not in covered}
    assert not bare, f"{lab}: no per-push known-wrong answer loses points on {sorted(bare)} (only {bare})"
    assert all(kw.nightly.strip() for kw in every if kw.nightly is not None), "a `# nightly:` line must say why"


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("lab,name", WRONG)
def test_known_wrong_submission_loses_points(lab, name, graded):
    g = graded(lab)
    kw, student = g.wrong[name], f"wrong_{name}"
    scores, full = g.scores[student], g.scores["solution"]
    assert scores, f"{student} was not graded\n" + g.explain(student)
    assert sum(s or 0 for s, _ in scores.values()) < sum(m for _, m in scores.values()), (
        f"{kw.path.name} ({kw.mistake}) got full marks\n" + g.explain(student))
    kept = [t for t in kw.loses if (scores.get(t, (0, 1))[0] or 0) >= scores.get(t, (0, 1))[1]]
    assert not kept, (
        f"{kw.path.name} ({kw.mistake}) should lose points on {kw.loses} but keeps full marks on {kept}: "
        f"the hidden tests of {kept} do not catch this mistake\n" + g.explain(student))
    assert full, "the solution was not graded"


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("lab", LABS)
def test_sampled_mutants_lose_points(lab, graded):
    """A mutant that keeps full marks is a mistake the tests let through (or an equivalent change: accept it with a
    reason in grader/mutants/NN_topic.toml)."""
    g = graded(lab)
    if g.session is None:
        pytest.skip("DTLABS_FULL=1: the nightly job runs `make mutate` on every lab instead")
    survivors = [m for m in g.mutants if all((e or 0) >= mx for e, mx in g.scores[f"mutant_{m.id}"].values())]
    assert not survivors, "mutants that keep full marks (strengthen a hidden test, or accept an equivalent one):\n" + \
        "\n".join(f"--- {m.id} {m.grade_id} line {m.line} ({m.operator}: {m.description})\n{m.diff}" for m in survivors)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("lab", LABS)
def test_swaps_leave_the_session_as_they_found_it(lab, graded):
    """Each swap puts the solution back; at the end every test passes again, or a swap's verdict may be another's."""
    g = graded(lab)
    if g.session is None:
        pytest.skip("DTLABS_FULL=1: every answer was graded as its own submission")
    assert not g.session.restore_errors, f"putting the solution back failed: {g.session.restore_errors}"
    short = {gid: s for gid, s in g.scores["control"].items() if (s[0] or 0) < s[1]}
    assert not short, (f"after the swaps the solution loses {short}: a swapped answer changed state that the "
                       f"solution's cells do not set again\n" + "\n".join(
                           f"  {gid}: {e}" for gid, e in g.session.control.errors.items()))
    assert g.session.mode != "unknown" and not g.session.mode.startswith("no subject"), g.session.mode


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("lab", LABS)
def test_autograde_leaves_no_process_behind(lab, graded):
    g = graded(lab)
    assert g.leftovers == [], g.leftovers[0]
