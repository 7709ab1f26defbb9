"""Split execution for grading: the student's cells run in a sandboxed *subject* process, the tests here.

``SplitExecute`` replaces nbgrader's ``Execute`` in ``autograde`` (``grader/nbgrader_config.py``) and in
``dtlabs validate``. Each code cell gets one of three routes before the notebook runs:

- **grader**: a graded test cell. Runs only in the kernel nbgrader started, which never executes student code;
- **shared**: a locked course cell that is not a test (parameters, imports, helpers, references). Runs in the
  kernel and, just before, in the subject too, because student code may need it;
- **student**: every other cell (answers, demos, cells a student added). Runs only in the subject: its source
  gets a ``%%student`` first line, so the kernel passes it over as a string and never parses it as code.

Under autograde the routes come from the gradebook (nbgrader's record of the course's source notebook), not from
the submitted notebook's metadata, so a submission cannot promote its own cell to "locked" or demote a test cell
to "solution". ``validate`` has no gradebook and trusts the notebook (a student only fools themselves there).
A first hidden cell starts the subject (``lab_utils.grading.split.proxy.start_grading``); it is removed afterwards, and every
answer cell gets its own source back, so the autograded notebook and the feedback show what the student wrote.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from nbclient.util import run_sync
from nbformat.v4 import new_code_cell
from nbgrader.preprocessors import Execute
from traitlets import Unicode

from lab_utils import settings
from lab_utils.grading.course import cell_meta
from lab_utils.grading.boundary import mounts, sandbox, separate_user
from lab_utils.grading.outcomes import Kind, Reason
from lab_utils.grading.split.kernels import PrivateSocketKernelManager
from lab_utils.grading.split.proxy import START_TIMEOUT_S

GRADER, SHARED, STUDENT = "grader", "shared", "student"
SAFE_KERNEL_ARG = "--IPKernelApp.ignore_cwd=True"


def execution_config(dt):
    """nbgrader's Execute settings for the course (``dt``: its ``settings.DTLabs``), for autograde and validate."""
    from traitlets.config import Config

    return Config({"Execute": {
        # nbgrader 0.9 reads Execute.timeout and ignores ExecutePreprocessor.timeout (nbgrader#1463)
        "timeout": dt.cell_timeout,
        # A cell that ran past its limit must cost that cell, not the notebook: nbgrader would otherwise drop the
        # whole submission when the interrupted kernel's last outputs arrive late (as they do on a loaded grader).
        "raise_on_iopub_timeout": False,
        "interrupt_on_timeout": True,
        "execute_retries": 0,
    }})


class SandboxNotStarted(RuntimeError):
    """The subject could not start (a fault of the grading machine, never a student's): nothing was graded."""
STUDENT_MAGIC = "%%student\n"


def routes(nb, resources=None) -> list[str | None]:
    """The route of every cell (None for markdown/raw cells)."""
    info = (resources or {}).get("nbgrader") or {}
    db_url, notebook, assignment = info.get("db_url"), info.get("notebook"), info.get("assignment")
    known = None
    if db_url and notebook and assignment:
        from nbgrader.api import Gradebook, MissingEntry

        known = {}
        with Gradebook(db_url) as gb:
            for cell in nb.cells:
                gid = cell_meta(cell).get("grade_id")
                if not gid or gid in known:
                    continue
                try:
                    locked = gb.find_source_cell(gid, notebook, assignment).locked
                except MissingEntry:
                    continue
                try:
                    gb.find_solution_cell(gid, notebook, assignment)
                    solution = True
                except MissingEntry:
                    solution = False
                try:
                    gb.find_graded_cell(gid, notebook, assignment)
                    graded = True
                except MissingEntry:
                    graded = False
                known[gid] = (graded, solution, locked)
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            out.append(None)
            continue
        m = cell_meta(cell)
        if known is not None:
            graded, solution, locked = known.get(m.get("grade_id"), (False, True, False))
        else:
            graded, solution, locked = bool(m.get("grade")), bool(m.get("solution")), bool(m.get("locked"))
        if graded and not solution:
            out.append(GRADER)
        elif locked and not solution:
            out.append(SHARED)
        else:
            out.append(STUDENT)
    return out


class SplitExecute(Execute):
    """nbgrader's Execute, with the cells routed as the module docstring says."""

    report_path = Unicode(
        "", help="A file to which the grader appends why a submission's sandbox stopped (a limit, a crash), one "
                 "line each, for the grade line (``dtlabs grade`` sets it per submission)."
    ).tag(config=True)

    def __init__(self, *args, **kwargs):
        # nbgrader's Execute sets AsyncKernelManager the same way; ours has no port race (lab_utils.grading.split.kernels)
        kwargs.setdefault("kernel_manager_class", PrivateSocketKernelManager)
        super().__init__(*args, **kwargs)

    def preprocess(self, nb, resources=None, km=None):
        resources = resources if resources is not None else {}
        with self.split(nb, resources):
            nb, resources = super().preprocess(nb, resources, km)
        return nb, resources

    async def async_start_new_kernel(self, **kwargs):
        """The grader kernel starts in an empty folder of its own, never the submission's, and nothing it imports
        can come from a folder a student writes: its working directory is not on its path (IPython's
        ``ignore_cwd``; ``PYTHONSAFEPATH`` keeps ``python -m`` from adding it either)."""
        kwargs["cwd"] = self._kernel_home
        # nor from the user's own IPython profile (its startup files) or user site-packages, which a submission
        # graded earlier without a boundary could have written
        kwargs["env"] = {**(kwargs.get("env") or os.environ), "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1",
                         "IPYTHONDIR": self._kernel_ipython}
        if SAFE_KERNEL_ARG not in self.extra_arguments:
            self.extra_arguments = [*self.extra_arguments, SAFE_KERNEL_ARG]
        await super().async_start_new_kernel(**kwargs)

    start_new_kernel = run_sync(async_start_new_kernel)  # nbclient's sync name is bound to its own coroutine

    def preprocess_cell(self, cell, resources, index):
        """A preamble that fails is the grading machine's fault: stop there, with the reason, instead of running
        every answer cell into "Cell magic %%student not found" and recording zeros."""
        if cell is not getattr(self, "_preamble", None):
            return super().preprocess_cell(cell, resources, index)
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            why = f"{errors[0].get('ename')}: {errors[0].get('evalue')}" if errors else None
        except Exception as exc:  # noqa: BLE001 - a dead kernel, a timeout: the sandbox did not start either
            why = f"{type(exc).__name__}: {exc}"
        if why:
            self._refuse(Reason(Kind.ENVIRONMENT, f"the sandbox did not start ({why})"))
        return cell, resources

    def _refuse(self, reason: Reason) -> None:
        """Nothing is graded: the reason goes to the run's report (a grade line), then up as ``SandboxNotStarted``."""
        if self.report_path:
            with open(self.report_path, "a") as fh:
                fh.write(str(reason).replace("\n", " ") + "\n")
        raise SandboxNotStarted(str(reason))

    @contextlib.contextmanager
    def split(self, nb, resources):
        """Route the cells and put the subject-starting cell first; yields every cell's route while it runs
        (the first cell's is None), and gives the answer cells their own source back afterwards."""
        route = routes(nb, resources)
        originals = {}
        shared = []
        for i, (cell, r) in enumerate(zip(nb.cells, route)):
            if r == STUDENT:
                originals[i] = cell.source
                cell.source = STUDENT_MAGIC + cell.source
            elif r == SHARED:
                shared.append(cell.source)
        workdir = (resources.get("metadata") or {}).get("path") or os.getcwd()
        report = self.report_path or None
        inside = mounts.installed_inside(workdir)
        if inside:
            self._refuse(Reason(Kind.ENVIRONMENT, (
                f"the notebook's folder {workdir} holds the Python that grades it ({inside[0]}): code run from that "
                "folder could rewrite it, and the grader takes nothing from there. Move the notebook into a folder of "
                "its own (as the course's labs/NN_topic/ folders are) and run again")))
        limits = settings.load(self.config)  # the run's config (the course's, the flags'), then the environment
        user_mode = sandbox.mode(limits.sandbox) == "user"
        work_root = separate_user.make_work_root(user_mode)  # removed here: the kernel may die uncleaned
        self._kernel_home = tempfile.mkdtemp(prefix="dtlabs-grader-")  # the kernel's working directory, empty
        self._kernel_ipython = tempfile.mkdtemp(prefix="dtlabs-ipython-")  # its IPython profile: none of the user's
        preamble = new_code_cell(
            "import lab_utils.grading.split.proxy as _dtlabs_proxy\n"
            f"_dtlabs_proxy.start_grading(shared_sources={shared!r}, workdir={str(workdir)!r}, report_path={report!r}, "
            f"work_root={work_root!r}, memory_mb={limits.memory_mb!r}, max_procs={limits.max_procs!r}, "
            f"sandbox={limits.sandbox!r}, subject_user={limits.subject_user!r}, disk_mb={limits.disk_mb!r})"
        )
        nb.cells.insert(0, preamble)
        self._preamble = preamble
        cell_timeout = self.timeout_func

        def timeout_for(cell):
            """Starting the sandbox is the grader's time: never cut short by the student's per-cell limit."""
            if cell is preamble and self.timeout:
                return max(self.timeout, START_TIMEOUT_S)
            return cell_timeout(cell) if cell_timeout is not None else self.timeout

        self.timeout_func = timeout_for
        try:
            yield [None, *route]
        finally:
            self.timeout_func = cell_timeout
            shutil.rmtree(work_root, ignore_errors=True)
            shutil.rmtree(self._kernel_home, ignore_errors=True)
            shutil.rmtree(self._kernel_ipython, ignore_errors=True)
            self._preamble = None
            nb.cells.pop(0)
            for i, src in originals.items():
                nb.cells[i].source = src

