"""``dtlabs``: the course's command line (thin wrappers; nbgrader does the grading).

    dtlabs doctor [--grading]         is this machine ready? (torch, backends, GPUs, a 2-rank all-reduce; grading)
    dtlabs doctor --nodes HOST...     can this node reach the others of a multi-node job? (names, interface, port)
    dtlabs settings                   every setting (c.DTLabs.*), its value and what it means
    dtlabs release [LAB ...]          regenerate labs/ from solutions/ (nbgrader generate_assignment)
    dtlabs validate NOTEBOOK          student's pre-submission check; exit code 0 only if every test passes
    dtlabs grade [--submissions DIR]  instructor batch: sandboxed autograde (--jobs N) -> CSV -> feedback
    dtlabs prepare-array / grade-one / merge   a class as a job array: prepare, one submission per task, merge
    dtlabs export gradescope LAB      a Gradescope autograder zip for LAB (--out DIR)
    dtlabs export canvas              the gradebook as a CSV for Canvas's import (--roster CSV --out FILE)
    dtlabs report LAB                 what the class got wrong: one HTML page with plots
    dtlabs bench [ARGS ...]           launcher benchmark (benchmarks/bench_launch.py)
    dtlabs mutate LAB                 mutation testing of a lab's tests (survivors, kill rate; --min-kill)
    dtlabs stress [LAB ...] --k K     grade each lab's solution K times with the other cores busy (flakes)
    dtlabs stress --tests 'ARGS' --k K  run pytest ARGS K times in a row with the other cores busy
"""
from __future__ import annotations

import argparse
import enum
import os
import subprocess
import sys
from pathlib import Path

from lab_utils.status import Refused, Status


class ExitCode(enum.IntEnum):
    """``dtlabs``'s exit codes, decided here only (``main``): every command's function returns a ``Status`` or raises
    ``Refused``."""

    OK = 0  # everything asked was done, and passed
    INCOMPLETE = 1  # something did not pass: a submission NOT GRADED, a failing test, a check that found a problem
    REFUSED = 2  # nothing (more) was done: bad arguments, no course, a machine that cannot grade


EXIT_CODES = {Status.DONE: ExitCode.OK, Status.INCOMPLETE: ExitCode.INCOMPLETE, Status.REFUSED: ExitCode.REFUSED}
ERRORS = {Refused: ExitCode.REFUSED}  # a typed error a command raises -> its exit code (with its message, no traceback)


def exit_code(outcome: Status | int) -> int:
    """The exit code of a command that ended with ``outcome``: a ``Status``, or the exit status of the one program
    the command ran in its place (``dtlabs bench``), passed on as it is."""
    return EXIT_CODES[outcome] if isinstance(outcome, Status) else int(outcome)


def _worst(*statuses: Status) -> Status:
    order = list(Status)  # DONE, INCOMPLETE, REFUSED: each worse than the one before
    return max(statuses, key=order.index)


COURSE_ROOT_HELP = ("the course folder (solutions/, labs/, grader/); default: the nearest one at or above the working "
                    "directory")


def _course_settings(course, **flags):
    """The command's one settings object: ``course``'s config, then the environment, then ``flags`` (None: not
    given). Every function below it takes this object, never a setting of its own."""
    from lab_utils.grading.nbgrader_run import course_settings

    return course_settings(course, **flags)


def _course(args):
    from lab_utils.grading import find_course_root

    return find_course_root(args.course_root)


def _doctor(args) -> Status:
    if args.nodes:
        from lab_utils.labkit.torchrun.preflight import check_nodes

        return check_nodes(args.nodes, port=args.port)
    from lab_utils.launcher.doctor import doctor

    status = doctor()
    from lab_utils.grading.split.provisioner import doctor_line

    print(doctor_line())
    if args.grading is None:
        return status
    from lab_utils.grading import canary

    course = _course(args)
    dt = _course_settings(course, cell_timeout=args.timeout)
    ready = canary.doctor(args.grading or None, course_root=course, settings=dt, fix=args.fix)
    return _worst(status, Status.DONE if ready else Status.INCOMPLETE)


def _settings(args) -> Status:
    from lab_utils import settings

    print(settings.describe(_course_settings(_course(args) if args.course_root else None)))
    return Status.DONE


def _release(args) -> Status:
    from lab_utils import grading

    try:
        written = grading.release(args.labs or None, dest=args.dest, root=args.course_root)
    except grading.GradingError as exc:  # a lab nbgrader could not release: INCOMPLETE (exit 1), as it always was
        print(exc, file=sys.stderr)
        return Status.INCOMPLETE
    for path in written:
        print(f"wrote {os.path.relpath(path)}")
    if not written:
        print("no labs found under solutions/ (solutions/NN_topic/NN_topic.ipynb)")
    return Status.DONE


def _validate(args) -> Status:
    from lab_utils.grading.validate import course_of, prestart_kernel, validate

    prestart_kernel()  # before the course's settings are read: that imports nbgrader, as long as the server imports
    return validate(args.notebook, settings=_course_settings(course_of(args.notebook), cell_timeout=args.timeout))


UNPROTECTED_HELP = ("grade where no boundary can be built (no bubblewrap, not root): submissions then run as you, "
                    "and every grade says it was taken without a boundary")


def _grading_settings(args, course):
    """A grading command's settings: its flags (``--timeout``, ``--submission-timeout``, ``--unprotected``: the
    instructor's choice by name) over the course's config and the environment."""
    return _course_settings(course, cell_timeout=args.timeout, submission_timeout=args.submission_timeout,
                            sandbox="unprotected" if args.unprotected else None)


def _grade(args) -> Status:
    from lab_utils import grading

    course = _course(args)
    return grading.grade(
        args.labs or None,
        settings=_grading_settings(args, course),
        submissions_dir=args.submissions,
        force=args.force,
        feedback=not args.no_feedback,
        csv_path=args.csv,
        course_root=course,
        jobs=args.jobs,
        timestamps=args.timestamps,
    )


def _prepare_array(args) -> Status:
    """Record a lab, snapshot its template and write the roster, before a job array grades it."""
    from lab_utils import grading
    from lab_utils.grading import jobarray

    try:
        course = _course(args)
        roster = jobarray.prepare(course, args.lab, args.out, students=args.students or None,
                                  settings=_course_settings(course), out=lambda line: print(line, file=sys.stderr))
    except grading.GradingError as exc:
        print(exc, file=sys.stderr)
        return Status.REFUSED
    print(len(roster))
    return Status.DONE


def _grade_one(args) -> Status:
    """One submission into a results folder (a Slurm array task); ``dtlabs merge`` brings them together."""
    from lab_utils import grading
    from lab_utils.grading import jobarray

    if (args.student is None) == (args.task is None):
        print("grade-one: give a STUDENT or --task N (line N of the roster), not both", file=sys.stderr)
        return Status.REFUSED
    try:
        course = _course(args)
        return jobarray.grade_one(course, args.lab, args.out, student=args.student, task=args.task,
                                  settings=_grading_settings(args, course))
    except grading.GradingError as exc:
        print(exc, file=sys.stderr)
        return Status.REFUSED


def _merge(args) -> Status:
    """Every ``grade-one`` result under the folders given, merged into the course's gradebook."""
    from lab_utils.grading import jobarray

    course = _course(args)
    dt = _course_settings(course)
    return _worst(*(jobarray.merge(course, folder, labs=args.lab or None, settings=dt) for folder in args.results))


def _export_gradescope(args) -> Status:
    from lab_utils.grading.export import gradescope

    course = _course(args)
    gradescope.build(args.lab, args.out, course_root=course, settings=_course_settings(course), wheel=args.wheel)
    return Status.DONE


def _export_canvas(args) -> Status:
    from lab_utils.grading.export import canvas

    return canvas.main(args.roster, args.out, labs=args.labs or None, course_root=args.course_root)


def _report(args) -> Status:
    from lab_utils.grading.export import report

    path = report.write(args.lab, args.out, course_root=args.course_root, anonymous=args.anonymous)
    print(f"report: {path}")
    return Status.DONE


def _bench(args) -> Status | int:
    from lab_utils.grading import REPO_ROOT

    script = (REPO_ROOT or Path.cwd()) / "benchmarks" / "bench_launch.py"
    if not script.is_file():
        print(f"no benchmark at {script}", file=sys.stderr)
        return Status.REFUSED
    return subprocess.call([sys.executable, str(script), *args.bench_args])  # the benchmark's own exit status


def _mutate(args) -> Status:
    from lab_utils.grading.quality import mutate

    return mutate.main(args.lab, n=args.n or None, seed=args.seed, min_kill=args.min_kill, cell_timeout=args.timeout,
                       list_only=args.list)


def _stress(args) -> Status:
    from lab_utils.grading.quality import stress

    if args.tests:
        import shlex

        runs = stress.stress_tests(shlex.split(args.tests), k=args.k, busy=args.busy)
        return Status.DONE if runs and all(rc == 0 for rc, _, _ in runs) else Status.INCOMPLETE
    runs = stress.stress(args.labs or None, k=args.k, busy=args.busy, cell_timeout=args.timeout, keep=args.keep)
    return Status.DONE if runs and all(r.full for r in runs) else Status.INCOMPLETE


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dtlabs", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("doctor", help="check torch, backends, GPUs and a 2-rank all-reduce (--grading: and grading)")
    s.add_argument("--grading", nargs="*", metavar="LAB", default=None,
                   help="also show the sandbox (mode, folders) and grade each LAB's solution and empty release here, "
                        "as a class would be graded (default: every lab of the course)")
    s.add_argument("--timeout", type=int, default=None, help="per-cell limit in seconds for --grading (default 180)")
    s.add_argument("--fix", action="store_true", help="with --grading, as root: create the separate user submissions "
                                                      "run as where bubblewrap cannot, and close the course to it")
    s.add_argument("--course-root", metavar="DIR", help=COURSE_ROOT_HELP)
    s.add_argument("--nodes", nargs="+", metavar="HOST", default=None,
                   help="instead: check, from this node, what a multi-node job needs of HOST... (the first is the "
                        "master): names that resolve to a shared address, the interface toward it, its --port")
    s.add_argument("--port", type=int, default=None, help="with --nodes: the master's rendezvous port to try")
    s.set_defaults(func=_doctor)

    s = sub.add_parser("settings", help="every setting (c.DTLabs.* in grader/nbgrader_config.py), its value and meaning")
    s.add_argument("--course-root", metavar="DIR", help=COURSE_ROOT_HELP)
    s.set_defaults(func=_settings)

    s = sub.add_parser("release", help="regenerate labs/ from solutions/ with nbgrader (commit the result)")
    s.add_argument("labs", nargs="*", metavar="LAB", help="assignment ids such as 01_ddp_setup (default: all)")
    s.add_argument("--dest", help="write the release here instead of labs/ (no gradebook is touched)")
    s.add_argument("--course-root", metavar="DIR", help=COURSE_ROOT_HELP)
    s.set_defaults(func=_release)

    s = sub.add_parser("validate", help="run a notebook's tests before submitting; non-zero exit if any fails")
    s.add_argument("notebook", metavar="NOTEBOOK")
    s.add_argument("--timeout", type=int, default=None, help="per-cell limit in seconds (default 180)")
    s.set_defaults(func=_validate)

    s = sub.add_parser("grade", help="autograde every submission, export grades.csv, write feedback")
    s.add_argument("labs", nargs="*", metavar="LAB", help="assignment ids to grade (default: all submitted)")
    s.add_argument("--submissions", metavar="DIR",
                   help="submissions in nbgrader's layout DIR/<student>/<NN_topic>/<NN_topic>.ipynb "
                        "(copied into grader/work/submitted; default: grader/work/submitted as it is)")
    s.add_argument("--timeout", type=int, default=None, help="per-cell limit in seconds (default 180)")
    s.add_argument("--submission-timeout", type=float, default=None,
                   help="wall-clock limit for grading one submission (default c.DTLabs.submission_timeout, 1800 s)")
    s.add_argument("--timestamps", metavar="CSV",
                   help="the submission times of --submissions DIR, from the LMS (a CSV with the columns student, "
                        "timestamp and optionally lab): a student's own timestamp.txt is never used; without this, "
                        "no late penalty")
    s.add_argument("--jobs", "-j", type=int, default=None,
                   help="grade this many submissions at once (default: the CPU budget of the cgroup, cpuset and "
                        "affinity mask at 2 CPUs a submission, and what the memory limit holds; 1 on 2 cores)")
    s.add_argument("--force", action="store_true", help="regrade every submission, changed or not")
    s.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    s.add_argument("--csv", metavar="PATH", help="grades CSV (default grader/work/grades.csv)")
    s.add_argument("--unprotected", action="store_true", help=UNPROTECTED_HELP)
    s.add_argument("--course-root", metavar="DIR", help=COURSE_ROOT_HELP)
    s.set_defaults(func=_grade)

    s = sub.add_parser("prepare-array", help="before a job array: record LAB, snapshot its template, write the roster")
    s.add_argument("lab", metavar="LAB")
    s.add_argument("students", nargs="*", metavar="STUDENT", help="whom to grade (default: everyone who submitted)")
    s.add_argument("--out", required=True, metavar="DIR", help="results folder the array and the merge use")
    s.add_argument("--course-root", metavar="DIR", help=COURSE_ROOT_HELP)
    s.set_defaults(func=_prepare_array)

    s = sub.add_parser("grade-one", help="grade one submission into a results folder (for Slurm job arrays)")
    s.add_argument("lab", metavar="LAB")
    s.add_argument("student", metavar="STUDENT", nargs="?", help="the student (or --task N)")
    s.add_argument("--task", type=int, default=None, metavar="N", help="grade line N of the roster (an array task id)")
    s.add_argument("--unprotected", action="store_true", help=UNPROTECTED_HELP)
    s.add_argument("--out", required=True, metavar="DIR", help="results folder (then: dtlabs merge DIR)")
    s.add_argument("--timeout", type=int, default=None, help="per-cell limit in seconds (default 180)")
    s.add_argument("--submission-timeout", type=float, default=None,
                   help="wall-clock limit for grading the submission (default c.DTLabs.submission_timeout, 1800 s)")
    s.add_argument("--course-root", metavar="DIR", help=COURSE_ROOT_HELP)
    s.set_defaults(func=_grade_one)

    s = sub.add_parser("merge", help="merge grade-one results into the course gradebook; every expected student "
                                     "is merged or listed NOT GRADED with the reason")
    s.add_argument("results", nargs="+", metavar="DIR")
    s.add_argument("--lab", action="append", metavar="LAB", help="merge only this lab (repeatable)")
    s.add_argument("--course-root", metavar="DIR", help=COURSE_ROOT_HELP)
    s.set_defaults(func=_merge)

    s = sub.add_parser("export", help="grades out: a Gradescope autograder, a Canvas gradebook CSV")
    exits = s.add_subparsers(dest="exit", required=True, metavar="EXIT")
    e = exits.add_parser("gradescope", help="a Gradescope autograder zip for LAB (hidden tests inside: upload it only "
                                           "to Gradescope)")
    e.add_argument("lab", metavar="LAB")
    e.add_argument("--out", required=True, metavar="DIR", help="folder for <LAB>-autograder.zip")
    e.add_argument("--wheel", metavar="PATH", help="bundle this wheel of the course package instead of building one")
    e.add_argument("--course-root", metavar="DIR", help=COURSE_ROOT_HELP)
    e.set_defaults(func=_export_gradescope)
    e = exits.add_parser("canvas", help="the gradebook as a CSV that Canvas's gradebook import accepts")
    e.add_argument("labs", nargs="*", metavar="LAB", help="labs to export (default: every lab in the gradebook)")
    e.add_argument("--roster", required=True, metavar="CSV", help="the course's Canvas gradebook export (Grades > "
                                                                  "Export): its students and column titles")
    e.add_argument("--out", required=True, metavar="FILE", help="the CSV to write (then Grades > Import in Canvas)")
    e.add_argument("--course-root", metavar="DIR", help=COURSE_ROOT_HELP)
    e.set_defaults(func=_export_canvas)

    s = sub.add_parser("report", help="what the class got wrong on LAB: scores, failing tests and messages, "
                                      "NOT GRADED submissions, grading time (one HTML page)")
    s.add_argument("lab", metavar="LAB")
    s.add_argument("--out", metavar="FILE", help="the HTML file (default grader/work/reports/<LAB>.html)")
    s.add_argument("--anonymous", action="store_true", help="no student ids (numbered instead), to share the page")
    s.add_argument("--course-root", metavar="DIR", help=COURSE_ROOT_HELP)
    s.set_defaults(func=_report)

    s = sub.add_parser("bench", help="launcher benchmark: ratios against mp.spawn and notebook_launcher")
    s.add_argument("bench_args", nargs=argparse.REMAINDER, help="passed to benchmarks/bench_launch.py")
    s.set_defaults(func=_bench)

    s = sub.add_parser("mutate", help="grade single-change mutants of a lab's solutions; survivors and kill rate")
    s.add_argument("lab", metavar="LAB", help="assignment id such as 04_mixed_precision")
    s.add_argument("--n", type=int, default=20, help="mutants to sample and grade (default 20; 0: all)")
    s.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    s.add_argument("--min-kill", type=float, default=0.9, help="exit 1 below this kill rate (default 0.9)")
    s.add_argument("--timeout", type=int, default=None,
                   help="per-cell limit in seconds (default: the course's c.DTLabs.cell_timeout)")
    s.add_argument("--list", action="store_true", help="list the sampled mutants, grade nothing")
    s.set_defaults(func=_mutate)
    s = sub.add_parser("stress", help="grade each lab's solution K times with the other cores busy; "
                                      "non-zero exit if any run lost points")
    s.add_argument("labs", nargs="*", metavar="LAB", help="assignment ids such as 05_multi_node (default: all)")
    s.add_argument("--k", type=int, default=10, help="autograde runs per lab (default 10)")
    s.add_argument("--busy", type=int, default=None, help="busy-loop processes (default: cores - 1)")
    s.add_argument("--timeout", type=int, default=None, help="per-cell limit in seconds (default 180)")
    s.add_argument("--keep", action="store_true", help="keep the scratch courses (autograded notebooks)")
    s.add_argument("--tests", metavar="PYTEST_ARGS", default=None,
                   help="instead of grading labs, run pytest with these arguments (one quoted string, e.g. "
                        "'-n 2 tests/labkit/test_torchrun.py') K times in a row under the same load")
    s.set_defaults(func=_stress)
    return p


def main(argv=None) -> int:
    """Run one ``dtlabs`` command and return its exit code (``ExitCode``; argparse's own 2 for bad usage)."""
    args = build_parser().parse_args(argv)
    from lab_utils.processes import share_cores

    share_cores(os.environ)  # every command's kernels, subjects, ranks and runs share the cores: none spins for them
    try:
        return exit_code(args.func(args))
    except tuple(ERRORS) as exc:  # a course that cannot be found or read: say so, no traceback
        print(f"dtlabs {args.command}: {exc}", file=sys.stderr)
        return next(code for error, code in ERRORS.items() if isinstance(exc, error))


if __name__ == "__main__":
    sys.exit(main())
