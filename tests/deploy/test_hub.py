"""The course on a real JupyterHub with nbgrader's exchange (grader/hub/hub.sh), driven as its people use it:
students in headless Chromium (Debian's), the instructor in a terminal, every one of them an ordinary Unix user.

- A student logs in (PAM), fetches Lab 01 from the Assignments list, runs a ``launch`` cell and a ``%%distributed``
  cell (both ranks' output in the cell), answers two exercises (one right, one known-wrong), validates, submits. A
  classmate fetches and submits from a terminal, and cannot read the first one's submission. The instructor
  collects (``nbgrader collect``), grades (``dtlabs grade``: sandboxed), and releases the feedback
  (``nbgrader release_feedback``). The student fetches it and sees their score and the failing test's message, and
  no hidden test's code.
- Two students run a 2-rank ``launch`` at the same moment: both succeed; their ranks share no port (a port is
  (network namespace, number): equal numbers in two namespaces are two ports), socket, /dev/shm name or temporary
  path; neither can signal the other's ranks or read their environment or files.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path

import nbformat
import pytest

from helpers.browser import CELLS, CHROMIUM_ARGS, find_chromium, wait_prompt
from deploy_helpers import (
    REPO, STUDENTS, TEACHER, TIMINGS, WRITES_GRADEBOOK, home, processes_of, report, run_as, teacher_env, user_env,
    wait_for,
)

from lab_utils import grading
from lab_utils.grading.course import split_hidden

pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group(WRITES_GRADEBOOK)]  # which worker: conftest.py
LAB = "01_ddp_setup"
ALICE, BOB = STUDENTS
ARTIFACTS = REPO / "test-artifacts" / "hub"
HUB_VENV = Path("/opt/dtlabs/venv")
# JupyterLab settings of the test's students: every cell in the DOM, so cell i is the i-th .jp-Cell
QUIET = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"}}


@pytest.fixture(scope="module")
def chromium():
    path, why = find_chromium()
    if path is None:
        pytest.skip(why)
    return path


def _settle_students():
    for user in STUDENTS:
        for rel, value in QUIET.items():
            f = home(user) / ".jupyter" / "lab" / "user-settings" / rel
            run_as(user, ["mkdir", "-p", f.parent])
            run_as(user, ["bash", "-c", f"cat > {shlex.quote(str(f))}"], input=json.dumps(value))


def _login(context, hub, user, password):
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{hub['url']}/hub/login")
    page.fill("input#username_input", user)
    page.fill("input#password_input", password)
    page.click("#login_submit")
    page.wait_for_selector(".jp-LabShell", timeout=180_000)  # the hub starts the user's JupyterLab as that user
    return page


def _assignments(page):
    page.click(".lm-MenuBar-itemLabel:text-is('Nbgrader')")
    page.click(".lm-Menu-itemLabel:text-is('Assignment List')")
    page.wait_for_selector("#released_assignments_list")
    return page.locator("#nbgrader-assignment-list")


def _run_cell(page, i: int, timeout_s: float) -> str:
    """Run cell i (Shift+Enter on its prompt), wait until it has finished; its output text."""
    page.locator(CELLS).nth(i).locator(".jp-InputArea-prompt").first.click()
    page.keyboard.press("Escape")
    page.keyboard.press("Shift+Enter")
    if not wait_prompt(page, i, r"^\[(\*|\d+)\]:?$", 15_000):  # a lost keypress on a busy page: once more
        page.locator(CELLS).nth(i).locator(".jp-InputArea-prompt").first.click()
        page.keyboard.press("Escape")
        page.keyboard.press("Shift+Enter")
    assert wait_prompt(page, i, r"^\[\d+\]:?$", timeout_s * 1000), f"cell {i} did not finish in {timeout_s:.0f} s"
    return page.locator(CELLS).nth(i).locator(".jp-OutputArea").first.inner_text()


def _type_into_cell(page, i: int, source: str) -> None:
    editor = page.locator(CELLS).nth(i).locator(".cm-content").first
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(source)  # as pasted: no auto-indent or auto-closed brackets
    page.keyboard.press("Escape")


def _cell_index(nb, test) -> int:
    return next(i for i, c in enumerate(nb.cells) if test(c))


@pytest.mark.timeout(1500)
def test_student_fetches_works_submits_and_reads_feedback(hub, course, passwords, chromium):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    env = teacher_env(course)
    nbgrader = [str(course / ".venv" / "bin" / "nbgrader")]
    run_as(TEACHER, [*nbgrader, "release_assignment", LAB, "--force"], cwd=course, env=env)
    _settle_students()
    release = nbformat.read(str(course / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    source = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    from helpers.known_wrong import read_known_wrong

    wrong = read_known_wrong(REPO / "grader" / "known_wrong" / LAB / "shard_same_shuffle_every_epoch.py")
    answers = {"ring_all_reduce": grading.solution_cells(source)["ring_all_reduce"], wrong.replaces: wrong.source}
    gid = lambda c: c.metadata.get("nbgrader", {}).get("grade_id")  # noqa: E731
    launch_cell = _cell_index(release, lambda c: c.cell_type == "code" and "launch(hello" in c.source)
    dist_cell = _cell_index(release, lambda c: c.source.startswith("%%distributed") and "all_reduce" in c.source)
    said, timings, t0 = [], {}, time.monotonic()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = None
        try:
            page = _login(context, hub, ALICE, passwords[ALICE])
            timings["logged in, JupyterLab up"] = time.monotonic() - t0
            panel = _assignments(page)
            panel.locator("#released_assignments_list .list_item", has_text=LAB).locator("button",
                                                                                         has_text="Fetch").click()
            fetched = panel.locator("#fetched_assignments_list .list_item", has_text=LAB).first
            fetched.wait_for()
            assert (home(ALICE) / LAB / f"{LAB}.ipynb").is_file(), "Fetch put no notebook in the student's home"
            page.goto(f"{hub['url']}/user/{ALICE}/lab/tree/{LAB}/{LAB}.ipynb")
            page.wait_for_selector(CELLS)
            page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\|\s*Idle\s*$")).first.wait_for(timeout=90_000)
            timings["Lab 01 fetched and open"] = time.monotonic() - t0

            # the demos up to the %%distributed all-reduce: a launch and persistent ranks, output in the cell
            outputs = {}
            for i in range(dist_cell + 1):
                if release.cells[i].cell_type == "code":
                    outputs[i] = _run_cell(page, i, 180)
            for i in (launch_cell, dist_cell):
                assert "[rank 0]" in outputs[i] and "[rank 1]" in outputs[i], f"cell {i}: {outputs[i][:800]}"
            said.append(f"launch cell {launch_cell}: {outputs[launch_cell].splitlines()[0]!r}; "
                        f"%%distributed cell {dist_cell}: {' | '.join(outputs[dist_cell].splitlines()[:2])!r}")
            timings["launch and %%distributed ran"] = time.monotonic() - t0
            page.screenshot(path=str(ARTIFACTS / "alice-ranks.png"))

            for grade_id, text in answers.items():
                _type_into_cell(page, _cell_index(release, lambda c: gid(c) == grade_id), text)
            page.keyboard.press("Control+s")
            page.wait_for_timeout(1500)
            saved = nbformat.read(str(home(ALICE) / LAB / f"{LAB}.ipynb"), as_version=4)
            assert {gid(c): c.source for c in saved.cells if gid(c) in answers} == answers, "the answers were not saved"

            page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .validate-button").first.click()
            dialog = page.locator(".jp-Dialog", has_text="Validation").first
            dialog.wait_for(timeout=400_000)
            verdict = dialog.inner_text()
            page.screenshot(path=str(ARTIFACTS / "alice-validate.png"))
            assert "the shuffle must change every epoch" in verdict, verdict[:2000]
            said.append(f"Validate: {verdict.splitlines()[0]!r}, names the known-wrong answer's failing check")
            page.keyboard.press("Escape")
            timings["validated"] = time.monotonic() - t0

            panel = _assignments(page)
            panel.locator("#fetched_assignments_list .list_item", has_text=LAB).locator("button",
                                                                                        has_text="Submit").first.click()
            panel.locator("#submitted_assignments_list .list_item", has_text=LAB).first.wait_for(timeout=60_000)
            timings["submitted"] = time.monotonic() - t0

            # a classmate, from a terminal: fetch and submit the untouched lab; she cannot see the other submission
            bob_env = user_env(BOB, PATH=f"{HUB_VENV}/bin:/usr/bin:/bin")
            run_as(BOB, ["nbgrader", "fetch_assignment", LAB], env=bob_env)
            run_as(BOB, ["nbgrader", "submit", LAB], env=bob_env)
            inbound = hub["exchange"] / "dtlabs" / "inbound"
            peek = run_as(BOB, ["ls", inbound], check=False, env=bob_env)
            assert peek.returncode != 0 and "Permission denied" in peek.stderr, "a student can list the inbound folder"
            said.append("classmate: fetch and submit from a terminal; the inbound folder is not listable")

            # the instructor: collect, grade (sandboxed), feedback back through the exchange
            run_as(TEACHER, [*nbgrader, "collect", LAB], cwd=course, env=env)
            for s in (ALICE, BOB):
                assert (course / "grader" / "work" / "submitted" / s / LAB / f"{LAB}.ipynb").is_file()
            g0 = time.monotonic()
            graded = run_as(TEACHER, [str(course / ".venv" / "bin" / "dtlabs"), "grade", LAB, "--jobs", "2"],
                            cwd=course, env=env, timeout=900)
            timings["instructor: dtlabs grade, 2 submissions"] = time.monotonic() - g0
            assert "sandbox: bwrap" in graded.stdout, graded.stdout
            line = next(ln for ln in graded.stdout.splitlines() if f"{ALICE}/{LAB}:" in ln)
            said.append(f"dtlabs grade: {line.strip()}")
            run_as(TEACHER, [*nbgrader, "release_feedback", LAB], cwd=course, env=env)
            timings["feedback released"] = time.monotonic() - t0

            panel = _assignments(page)
            panel.locator("#refresh_assignments_list").click()
            item = panel.locator("#submitted_assignments_list .list_item", has_text=LAB).first
            item.locator("button", has_text="Fetch Feedback").click()
            link = item.locator("a", has_text=re.compile("view feedback", re.I)).first
            link.wait_for(timeout=60_000)
            link.click()  # the file browser goes to the feedback's folder; the student opens the page there
            page.locator(".jp-DirListing-item", has_text=f"{LAB}.html").first.dblclick()
            viewer = page.frame_locator(".jp-HTMLViewer:not(.lm-mod-hidden) iframe").first
            viewer.locator("body").wait_for(timeout=30_000)
            text = viewer.locator("body").inner_text()
            page.screenshot(path=str(ARTIFACTS / "alice-feedback.png"))
            html = "\n".join(p.read_text(errors="replace") for p in (home(ALICE) / LAB / "feedback").rglob("*.html"))
            timings["feedback read"] = time.monotonic() - t0
        except BaseException:
            if page is not None:
                page.screenshot(path=str(ARTIFACTS / "failure.png"))
            raise
        finally:
            context.close()
            browser.close()
    for line in said:
        report(f"[hub] {line}")
    report("[hub] timings (s since start): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    TIMINGS.update({f"hub flow: {k}": v for k, v in timings.items()})

    earned = re.search(r"Score:\s*([\d.]+)\s*/\s*([\d.]+)", text)
    assert earned, f"no score in the feedback:\n{text[:1500]}"
    ring_points = next(c.metadata["nbgrader"]["points"] for c in source.cells if gid(c) == "test_ring_all_reduce")
    assert float(earned.group(1)) >= ring_points and float(earned.group(1)) < float(earned.group(2)), earned.group(0)
    assert "the shuffle must change every epoch" in text, "the failing test's message is missing from the feedback"
    hidden = [line.strip() for c in source.cells if (c.metadata.get("nbgrader") or {}).get("grade")
              for line in split_hidden(c.source)[1] if len(line.strip()) > 12]
    assert hidden, "Lab 01 should have hidden tests"
    leaked = [line for line in hidden if line in html or line in text]
    assert not leaked, f"hidden test code in the student's feedback: {leaked[:3]}"


TWIN = """
import os, tempfile, time, torch, torch.distributed as dist
from lab_utils import launch

def hold(release):
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    with tempfile.NamedTemporaryFile(prefix="dtlabs-twin-") as f:  # a temporary path of the rank's own
        deadline = time.monotonic() + 180
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.1)  # both students' ranks are alive together until the test has looked at them
    dist.all_reduce(t)
    netns = os.readlink("/proc/self/ns/net")  # the rendezvous port is a port in this namespace
    print(f"pid {os.getpid()} netns {netns} port {os.environ['MASTER_PORT']} tmp {f.name} sum {t.item()}")
    return os.getpid()

pids = launch(hold, world_size=2, args=(RELEASE,), timeout=240)
pids
"""


def _ranks(user) -> list:
    return [p for p in processes_of(user) if p.name().startswith("dtlabs-rank")]


def _sockets(pid: int) -> tuple[set, set]:
    """The TCP ports ((network namespace, port)) and Unix socket names (an abstract name with its namespace) that
    ``pid`` holds, from the tables of its own namespace (/proc/PID/net): psutil reads the caller's namespace's,
    where the sockets of ranks in a private one are not."""
    ns = os.readlink(f"/proc/{pid}/ns/net")
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    ports, unix = set(), set()
    for table in ("tcp", "tcp6"):
        for line in open(f"/proc/{pid}/net/{table}").readlines()[1:]:
            f = line.split()
            if f[9] in inodes:
                ports.add((ns, int(f[1].rsplit(":", 1)[1], 16)))
    for line in open(f"/proc/{pid}/net/unix").readlines()[1:]:
        f = line.split()
        if len(f) >= 8 and f[6] in inodes:
            unix.add((ns, f[7]) if f[7].startswith("@") else f[7])
    return ports, unix


def _footprint(procs) -> dict:
    """What processes hold: TCP ports, Unix socket names, /dev/shm and /tmp paths."""
    ports, unix, paths = set(), set(), set()
    for p in procs:
        try:
            held = _sockets(p.pid)
            ports |= held[0]
            unix |= held[1]
            for f in p.open_files():
                if f.path.startswith(("/tmp", "/dev/shm", "/run/user")):
                    paths.add(f.path)
            for m in p.memory_maps(grouped=True):
                if m.path.startswith(("/dev/shm", "/tmp")):
                    paths.add(m.path)
        except Exception:  # noqa: BLE001 - a process that ended meanwhile
            pass
    return {"ports": ports, "unix": unix, "paths": paths}


@pytest.mark.timeout(900)
def test_two_students_launch_at_once(hub, passwords, chromium):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    release = hub["exchange"].parent / "release-ranks"  # the test's signal to the ranks that it has looked
    release.unlink(missing_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(TWIN.replace("RELEASE", repr(str(release))).strip())])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    for user in STUDENTS:
        run_as(user, ["bash", "-c", "cat > concurrent.ipynb"], input=nbformat.writes(nb))
    _settle_students()
    said = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        pages = {}
        try:
            for user in STUDENTS:
                ctx = browser.new_context(viewport={"width": 1200, "height": 800})
                page = _login(ctx, hub, user, passwords[user])
                page.goto(f"{hub['url']}/user/{user}/lab/tree/concurrent.ipynb")
                page.wait_for_selector(CELLS)
                page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\|\s*Idle\s*$")).first \
                    .wait_for(timeout=90_000)
                pages[user] = page
            t0 = time.monotonic()
            for user, page in pages.items():  # one after the other, milliseconds apart
                page.locator(CELLS).nth(0).locator(".jp-InputArea-prompt").first.click()
                page.keyboard.press("Shift+Enter")
            def inside_hold():  # both ranks of each student's launch in hold(): rendezvous done, temporary file open
                seen = {u: [p for p in _ranks(u) if any("dtlabs-twin-" in f for f in _footprint([p])["paths"])]
                        for u in STUDENTS}  # (a student's other ranks, Lab 01's %dist ones, may be running too)
                return seen if all(len(seen[u]) == 2 for u in STUDENTS) else None

            seen = wait_for(inside_hold, 240, "both students' 2 ranks inside hold()", poll=0.2)
            started = time.monotonic() - t0
            feet = {u: _footprint(processes_of(u)) for u in STUDENTS}  # server, kernel, zygote, ranks
            a, b = (feet[u] for u in STUDENTS)
            assert a["ports"] and b["ports"], f"no TCP port found for a student's processes: {feet}"
            for kind in ("ports", "unix", "paths"):
                assert not (a[kind] & b[kind]), f"{kind} shared between the students' ranks: {a[kind] & b[kind]}"
            # across users: no signal, no environment, no open files; as each of them would try from a terminal
            for me, other in ((ALICE, BOB), (BOB, ALICE)):
                pid = seen[other][0].pid
                sig = run_as(me, ["kill", "-TERM", str(pid)], check=False)
                assert sig.returncode != 0 and "Operation not permitted" in sig.stderr, sig
                for peek_cmd in (["cat", f"/proc/{pid}/environ"], ["ls", f"/proc/{pid}/fd"],
                                 ["head", "-c", "1", f"/proc/{pid}/mem"]):
                    peek = run_as(me, peek_cmd, check=False)
                    assert peek.returncode != 0 and "ermission denied" in peek.stderr, (peek_cmd, peek)
            said.append(f"both students' ranks up {started:.1f} s after the first Shift+Enter; "
                        f"(netns, port) {sorted(a['ports'])} vs {sorted(b['ports'])}; kill/environ/fd/mem across "
                        "users denied")
            release.touch()
            outs = {}
            for user, page in pages.items():
                assert wait_prompt(page, 0, r"^\[\d+\]:?$", 120_000), f"{user}'s launch did not finish"
                outs[user] = page.locator(CELLS).nth(0).locator(".jp-OutputArea").first.inner_text()
            took = time.monotonic() - t0
            for user, text in outs.items():
                assert "[rank 0]" in text and "[rank 1]" in text and text.count("sum 6.0") == 2, f"{user}: {text}"
            mine = {u: set(re.findall(r"netns (\S+) port (\d+)", outs[u])) for u in STUDENTS}
            assert len(mine[ALICE]) == 1 and mine[ALICE] != mine[BOB], mine
            said.append(f"both launches succeeded, {took:.1f} s after the first Shift+Enter: rendezvous ports {mine}")
            TIMINGS["two students' 2-rank launches at once: both ranks up"] = started
            TIMINGS["two students' 2-rank launches at once: both cells done"] = took
            for i, (user, page) in enumerate(pages.items()):
                page.screenshot(path=str(ARTIFACTS / f"{user}-concurrent.png"))
        finally:
            release.touch()  # never leave ranks waiting
            browser.close()
    for line in said:
        report(f"[hub] {line}")
