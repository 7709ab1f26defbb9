"""Before a class is graded: the lab's own solution and its empty release, graded exactly as a submission would be.

A grading machine that cannot grade (a sandbox that hides the venv, a Python that cannot import torch, a limit too
tight for the lab) turns every submission into a zero that looks like the student's. So before ``dtlabs grade`` or
``grade-one`` grades anyone's work on a lab, ``check`` grades two notebooks made from the course's own source in
the same pipeline (the same scratch course, nbgrader autograde, sandbox, limits, paths): the solution must get full
marks and the untouched release must get zero. If either does not, nothing is graded, nothing is written to the
gradebook, and the error says what went wrong and how to fix it.

The verdict is kept per user (``c.DTLabs.cache_dir``, by default ``~/.cache/dtlabs/canary.json``) under a digest of everything it depends on:
the lab's source, this package's code, the Python and torch in use, the sandbox (mode, bubblewrap), the limits,
the folders the sandbox binds and the scratch folder's location, the user. A change to any of them grades the
canary again; a submission whose sandbox fails for a reason that is not the student's grades it again at once.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab_utils import processes
from lab_utils.grading.quality.build import fill_solutions, without_demos
from lab_utils.grading.course import WORK
from lab_utils.grading import scratch as grading_scratch
from lab_utils.grading.nbgrader_run import course_settings
from lab_utils.grading.submission import grade_submission, prepare_template

SOLUTION, RELEASE = "dtlabs-canary-solution", "dtlabs-canary-release"


@dataclass
class Verdict:
    """The canary of one lab: what its solution and its release scored, and why it failed if it did."""

    lab: str
    solution: tuple = (0.0, 0.0)  # (got, possible)
    release: tuple = (0.0, 0.0)
    problems: list = field(default_factory=list)
    seconds: float = 0.0
    cached: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def explain(self) -> str:
        head = (f"the grading environment cannot grade {self.lab}: graded here, the lab's own solution got "
                f"{self.solution[0]:g}/{self.solution[1]:g} and its empty release {self.release[0]:g}/{self.release[1]:g}")
        return "\n".join([head, *(f"  - {p}" for p in self.problems), "  nothing was graded; fix the above and grade "
                          "again (`dtlabs doctor --grading` runs this check and shows the sandbox's folders)"])


def cache_path(settings) -> Path:
    """Where this user's verdicts are kept (``c.DTLabs.cache_dir`` of the command's ``settings``)."""
    folder = settings.cache_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "dtlabs")
    return Path(folder) / "canary.json"


def _package_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(processes.PACKAGE_DIR.rglob("*.py")):
        h.update(str(p.relative_to(processes.PACKAGE_DIR)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def environment_digest(course_root: Path, lab: str, dt) -> str:
    """Everything a canary's verdict depends on under the command's settings ``dt``, as one digest (module
    docstring)."""
    from lab_utils.grading.boundary import mounts, sandbox

    try:  # the installed distribution's version: importing torch here would cost this process seconds
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    facts = {
        "lab": hashlib.sha256((course_root / "solutions" / lab / f"{lab}.ipynb").read_bytes()).hexdigest(),
        "config": _config_text(course_root),
        "package": _package_digest(),
        "python": sys.version, "executable": os.path.realpath(sys.executable), "torch": torch_version,
        "sandbox": [sandbox.mode(), sandbox.bwrap_path(), sandbox.subject_user_name(), [m.dest for m in mounts.mounts("/")]],
        "limits": [dt.memory_mb, dt.max_procs, dt.cell_timeout, dt.sandbox],
        "tmp": os.path.realpath(tempfile.gettempdir()), "uid": os.geteuid(),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def _config_text(course_root: Path) -> str:
    from lab_utils.grading.nbgrader_run import config_dir

    path = config_dir(course_root) / "nbgrader_config.py"
    return path.read_text() if path.is_file() else ""


def _read_cache(settings) -> dict:
    try:
        return json.loads(cache_path(settings).read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(settings, data: dict) -> None:
    path = cache_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)  # a reader never sees half a file; two graders at once: the last one's verdicts stay


def forget(course_root: Path, lab: str, settings=None) -> None:
    """Drop the kept verdict: the next ``check`` grades the canary again."""
    settings = settings if settings is not None else course_settings(course_root)
    data = _read_cache(settings)
    if data.pop(environment_digest(course_root, lab, settings), None) is not None:
        _write_cache(settings, data)


def check(course_root, lab: str, *, settings=None, force: bool = False, out=print) -> Verdict:
    """The lab's canary verdict under the command's ``settings`` (default: the course's): kept, or graded now
    (about two submissions' time) when anything changed."""
    from lab_utils.grading.boundary import sandbox

    course_root = Path(course_root)
    settings = settings if settings is not None else course_settings(course_root)
    sandbox.choose(settings)  # the boundary the digest names is the one this grading uses
    key = environment_digest(course_root, lab, settings)
    with _one_at_a_time(settings):  # array tasks starting together: the first grades the canary, the rest read it
        kept = _read_cache(settings).get(key)
        if kept and not force:
            verdict = Verdict(**{**kept, "solution": tuple(kept["solution"]), "release": tuple(kept["release"])})
            verdict.cached = True
            return verdict
        return _grade_canary(course_root, lab, key, settings, out)


@contextlib.contextmanager
def _one_at_a_time(settings):
    """This user's canaries, one at a time (an flock beside the verdict cache)."""
    path = cache_path(settings).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _grade_canary(course_root: Path, lab: str, key: str, settings, out) -> Verdict:
    import nbformat

    start = time.monotonic()
    out(f"== {lab}: checking that this machine can grade it (the lab's solution and its empty release, graded here)")
    verdict = Verdict(lab)
    scratch = Path(grading_scratch.make("dtlabs-canary-", tag=lab))
    try:
        template = prepare_template(course_root, lab, scratch / "template", settings=settings)
        release_nb = nbformat.read(str(template / WORK / "release" / lab / f"{lab}.ipynb"), as_version=4)
        source_nb = nbformat.read(str(course_root / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
        for student, nb in ((SOLUTION, without_demos(fill_solutions(release_nb, source_nb))),
                            (RELEASE, release_nb)):
            folder = scratch / "submitted" / student / lab
            folder.mkdir(parents=True)
            nbformat.write(nb, str(folder / f"{lab}.ipynb"))
            res = grade_submission(course_root, lab, student, template, settings=settings,
                                   scratch=scratch / student, submission_dir=folder)
            points = res.points if res.graded else (0.0, 0.0)
            if student == SOLUTION:
                verdict.solution = points
                if not res.graded or points[0] < points[1] or points[1] == 0:
                    verdict.problems.append("the solution " + ("was not graded" if not res.graded else
                                            f"lost points ({points[0]:g}/{points[1]:g})") + _why(res))
            else:
                verdict.release = points
                if not res.graded or points[0] > 0:
                    verdict.problems.append("the empty release " + ("was not graded" if not res.graded else
                                            f"scored {points[0]:g} (it must score 0)") + _why(res))
    except Exception as exc:  # noqa: BLE001 - a canary that cannot run is a failed canary, with the reason
        verdict.problems.append(f"the check itself could not run: {type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    verdict.seconds = time.monotonic() - start
    if verdict.ok:
        data = _read_cache(settings)
        data[key] = {k: v for k, v in asdict(verdict).items() if k != "cached"}
        _write_cache(settings, data)
    return verdict


def _why(res) -> str:
    """The reasons a canary grading gave, and a hint for the common environment faults."""
    text = "; ".join(map(str, res.reasons)) or "no reason given; see `dtlabs doctor --grading`"
    hints = []
    low = text.lower()
    if "no module named" in low or "importerror" in low or "modulenotfounderror" in low:
        hints.append("an import failed inside the sandbox: the venv or the package may live in a folder the sandbox "
                     "does not show (`dtlabs doctor --grading` lists its folders)")
    if "memory limit" in low:
        hints.append("raise c.DTLabs.memory_mb (or DTLABS_MEMORY_MB) in the course's grader/nbgrader_config.py")
    if "process limit" in low:
        hints.append("raise c.DTLabs.max_procs (or DTLABS_MAX_PROCS)")
    if "time limit" in low or "timed out" in low:
        hints.append("raise the per-cell limit (--timeout, c.DTLabs.cell_timeout) or grade on a less busy machine")
    return f": {text}" + ("".join(f" (hint: {h})" for h in hints))


def doctor(labs=None, *, course_root=None, settings=None, fix=False, out=print) -> bool:
    """``dtlabs doctor --grading``: the boundary this machine grades in (mode, what the subject sees or may not
    reach; ``fix``: create the separate user and close the course to it first) and each lab's canary graded now,
    under the command's ``settings`` (default: the course's). True if every lab can be graded here."""
    from lab_utils.grading.boundary import network, sandbox, separate_user
    from lab_utils.grading.course import discover_labs, find_course_root

    course_root = find_course_root(course_root)
    settings = settings if settings is not None else course_settings(course_root)
    sandbox.choose(settings)
    out(f"course      {course_root}")
    if fix:
        for line in sandbox.fix(course_root):
            out(f"fix         {line}")
    box_mode = sandbox.mode()
    why = sandbox.probe_failure()
    out(f"boundary    {box_mode}" + (f" (bubblewrap: {why})" if why and box_mode != "bwrap" else ""))
    if box_mode == "bwrap":
        out("the subject sees (in this order):")
        out(sandbox.describe_mounts(tempfile.gettempdir() + "/<submission>", sandbox.Limits.of(settings)))
    elif box_mode == "user":
        found = sandbox.exposure(separate_user.course_paths(course_root))
        out(f"the subject runs as {sandbox.subject_user_name()!r}; " + (
            "it can reach: " + "; ".join(found) + " (fix: dtlabs doctor --grading --fix)" if found else
            "it cannot read the course's answers or gradebooks, nor write the venv, the package or the course"))
        out(f"network     {network.describe(sandbox.subject_user()[0].pw_uid)}")
        if found:
            return False
    elif box_mode == "none":
        out("PROBLEM " + sandbox.refusal())
        return False
    else:
        out(sandbox.UNPROTECTED_WARNING)
    from lab_utils.grading.boundary import landlock

    version, why_not = landlock.abi()
    out(f"landlock    ABI {version}: no process of a submission traces, signals or reaches the grader's" if version else
        f"landlock    none ({why_not}): " + ("a submission could trace the grader's processes, which are its own user's"
                                            if box_mode == "unprotected" else "the boundary above stands alone"))
    failed = 0
    for lab in labs or discover_labs(course_root):
        verdict = check(course_root, lab, settings=settings, force=True, out=out)
        if verdict.ok:
            out(f"{lab}: can be graded here (solution {verdict.solution[0]:g}/{verdict.solution[1]:g}, empty release "
                f"{verdict.release[0]:g}/{verdict.release[1]:g}, {verdict.seconds:.0f} s)")
        else:
            failed += 1
            out("PROBLEM " + verdict.explain())
    return not failed
