"""The grading rails: thin wrappers that compose nbgrader's own steps, plus what nbgrader 0.9.6 lacks.

nbgrader does the work (``generate_assignment``, ``autograde``, ``export``, ``generate_feedback``,
``Validator``); this module only makes it safe and repeatable for this course:

- **Config from anywhere.** nbgrader reads ``nbgrader_config.py`` only from the working directory or the
  Jupyter config path (``--config`` is ignored), so every call runs with ``JUPYTER_CONFIG_PATH=grader/``
  (see ``grader/nbgrader_config.py``); ``DTLABS_COURSE_ROOT`` points the same layout at a scratch course.
- **Nothing survives grading.** torchrun workers started from a cell live in their own session and outlive
  a timed-out cell and the kernel (design.md section 7). Every nbgrader run carries a fresh token in its
  environment; afterwards every process still carrying it (kernel, zygote, ranks, torchrun agents and
  workers) is killed with its process group. Processes without the token are never touched.
- **One bad submission never stops the batch.** nbgrader already continues past a broken notebook; the
  per-cell ``Execute.timeout`` interrupts a hang; we add a wall-clock limit per nbgrader run and the reaping.
- **Feedback without hidden tests.** nbgrader's feedback HTML shows the graded cells as autograded, hidden
  tests included. ``HideHiddenTests`` (configured into ``GenerateFeedback.preprocessors``) removes the
  hidden regions and redacts them from the cell's error output, so any route to feedback (CLI, formgrader)
  is safe.
- **Validation with an exit code.** ``nbgrader validate`` exits 0 on failure; ``validate`` here returns 1.
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
GRADER_DIR = REPO_ROOT / "grader"
WORK = Path("grader") / "work"  # relative to a course root, as in grader/nbgrader_config.py
LAB_ID = re.compile(r"^\d\d_[A-Za-z0-9_]+$")
TOKEN_VAR = "DTLABS_GRADING_TOKEN"
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
HIDDEN_MARKERS = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")


class GradingError(RuntimeError):
    """An nbgrader step could not run at all (not: a submission failed, which is a grade)."""


# ------------------------------------------------------------------------------------------ discovery
def discover_labs(root: Path | str = REPO_ROOT) -> list[str]:
    """Assignment ids ``NN_topic`` that have ``solutions/NN_topic/NN_topic.ipynb``, sorted."""
    sol = Path(root) / "solutions"
    if not sol.is_dir():
        return []
    return sorted(
        d.name for d in sol.iterdir() if d.is_dir() and LAB_ID.match(d.name) and (d / f"{d.name}.ipynb").is_file()
    )


# ------------------------------------------------------------------------------------------ processes
def processes_with_token(token: str, exclude=(), var: str = TOKEN_VAR) -> list:
    """Live processes whose environment carries ``var=token`` (psutil.Process objects)."""
    import psutil

    skip = {os.getpid(), *exclude}
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in skip:
            continue
        try:
            if proc.environ().get(var) == token and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def reap(token: str, grace_s: float = 0.0, var: str = TOKEN_VAR) -> list[str]:
    """Kill every process carrying ``token`` (and the process groups they lead). Returns what was killed.

    Only processes started under the token are touched: a group is killed only when its leader carries the
    token too, so nothing another user or notebook started on a shared machine is ever signalled.
    """
    import psutil

    deadline = time.monotonic() + grace_s
    procs = processes_with_token(token, var=var)
    while procs and time.monotonic() < deadline:  # give normal shutdown a moment first
        time.sleep(0.2)
        procs = processes_with_token(token, var=var)
    own_pgid = os.getpgid(0)
    killed, leaders = [], set()
    pids = {p.pid for p in procs}
    for proc in procs:
        try:
            desc = f"{proc.pid} {proc.name()} {' '.join(proc.cmdline())[:120]}"
            pgid = os.getpgid(proc.pid)
        except (psutil.Error, OSError):
            continue
        killed.append(desc)
        if pgid != own_pgid and pgid in pids and pgid not in leaders:
            leaders.add(pgid)
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)
    return killed


# ------------------------------------------------------------------------------------------ running nbgrader
@dataclass
class NbgraderRun:
    args: list
    returncode: int
    output: str
    seconds: float
    timed_out: bool = False
    reaped: list = field(default_factory=list)


def nbgrader_env(course_root: Path | str | None = None, cell_timeout: int | None = None) -> dict:
    """The environment nbgrader needs: our config on the Jupyter config path, this venv's tools on PATH."""
    env = dict(os.environ)
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (str(GRADER_DIR), env.get("JUPYTER_CONFIG_PATH")) if p)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # nbgrader runs `alembic`
    env["DTLABS_COURSE_ROOT"] = str(Path(course_root or REPO_ROOT).resolve())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    if cell_timeout is not None:
        env["DTLABS_CELL_TIMEOUT"] = str(int(cell_timeout))
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return env


def run_nbgrader(args, *, course_root=None, cell_timeout=None, timeout=None, echo=False) -> NbgraderRun:
    """``nbgrader ARGS`` for a course root, with a wall-clock limit; every process it left is reaped."""
    course_root = Path(course_root or REPO_ROOT).resolve()
    (course_root / WORK).mkdir(parents=True, exist_ok=True)  # sqlite does not create folders
    token = uuid.uuid4().hex
    env = nbgrader_env(course_root, cell_timeout)
    env[TOKEN_VAR] = token
    cmd = [sys.executable, "-m", "nbgrader", *map(str, args)]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=course_root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, errors="replace", start_new_session=True,
    )
    timed_out = False
    lines = []
    try:
        import threading

        def pump():
            for line in proc.stdout:
                lines.append(line)
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        t.join(timeout=5)
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        reaped = reap(token, grace_s=1.0)
    return NbgraderRun(cmd[3:], proc.returncode, "".join(lines), time.monotonic() - start, timed_out, reaped)


# ------------------------------------------------------------------------------------------ release
def release(labs=None, *, root: Path | str = REPO_ROOT, dest: Path | str | None = None, echo=False) -> list[Path]:
    """Regenerate the release (``labs/`` by default, or ``dest``) of ``labs`` (default: all) from solutions/.

    This is ``nbgrader generate_assignment --force``; with ``dest`` it also passes ``--no-db`` so a trial
    release touches no gradebook. nbgrader writes no timestamps (checked: two runs give the same bytes);
    ``_normalise`` only guarantees a trailing newline. Returns the notebooks written.
    """
    root = Path(root).resolve()
    labs = list(labs) if labs else discover_labs(root)
    missing = [lab for lab in labs if lab not in discover_labs(root)]
    if missing:
        raise GradingError(f"no solutions/NN_topic/NN_topic.ipynb for {missing}; labs found: {discover_labs(root)}")
    out_root = Path(dest).resolve() if dest else root / "labs"
    extra = ["--no-db", f"--CourseDirectory.release_directory={out_root}"] if dest else []
    # one nbgrader process for all labs when it can (start-up costs seconds); nbgrader globs assignment ids
    globbed = {d.name for d in (root / "solutions").glob("[0-9][0-9]_*") if d.is_dir()}
    every = globbed == set(labs)
    batches = [("[0-9][0-9]_*", labs)] if every and len(labs) > 1 else [(lab, [lab]) for lab in labs]
    written = []
    for pattern, group in batches:
        for lab in group:  # --force replaces a lab's folder; make sure no stale file survives either way
            shutil.rmtree(out_root / lab, ignore_errors=True)
        run = run_nbgrader(["generate_assignment", pattern, "--force", *extra], course_root=root, timeout=600,
                           echo=echo)
        for lab in group:
            nb_path = out_root / lab / f"{lab}.ipynb"
            if run.returncode != 0 or not nb_path.is_file():
                raise GradingError(f"nbgrader generate_assignment {pattern} failed:\n{run.output[-4000:]}")
            _normalise(nb_path)
            written.append(nb_path)
    return written


def _normalise(path: Path) -> None:
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        path.write_bytes(data + b"\n")


# ------------------------------------------------------------------------------------------ submissions
def _nb(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def strip_solution_markers(source: str) -> str:
    """The solution as a student would type it: the ``### BEGIN/END SOLUTION`` lines removed."""
    return "\n".join(line for line in source.split("\n") if line.strip() not in SOLUTION_MARKERS)


def solution_cells(source_nb) -> dict:
    """grade_id -> the student-ready source of every solution cell of a solutions/ notebook."""
    return {_nb(c)["grade_id"]: strip_solution_markers(c["source"]) for c in source_nb.cells if _nb(c).get("solution")}


def fill_solutions(release_nb, source_nb, replace: dict | None = None):
    """A submission: the release with every solution cell answered (``replace`` wins over the solution)."""
    import copy

    answers = {**solution_cells(source_nb), **(replace or {})}
    nb = copy.deepcopy(release_nb)
    for cell in nb.cells:
        gid = _nb(cell).get("grade_id")
        if _nb(cell).get("solution") and gid in answers:
            cell["source"] = answers[gid]
    return nb


@dataclass
class KnownWrong:
    """One ``grader/known_wrong/NN_topic/<mistake>.py`` (format in AUTHORING.md)."""

    path: Path
    replaces: str
    loses: list
    mistake: str
    source: str

    @property
    def name(self) -> str:
        return self.path.stem


def read_known_wrong(path: Path | str) -> KnownWrong:
    path = Path(path)
    header, body, in_header = {}, [], True
    for line in path.read_text().split("\n"):
        m = re.match(r"^#\s*(replaces|loses|mistake)\s*:\s*(.*?)\s*$", line) if in_header else None
        if m:
            header[m.group(1)] = m.group(2)
            continue
        in_header = False
        body.append(line)
    for key in ("replaces", "loses", "mistake"):
        if not header.get(key):
            raise ValueError(f"{path}: missing header line '# {key}: ...' (see AUTHORING.md, Known-wrong submissions)")
    loses = [x.strip() for x in header["loses"].split(",") if x.strip()]
    return KnownWrong(path, header["replaces"], loses, header["mistake"], "\n".join(body).strip("\n"))


def known_wrong(lab: str, root: Path | str = REPO_ROOT) -> list[KnownWrong]:
    folder = Path(root) / "grader" / "known_wrong" / lab
    return [read_known_wrong(p) for p in sorted(folder.glob("*.py"))] if folder.is_dir() else []


def submit(course_root: Path | str, student: str, lab: str, nb) -> Path:
    """Place a notebook where nbgrader's autograde looks: submitted/<student>/<lab>/<lab>.ipynb."""
    import nbformat

    dest = Path(course_root) / WORK / "submitted" / student / lab / f"{lab}.ipynb"
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(dest))
    return dest


# ------------------------------------------------------------------------------------------ grades
def cell_scores(course_root: Path | str, lab: str, student: str) -> dict:
    """grade_id -> (score, max_score) of every graded cell of one autograded submission ({} if none)."""
    from nbgrader.api import Gradebook, MissingEntry

    db = "sqlite:///" + str(Path(course_root).resolve() / WORK / "gradebook.db")
    out = {}
    with Gradebook(db) as gb:
        try:
            sub = gb.find_submission(lab, student)
        except MissingEntry:
            return {}
        for nb in sub.notebooks:
            for g in nb.grades:
                out[g.name] = (float(g.score or 0.0), float(g.max_score))
    return out


def submissions(course_root: Path | str) -> dict:
    """assignment id -> sorted student ids found in submitted/<student>/<assignment>/."""
    base = Path(course_root) / WORK / "submitted"
    found: dict = {}
    if base.is_dir():
        for student in sorted(p for p in base.iterdir() if p.is_dir()):
            for lab in sorted(p for p in student.iterdir() if p.is_dir()):
                found.setdefault(lab.name, []).append(student.name)
    return found


def register_students(course_root: Path | str, students) -> None:
    """Every submitter gets a gradebook row, so the CSV lists even a submission nbgrader could not read."""
    from nbgrader.api import Gradebook

    db = "sqlite:///" + str(Path(course_root).resolve() / WORK / "gradebook.db")
    with Gradebook(db) as gb:
        for s in students:
            gb.update_or_create_student(s)


def autograde(lab: str, *, course_root=None, cell_timeout=None, timeout=None, force=True, echo=False) -> NbgraderRun:
    """``nbgrader autograde LAB`` over every submission of it (one run: one kernel start per submission)."""
    args = ["autograde", lab] + (["--force"] if force else [])
    return run_nbgrader(args, course_root=course_root, cell_timeout=cell_timeout, timeout=timeout, echo=echo)


def grade(
    labs=None,
    *,
    course_root=None,
    submissions_dir=None,
    cell_timeout=None,
    lab_timeout=None,
    force=False,
    feedback=True,
    csv_path=None,
    out=print,
) -> int:
    """Instructor batch: gradebook entries -> autograde -> CSV -> feedback (hidden tests removed).

    ``submissions_dir`` (nbgrader's layout ``<student>/<assignment>/<notebook>.ipynb``) is copied into
    ``grader/work/submitted`` first. Returns 0 when every submission was graded, 1 when some could not be
    (they are listed; the rest of the batch is graded and exported regardless), 2 on a setup problem
    (nothing submitted, or submissions for a lab with no source: those are skipped, the rest graded).
    """
    course_root = Path(course_root or REPO_ROOT).resolve()
    submitted = course_root / WORK / "submitted"
    if submissions_dir:
        src = Path(submissions_dir).resolve()
        if not src.is_dir():
            out(f"no such folder: {src}")
            return 2
        if src != submitted.resolve():
            shutil.copytree(src, submitted, dirs_exist_ok=True)
    found = submissions(course_root)
    labs = list(labs) if labs else sorted(found)
    if not labs:
        out(f"nothing to grade: no submissions under {submitted} (layout: <student>/<NN_topic>/<NN_topic>.ipynb)")
        return 2
    known = discover_labs(course_root)
    unknown = [lab for lab in labs if lab not in known]
    if unknown:  # reported, and the rest of the batch is graded all the same
        out(f"SKIPPED {unknown}: no solutions/<lab>/<lab>.ipynb source for them (known labs: {known})")
    labs = [lab for lab in labs if lab in known]
    if not labs:
        return 2
    problems = []
    for lab in labs:
        students = found.get(lab, [])
        out(f"== {lab}: {len(students)} submission(s)")
        # the gradebook must hold the assignment's cells (hidden tests included): record them from the source,
        # releasing into a scratch folder so labs/ is left alone
        run = run_nbgrader(
            ["generate_assignment", lab, "--force", f"--CourseDirectory.release_directory={WORK / 'release'}"],
            course_root=course_root, timeout=300,
        )
        if run.returncode != 0:
            out(run.output[-3000:])
            out(f"could not record {lab} in the gradebook (see above)")
            return 2
        register_students(course_root, students)
        run = autograde(lab, course_root=course_root, cell_timeout=cell_timeout, timeout=lab_timeout, force=force)
        out(f"   autograde: {run.seconds:.0f} s" + (" (stopped at the time limit)" if run.timed_out else ""))
        if run.reaped:
            out(f"   stopped {len(run.reaped)} process(es) left behind by submissions")
        for student in students:
            if not cell_scores(course_root, lab, student) or not (
                course_root / WORK / "autograded" / student / lab
            ).is_dir():
                problems.append((lab, student))
                why = _failure_reason(run.output, student)
                out(f"   NOT GRADED: {student}" + (f" ({why})" if why else ""))
    csv_path = Path(csv_path) if csv_path else course_root / WORK / "grades.csv"
    run = run_nbgrader(["export", f"--to={csv_path.resolve()}"], course_root=course_root, timeout=300)
    out(f"grades: {csv_path}" if run.returncode == 0 else f"export failed:\n{run.output[-3000:]}")
    if feedback:
        for lab in labs:
            run = run_nbgrader(["generate_feedback", lab, "--force"], course_root=course_root, timeout=600)
            if run.returncode != 0:
                out(f"   feedback for {lab} incomplete:\n{run.output[-2000:]}")
        out(f"feedback: {course_root / WORK / 'feedback'}")
    if problems:
        out(f"{len(problems)} submission(s) could not be graded: " + ", ".join(f"{s}/{a}" for a, s in problems))
        return 1
    return 2 if unknown else 0


def _failure_reason(log: str, student: str) -> str:
    for line in log.splitlines():
        if "error" in line.lower() and f"'{student}'" in line:
            return line.split("] ", 1)[-1].strip()
    return ""


def read_grades_csv(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# ------------------------------------------------------------------------------------------ feedback
def _hidden_test_preprocessor():
    from nbgrader.preprocessors import ClearHiddenTests

    class HideHiddenTests(ClearHiddenTests):
        """Feedback without hidden tests: nbgrader's ClearHiddenTests on the autograded copy, plus redaction.

        The region is replaced by one comment line, and the cell's outputs lose every line that quotes a
        hidden line (an IPython traceback prints the failing source line). A failing hidden check still
        shows its message, which AUTHORING.md asks to be written for the student.
        """

        placeholder = "# (hidden tests: not shown)"

        def preprocess_cell(self, cell, resources, cell_index):
            if cell.cell_type != "code" or HIDDEN_MARKERS[0] not in cell.source:
                return cell, resources
            hidden = _hidden_lines(cell.source)
            lines, out, inside = cell.source.split("\n"), [], False
            for line in lines:
                if HIDDEN_MARKERS[0] in line:
                    inside = True
                    out.append(line[: len(line) - len(line.lstrip())] + self.placeholder)
                elif HIDDEN_MARKERS[1] in line:
                    inside = False
                elif not inside:
                    out.append(line)
            cell.source = "\n".join(out)
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    # a traceback shows source lines: keep only the final "Error: message" line
                    output["evalue"] = _redact(output.get("evalue", ""), hidden)
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output['evalue']}"]
                elif output.get("output_type") == "stream":
                    output["text"] = _redact(output.get("text", ""), hidden)
            return cell, resources

    return HideHiddenTests


def _hidden_lines(source: str) -> list[str]:
    lines, inside = [], False
    for line in source.split("\n"):
        if HIDDEN_MARKERS[0] in line:
            inside = True
        elif HIDDEN_MARKERS[1] in line:
            inside = False
        elif inside and len(line.strip()) >= 8:
            lines.append(line.strip())
    return lines


def _redact(text: str, hidden: list[str]) -> str:
    if not hidden:
        return text
    return "\n".join(
        "(hidden test line)" if any(h in line for h in hidden) else line for line in text.split("\n")
    )


def __getattr__(name):  # HideHiddenTests imports nbgrader only when asked for (notebooks import lab_utils)
    if name == "HideHiddenTests":
        cls = _hidden_test_preprocessor()
        globals()["HideHiddenTests"] = cls
        return cls
    raise AttributeError(name)


# ------------------------------------------------------------------------------------------ validate
def validate(notebook, *, cell_timeout=None, stream=None) -> int:
    """The student's pre-submission check: nbgrader's Validator, printed as nbgrader prints it, with an exit
    code (0: every test passes and no locked cell changed; 1: not so; 2: cannot run)."""
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader
    from nbgrader.validator import Validator

    path = Path(notebook)
    if not path.is_file():
        print(f"no such notebook: {path}", file=sys.stderr)
        return 2
    env_before = {k: os.environ.get(k) for k in ("DTLABS_CELL_TIMEOUT",)}
    if cell_timeout is not None:
        os.environ["DTLABS_CELL_TIMEOUT"] = str(int(cell_timeout))
    try:
        cfg = PyFileConfigLoader("nbgrader_config.py", path=str(GRADER_DIR)).load_config()
    finally:
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    cfg.merge(Config({"Validator": {"ignore_checksums": False}}))

    class _Validator(Validator):
        def validate(self, filename):
            self.results = super().validate(filename)
            return self.results

        def _print_error(self, source, error):
            # nbgrader cuts every line at `width` characters, which cuts off the tutor's message at the end of
            # our assertions (what, where, by how much, the hint): wrap the error instead, keep the cut for code.
            self.stream.write("\n" + "=" * self.width + "\n")
            self.stream.write("The following cell failed:\n\n")
            self.stream.write(self._indent(source) + "\n\n")
            self.stream.write("The error was:\n\n")
            self.stream.write(_wrap_error(error, self.indent, self.width) + "\n\n")

    v = _Validator(config=cfg)
    if stream is not None:
        v.stream = stream
    token = uuid.uuid4().hex
    os.environ[TOKEN_VAR] = token
    try:
        v.validate_and_print(str(path))
    except Exception as exc:  # noqa: BLE001 - a notebook nbgrader cannot read is a failed validation
        print(f"cannot validate {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    finally:
        os.environ.pop(TOKEN_VAR, None)
        reap(token, grace_s=1.0)
    res = getattr(v, "results", {})
    return 1 if (res.get("type_changed") or res.get("changed") or res.get("failed")) else 0


def _wrap_error(text: str, indent: str, width: int) -> str:
    """Every line of ``text`` indented and wrapped (not cut) at ``width``; ANSI colours removed."""
    import textwrap

    from nbconvert.filters import strip_ansi

    out = []
    for line in strip_ansi(text).split("\n"):
        lead = line[: len(line) - len(line.lstrip())]
        out.extend(textwrap.wrap(line, width=width, initial_indent=indent, subsequent_indent=indent + lead + "  ",
                                 break_on_hyphens=False, drop_whitespace=True) or [indent.rstrip()])
    return "\n".join(out)


def notebook_problems(path) -> list[str]:
    """Problems that keep a committed notebook from being reproducible: outputs, execution counts/metadata."""
    nb = json.loads(Path(path).read_text())
    problems = []
    for i, cell in enumerate(nb.get("cells", [])):
        where = f"cell {i} ({cell.get('id', '?')})"
        if cell.get("outputs"):
            problems.append(f"{where} has outputs")
        if cell.get("execution_count") is not None:
            problems.append(f"{where} has an execution count")
        meta = cell.get("metadata", {})
        for key in ("execution", "papermill", "ExecuteTime"):
            if key in meta:
                problems.append(f"{where} has metadata '{key}'")
        if "id" not in cell:
            problems.append(f"{where} has no id")
    for key in ("papermill", "widgets"):
        if key in nb.get("metadata", {}):
            problems.append(f"notebook metadata has '{key}'")
    return problems


__all__ = [
    "discover_labs", "release", "autograde", "grade", "validate", "reap", "processes_with_token", "run_nbgrader",
    "fill_solutions", "strip_solution_markers", "solution_cells", "read_known_wrong", "known_wrong", "submit",
    "cell_scores", "submissions", "notebook_problems", "KnownWrong", "GradingError", "HideHiddenTests",
]
