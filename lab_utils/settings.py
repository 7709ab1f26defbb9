"""Every setting of the course package, with its default and meaning: ``DTLabs``.

Settings are traitlets, so a course sets them where it sets nbgrader's, in ``grader/nbgrader_config.py``::

    c.DTLabs.memory_mb = 4096
    c.DTLabs.sandbox = "bwrap"       # refuse to grade where bubblewrap cannot run

An environment variable overrides the config for one run (the ``env`` named in each setting's help, e.g.
``DTLABS_MEMORY_MB=4096 dtlabs grade``); ``dtlabs`` flags such as ``--timeout`` override both. ``dtlabs`` builds
one ``DTLabs`` per command from these three sources (``load``) and passes it down; a process it starts gets the
values that came from flags as nbgrader configuration (``nbgrader_run.run_nbgrader``), never as new environment
variables. ``dtlabs settings`` prints them all with their current values. Nothing else in the package reads
``DTLABS_*`` settings from the environment. (Variables the package sets for its own processes, such as a rank's ``DTLABS_RANK_PID`` mark or a
grading run's ``DTLABS_GRADING_TOKEN``, are how processes find each other, not settings.)
"""
from __future__ import annotations

import json
import os

from traitlets import Bool, Dict, Enum, Float, Int, TraitError, Unicode
from traitlets.config import Configurable

_FALSE = ("0", "false", "no", "off", "")


class DTLabs(Configurable):
    """The course package's settings (section ``c.DTLabs`` of ``nbgrader_config.py``)."""

    given: frozenset = frozenset()  # the names ``load`` took from flags (``given``)

    # ---------------------------------------------------------------------------------------------- the course
    course_root = Unicode(
        "", help="The course folder (solutions/, labs/, grader/). Empty: `dtlabs --course-root`, else the nearest "
                 "folder at or above the working directory with grader/nbgrader_config.py and solutions/."
    ).tag(config=True, env="DTLABS_COURSE_ROOT")

    cache_dir = Unicode(
        "", help="Where grading keeps what it may reuse (the canary's verdicts). Empty: $XDG_CACHE_HOME/dtlabs, "
                 "else ~/.cache/dtlabs: one per user, so two instructors on one host never share it."
    ).tag(config=True, env="DTLABS_CACHE_DIR")

    # ---------------------------------------------------------------------------------------------- grading limits
    cell_timeout = Int(
        180, help="Seconds one cell may run under autograde and validate (nbgrader's Execute.timeout), and in "
                  "`dtlabs mutate`'s swap sessions. Lab cells "
                  "call launch(..., timeout<=60), so a hanging rank is reported by the launcher first."
    ).tag(config=True, env="DTLABS_CELL_TIMEOUT")
    submission_timeout = Float(
        1800.0, help="Seconds one submission may take to grade, all its cells together."
    ).tag(config=True, env="DTLABS_SUBMISSION_TIMEOUT")
    memory_mb = Int(
        8192, help="Memory (total RSS in MB) of all the processes of one submission while it is graded."
    ).tag(config=True, env="DTLABS_MEMORY_MB")
    max_procs = Int(
        96, help="Processes one submission may have at once while it is graded."
    ).tag(config=True, env="DTLABS_MAX_PROCS")
    disk_mb = Int(
        2048, help="Disk one submission may fill while it is graded: its folder, and its private /tmp (memory-backed)."
    ).tag(config=True, env="DTLABS_DISK_MB")
    sandbox = Enum(
        ["auto", "bwrap", "user", "unprotected", "off"], "auto",
        help="Where a submission's code runs. auto: bubblewrap where it can build a sandbox here, else (as root) the "
             "separate user c.DTLabs.subject_user, else refuse with the reason; bwrap or user: that boundary or "
             "refuse; unprotected (or off): as the grader's own user, with limits and the course guard only, and "
             "every grade says it was taken without a boundary (`dtlabs grade --unprotected`)."
    ).tag(config=True, env="DTLABS_SANDBOX")
    subject_user = Unicode(
        "dtlabs-subject", help="The unprivileged user a submission runs as where bubblewrap cannot run and the "
                               "grader is root (Gradescope, Docker). `dtlabs doctor --grading --fix` creates it."
    ).tag(config=True, env="DTLABS_SUBJECT_USER")

    warm_nbgrader = Bool(
        True, help="Fork each nbgrader run from a server that has imported nbgrader once (its imports are saved "
                   "per submission). Off: every run is a fresh `python -m nbgrader`. Either way the run is the same."
    ).tag(config=True, env="DTLABS_WARM_NBGRADER")
    warm_kernels = Bool(
        True, help="Fork grader kernels (grading, `dtlabs validate`, the test suite) from a server that has imported "
                   "ipykernel, torch and numpy once (0.4-2 CPU-s saved per kernel). Off, or where the server cannot "
                   "run (`dtlabs doctor` says why), every kernel is a fresh `python -m ipykernel_launcher`."
    ).tag(config=True, env="DTLABS_WARM_KERNELS")
    unsafe_plain_execute = Bool(
        False, help="Only for benchmarks/bench_grading.py's baseline: grade with nbgrader's own Execute, student code "
                    "in the grader's kernel, no sandbox. Never for a class."
    ).tag(config=True, env="DTLABS_BENCH_BASELINE")

    # ---------------------------------------------------------------------------------------------- grades out
    due_dates = Dict(
        key_trait=Unicode(), value_trait=Unicode(),
        help="lab -> due date, as nbgrader writes them ('2025-10-01 23:59:00 UTC'). Autograde records it in the "
             "gradebook, so nbgrader's late-submission plugin (c.AssignLatePenalties.plugin_class, "
             "c.LateSubmissionPlugin.penalty_method) charges a submission whose timestamp.txt is later; every export "
             "shows the score after that penalty. A lab not listed keeps the due date its gradebook holds, if any."
    ).tag(config=True, env="DTLABS_DUE_DATES")
    gradescope_visibility = Dict(
        key_trait=Unicode(), value_trait=Enum(["hidden", "after_due_date", "after_published", "visible"]),
        help="lab -> when Gradescope shows students the result of a test cell that holds hidden tests (its score "
             "would tell how the hidden checks went). A lab not listed: after_published. Test cells without hidden "
             "tests are always visible."
    ).tag(config=True, env="DTLABS_GRADESCOPE_VISIBILITY")
    canvas_columns = Dict(
        key_trait=Unicode(), value_trait=Unicode(),
        help="lab -> the title of its column in the Canvas gradebook (with or without Canvas's ' (12345)' id). A lab "
             "not listed uses the roster's column named after it (NN_topic), else a new column NN_topic."
    ).tag(config=True, env="DTLABS_CANVAS_COLUMNS")

    # ---------------------------------------------------------------------------------------------- the launcher
    warm_imports = Bool(
        True, help="Let the launcher's fork server import the distributed stack (DDP, FSDP, DTensor, profiler) while "
                   "idle, so later launches start warm. Off: less memory, slower first launches of that code."
    ).tag(config=True, env="DTLABS_WARM_IMPORTS")
    private_network = Bool(
        True, help="Give a notebook's ranks a network namespace of their own where the machine lets an ordinary user "
                   "make one: their rendezvous and collectives listen on a loopback no other user's process can "
                   "reach (a classmate on the same hub). Off: ranks listen on the machine's loopback."
    ).tag(config=True, env="DTLABS_PRIVATE_NETWORK")
    warm_torchrun = Bool(
        True, help="Fork the torchrun agents that lab_utils.labkit.torchrun starts (Labs 05 and 09), and their "
                   "workers, from servers in the notebook's process that have imported torch once (about a "
                   "CPU-second saved per agent, worker and restart; the servers hold about 150 MB each while the "
                   "notebook runs). Off: every agent is a fresh interpreter, and every worker a fresh "
                   "`python -u SCRIPT`, as torchrun starts it."
    ).tag(config=True, env="DTLABS_WARM_TORCHRUN")


def _from_env(trait, text: str):
    if isinstance(trait, Dict):  # a JSON object, e.g. DTLABS_DUE_DATES='{"01_ddp_setup": "2025-10-01 23:59:00 UTC"}'
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("a JSON object is needed")
        return value
    if isinstance(trait, Bool):
        return text.strip().lower() not in _FALSE
    if isinstance(trait, Int):
        return int(text)
    if isinstance(trait, Float):
        return float(text)
    return text


def load(config=None, **overrides) -> DTLabs:
    """The settings in force: defaults, then ``config`` (a traitlets Config, e.g. the course's nbgrader config),
    then the environment's overrides, then ``overrides`` (command-line flags; None means not given)."""
    settings = DTLabs(config=config) if config is not None else DTLabs()
    for name, trait in settings.traits(config=True).items():
        var = trait.metadata.get("env")
        if var and var in os.environ:
            try:
                setattr(settings, name, _from_env(trait, os.environ[var]))
            except (ValueError, TypeError, TraitError) as exc:
                raise ValueError(f"{var}={os.environ[var]!r} is not a valid {name}: {exc}") from None
    given = []
    for name, value in overrides.items():
        if value is not None:
            setattr(settings, name, value)
            given.append(name)
    settings.given = frozenset(given)
    return settings


def given(settings: DTLabs) -> dict:
    """name -> value of the settings that came from flags (``load``'s overrides): what a process started for the
    same command must be told, since its own config and environment do not hold them."""
    return {name: getattr(settings, name) for name in sorted(getattr(settings, "given", ()))}


def env_var(name: str) -> str | None:
    """The environment variable that sets ``name`` (its ``env`` tag), or None."""
    return DTLabs.class_traits()[name].metadata.get("env")


def default(name: str):
    """A setting's own default (the value ``DTLabs`` has when nothing sets it)."""
    return DTLabs.class_traits()[name].default_value


def describe(settings: DTLabs | None = None) -> str:
    """Every setting, its value, its environment override and its meaning (``dtlabs settings``)."""
    settings = settings or load()
    lines = []
    for name, trait in sorted(settings.traits(config=True).items()):
        lines.append(f"c.DTLabs.{name} = {getattr(settings, name)!r}    (env {trait.metadata.get('env')})")
        lines.append(f"    {trait.help}")
    return "\n".join(lines)
