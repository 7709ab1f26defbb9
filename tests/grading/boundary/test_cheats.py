"""The cheat corpus (grader/cheats/, see its README) graded the way an instructor grades: no cheat gains anything,
nothing of the course changes, a victim graded after every attacker keeps full marks, nothing survives.

make test grades, with bubblewrap (where it works), the attacks that need Lab 01's own code (header ``# needs:``:
its ranks, torch, ``ring_all_reduce``) against Lab 01 and every other attack against the synthetic lab: the same
attacks on the same grading pipeline, at a few seconds per submission instead of a torch kernel, subject and rank
server each. The cheats whose defence depends on the sandbox mode are graded again in the fallback
(DTLABS_SANDBOX=off), against the synthetic lab. DTLABS_FULL=1 (the nightly job) grades the whole corpus against
Lab 01 with bubblewrap, and the fallback set against Lab 01 too. Where bubblewrap cannot run, make test grades
Lab 01 in the fallback.

In the fallback nothing stops a submission from writing what it finds, so the attacks that search the machine for
gradebooks and submissions really write them (and the course guard must put them back): there they search only
this test's folder, which holds the course and, beside it, the temp folder the grading uses, as /tmp lies beside a
course. Searching all of /tmp would damage the courses of tests running in parallel and the developer's checkout.
"""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
import uuid
from pathlib import Path

import nbformat
import pytest
from helpers import nobody
from helpers.cheat_corpus import CHEATS, LAB01, PWNED, SYNTHETIC, Run, attacks, header, submit_corpus, tree_digest
from helpers.processes import TEST_TOKEN_VAR, assert_no_leftovers
from helpers.synthetic import HIDDEN_SOURCE, SYNTHETIC_LAB

from lab_utils import grading
from lab_utils.grading.boundary import sandbox

REPO = grading.REPO_ROOT


def _grade_corpus(root: Path, run: Run, monkeypatch) -> dict:
    mode, target = run.mode, run.target
    lab = target.lab
    search_root = None
    if mode == "fallback":  # the course, its templates and scratch courses, and nothing else, are what attacks find
        search_root, tmp = root.parent, root.parent / "tmp"  # side by side, as a course and /tmp are
        tmp.mkdir()
        monkeypatch.setenv("TMPDIR", str(tmp))
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    elif mode == "user":  # what is open to every user of this machine (other checkouts) is not this course's to judge
        search_root = root.parent
    submit_corpus(root, run, search_root)
    before = tree_digest(root)
    repo_before = tree_digest(REPO)
    PWNED.unlink(missing_ok=True)
    token = uuid.uuid4().hex
    monkeypatch.setenv(TEST_TOKEN_VAR, token)
    monkeypatch.setenv("DTLABS_MEMORY_MB", "4096")
    monkeypatch.setenv("DTLABS_MAX_PROCS", "64")
    monkeypatch.setenv("DTLABS_DISK_MB", "256")
    if mode == "fallback":
        monkeypatch.setenv("DTLABS_SANDBOX", "unprotected")
        # the user folders the startup watch guards are this test's own: other tests' kernels write the real ones
        monkeypatch.setenv("HOME", str(root.parent / "home"))
    elif mode == "user":
        monkeypatch.setenv("DTLABS_SANDBOX", "user")
        sandbox.fix(root)
    lines = []
    # another user of the machine listens to every socket and port it can reach while the class is graded
    with (nobody.listening(nobody.hidden_lines(root, lab)) if nobody.why_not() is None else contextlib.nullcontext({})) as ear:
        code = grading.grade([lab], course_root=root, jobs=2, feedback=False, out=lines.append, progress=False)
    repo_after = tree_digest(REPO)
    assert_no_leftovers(token)
    return {"code": code, "lines": lines, "before": before, "after": tree_digest(root), "repo_before": repo_before,
            "repo_after": repo_after, "ear": ear}



def _separate_user_here() -> bool:
    """Root, with the separate user there (or made now), and this Python runnable by it: then the separate user's
    corpus runs on every push too. Where this Python lies in a private folder (a venv made from a Python under /root)
    it cannot, and make test-deploy grades that corpus as the separate user from the course's own venv instead,
    with namespaces refused as Docker refuses them (tests/deploy/test_no_namespaces.py)."""
    if os.geteuid() != 0 or not sandbox.bwrap_path() or sandbox.subject_user()[0] is None:
        return False
    return not any("could not run" in f for f in sandbox.exposure())


# Under pytest-xdist one worker grades a corpus and runs its tests (module docstring: which corpora run when).
FULL = os.environ.get("DTLABS_FULL", "") not in ("", "0")
if not sandbox.bwrap_path():
    RUNS = [Run("fallback", LAB01)]
elif FULL:
    RUNS = [Run("bwrap", LAB01), Run("fallback", LAB01), Run("fallback", SYNTHETIC)]
else:
    RUNS = [Run("bwrap", LAB01, "needs"), Run("bwrap", SYNTHETIC, "rest"), Run("fallback", SYNTHETIC)]
if _separate_user_here():
    RUNS.append(Run("user", SYNTHETIC))


@pytest.fixture(scope="module", params=[pytest.param(r, id=r.name, marks=pytest.mark.xdist_group(f"cheats-{r.name}"))
                                        for r in RUNS])
def corpus(request, tmp_path_factory):
    run = request.param
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp(f"cheats-{run.mode}") / "course"
    root.mkdir()
    try:
        result = _grade_corpus(root, run, mp)
    finally:
        mp.undo()
    result.update(root=root, run=run)
    return result


def _scores(corpus, student):
    return grading.cell_scores(corpus["root"], corpus["run"].target.lab, student)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_honest_answer_underneath_scores_zero_and_the_victim_full_marks(corpus):
    t = corpus["run"].target
    honest, victim = _scores(corpus, "honest"), _scores(corpus, "zz_victim")
    assert honest.get(t.test) == t.honest_score, (
        f"the honest wrong answer should score {t.honest_score} on {t.test}: {honest}\n" + "\n".join(corpus["lines"]))
    assert victim.get(t.test) == t.full_score, (
        f"the victim graded after every attacker lost points: {victim}\n" + "\n".join(corpus["lines"]))


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_no_other_user_of_the_machine_heard_a_hidden_test(corpus):
    """While the whole corpus was graded, user ``nobody`` subscribed to every kernel and socket it could reach, the
    grader kernels' IOPub (every hidden test they execute) included; it must hear no hidden test's line."""
    if nobody.why_not():
        pytest.skip(nobody.why_not())
    ear = corpus["ear"]
    assert ear and not ear["heard"], f"another user heard the hidden tests: {ear.get('heard')} (reached {ear.get('reached')})"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_no_cheat_gains_anything(corpus):
    """Every cheat of this corpus against the honest answer underneath it, cell by cell; the failure names each
    cheat that gained and its grading line."""
    honest = _scores(corpus, "honest")
    honest_total = sum(s for s, _ in honest.values())
    gains = []
    for path in attacks(corpus["run"]):
        got = _scores(corpus, f"cheat_{path.stem}")
        gained = {gid: s for gid, s in got.items() if s[0] > honest.get(gid, (0, 0))[0]}
        line = next((x for x in corpus["lines"] if f"cheat_{path.stem}/" in x), "(no line)")
        if gained:
            gains.append(f"{path.stem} gained {gained}: {line}")
        said = re.match(r"\s*cheat_\S+: ([0-9.]+)/", line)  # what the instructor reads (and outcomes record)
        if said and float(said.group(1)) > honest_total:
            gains.append(f"{path.stem}'s grade line shows more than the honest answer's {honest_total:g}: {line}")
    assert not gains, (f"[{corpus['run'].mode}, {corpus['run'].target.lab}] cheats gained points over the honest answer "
                       f"{honest}:\n" + "\n".join(gains))


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_course_and_gradebook_are_unchanged(corpus):
    assert corpus["after"] == corpus["before"], "grading changed the course's files: " + ", ".join(
        k for k in corpus["after"] if corpus["before"].get(k) != corpus["after"].get(k))
    assert corpus["repo_after"] == corpus["repo_before"], "grading changed the repository's own files: " + ", ".join(
        k for k in corpus["repo_after"] if corpus["repo_before"].get(k) != corpus["repo_after"].get(k))
    assert not PWNED.exists(), "a hostile return value ran code in the grader"
    from nbgrader.api import Gradebook

    with Gradebook(grading.gradebook.db_url(corpus["root"])) as gb:
        for sub in gb.assignment_submissions(corpus["run"].target.lab):
            for nb in sub.notebooks:
                manual = [g.name for g in nb.grades if g.manual_score is not None]
                assert not manual, f"{sub.student.id} has manual scores nobody gave: {manual}"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_no_hidden_test_reaches_a_cheats_output(corpus):
    t = corpus["run"].target
    src = nbformat.read(str(corpus["root"] / "solutions" / t.lab / f"{t.lab}.ipynb"), as_version=4)
    hidden = [line.strip() for c in src.cells for line in c.source.split("### BEGIN HIDDEN TESTS")[1:]
              for line in line.split("### END HIDDEN TESTS")[0].splitlines() if len(line.strip()) > 20]
    assert hidden and (t.lab != SYNTHETIC_LAB or any(HIDDEN_SOURCE in h for h in hidden))
    for path in attacks(corpus["run"]):
        nb_path = corpus["root"] / "grader" / "work" / "autograded" / f"cheat_{path.stem}" / t.lab / f"{t.lab}.ipynb"
        if not nb_path.is_file():
            continue
        nb = nbformat.read(str(nb_path), as_version=4)
        answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == t.answer]
        text = "".join(str(o) for c in answers for o in c.get("outputs", []))
        leaked = [h for h in hidden if h in text]
        assert not leaked, f"[{corpus['run'].mode}, {t.lab}] {path.stem} printed a hidden test line: {leaked[0]}"


def _autograded(corpus, path: Path):
    lab = corpus["run"].target.lab
    nb_path = corpus["root"] / "grader" / "work" / "autograded" / f"cheat_{path.stem}" / lab / f"{lab}.ipynb"
    return nbformat.read(str(nb_path), as_version=4) if nb_path.is_file() else None


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_nothing_a_cheat_wrote_can_run_in_a_page(corpus):
    """autograded/ (what the formgrader and feedback render) holds no HTML that could run: every markdown cell's
    rendering passes the allow-list unchanged, attachments are raster images, outputs render as text or rasters.
    tests/grading/boundary/test_browser_formgrader.py opens such a submission in the formgrader and its feedback in Chromium."""
    from lab_utils.grading.boundary.inert import RASTER, inert_markdown, render_markdown

    for path in attacks(corpus["run"]):
        nb = _autograded(corpus, path)
        if nb is None:
            continue
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                assert inert_markdown(cell.source, cell.get("attachments")), (path.stem, cell.source)
                assert "<script" not in render_markdown(cell.source, cell.get("attachments")), (path.stem, cell.source)
            for bundle in (cell.get("attachments") or {}).values():
                assert set(bundle) <= set(RASTER), (path.stem, set(bundle))
            for o in cell.get("outputs", []):
                live = set(o.get("data", {})) & {"application/javascript", "image/svg+xml", "text/markdown"}
                assert not live, (path.stem, live)
                assert "<script" not in str(o.get("data", {}).get("text/html", "")), (path.stem, o)
    if "script_in_markdown" in {p.stem for p in attacks(corpus["run"])}:
        nb = _autograded(corpus, REPO / "grader" / "cheats" / "script_in_markdown.py")
        assert nb is not None and any("DTLABS-MARKDOWN" in c.source for c in nb.cells if c.cell_type == "markdown"), \
            "the cheat's markdown cell should reach autograded/, shown as text"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_nothing_student_code_said_under_a_hidden_call_reaches_an_output(corpus):
    """From the first cell with hidden tests on, a cell shows what the grader composed: never a print, an exception's
    message or a traceback of the student's code (grader/cheats/hidden_args_in_exception.py spells each call's
    arguments out, base64, after DTLEAK), neither in autograded/ nor in the feedback made from it, nor in the messages
    Gradescope and the report read (cells.messages)."""
    from lab_utils.grading.export import cells
    from lab_utils.grading.feedback import HideHiddenTests

    t = corpus["run"].target
    hidden_ids = {c.grade_id for c in cells.graded_cells(cells.source_notebook(corpus["root"], t.lab)) if c.hidden}

    def after_hidden(nb):
        first = next((i for i, c in enumerate(nb.cells)
                      if c.metadata.get("nbgrader", {}).get("grade_id") in hidden_ids), len(nb.cells))
        return "".join(str(o) for c in nb.cells[first:] for o in c.get("outputs", []))

    for path in attacks(corpus["run"]):
        nb = _autograded(corpus, path)
        if nb is None:
            continue
        text = after_hidden(nb)
        assert "DTLEAK" not in text, f"{path.stem}: student text under a hidden call reached autograded/: {text[:2000]}"
        said = cells.messages(nb, [])
        assert not any("DTLEAK" in m for m in said.values()), (path.stem, said)
        shown, _ = HideHiddenTests().preprocess(nb, {})
        text = after_hidden(shown)
        assert "DTLEAK" not in text, f"{path.stem}: student text under a hidden call reached feedback: {text[:2000]}"
    if "hidden_args_in_exception" in {p.stem for p in attacks(corpus["run"])}:
        said = cells.messages(_autograded(corpus, REPO / "grader" / "cheats" / "hidden_args_in_exception.py"), [])
        assert any("hidden test" in said.get(g, "") for g in hidden_ids), said  # the grader's own words instead


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_limits_and_reasons_are_reported(corpus):
    lines = "\n".join(corpus["lines"])
    graded = {p.stem for p in attacks(corpus["run"])}
    if "memory_hog" in graded:
        assert re.search(r"cheat_memory_hog/.*memory limit", lines), lines
    if "fork_flood" in graded:
        assert re.search(r"cheat_fork_flood/.*process limit", lines), lines
    if "tamper_test_cell" in graded:
        assert re.search(rf"cheat_tamper_test_cell/.*tampered test cell {corpus['run'].target.test}", lines), lines
    if "disk_flood" in graded:
        assert re.search(r"cheat_disk_flood/.*disk limit", lines), lines
    if "huge_frame" in graded:  # refused unread, not read and then found too big; the size it declared is not echoed
        assert re.search(r"cheat_huge_frame/.*an answer over the limit of \d+ MB \(refused unread\)", lines), lines
        assert "1500000000" not in lines, lines
    if "links_to_the_course" in graded:
        assert re.search(r"cheat_links_to_the_course/.*solution\.ipynb \(a symbolic link\)", lines), lines
    if corpus["run"].mode == "fallback":  # the guard, not luck, undid them: each line names what was put back
        assert "graded one at a time" in lines, "--jobs 2 without bubblewrap must say it grades one at a time"
        assert re.search(r"cheat_gradebook_write/.*put back\): .*gradebook\.db", lines), lines
        assert re.search(r"cheat_overwrite_victims/.*put back\): .*submitted/", lines), lines
        assert not re.search(r"(honest|zz_victim)/.*put back", lines), "an honest submission was said to change files"
        assert re.search(r"cheat_gradebook_trigger/.*changed the gradebook it was graded in: added trigger", lines), lines
        assert re.search(r"cheat_venv_backdoor/.*put back\): .*zz_dtlabs_backdoor\.pth", lines), lines
        assert re.search(r"cheat_venv_backdoor/.*put back\): .*/sitecustomize\b", lines), lines
        graded_lines = [x for x in corpus["lines"] if re.match(r"\s+(NOT GRADED: )?\S+/\S+[: ]", x)]
        unmarked = [x for x in graded_lines if "taken without a boundary" not in x]
        assert graded_lines and not unmarked, f"grade lines that do not say they lack a boundary: {unmarked}"
    if corpus["run"].mode == "user":
        assert "one submission runs at a time" in lines, lines
        assert "taken without a boundary" not in lines, lines


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_only_the_notebook_comes_back_to_the_course(corpus):
    """What a submission held beside its notebook (links, shipped modules) never reaches autograded/ or feedback."""
    lab = corpus["run"].target.lab
    autograded = corpus["root"] / "grader" / "work" / "autograded"
    extra = {str(p.relative_to(autograded)) for p in autograded.rglob("*") if p.name != f"{lab}.ipynb" and not p.is_dir()}
    links = {str(p.relative_to(autograded)) for p in autograded.rglob("*") if p.is_symlink()}
    assert not extra and not links, f"autograded/ holds more than the notebooks: {sorted(extra | links)}"


def test_every_attack_is_graded_with_the_sandbox_on_every_push():
    """Splitting the corpus between Lab 01 and the synthetic lab must not drop an attack, and what an attack says it
    needs of Lab 01 it gets there."""
    bwrap = [r for r in RUNS if r.mode == "bwrap"]
    if not bwrap:
        pytest.skip("no bubblewrap here: make test grades the fallback against Lab 01")
    graded = [p for r in bwrap for p in attacks(r)]
    assert sorted(graded) == CHEATS, "attacks graded twice or not at all with bubblewrap: " + ", ".join(
        sorted({p.stem for p in CHEATS} ^ {p.stem for p in graded}))
    for r in bwrap:
        for p in attacks(r):
            if header(p).get("needs"):
                assert r.target == LAB01, f"{p.stem} needs Lab 01 ({header(p)['needs']}) but is graded against {r.target.lab}"
