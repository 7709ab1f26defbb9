"""Every lab, proved the same way (AUTHORING.md, "What CI proves"), discovered from solutions/*/:

1. the solution runs under papermill with parameters injected (CPU, gloo), cwd at the notebook's folder;
2. ``nbgrader autograde`` gives the solution full marks and the untouched release zero, and finishes;
3. each known-wrong submission (grader/known_wrong/NN_topic/*.py) loses points on every cell it names;
4. nothing the notebooks started (ranks, zygotes, torchrun agents and workers, kernels) survives.

For speed, all submissions of one lab (the solution, the release, each known-wrong: one "student" each)
are autograded in ONE nbgrader run in a temporary course; the tests of that lab share its gradebook.
"""
from __future__ import annotations

import os
import shutil
import time
import uuid

import nbformat
import pytest
from conftest import LAB_POINTS, LAB_TIMINGS, TEST_TOKEN_VAR, assert_no_leftovers

from lab_utils import grading
from known_wrong import known_wrong

REPO = grading.REPO_ROOT
LABS = grading.discover_labs(REPO)
WRONG = [(lab, kw.name) for lab in LABS for kw in known_wrong(lab, REPO)]
PARAMETERS = {"WORLD_SIZE": 2, "BACKEND": "gloo"}
LAB_AUTOGRADE_LIMIT_S = float(os.environ.get("DTLABS_LAB_AUTOGRADE_LIMIT_S", "1500"))
# A known-wrong submission ends after the last cell it must lose points on (the cells after it cannot change that
# verdict; nbgrader grades missing cells as 0, as for a student who deleted them), and it leaves out the demo cells
# (student-writable cells that are neither answers nor course cells), which no test may depend on: the "solution
# without demos" student proves that, by keeping full marks. DTLABS_KNOWN_WRONG_FULL=1 runs them whole.
FULL_KNOWN_WRONG = os.environ.get("DTLABS_KNOWN_WRONG_FULL", "") not in ("", "0")


def _source(lab):
    return nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)


def _meta(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def _without_demos(nb):
    nb.cells = [c for c in nb.cells if c.cell_type != "code" or _meta(c)]
    return nb


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
def _papermill(lab, tmp_path, parameters, timing_key):
    """Execute the solution beside a copy of its folder (a lab may write files); return the executed notebook."""
    import papermill

    work = tmp_path / lab
    shutil.copytree(REPO / "solutions" / lab, work)
    out = tmp_path / f"{lab}.{timing_key}.ipynb"
    start = time.monotonic()
    papermill.execute_notebook(
        str(work / f"{lab}.ipynb"), str(out), parameters=parameters, cwd=str(work), kernel_name="python3",
        progress_bar=False, log_output=False, execution_timeout=300,
    )
    LAB_TIMINGS.setdefault(lab, {})[timing_key] = time.monotonic() - start
    return nbformat.read(str(out), as_version=4)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("lab", LABS)
def test_solution_runs_under_papermill(lab, tmp_path, no_leaked_processes):
    executed = _papermill(lab, tmp_path, PARAMETERS, "papermill_s")
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "BACKEND = \"gloo\"" in injected[0].source, "papermill did not inject the parameters"


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()  # counts devices without creating a CUDA context in this process


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("lab", LABS)
def test_solution_runs_with_nccl_on_a_gpu_runner(lab, tmp_path, no_leaked_processes):
    """GPU runners: the same solution with BACKEND="auto", one rank per GPU (up to 4), so launch() picks NCCL."""
    gpus = _gpus()
    if gpus < 2:
        pytest.skip(f"needs 2 CUDA GPUs for NCCL with one GPU per rank (found {gpus})")
    executed = _papermill(lab, tmp_path, {"WORLD_SIZE": min(gpus, 4), "BACKEND": "auto"}, "papermill_gpu_s")
    text = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", [])
                   if o.get("output_type") == "stream")
    assert "nccl" in text.lower(), "launch() did not report NCCL on a machine with a GPU per rank"


# ------------------------------------------------------------------------------------------ autograde
class LabGrades:
    """One nbgrader autograde run over every submission of one lab, and its results."""

    def __init__(self, lab, root):
        self.lab, self.root = lab, root
        self.wrong = {kw.name: kw for kw in known_wrong(lab, REPO)}
        self.students = ["solution", "solution_without_demos", "release"] + [f"wrong_{n}" for n in self.wrong]
        self.run = None
        self.scores = {}
        self.leftovers = None

    def grade(self):
        shutil.copytree(REPO / "solutions" / self.lab, self.root / "solutions" / self.lab)
        grading.release([self.lab], root=self.root)  # fills this course's gradebook with the hidden tests
        rel = nbformat.read(str(self.root / "labs" / self.lab / f"{self.lab}.ipynb"), as_version=4)
        src = _source(self.lab)
        grading.submit(self.root, "solution", self.lab, grading.fill_solutions(rel, src))
        grading.submit(self.root, "solution_without_demos", self.lab, _without_demos(grading.fill_solutions(rel, src)))
        grading.submit(self.root, "release", self.lab, rel)
        for name, kw in self.wrong.items():
            nb = grading.fill_solutions(rel, src, {kw.replaces: kw.source})
            if not FULL_KNOWN_WRONG:
                nb = _without_demos(nb)
                nb.cells = nb.cells[: _last_cell(nb, kw.loses) + 1]
            grading.submit(self.root, f"wrong_{name}", self.lab, nb)
        token = uuid.uuid4().hex
        os.environ[TEST_TOKEN_VAR] = token
        try:
            self.run = grading.autograde(self.lab, course_root=self.root, timeout=LAB_AUTOGRADE_LIMIT_S)
        finally:
            os.environ.pop(TEST_TOKEN_VAR, None)
        try:
            assert_no_leftovers(token)
            self.leftovers = []
        except AssertionError as exc:
            self.leftovers = [str(exc)]
        self.scores = {s: grading.cell_scores(self.root, self.lab, s) for s in self.students}
        LAB_POINTS[self.lab] = {s: self._points(s) for s in self.students}
        LAB_TIMINGS.setdefault(self.lab, {}).update(
            autograde_s=self.run.seconds, submissions=len(self.students), reaped=len(self.run.reaped))
        return self

    def _points(self, student) -> str:
        """'7/10' for a whole submission; for a known-wrong one, its points on the cells it must lose."""
        sc = self.scores.get(student) or {}
        if student.startswith("wrong_"):
            kw = self.wrong[student[len("wrong_"):]]
            return ", ".join(f"{t} {sc.get(t, (0, 0))[0]:g}/{sc.get(t, (0, 0))[1]:g}" for t in kw.loses)
        return f"{sum(e for e, _ in sc.values()):g}/{sum(m for _, m in sc.values()):g}"

    def explain(self, student):
        return f"{student}: {self.scores.get(student)}\nnbgrader log tail:\n{self.run.output[-3000:]}"


_GRADED: dict = {}


@pytest.fixture
def graded(tmp_path_factory):
    def get(lab) -> LabGrades:
        if lab not in _GRADED:
            _GRADED[lab] = LabGrades(lab, tmp_path_factory.mktemp(f"course-{lab}")).grade()
        return _GRADED[lab]
    return get


TIMEOUT = int(LAB_AUTOGRADE_LIMIT_S + 300)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("lab", LABS)
def test_solution_gets_full_marks(lab, graded):
    g = graded(lab)
    assert not g.run.timed_out, f"autograde of {lab} ran past {LAB_AUTOGRADE_LIMIT_S} s"
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
    assert not g.run.timed_out, f"autograde of {lab} ran past {LAB_AUTOGRADE_LIMIT_S} s: a stub hangs?"
    scores = g.scores["release"]
    assert scores, "the release stub was not graded\n" + g.explain("release")
    earned = {gid: s for gid, s in scores.items() if s[0] > 0}
    assert not earned, f"the untouched release earns points on {earned}\n" + g.explain("release")


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
def test_autograde_leaves_no_process_behind(lab, graded):
    g = graded(lab)
    assert g.leftovers == [], g.leftovers[0]
