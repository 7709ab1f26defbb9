"""A class at once: N simulated students start together, each a kernel started the way JupyterLab starts one, each
in a child cgroup with its share of the CPU budget and a memory limit, each running a lab's solution cells.

Per lab, in one run: first one student alone (the baseline: the whole CPU budget, the same memory limit), then N at
once (budget / N CPUs of quota each). A student is a driver process (standing in for the student's Jupyter server, in
the student's cgroup like a single-user pod) that starts a kernel with the course's ``StudentKernelManager`` (the
server's kernel manager: ipc sockets in a private folder) and runs the lab's solution cells through nbclient, with
errors allowed so that every failing cell is counted. A first cell of ours wraps ``RankGroup`` and ``launch`` in the
kernel to time them (the launch latency: a group of ranks forked by the warm fork server and handed its job, the
time a student's ``launch(...)`` or ``%dist start`` waits before its ranks run).

Printed per lab: failures (failed cells, and students with one), per-student memory (PSS of the kernel and every
process under it: idle after ``prewarm(wait=True)``, and the sampled peak), launch latency p50 and p95, the makespan
against N times the student alone, the slowest student against the fastest, throttled periods (cgroup cpu.stat
nr_throttled), OOM kills, CPU-seconds per student (its cgroup's usage; over the time alone: the CPU per active
student) and the memory cgroup's peak charge. Targets, at N = 6 on 2 cores, for Labs 01 and 05: 0 failures,
makespan <= 1.15 x N x alone. Lab 10 runs its launcher cells only by default (``--lab10 launcher``: the
3D-parallel cells, the DDP test and the scaling cells, not DeepSpeed, Ray, TensorFlow, Accelerate or Horovod, which
take most of its time and are optional extras); ``--lab10 all`` runs every cell. No target applies to Lab 10.

``--grading-under-load``: after the labs, 3 students (``--load-students``) run Lab 10 while ``dtlabs grade`` grades 6
honest submissions (``--submissions``) of Lab 05 at ``--jobs 3`` (a scratch course; nothing in the repository is
touched); every submission must keep every point (busy is not stuck).

Nothing is left behind: every student's cgroup is killed and removed at the end, on an error and on Ctrl-C.
Needs root (or a delegated cgroup) to make child cgroups; exits 2 with the reason where it cannot.

    .venv/bin/python benchmarks/bench_class.py [--students 6] [--labs 01,05,10] [--memory-mb 3072]
        [--lab10 launcher|all] [--lab10-students N] [--grading-under-load [--load-students 3] [--submissions 6]
        [--jobs 3]] [--skip-labs] [--json PATH]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab_utils import cgroups  # noqa: E402

TARGET_MAKESPAN = 1.15  # makespan / (N x one student alone), at most
TARGET_LABS = ("01", "05")  # the labs the targets apply to
TARGET_N = 6
CELL_TIMEOUT_S = 1800  # JupyterLab has no per-cell limit; this only keeps a hung cell from hanging the benchmark
SAMPLE_S = 1.0  # how often each student's PSS is sampled
FRAMEWORK_CELLS = ("deepspeed_config", "compute_scaling")  # Lab 10: from the first up to (not with) the second

# The first cell of every student's kernel: time each RankGroup start (the launch latency) and each launch() call.
TIMING_CELL = r'''
import time as _bc_time, lab_utils as _bc_lu
from lab_utils.launcher import group as _bc_group, launch as _bc_launch
_BC = {"start": [], "launch": []}
_bc_init = _bc_group.RankGroup.__init__
def _bc_timed_init(self, *a, **k):
    t = _bc_time.perf_counter()
    try:
        return _bc_init(self, *a, **k)
    finally:
        _BC["start"].append(_bc_time.perf_counter() - t)
_bc_group.RankGroup.__init__ = _bc_timed_init
_bc_orig_launch = _bc_launch.launch
def _bc_timed_launch(*a, **k):
    t = _bc_time.perf_counter()
    try:
        return _bc_orig_launch(*a, **k)
    finally:
        _BC["launch"].append(_bc_time.perf_counter() - t)
_bc_launch.launch = _bc_lu.launch = _bc_timed_launch
'''
IDLE_CELL = "from lab_utils import prewarm as _bc_prewarm\n_bc_prewarm(wait=True)"
REPORT_CELL = "import json as _bc_json\nprint('BENCH-CLASS ' + _bc_json.dumps(_BC))"


def lab_dir(lab: str) -> Path:
    found = sorted((REPO / "solutions").glob(f"{lab}_*"))
    if not found:
        raise SystemExit(f"no lab {lab} in solutions/")
    return found[0]


def lab_cells(nb, lab: str, lab10: str) -> list:
    """The solution's code cells this benchmark runs (Lab 10: its launcher cells only unless ``lab10 == 'all'``)."""
    cells = [c for c in nb.cells if c.cell_type == "code"]
    if lab != "10" or lab10 == "all":
        return cells
    ids = [c.metadata.get("nbgrader", {}).get("grade_id", "") for c in cells]
    first, last = ids.index(FRAMEWORK_CELLS[0]), ids.index(FRAMEWORK_CELLS[1])
    return cells[:first] + cells[last:-1]  # the last cell stops the frameworks and checks none is left


# ------------------------------------------------------------------------------------------ one student (driver)
def student_main(lab: str, workdir: str, lab10: str) -> int:
    """Run in the student's cgroup: wait for the start signal (a line on stdin), then start a kernel as JupyterLab
    does and run the lab's cells; print one JSON line with what happened."""
    import nbformat
    import psutil
    from nbclient import NotebookClient

    from lab_utils.launcher.kernel_channels import StudentKernelManager

    src = lab_dir(lab)
    nb = nbformat.read(str(src / f"{src.name}.ipynb"), as_version=4)
    cells = lab_cells(nb, lab, lab10)
    v4 = nbformat.v4
    nb.cells = [v4.new_code_cell(TIMING_CELL), v4.new_code_cell(IDLE_CELL)] + cells + [v4.new_code_cell(REPORT_CELL)]
    print("READY", flush=True)
    sys.stdin.readline()  # go
    t0 = time.time()
    km = StudentKernelManager(kernel_name="python3")
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, allow_errors=True, kernel_name="python3",
                            resources={"metadata": {"path": workdir}})
    out = {"lab": lab, "t_start": t0, "idle_pss": None, "failures": [], "timings": None, "error": None}

    def tree_pss() -> int:
        try:
            kernel = psutil.Process(km.provisioner.process.pid)
            procs = [kernel] + kernel.children(recursive=True)
        except (psutil.Error, AttributeError):
            return 0
        total = 0
        for p in procs:
            try:
                total += p.memory_full_info().pss
            except psutil.Error:
                pass
        return total

    async def run():
        client.reset_execution_trackers()
        async with client.async_setup_kernel():
            for index, cell in enumerate(nb.cells):
                await client.async_execute_cell(cell, index)
                if index == 1:  # prewarm(wait=True) done: the kernel and its warm fork server, idle
                    await asyncio.sleep(1.0)
                    out["idle_pss"] = tree_pss()
            await asyncio.sleep(0)

    try:
        asyncio.run(run())
    except Exception as exc:  # noqa: BLE001 - a dead kernel, a cell past CELL_TIMEOUT_S: the student failed
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    for index, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                gid = cell.metadata.get("nbgrader", {}).get("grade_id") or f"cell {index - 2}"
                out["failures"].append(f"{gid}: {o.get('ename')}: {str(o.get('evalue'))[:300]}")
            elif o.get("output_type") == "stream" and "BENCH-CLASS " in o.get("text", ""):
                out["timings"] = json.loads(o["text"].split("BENCH-CLASS ", 1)[1].splitlines()[0])
    out["t_end"] = time.time()
    print("BENCH-RESULT " + json.dumps(out), flush=True)
    return 0


# ------------------------------------------------------------------------------------------ the class (parent)
class Usage:
    """The CPU-seconds a student's processes used: cgroup v2's cpu.stat ``usage_usec`` of its ``Child``, or on v1 the
    ``cpuacct.usage`` of the child's cpu folder where cpuacct is mounted with cpu, else of a cpuacct child of our own
    (``lab_utils.cgroups.Child`` reads no usage). ``kill``/``remove`` as a Child's, for ``cleanup``."""

    def __init__(self, child, name: str):
        self.child, self.path, self.paths = child, None, []
        cpu = child.v1.get("cpu")
        if child.v2 or (cpu and os.path.exists(os.path.join(cpu, "cpuacct.usage"))):
            return
        own = cgroups.folders("cpuacct")
        if own:
            try:
                os.mkdir(os.path.join(own[0], name))
                self.path = os.path.join(own[0], name)
                self.paths = [self.path]
            except OSError:
                pass

    def add(self, pid: int) -> None:
        if self.path:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(pid))

    def seconds(self) -> float | None:
        try:
            if self.child.v2:
                with open(os.path.join(self.child.v2, "cpu.stat")) as f:
                    return next(int(ln.split()[1]) for ln in f if ln.startswith("usage_usec ")) / 1e6
            path = self.path or self.child.v1.get("cpu")
            with open(os.path.join(path, "cpuacct.usage")) as f:
                return int(f.read()) / 1e9
        except (OSError, StopIteration, TypeError, ValueError):
            return None

    def kill(self) -> None:
        pass  # its processes are its Child's, killed just before

    def remove(self) -> bool:
        for _ in range(50):
            try:
                if self.path:
                    os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                time.sleep(0.02)
        return False


class Cohort:
    """N students of one lab started together, each in a cgroup of its own; sampled while they run."""

    def __init__(self, tag: str, lab: str, n: int, cpus: float, memory_bytes: int, lab10: str, root: Path,
                 live: list):
        self.lab, self.n, self.students, self.results = lab, n, [], []
        self.peak = [0] * n
        self.usages = []
        for i in range(n):
            child = cgroups.Child.make(f"dtlabs-bench-class-{os.getpid()}-{tag}-{i}", cpus=cpus,
                                       memory_bytes=memory_bytes)
            if child is None:
                raise RuntimeError("cannot make a child cgroup here (root, or a delegated cgroup, is needed)")
            live.append(child)
            usage = Usage(child, f"dtlabs-bench-class-{os.getpid()}-{tag}-{i}")
            live.append(usage)
            work = root / f"{tag}-{i}"
            shutil.copytree(lab_dir(lab), work)
            proc = subprocess.Popen(
                [sys.executable, __file__, "--student", lab, str(work), lab10], cwd=work, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            )
            if not child.add(proc.pid):
                proc.kill()
                raise RuntimeError(f"could not move a student into {child.paths}")
            usage.add(proc.pid)
            self.students.append((child, proc))
            self.usages.append(usage)
        for child, proc in self.students:  # every driver has imported what it needs: only the go is left
            line = proc.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"a student's driver did not start: {line}{proc.stderr.read()[-1500:]}")

    def run(self) -> float:
        """Start every student at once; wait for all; the makespan in seconds."""
        import psutil

        outs = [None] * self.n
        readers = []
        for i, (_, proc) in enumerate(self.students):
            def read(i=i, proc=proc):
                outs[i] = proc.communicate()
            readers.append(threading.Thread(target=read, daemon=True))
        start = time.monotonic()
        for _, proc in self.students:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for t in readers:
            t.start()
        while any(t.is_alive() for t in readers):
            for i, (child, proc) in enumerate(self.students):
                total = 0
                for pid in child.pids():
                    if pid == proc.pid:
                        continue  # the driver stands in for the Jupyter server: not the student's kernel
                    try:
                        total += psutil.Process(pid).memory_full_info().pss
                    except psutil.Error:
                        pass
                self.peak[i] = max(self.peak[i], total)
            time.sleep(SAMPLE_S)
        makespan = time.monotonic() - start
        for i, (child, proc) in enumerate(self.students):
            stdout, stderr = outs[i]
            line = next((ln for ln in stdout.splitlines() if ln.startswith("BENCH-RESULT ")), None)
            res = json.loads(line.split(" ", 1)[1]) if line else {
                "failures": [], "error": f"driver exited {proc.returncode}: {stderr[-1500:]}", "timings": None,
                "idle_pss": None, "t_start": 0, "t_end": 0}
            res["throttled"] = child.throttled()
            res["oom_kills"] = child.oom_kills()
            res["peak_pss"] = self.peak[i]
            res["cpu_s"] = self.usages[i].seconds()
            res["charge_peak"] = charge_peak(child)
            res["elapsed"] = res["t_end"] - res["t_start"] if res.get("t_end") else makespan
            self.results.append(res)
        return makespan


def charge_peak(child) -> int | None:
    """The most memory the student's cgroup was charged (what its limit applies to: PSS plus the page cache it
    brought in, such as torch's libraries read the first time): v1 memory.max_usage_in_bytes, v2 memory.peak."""
    path = os.path.join(child.v2, "memory.peak") if child.v2 else (
        os.path.join(child.v1["memory"], "memory.max_usage_in_bytes") if "memory" in child.v1 else None)
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, TypeError, ValueError, IndexError):
        return None


def cleanup(live: list) -> None:
    for child in live:
        try:
            child.kill()
        except RuntimeError as exc:
            print(f"warning: {exc}", file=sys.stderr)
        if not child.remove():
            print(f"warning: cgroup left behind: {child.paths}", file=sys.stderr)
    live.clear()


def run_cohort(tag, lab, n, cpus, memory_bytes, lab10, root, live) -> tuple[float, list]:
    cohort = Cohort(tag, lab, n, cpus, memory_bytes, lab10, root, live)
    try:
        return cohort.run(), cohort.results
    finally:
        cleanup(live)


def pct(values, q) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo = int(k)
    return values[lo] + (values[min(lo + 1, len(values) - 1)] - values[lo]) * (k - lo)


def mb(n) -> str:
    return "?" if not n else f"{n / 2**20:.0f} MB"


def summarize(lab, n, alone_s, alone_res, makespan, results) -> dict:
    failed_cells = sum(len(r["failures"]) + (1 if r["error"] else 0) for r in results)
    failed_students = sum(1 for r in results if r["failures"] or r["error"])
    starts = [t for r in results if r.get("timings") for t in r["timings"]["start"]]
    launches = [t for r in results if r.get("timings") for t in r["timings"]["launch"]]
    alone_starts = [t for r in alone_res if r.get("timings") for t in r["timings"]["start"]]
    elapsed = [r["elapsed"] for r in results]
    ratio = makespan / (n * alone_s)
    s = {
        "lab": lab, "students": n, "alone_s": alone_s, "makespan_s": makespan, "makespan_ratio": ratio,
        "failed_cells": failed_cells, "failed_students": failed_students,
        "failures": [f for r in results for f in r["failures"] + ([r["error"]] if r["error"] else [])],
        "alone_failures": [f for r in alone_res for f in r["failures"] + ([r["error"]] if r["error"] else [])],
        "idle_pss_mb": statistics.median([r["idle_pss"] for r in results if r["idle_pss"]] or [0]) / 2**20,
        "peak_pss_mb": [r["peak_pss"] / 2**20 for r in results],
        "alone_peak_pss_mb": alone_res[0]["peak_pss"] / 2**20 if alone_res else None,
        "start_p50_s": pct(starts, 0.5), "start_p95_s": pct(starts, 0.95),
        "alone_start_p50_s": pct(alone_starts, 0.5), "launches": len(launches),
        "launch_p50_s": pct(launches, 0.5), "launch_p95_s": pct(launches, 0.95),
        "slowest_over_fastest": max(elapsed) / min(elapsed) if elapsed and min(elapsed) > 0 else float("nan"),
        "throttled": [r["throttled"] for r in results], "oom_kills": sum(r["oom_kills"] for r in results),
        "charge_peak_mb": [r["charge_peak"] / 2**20 for r in results if r.get("charge_peak")],
        "cpu_s": [r.get("cpu_s") for r in results], "alone_cpu_s": alone_res[0].get("cpu_s") if alone_res else None,
    }
    if s["alone_cpu_s"] and alone_s:
        s["cpu_per_active_student"] = s["alone_cpu_s"] / alone_s
    return s


def print_lab(s, budget) -> list:
    """Print one lab's figures; the targets missed (empty when met or none applies)."""
    n = s["students"]
    print(f"\nLab {s['lab']}: {n} students at once, {budget / n:.2f} CPUs each ({budget} CPUs of budget)")
    print(f"  one student alone ({budget} CPUs): {s['alone_s']:.0f} s"
          + (f", FAILED: {s['alone_failures'][:3]}" if s["alone_failures"] else ", no failure"))
    print(f"  failures: {s['failed_cells']} failed cells in {s['failed_students']} of {n} students")
    for f in s["failures"][:8]:
        print(f"    {f}")
    peaks = s["peak_pss_mb"]
    print(f"  memory per student (PSS of the kernel and all under it): idle {s['idle_pss_mb']:.0f} MB, peak median "
          f"{statistics.median(peaks):.0f} MB, max {max(peaks):.0f} MB (alone: {s['alone_peak_pss_mb']:.0f} MB); "
          f"OOM kills {s['oom_kills']}")
    if s["charge_peak_mb"]:
        print(f"  memory cgroup's peak charge per student (what --memory-mb limits; page cache included): median "
              f"{statistics.median(s['charge_peak_mb']):.0f} MB, max {max(s['charge_peak_mb']):.0f} MB")
    print(f"  launch latency (ranks forked and given their job): p50 {s['start_p50_s'] * 1e3:.0f} ms, p95 "
          f"{s['start_p95_s'] * 1e3:.0f} ms (alone p50 {s['alone_start_p50_s'] * 1e3:.0f} ms); whole launch() calls "
          f"({s['launches']}): p50 {s['launch_p50_s']:.2f} s, p95 {s['launch_p95_s']:.2f} s")
    print(f"  makespan {s['makespan_s']:.0f} s = {s['makespan_ratio']:.2f} x (N x alone = {n * s['alone_s']:.0f} s); "
          f"slowest / fastest student = {s['slowest_over_fastest']:.2f}")
    print(f"  throttled periods per student: {s['throttled']}")
    if s.get("cpu_per_active_student"):
        cpu = [c for c in s["cpu_s"] if c]
        print(f"  CPU per active student: {s['alone_cpu_s']:.0f} CPU-s in {s['alone_s']:.0f} s alone = "
              f"{s['cpu_per_active_student']:.2f} CPUs; at once: {statistics.median(cpu):.0f} CPU-s per student "
              f"(median), {sum(cpu) / s['makespan_s']:.2f} CPUs busy on average over the makespan")
    missed = []
    if s["lab"] in TARGET_LABS:
        at_target = n == TARGET_N
        ok_fail = s["failed_cells"] == 0
        ok_span = s["makespan_ratio"] <= TARGET_MAKESPAN
        note = "" if at_target else f" (the targets are for N = {TARGET_N}; informative here)"
        print(f"  target 0 failures: {'PASS' if ok_fail else 'FAIL'}{note}")
        print(f"  target makespan <= {TARGET_MAKESPAN} x N x alone: {'PASS' if ok_span else 'FAIL'} "
              f"({s['makespan_ratio']:.2f}){note}")
        if at_target:
            missed += [] if ok_fail else [f"Lab {s['lab']} failures"]
            missed += [] if ok_span else [f"Lab {s['lab']} makespan"]
    return missed


def grading_under_load(load_students, submissions, jobs, budget, memory_bytes, lab10, root, live) -> dict:
    """Grade ``submissions`` honest submissions of Lab 05 at ``--jobs`` while ``load_students`` run Lab 10."""
    import nbformat

    from lab_utils import grading

    lab = lab_dir("05").name
    course = root / "course"
    shutil.copytree(REPO / "solutions" / lab, course / "solutions" / lab)
    grading.release([lab], root=course)
    rel = nbformat.read(str(course / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    src = nbformat.read(str(course / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    names = [f"s{i}" for i in range(submissions)]
    for s in names:
        grading.submit(course, s, lab, grading.fill_solutions(rel, src))
    cohort = Cohort("load", "10", load_students, budget / load_students, memory_bytes, lab10, root, live)
    result = {}
    try:
        loader = threading.Thread(target=lambda: result.__setitem__("makespan", cohort.run()), daemon=True)
        loader.start()
        time.sleep(5)  # the students' kernels are starting: the grading starts into a loaded machine
        start = time.monotonic()
        grading.grade([lab], course_root=course, jobs=jobs, feedback=False, out=lambda s: None, progress=False)
        result["grade_s"] = time.monotonic() - start
        result["load_busy_at_end"] = loader.is_alive()
        loader.join()
    finally:
        cleanup(live)
    result["points"] = {}
    for s in names:
        sc = grading.cell_scores(course, lab, s)
        result["points"][s] = (sum(a for a, _ in sc.values()), sum(m for _, m in sc.values()))
        result.setdefault("lost", {})[s] = [gid for gid, (a, m) in sc.items() if a < m]
    result["load_failures"] = [f for r in cohort.results for f in r["failures"] + ([r["error"]] if r["error"] else [])]
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=int, default=TARGET_N, help=f"students at once (default {TARGET_N})")
    ap.add_argument("--labs", default="01,05,10", help="labs, by number (default 01,05,10)")
    ap.add_argument("--memory-mb", type=int, default=3072, help="each student's memory limit (default 3072)")
    ap.add_argument("--lab10", choices=("launcher", "all"), default="launcher",
                    help="Lab 10's cells: its launcher cells only (default) or all, frameworks included")
    ap.add_argument("--lab10-students", type=int, default=None,
                    help="students for Lab 10 (default: --students)")
    ap.add_argument("--grading-under-load", action="store_true",
                    help="also grade --submissions honest Lab 05 submissions at --jobs while --load-students "
                         "run Lab 10")
    ap.add_argument("--load-students", type=int, default=3)
    ap.add_argument("--submissions", type=int, default=6)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--skip-labs", action="store_true", help="only the grading under load")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--student", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.student:
        return student_main(*args.student)

    budget = cgroups.cpu_budget()
    print(f"CPU budget: {budget.cpus} CPUs ({budget.source}); {os.cpu_count()} CPUs on the machine; "
          f"memory limit per student {args.memory_mb} MB; load average {os.getloadavg()[0]:.2f}", flush=True)
    memory_bytes = args.memory_mb << 20
    probe = cgroups.Child.make(f"dtlabs-bench-class-{os.getpid()}-probe", cpus=budget.cpus, memory_bytes=memory_bytes)
    if probe is None:
        print("cannot make a child cgroup with a CPU quota and a memory limit under this process's own: run as root, "
              "or in a cgroup delegated to you (cgroup v2 with the cpu and memory controllers enabled below it)",
              file=sys.stderr)
        return 2
    probe.remove()
    live: list = []  # the cgroups that exist now: removed on any exit

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    missed, figures = [], {"budget": budget.cpus, "labs": {}}
    root = Path(tempfile.mkdtemp(prefix="dtlabs-bench-class-"))
    try:
        for lab in ([] if args.skip_labs else [x.strip().zfill(2) for x in args.labs.split(",") if x.strip()]):
            n = args.lab10_students if lab == "10" and args.lab10_students else args.students
            alone_s, alone_res = run_cohort(f"{lab}-alone", lab, 1, budget.cpus, memory_bytes, args.lab10, root, live)
            print(f"Lab {lab}: one student alone: {alone_s:.0f} s", flush=True)
            makespan, results = run_cohort(f"{lab}-class", lab, n, budget.cpus / n, memory_bytes, args.lab10, root,
                                           live)
            s = summarize(lab, n, alone_s, alone_res, makespan, results)
            figures["labs"][lab] = s
            missed += print_lab(s, budget.cpus)
            sys.stdout.flush()
        if args.grading_under_load:
            print(f"\ngrading {args.submissions} honest Lab 05 submissions at --jobs {args.jobs} while "
                  f"{args.load_students} students run Lab 10 ({args.lab10} cells)", flush=True)
            g = grading_under_load(args.load_students, args.submissions, args.jobs, budget.cpus, memory_bytes,
                                   args.lab10, root, live)
            figures["grading_under_load"] = g
            lost = {s: ids for s, ids in g["lost"].items() if ids}
            print(f"  graded in {g['grade_s']:.0f} s (the Lab 10 students still running at its end: "
                  f"{g['load_busy_at_end']}); points: "
                  + " ".join(f"{a:g}/{m:g}" for a, m in g["points"].values()))
            print(f"  Lab 10 students under the grading: {len(g['load_failures'])} failed cells "
                  + "; ".join(g["load_failures"][:4]))
            ok = not lost and all(m > 0 for _, m in g["points"].values())
            print(f"  target no honest submission loses a point: {'PASS' if ok else 'FAIL'}"
                  + (f" (lost: {lost})" if lost else ""))
            missed += [] if ok else ["grading under load"]
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every student", file=sys.stderr)
        return 130
    finally:
        cleanup(live)
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    print("\n" + ("all targets met" if not missed else "MISSED: " + ", ".join(missed)))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
