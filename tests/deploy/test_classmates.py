"""A classmate, for real (issue 50): on the hub, while one student works and the instructor grades, another student
logged in beside them listens everywhere he can and hears nothing of theirs.

- Student A (dtl-alice) runs Lab 01's cells in the kernel her hub server starts for her (its REST and websocket API,
  as JupyterLab drives it, with a token she asked the hub for with her password): the setup, a ``launch``, a
  ``%%distributed`` session; among them cells whose code, printed output and tensors carry secrets of this run: a
  ``launch`` whose 2 ranks all-reduce a secret tensor until the test has looked (rank 0 also hands its tensor over
  through the rendezvous store), a ``%%distributed`` cell that does the same, and, as Labs 05 and 09 do, two torchrun
  agents whose workers all-reduce a secret tensor until the test has looked. Student B (dtl-bob), logged in too,
  runs ``tests/helpers/eavesdrop.py`` from a shell on the machine (the system Python: ``--speak --proc``): every
  listening Unix socket and TCP port he can see, in /proc/net and in every other process's network namespace table,
  connected, subscribed as ZeroMQ's SUB, spoken to as a TCPStore client and an HTTP client; every other user's /proc
  (cmdline, environ, status, maps, fd, net tables, ...). B receives none of A's code, output or tensor values (as
  text, or as their float32 bytes), and A's cells give the right output. B sees A's processes in ps, and none of
  them once /proc is mounted hidepid (``hub.sh hidepid``, on a /proc of the test's own).
- Then the instructor grades Lab 01 (``dtlabs grade``, in a copy of the course, the lab's canary included) while B
  listens the same way: no line of a hidden test reaches him.
- The control: A's server with ``KernelManager.transport = "tcp"`` (her own ~/.jupyter config, in that test only),
  and B hears her cell's code and output. So the silence above is the transport's doing, and the first test fails when
  kernels go back to TCP.
"""
from __future__ import annotations

import json
import random
import secrets
import select
import shutil
import struct
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from deploy_helpers import (
    COURSE_PARENT, REPO, STUDENTS, SYSTEM_PYTHON, TEACHER, TIMINGS, WRITES_GRADEBOOK, _as_user, copy_course, home,
    processes_of, report, run_as, teacher_env, user_env,
)

from hub_api import Student
from lab_utils.grading.course import split_hidden

# on the hub's worker (the hub is that worker's); it grades in a copy of its own, never the course's gradebook
pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group(WRITES_GRADEBOOK)]
LAB = "01_ddp_setup"
ALICE, BOB = STUDENTS
EAVESDROP = REPO / "tests" / "helpers" / "eavesdrop.py"
# a student's own Jupyter config that puts her kernels back on TCP (`--KernelManager.transport=tcp`), in the control only
BACK_TO_TCP = {"KernelManager": {"transport": "tcp", "ip": "127.0.0.1"}}


class Scan:
    """Student B's eavesdropper (tests/helpers/eavesdrop.py --speak --proc), as B, with the system Python; the
    needles go on its stdin, never its command line (which /proc shows everyone)."""

    def __init__(self, needles: list):
        argv = _as_user(BOB, [SYSTEM_PYTHON, "-I", "-c", EAVESDROP.read_text(), "--speak", "--proc", "--stdin",
                              "--ready", "900"], user_env(BOB))
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=str(home(BOB)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.proc.stdin.write(json.dumps(needles) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stderr], [], [], 60)
        line = self.proc.stderr.readline() if ready else ""
        assert line.strip() == "ready", f"B's scanner did not start: {line!r}"

    def stop(self) -> dict:
        out, err = self.proc.communicate("stop\n", timeout=60)  # B stops listening and says what he got
        assert self.proc.returncode == 0, f"B's scanner failed ({self.proc.returncode}): {err[-2000:]}"
        got = json.loads(out.strip().splitlines()[-1])
        got["wall"] = time.monotonic() - self.t0
        return got


def said(got: dict) -> str:
    p = got["proc"]
    return (f"B tried {got['endpoints']} listening endpoints for {got['wall']:.0f} s: {len(got['reached'])} accepted, "
            f"{len(got['spoke'])} answered a TCPStore or HTTP request ({got['store_keys']} store keys read); /proc of "
            f"{p['pids']} other processes: {p['read']} files read, {p['refused']} refused; {got['bytes']} bytes received")


def _secrets() -> dict:
    """This run's secrets: the code's, the output's, and two tensors' values (rank r holds values * (r + 1))."""
    values = [[float(random.randrange(1_000_000, 5_000_000)) for _ in range(4)] for _ in range(3)]
    return {"code": f"dtlabs-code-{secrets.token_hex(8)}", "out": f"dtlabs-out-{secrets.token_hex(8)}",
            "launch": values[0], "dist": values[1], "torchrun": values[2]}


def _needles(s: dict) -> dict:
    """needle -> what it is: the code, the output, each tensor's all-reduced values as printed and every rank's
    float32 bytes (its input, the sum)."""
    out = {s["code"]: "code", s["out"]: "output"}
    for name in ("launch", "dist", "torchrun"):
        out[str([3 * v for v in s[name]])] = f"{name} tensor, as printed"
        for k in (1, 2, 3):
            out["hex:" + struct.pack("<4f", *(k * v for v in s[name])).hex()] = f"{name} tensor x{k}, float32 bytes"
    return out


HOLD = '''
SECRET_CODE = "{code}"  # in the code only: never printed
def hold(release):
    import time
    t = torch.tensor({values}) * (dist.get_rank() + 1)
    deadline = time.monotonic() + 120
    if dist.get_rank() == 0:  # handed over through the rendezvous store too, as a student might
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        store.set("handover", t.numpy().tobytes())
    s = t.clone()
    dist.all_reduce(s)
    print("dtlabs-out-" + "{reversed_hex}"[::-1], "holding", s.tolist(), flush=True)
    while not os.path.exists(release) and time.monotonic() < deadline:
        s = t.clone()
        dist.all_reduce(s)  # the secret tensor crosses between the ranks until the test has looked
        time.sleep(0.05)
    return s.tolist()

print("launch returned", launch(hold, world_size=2, args=({release!r},), timeout=150))
'''
TORCHRUN = '''
import os, tempfile
from lab_utils.labkit.torchrun import run_nodes
# {code}
folder = tempfile.mkdtemp()
with open(os.path.join(folder, "hold.py"), "w") as f:
    f.write("""
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor({values}) * (dist.get_rank() + 1)
s = t.clone()
dist.all_reduce(s)
print("dtlabs-out-" + "{reversed_hex}"[::-1], "holding", s.tolist(), flush=True)
deadline = time.monotonic() + 120
while not os.path.exists({release!r}) and time.monotonic() < deadline:
    s = t.clone()
    dist.all_reduce(s)  # the secret tensor crosses between the nodes' workers until the test has looked
    time.sleep(0.05)
dist.destroy_process_group()
""")
run = run_nodes(os.path.join(folder, "hold.py"), nnodes=2, rdzv="c10d", timeout=150)
print("torchrun ok", run.ok)
'''
DIST = '''%%distributed
# {code}
s = torch.tensor({values}) * (rank + 1)
dist.all_reduce(s)
print("dtlabs-out-" + "{reversed_hex}"[::-1], s.tolist())
'''


@pytest.mark.timeout(600)
def test_a_classmate_hears_nothing_of_a_student_at_work_or_of_the_grading(hub, course, passwords):
    t0 = time.monotonic()
    alice, bob = Student(hub, ALICE, passwords[ALICE]), Student(hub, BOB, passwords[BOB])
    try:
        for s in (alice, bob):  # both logged in: each has a server (B listens from a shell on the machine)
            s.start()
        for s in (alice, bob):
            s.wait_ready()
        TIMINGS["classmates: both students' servers up"] = time.monotonic() - t0
        sec = _secrets()
        needles = _needles(sec)
        outs, heard_a = _alice_works_while_bob_listens(alice, course, hub["exchange"].parent / "release-classmates",
                                                       sec, needles)
        # the instructor grades Lab 01 (its canary: the solution and the release, every hidden test) while B listens
        t2 = time.monotonic()
        hidden = _hidden_needles()
        scan = Scan(hidden)
        try:
            graded = _grade_a_copy(course)
        finally:
            heard_g = scan.stop()
        TIMINGS["classmates: the instructor grades Lab 01 while B listens"] = time.monotonic() - t2
    finally:
        for s in (alice, bob):
            s.stop()
    report(f"[classmates] the instructor graded Lab 01 ({len(hidden)} hidden-test lines as needles): {said(heard_g)}; "
           f"heard: {heard_g['heard'] or 'none'}")
    assert graded.returncode == 0 and "NOT GRADED" not in graded.stdout, graded.stdout[-3000:] + graded.stderr[-2000:]
    leaks = [f"{needles[n]} at {w}" for w, n in heard_a["heard"]] + [f"hidden test {n!r} at {w}"
                                                                       for w, n in heard_g["heard"]]
    assert not leaks, f"B heard {len(leaks)} secrets: " + "; ".join(leaks[:12])


def _alice_works_while_bob_listens(alice, course, release, sec, needles) -> tuple[dict, dict]:
    """A runs Lab 01's first cells, a secret launch and a secret %%distributed cell while B listens; every output is
    what it would be alone (A unharmed). Her outputs by cell, and what B heard."""
    release.unlink(missing_ok=True)
    lab = nbformat.read(str(course / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    code = {i: c.source for i, c in enumerate(lab.cells) if c.cell_type == "code"}
    first = lambda test: next(i for i, src in code.items() if test(src))  # noqa: E731
    hello, start = first(lambda s: "launch(hello" in s), first(lambda s: s.startswith("%load_ext lab_utils"))
    pull = first(lambda s: "%dist pull" in s)
    fill = dict(code=sec["code"], reversed_hex=sec["out"][len("dtlabs-out-"):][::-1])
    t1 = time.monotonic()
    kernel = alice.kernel()
    scan, outs = None, {}
    try:
        scan = Scan(list(needles))
        for i in (first(lambda s: "WORLD_SIZE =" in s), first(lambda s: "prewarm()" in s), hello):
            outs[i] = kernel.run(code[i])
        hold = kernel.execute(HOLD.format(values=sec["launch"], release=str(release), **fill))
        kernel.wait(hold, 180, until=lambda text: text.count("holding") == 2)
        looked = time.monotonic()
        _hidepid_hides_alice()  # her server, kernel, zygote, ranks and their store, in ps or not
        time.sleep(max(0.0, 6 - (time.monotonic() - looked)))  # the ranks all-reduce the secret while B's scanner
        # finds their endpoints and processes (within 2 s)
        release.touch()
        outs["hold"] = kernel.wait(hold, 120)
        for i in sorted(code):  # the %%distributed session, with the secret cell before the pull and stop
            if i == start or (start < i < pull and code[i].startswith(("%%distributed", "%%rank"))):
                outs[i] = kernel.run(code[i])
        outs["dist"] = kernel.run(DIST.format(values=sec["dist"], **fill))
        outs["pull"] = kernel.run("from_ranks = %dist pull s\nprint('pulled', [t.tolist() for t in from_ranks])")
        outs[pull] = kernel.run(code[pull])
        # Lab 05's and 09's way: two torchrun agents (each a "node") whose workers all-reduce a secret tensor
        release.unlink()
        run = kernel.execute(TORCHRUN.format(values=sec["torchrun"], release=str(release), **fill))
        kernel.wait(run, 180, until=lambda text: text.count("holding") == 2)
        time.sleep(6)  # B's scanner finds the agents', workers' and store's endpoints and processes (within 2 s)
        release.touch()
        outs["torchrun"] = kernel.wait(run, 120)
        heard = scan.stop()
        scan = None
    finally:
        release.touch()
        if scan is not None:
            scan.stop()
        kernel.close()
        alice.clean()
    TIMINGS["classmates: A's Lab 01 cells while B listens"] = time.monotonic() - t1
    total = {name: str([3 * v for v in sec[name]]) for name in ("launch", "dist", "torchrun")}
    assert "[rank 0]" in outs[hello] and "[rank 1]" in outs[hello], outs[hello]
    assert outs["hold"].count(sec["out"]) == 2 and f"launch returned [{total['launch']}, {total['launch']}]" \
        in outs["hold"], outs["hold"]
    assert outs["dist"].count(sec["out"]) == 2 and outs["dist"].count(total["dist"]) == 2, outs["dist"]
    assert f"pulled [{total['dist']}, {total['dist']}]" in outs["pull"], outs["pull"]
    assert "x on each rank: [[3.0], [3.0]]" in outs[pull], outs[pull]
    assert outs["torchrun"].count(sec["out"]) == 2 and outs["torchrun"].count(total["torchrun"]) == 2 and \
        "torchrun ok True" in outs["torchrun"], outs["torchrun"]
    report(f"[classmates] A ran Lab 01's cells {sorted(i for i in outs if isinstance(i, int))}, a 2-rank launch, "
           f"a %%distributed cell and a 2-node torchrun run all-reducing secret tensors: all right. {said(heard)}; A's secrets heard: "
           f"{[needles[n] + ' at ' + where for where, n in heard['heard']] or 'none'}")
    return outs, heard


LIST_PIDS = "import os; print(' '.join(p for p in os.listdir('/proc') if p.isdigit()))"


def _hidepid_hides_alice() -> None:
    """What B sees in ps of A's processes (her server, at least): all of them, unless /proc is mounted hidepid; then
    none (``hub.sh hidepid``). Tried on a /proc of the test's own (a mount namespace of its own, a new proc instance:
    Linux 5.8+), never the machine's, which is checked unchanged; skipped where that instance would be the machine's."""
    mine = set(map(str, (p.pid for p in processes_of(ALICE))))
    plain = set(run_as(BOB, [SYSTEM_PYTHON, "-c", LIST_PIDS]).stdout.split())
    before = Path("/proc/self/mountinfo").read_text()
    script = (f'd=$(stat -c %d /proc); mount -t proc proc /proc; [ "$(stat -c %d /proc)" != "$d" ] || exit 77; '
              f'{REPO / "grader" / "hub" / "hub.sh"} hidepid >&2 && runuser -u {BOB} -- {SYSTEM_PYTHON} -c "$1"')
    hid = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", script, "-", LIST_PIDS],
                         capture_output=True, text=True, timeout=60)
    assert Path("/proc/self/mountinfo").read_text() == before, "the machine's /proc mount changed"
    if hid.returncode == 77:
        report("[classmates] hidepid not tried: a new /proc here would share the machine's (Linux before 5.8)")
        return
    assert hid.returncode == 0, hid.stderr
    seen = set(hid.stdout.split())
    strangers = {p for p in seen - {str(q.pid) for q in processes_of(BOB)} if Path(f"/proc/{p}").exists()}
    assert mine and mine & plain and seen and not mine & seen and not strangers, (mine, plain, seen, strangers)
    report(f"[classmates] ps as B: {len(mine & plain)} of A's {len(mine)} processes without hidepid, "
           f"{len(mine & seen)} with `hub.sh hidepid` ({len(seen)} processes visible, all B's)")


def _hidden_needles() -> list:
    """Every hidden test line of Lab 01 longer than 12 characters, as written and as JSON carries it."""
    source = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    lines = {line.strip() for c in source.cells if (c.metadata.get("nbgrader") or {}).get("grade")
             for line in split_hidden(c.source)[1] if len(line.strip()) > 12}
    assert lines, "Lab 01 should have hidden tests"
    return sorted(lines | {json.dumps(line)[1:-1] for line in lines})


def _grade_a_copy(course: Path) -> subprocess.CompletedProcess:
    """``dtlabs grade`` of one Lab 01 submission (the untouched release) in a copy of the course, as the instructor."""
    dest, inbox = COURSE_PARENT / "classmates course", COURSE_PARENT / "classmates inbox"
    copy_course(dest, TEACHER)
    shutil.rmtree(inbox, ignore_errors=True)
    (inbox / ALICE / LAB).mkdir(parents=True)
    shutil.copy(dest / "labs" / LAB / f"{LAB}.ipynb", inbox / ALICE / LAB / f"{LAB}.ipynb")
    subprocess.run(["chown", "-R", f"{TEACHER}:", str(inbox)], check=True)
    env = {**teacher_env(dest), "PATH": f"{course / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin"}
    return run_as(TEACHER, [course / ".venv" / "bin" / "dtlabs", "grade", LAB, "--submissions", inbox,
                            "--no-feedback", "--course-root", dest], cwd=dest, env=env, check=False, timeout=900)


CONTROL = '''import json, time
from ipykernel import get_connection_info
print("transport", json.loads(get_connection_info())["transport"])
for _ in range(30):
    print("dtlabs-out-" + "{reversed_hex}"[::-1], flush=True)  # {code}
    time.sleep(0.1)
'''


@pytest.mark.timeout(300)
def test_the_classmate_hears_a_kernel_on_tcp(hub, passwords):
    """The control: the same scan hears A's cells when her server's kernels are the stock ones on loopback TCP."""
    t0 = time.monotonic()
    alice = Student(hub, ALICE, passwords[ALICE])
    config = home(ALICE) / ".jupyter" / "jupyter_server_config.json"
    if alice._server() is not None:
        alice.stop()
    run_as(ALICE, ["mkdir", "-p", config.parent])
    run_as(ALICE, ["bash", "-c", f"cat > '{config}'"], input=json.dumps(BACK_TO_TCP))
    sec = _secrets()
    try:
        alice.start()
        alice.wait_ready()
        kernel = alice.kernel()
        try:
            scan = Scan([sec["code"], sec["out"]])
            try:
                out = kernel.run(CONTROL.format(code=sec["code"], reversed_hex=sec["out"][len("dtlabs-out-"):][::-1]))
            finally:
                heard = scan.stop()
        finally:
            kernel.close()
            alice.clean()
    finally:
        config.unlink(missing_ok=True)
        alice.stop()
    TIMINGS["classmates control: A on TCP, B listens"] = time.monotonic() - t0
    assert "transport tcp" in out and sec["out"] in out, out
    report(f"[classmates] control, A's kernel on TCP: {said(heard)}; heard {sorted(set(n for _, n in heard['heard']))}")
    assert {n for _, n in heard["heard"]} >= {sec["code"], sec["out"]}, f"B heard too little of a TCP kernel: {heard}"
