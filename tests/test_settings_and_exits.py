"""One settings object per command (course config < environment < flag), typed reasons, and exit codes decided in
``cli.main`` only."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lab_utils import cli, settings
from lab_utils.grading import GradingError, nbgrader_run
from lab_utils.grading.outcomes import Kind, Reason, of_kind
from lab_utils.grading.submission import Result
from lab_utils.status import Refused, Status

PKG = Path(cli.__file__).resolve().parent


@pytest.fixture()
def course(tmp_path, monkeypatch):
    """A course whose config sets three limits; no DTLABS_* variable of the caller's leaks in."""
    for trait in settings.DTLabs.class_traits(config=True).values():
        if trait.metadata.get("env"):
            monkeypatch.delenv(trait.metadata["env"], raising=False)
    (tmp_path / "solutions").mkdir()
    (tmp_path / "grader").mkdir()
    (tmp_path / "grader" / "nbgrader_config.py").write_text(
        "c = get_config()\nc.DTLabs.memory_mb = 1000\nc.DTLabs.cell_timeout = 50\nc.DTLabs.submission_timeout = 60.0\n")
    return tmp_path


# ------------------------------------------------------------------------------------------ settings
def test_a_flag_beats_the_environment_which_beats_the_course_config(course, monkeypatch):
    monkeypatch.setenv("DTLABS_MEMORY_MB", "2000")
    monkeypatch.setenv("DTLABS_CELL_TIMEOUT", "70")
    dt = nbgrader_run.course_settings(course, cell_timeout=90, submission_timeout=None)
    assert dt.memory_mb == 2000, "the environment overrides the course config"
    assert dt.cell_timeout == 90, "a flag overrides the environment"
    assert dt.submission_timeout == 60.0, "the course config overrides the default"
    assert dt.max_procs == settings.default("max_procs")
    assert settings.given(dt) == {"cell_timeout": 90}, "only what came from a flag counts as given"


def test_cli_builds_one_settings_object_per_command_and_passes_it_down(course, monkeypatch):
    from lab_utils import grading

    monkeypatch.setenv("DTLABS_SUBMISSION_TIMEOUT", "5")
    loads, seen = [], {}
    real_load = settings.load

    def counting_load(*a, **k):
        loads.append(1)
        return real_load(*a, **k)

    def fake_grade(labs=None, *, settings=None, **kw):
        seen["settings"] = settings
        return Status.DONE

    monkeypatch.setattr(settings, "load", counting_load)
    monkeypatch.setattr(grading, "grade", fake_grade)
    code = cli.main(["grade", "--timeout", "7", "--submission-timeout", "9", "--unprotected", "--course-root",
                     str(course)])
    assert code == cli.ExitCode.OK
    dt = seen["settings"]
    assert (dt.cell_timeout, dt.submission_timeout, dt.sandbox, dt.memory_mb) == (7, 9.0, "unprotected", 1000)
    # course_root may be read from the environment before the course is known; the command's object is built once
    assert len(loads) <= 2, f"settings loaded {len(loads)} times for one command"


def test_grade_one_takes_the_environment_submission_timeout_when_no_flag_gives_one(course, monkeypatch):
    from lab_utils.grading import jobarray

    monkeypatch.setenv("DTLABS_SUBMISSION_TIMEOUT", "25")
    seen = {}

    def fake_grade_one(course_root, lab, results, *, settings=None, **kw):
        seen["settings"] = settings
        return Status.INCOMPLETE

    monkeypatch.setattr(jobarray, "grade_one", fake_grade_one)
    code = cli.main(["grade-one", "00_x", "ann", "--out", str(course / "r"), "--course-root", str(course)])
    assert code == cli.ExitCode.INCOMPLETE
    assert seen["settings"].submission_timeout == 25.0 and seen["settings"].sandbox == "auto"


def test_an_nbgrader_run_gets_the_flags_as_configuration_and_not_the_variables_they_override(course, monkeypatch):
    monkeypatch.setenv("DTLABS_CELL_TIMEOUT", "70")
    monkeypatch.setenv("DTLABS_MEMORY_MB", "2000")
    dt = nbgrader_run.course_settings(course, cell_timeout=9, sandbox="unprotected")
    args, leave_out = nbgrader_run.child_config(course / "scratch", dt)
    assert f"--CourseDirectory.root={(course / 'scratch').resolve()}" in args
    assert {"--DTLabs.cell_timeout=9", "--Execute.timeout=9", "--DTLabs.sandbox=unprotected"} <= set(args)
    assert not any("memory_mb" in a for a in args), "a setting no flag gave stays with the config and environment"
    env = nbgrader_run.nbgrader_env(course / "scratch", course, leave_out)
    assert "DTLABS_CELL_TIMEOUT" not in env and "DTLABS_SANDBOX" not in env and "DTLABS_COURSE_ROOT" not in env
    assert env["DTLABS_MEMORY_MB"] == "2000", "the environment stays one source of the child's settings"


# ------------------------------------------------------------------------------------------ reasons
@pytest.mark.parametrize("text, kind", [
    ("sandbox: environment: the sandbox did not start (bwrap: uid map)", Kind.ENVIRONMENT),
    ("environment: cannot grade on node7: no boundary", Kind.ENVIRONMENT),
    ("sandbox: taken without a boundary (--unprotected)", Kind.UNPROTECTED),
    ("sandbox: memory limit: the submission's processes used more than 8192 MB", Kind.STUDENT),
    ("test_add: AssertionError: environment: mine", Kind.STUDENT),  # the student's own words never read as ours
    ("left out of the copy: environment: x.txt", Kind.STUDENT),
])
def test_a_reason_reads_back_as_its_kind_and_its_text_is_unchanged(text, kind):
    reason = Reason.parse(text)
    assert reason.kind is kind and str(reason) == text


def test_only_the_environments_reasons_make_a_result_the_machines_fault():
    res = Result("00_x", "ann", Path("/nonexistent"))
    res.reasons = [Reason(Kind.STUDENT, "test_add: AssertionError: environment: 1 != 2"),
                   Reason(Kind.ENVIRONMENT, "the sandbox did not start (x)", "sandbox"), Reason(Kind.COURSE, "oops")]
    assert [str(r) for r in res.environment] == ["sandbox: environment: the sandbox did not start (x)"]
    assert of_kind(["grading failed: X"], Kind.ENVIRONMENT) == []


# ------------------------------------------------------------------------------------------ exit codes
@pytest.mark.parametrize("status, code", [(Status.DONE, 0), (Status.INCOMPLETE, 1), (Status.REFUSED, 2)])
def test_each_status_has_its_exit_code(status, code, monkeypatch):
    monkeypatch.setattr(cli, "_settings", lambda args: status)
    assert cli.main(["settings"]) == code and isinstance(cli.main(["settings"]), cli.ExitCode)


@pytest.mark.parametrize("error", [Refused("no"), GradingError("no course")])
def test_a_refusal_raised_by_a_command_exits_2_with_its_message(error, monkeypatch, capsys):
    def refuse(args):
        raise error

    monkeypatch.setattr(cli, "_settings", refuse)
    assert cli.main(["settings"]) == cli.ExitCode.REFUSED == 2
    assert str(error) in capsys.readouterr().err


def test_the_worst_status_of_a_command_wins():
    assert cli._worst(Status.DONE, Status.INCOMPLETE, Status.DONE) is Status.INCOMPLETE
    assert cli._worst(Status.REFUSED, Status.INCOMPLETE) is Status.REFUSED


def test_the_gradescope_script_exits_as_dtlabs_would():
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_dtlabs", PKG / "grading" / "export" / "bundle" / "run_dtlabs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.NOT_GRADED == cli.ExitCode.INCOMPLETE == cli.exit_code(Status.INCOMPLETE)


# ------------------------------------------------------------------------------------------ decided in cli only
SCRIPTS = {"cli.py", "grading/export/bundle/run_dtlabs.py"}  # run as programs: sys.exit(main()) under __main__
NOT_EXIT_CODES = {  # functions whose small int is not a command's exit code
    ("launcher/backend.py", "gpu_count"),  # a count of GPUs
    ("processes.py", "poll"),  # Popen's returncode of a child
    ("launcher/worker.py", "run_rank"),  # a forked rank's own process status
    ("cgroups/child.py", "_memory_folder"),  # a cgroup version (1 or 2) and its folder
    ("cgroups/child.py", "throttled"),  # a count of throttled periods
    ("cgroups/memory.py", "oom_killed"),  # a count of out-of-memory kills
}


def exit_code_problems(source: str, rel: str) -> list[str]:
    """Where ``source`` (the module ``rel``) ends a process or decides an exit code outside ``cli.main``."""
    tree = ast.parse(source)
    problems = []
    main_guard = {id(n) for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
                  for n in ast.walk(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "exit", "quit"):
            if not (rel in SCRIPTS and id(node) in main_guard):
                problems.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Raise) and node.exc is not None and "SystemExit" in ast.unparse(node.exc):
            problems.append(f"{rel}:{node.lineno}: raise SystemExit")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and rel != "cli.py" \
                and (rel, node.name) not in NOT_EXIT_CODES:
            for ret in (n for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None):
                values = [ret.value.body, ret.value.orelse] if isinstance(ret.value, ast.IfExp) else \
                    list(ret.value.elts) if isinstance(ret.value, ast.Tuple) else [ret.value]
                if any(isinstance(v, ast.Constant) and type(v.value) is int and v.value in (0, 1, 2) for v in values):
                    problems.append(f"{rel}:{ret.lineno}: {node.name} returns {ast.unparse(ret.value)}")
    return problems


def test_no_module_but_cli_ends_the_process_or_returns_an_exit_code():
    problems = []
    for path in sorted(PKG.rglob("*.py")):
        problems += exit_code_problems(path.read_text(), path.relative_to(PKG).as_posix())
    assert not problems, "exit codes are decided in cli.main only:\n" + "\n".join(problems)


@pytest.mark.parametrize("source", [
    "def grade():\n    return 2\n",
    "def check(ok):\n    return 0 if ok else 1\n",
    "def run():\n    return payload, 1\n",
    "import sys\ndef main():\n    sys.exit(3)\n",
    "def main():\n    raise SystemExit(1)\n",
])
def test_the_exit_code_check_finds_what_it_forbids(source):
    assert exit_code_problems(source, "grading/x.py")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_flag_reaches_the_grader_kernel_over_the_environments_variable(synthetic_course, tmp_path, monkeypatch,
                                                                       no_leaked_processes, capsys):
    """`dtlabs grade --unprotected` with DTLABS_SANDBOX=bwrap in the environment: the flag is the command's choice in
    every process grading starts (nbgrader, its grader kernel), so each grade says it was taken without a boundary."""
    import shutil

    import nbformat
    from helpers.synthetic import SYNTHETIC_LAB as LAB

    from lab_utils import grading

    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    release = nbformat.read(str(root / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    source = nbformat.read(str(root / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    grading.submit(root, "ann", LAB, grading.fill_solutions(release, source))
    monkeypatch.setenv("DTLABS_SANDBOX", "bwrap")
    assert cli.main(["grade", LAB, "--no-feedback", "--unprotected", "--course-root", str(root)]) == cli.ExitCode.OK
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "ann/" in x)
    assert "sandbox: taken without a boundary (--unprotected)" in line, out
