"""Inside a Gradescope autograder bundle: grade the one submitted notebook as ``dtlabs grade`` would, write results.json.

``run_autograder`` (the bundle's, see ``gradescope.py``) calls ``main(ROOT)``. The lab's source (hidden tests
included) and the course config are in ``ROOT/source/course``; the submission is in ``ROOT/submission``. The
canary runs first, as before a class: the lab's own solution must get full marks and its release zero here (its
verdict is kept per user, and ``setup.sh`` grades it while the image is built, so a submission seldom waits for it).
Then ``submission.grade_submission`` grades the notebook in a scratch course with the same split execution,
sandbox, hidden tests and limits as ``dtlabs grade`` (the limits are the bundled course config's ``c.DTLabs``).

results.json (Gradescope's format): one test per graded cell (``name``, ``score``, ``max_score``, ``status``, the
failing error's message as ``output``, ``visibility``: ``visible`` for a cell without hidden tests, else the lab's
``c.DTLabs.gradescope_visibility``). Students see results.json; the stdout goes to the instructor only
(``stdout_visibility: hidden``). Neither ever holds hidden test source: every text passes ``cells.clean``.
A submission that is not one readable notebook scores 0 with the reason. A machine that cannot grade (the canary
fails, the sandbox does not start, the package does not import) is not the student's zero: every test is failed
with that reason, and the run is ``Status.INCOMPLETE`` (exit status 1, ``run_dtlabs.py``), so the instructor sees
an autograder error.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path

from lab_utils.status import Status

MANIFEST = "dtlabs-autograder.json"
STUDENT = "student"
DEFAULT_VISIBILITY = "after_published"


def _tests(manifest: dict, *, output: str, status: str = "failed") -> list[dict]:
    return [{"name": t["name"], "score": 0.0, "max_score": t["points"], "status": status, "output": output,
             "visibility": t["visibility"]} for t in manifest["tests"]]


def student_zero(manifest: dict, why: str) -> dict:
    """The submission cannot be graded as it is (the student's to fix): 0 with the reason, on every test."""
    text = f"NOT GRADED: {why}"
    return {"score": 0.0, "output": text, "stdout_visibility": "hidden",
            "tests": [{**t, "visibility": "visible"} for t in _tests(manifest, output=text)]}


def environment_error(manifest: dict, why: str) -> dict:
    """The machine cannot grade (the instructor's to fix): every test failed with the reason, never a quiet zero."""
    text = ("NOT GRADED: the autograder's environment cannot grade this lab; this is not your fault, and the "
            f"instructor sees this message.\n{why}")
    return {"score": 0.0, "output": text, "stdout_visibility": "hidden",
            "tests": [{**t, "visibility": "visible"} for t in _tests(manifest, output=text)]}


def _the_notebook(submission: Path, lab: str) -> Path:
    """The one notebook submitted, or ValueError saying what is wrong with the submission."""
    found = sorted(p for p in submission.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts) \
        if submission.is_dir() else []
    if not found:
        raise ValueError(f"no notebook was submitted: upload your {lab}.ipynb (the notebook file itself)")
    if len(found) > 1:
        names = ", ".join(str(p.relative_to(submission)) for p in found[:6]) + (" ..." if len(found) > 6 else "")
        raise ValueError(f"{len(found)} notebooks were submitted ({names}): upload only your {lab}.ipynb")
    return found[0]


def _readable(notebook: Path) -> None:
    """``ValueError`` unless ``notebook`` is a regular file Jupyter can read as a notebook (checked before anything is
    graded: a student's broken upload costs no canary and no nbgrader run)."""
    from lab_utils.grading.export import cells
    from lab_utils.grading.boundary.files import SubmissionError, regular_notebook

    try:
        regular_notebook(notebook)
        cells.read(notebook)
    except SubmissionError as exc:
        raise ValueError(f"{notebook.name} cannot be read as a file: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - nbformat's many ways of saying "not a notebook"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ValueError(f"{notebook.name} is not a notebook Jupyter can read (invalid notebook: {first}); "
                         "upload the .ipynb file your notebook server saved") from None


def template(course: Path, lab: str, settings) -> Path:
    """The scratch course whose gradebook every submission of ``lab`` copies (``submission.prepare_template``), kept
    beside the canary's verdicts under the same digest of everything it depends on: setup.sh makes it while the
    image is built, and each submission saves an nbgrader run."""
    from lab_utils.grading import canary
    from lab_utils.grading.course import WORK
    from lab_utils.grading.submission import prepare_template

    kept = canary.cache_path(settings).parent / "templates" / canary.environment_digest(course, lab, settings)
    if (kept / WORK / "gradebook.db").is_file():
        return kept
    kept.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=".template-", dir=kept.parent))
    prepare_template(course, lab, fresh / "t", settings=settings)
    try:
        os.replace(fresh / "t", kept)
    except OSError:  # another run kept one meanwhile: the same content
        pass
    shutil.rmtree(fresh, ignore_errors=True)
    return kept


def _stage(submission: Path, notebook: Path, dest: Path, lab: str) -> str:
    """The submission as nbgrader expects it (``dest/<lab>.ipynb`` beside the other files it held); returns the note
    for what was left out. Files are copied as data (``files``): no link followed."""
    from lab_utils.grading.boundary.files import _copy_regular, copy_submission, regular_notebook

    regular_notebook(notebook)  # a link or a special file: SubmissionError, the student's to fix
    # notebooks (the one graded is copied under the lab's name) and a timestamp.txt (nbgrader's submission time:
    # on Gradescope, Gradescope keeps the time and its late policy) stay out
    copied = copy_submission(submission, dest, skip=lambda rel, is_dir: not is_dir and (
        rel.suffix == ".ipynb" or str(rel) == "timestamp.txt"))
    _copy_regular(notebook, dest / f"{lab}.ipynb")
    return copied.note()


def _graded(manifest: dict, res, hidden: list[str]) -> dict:
    from lab_utils.grading.export import cells

    try:
        said = cells.messages(cells.read(res.notebook), hidden)
    except Exception:  # noqa: BLE001 - an autograded notebook nbgrader wrote but we cannot read: scores still hold
        said = {}
    tests = []
    for t in manifest["tests"]:
        got, possible = res.scores.get(t["grade_id"], (0.0, t["points"]))
        passed = got >= possible
        tests.append({"name": t["name"], "score": got, "max_score": possible,
                      "status": "passed" if passed else "failed",
                      "output": "" if passed else said.get(t["grade_id"], cells.NO_MESSAGE),
                      "visibility": t["visibility"]})
    ids = tuple(f"{t['grade_id']}:" for t in manifest["tests"])
    # the top-level output is always visible: nothing in it may tell how a hidden test went (those are per test)
    notes = [cells.clean(str(r), hidden, 500) for r in res.reasons if not str(r).startswith(ids)]
    text = "\n".join([f"{manifest['lab']}: graded; each test cell's result is below.", *notes])
    return {"score": res.points[0], "output": text, "stdout_visibility": "hidden", "tests": tests}


def _grade(root: Path, manifest: dict, dt, out) -> tuple[dict, Status]:
    from lab_utils.grading import canary
    from lab_utils.grading import scratch as grading_scratch
    from lab_utils.grading.boundary import sandbox
    from lab_utils.grading.export import cells
    from lab_utils.grading.boundary.files import SubmissionError
    from lab_utils.grading.outcomes import Kind, Reason
    from lab_utils.grading.submission import grade_submission

    lab = manifest["lab"]
    course = root / "source" / "course"
    try:
        notebook = _the_notebook(root / "submission", lab)
        _readable(notebook)
    except ValueError as exc:
        return student_zero(manifest, str(exc)), Status.DONE
    try:
        # as a separate user: the bundle (the lab's hidden tests) unreadable to it, the results folder unwritable
        sandbox.require(dt.sandbox, course_root=course, protect=[root / "source"], read_only=[root / "results"],
                        user=dt.subject_user)
    except sandbox.SandboxUnavailable as exc:
        return environment_error(manifest, str(exc)), Status.INCOMPLETE
    out(f"sandbox: {sandbox.mode()}" + (f" ({sandbox.UNPROTECTED_WARNING})" if sandbox.mode() == "unprotected" else ""))
    verdict = canary.check(course, lab, settings=dt, out=out)
    out(f"canary: solution {verdict.solution[0]:g}/{verdict.solution[1]:g}, release {verdict.release[0]:g}/"
        f"{verdict.release[1]:g}" + (" (kept verdict)" if verdict.cached else f" ({verdict.seconds:.0f} s)"))
    if not verdict.ok:
        return environment_error(manifest, verdict.explain()), Status.INCOMPLETE
    hidden = cells.lab_hidden_lines(cells.source_notebook(course, lab))
    scratch = Path(grading_scratch.make("dtlabs-gradescope-", tag=lab))
    try:
        staged = scratch / "submitted" / STUDENT / lab
        try:
            left_out = _stage(root / "submission", notebook, staged, lab)
        except (SubmissionError, OSError) as exc:
            return student_zero(manifest, f"the notebook {notebook.name} cannot be read as a file: {exc}"), Status.DONE
        res = grade_submission(course, lab, STUDENT, template(course, lab, dt), settings=dt,
                               scratch=scratch / "grade", submission_dir=staged)
        if left_out:
            res.reasons.insert(0, Reason(Kind.STUDENT, left_out))
        out(f"graded in {res.seconds:.1f} s: " + (f"{res.points[0]:g}/{res.points[1]:g}" if res.graded else
                                                 "NOT GRADED"))
        for reason in res.reasons:
            out(f"  {cells.clean(str(reason), hidden, 500)}")
        if res.environment:
            canary.forget(course, lab, dt)
            return environment_error(manifest, "; ".join(map(str, res.environment))), Status.INCOMPLETE
        if not res.graded:
            why = "; ".join(cells.clean(str(r), hidden, 500) for r in res.reasons) or "nbgrader produced no grade"
            return student_zero(manifest, f"the notebook could not be graded: {why}"), Status.DONE
        return _graded(manifest, res, hidden), Status.DONE
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _package_note(manifest: dict) -> str | None:
    from lab_utils.grading import canary

    if manifest.get("package_digest") and manifest["package_digest"] != canary._package_digest():
        return ("note: the course package in use is not the one this bundle was exported with (setup.sh installs the "
                "bundled wheel; a different one grades only if its canary passes, as it did here)")
    return None


def main(root: Path | str, *, check_only: bool = False, out=print) -> Status:
    """Grade ``ROOT/submission`` into ``ROOT/results/results.json``: DONE, or INCOMPLETE when the environment cannot
    grade (NOT GRADED).
    ``check_only`` (setup.sh): run the canary only, and say whether this machine can grade the lab."""
    start = time.monotonic()
    from lab_utils.grading.nbgrader_run import course_settings

    root = Path(root)
    manifest = json.loads((root / "source" / MANIFEST).read_text())
    course = root / "source" / "course"
    if check_only:
        from lab_utils.grading import canary

        dt = course_settings(course)  # the bundle's one settings object: its course's config, then the environment
        verdict = canary.check(course, manifest["lab"], settings=dt, force=True, out=out)
        if verdict.ok:
            template(course, manifest["lab"], dt)
        out(f"{manifest['lab']}: this image can grade it (solution {verdict.solution[0]:g}/{verdict.solution[1]:g}, "
            f"release {verdict.release[0]:g}/{verdict.release[1]:g})" if verdict.ok else "PROBLEM " + verdict.explain())
        return Status.DONE if verdict.ok else Status.INCOMPLETE
    try:
        payload, code = _grade(root, manifest, course_settings(course), out)
    except Exception as exc:  # noqa: BLE001 - our failure, never the student's zero
        out(traceback.format_exc())
        payload = environment_error(manifest, f"the autograder failed: {type(exc).__name__}: {exc}")
        code = Status.INCOMPLETE
    note = _package_note(manifest)
    if note:
        out(note)
    payload["execution_time"] = int(round(time.monotonic() - start))
    results = root / "results"
    results.mkdir(parents=True, exist_ok=True)
    tmp = results / f".results.{os.getpid()}.json"
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, results / "results.json")
    out(f"score {payload['score']:g} in {payload['execution_time']} s; results: {results / 'results.json'}")
    if code is not Status.DONE:
        out("ENVIRONMENT ERROR: " + payload["output"].splitlines()[-1])
    return code
