"""Grader kernels forked from a warm server (lab_utils.warm, .provisioner) keep a kernel's lifecycle:
an interrupt, a restart, a kill, the death of the process that started it and the token grading reaps by all mean
what they mean for a cold kernel; where no warm start is possible the kernel starts cold and says why."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from lab_utils import warm
from lab_utils.grading import processes_with_token
from lab_utils.grading.split import provisioner
from lab_utils.grading.split.kernels import PrivateSocketKernelManager

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked kernels are Linux's")

PROBE = "import os, json; print(json.dumps({'pid': os.getpid(), 'pgid': os.getpgid(0), 'sid': os.getsid(0)}))"


async def _run(kc, code: str, timeout: float = 60) -> dict:
    """Execute ``code``; its stdout text and the reply's status."""
    out = []
    reply = await kc.execute_interactive(code, timeout=timeout,
                                         output_hook=lambda m: out.append(m["content"].get("text", "")))
    return {"status": reply["content"]["status"], "ename": reply["content"].get("ename"), "text": "".join(out)}


async def _started(km):
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    return kc


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_a_grader_kernel_is_forked_warm_and_is_what_a_cold_one_would_be(no_leaked_processes, tmp_path):
    token = "warm-" + os.urandom(8).hex()

    async def go():
        km = PrivateSocketKernelManager(kernel_name="python3")
        env = {**os.environ, "DTLABS_GRADING_TOKEN": token, "PYTHONSAFEPATH": "1"}
        await km.start_kernel(env=env, cwd=str(tmp_path))
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            assert km.provisioner.warm, f"the kernel started cold: {km.provisioner.cold_reason}"
            r = await _run(kc, PROBE + "\nimport sys; print(os.getcwd()); print('' in sys.path)\n"
                               "print(get_ipython().kernel.parent.parent_handle == int(os.environ['JPY_PARENT_PID']))\n"
                               "import gc; print(gc.get_freeze_count() > 10_000, gc.isenabled())")
            info = json.loads(r["text"].splitlines()[0])
            # its folder, not on its path (PYTHONSAFEPATH), and the parent ipykernel reads from JPY_PARENT_PID at import
            # ... and its collector leaves the server's objects (frozen before the fork) alone: no copy of their pages;
            # it collects (the server runs without the collector, a kernel runs cells)
            assert r["text"].splitlines()[1:] == [str(tmp_path), "False", "True", "True True"], r["text"]
            kernel = psutil.Process(info["pid"])
            assert info["pid"] == km.provisioner.pid == info["pgid"] == info["sid"], (
                "the forked kernel must lead its own session and group, as a cold one does: an interrupt or a kill "
                f"goes to that group ({info})")
            assert kernel.parent().name() == "dtlabs-warm"
            # grading reaps by the token in /proc/PID/environ: a forked kernel shows its own environment there
            assert [p.pid for p in processes_with_token(token)] == [info["pid"]], (
                "the grading token does not find the forked kernel: it would outlive its grading")
            assert "ipykernel_launcher" in " ".join(kernel.cmdline())
            assert kernel.name() == psutil.Process().name(), "a forked kernel goes by the server's name"
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
        assert _gone(info["pid"])

    asyncio.run(go())


def test_interrupt_restart_and_kill_keep_their_meaning(no_leaked_processes):
    async def go():
        km = PrivateSocketKernelManager(kernel_name="python3")
        kc = await _started(km)
        try:
            assert km.provisioner.warm, km.provisioner.cold_reason
            first = json.loads((await _run(kc, PROBE))["text"])["pid"]
            # an interrupt stops a running cell with KeyboardInterrupt, and the kernel lives on
            running = asyncio.ensure_future(_run(kc, "import time; time.sleep(120)", timeout=90))
            await asyncio.sleep(1.5)
            t0 = time.monotonic()
            await km.interrupt_kernel()
            r = await running
            assert r["ename"] == "KeyboardInterrupt" and time.monotonic() - t0 < 15, r
            assert json.loads((await _run(kc, PROBE))["text"])["pid"] == first
            # a restart is a new kernel, forked warm again, with a fresh namespace
            await _run(kc, "marker = 1")
            await km.restart_kernel(now=True)
            await kc.wait_for_ready(timeout=60)
            assert km.provisioner.warm, km.provisioner.cold_reason
            assert _gone(first), "the kernel before the restart is still there"
            r = await _run(kc, PROBE + "\nprint('marker' in globals())")
            second = json.loads(r["text"].splitlines()[0])["pid"]
            assert second != first and r["text"].splitlines()[1] == "False", r
            # a kill takes the kernel and what it started in its group
            r = await _run(kc, "import subprocess; print(subprocess.Popen(['sleep', '300']).pid)")
            sleeper = int(r["text"])
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
        assert _gone(second) and _gone(sleeper), "a killed kernel left itself or its children behind"

    asyncio.run(go())


CLIENT = """
import asyncio, os, sys
from lab_utils.grading.split.kernels import PrivateSocketKernelManager
async def go():
    km = PrivateSocketKernelManager(kernel_name="python3")
    await km.start_kernel()
    kc = km.client(); kc.start_channels(); await kc.wait_for_ready(timeout=60)
    print(km.provisioner.pid, km.provisioner.warm, flush=True)
    await asyncio.sleep(300)
asyncio.run(go())
"""


@pytest.mark.parametrize("shared", [True, False], ids=["server-of-another-process", "own-server"])
def test_a_kernel_dies_with_the_process_that_started_it(no_leaked_processes, monkeypatch, shared, tmp_path):
    """As a cold kernel's parent poller ends it: whether the client used an inherited server (which kills the kernel
    when the client's connection closes) or its own (which dies with the client, and its kernels with it)."""
    monkeypatch.delenv(warm.ADDRESS_VAR, raising=False)  # this process's own server, not one an xdist controller shares
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the killed client's connection file stays there, not in /tmp
    if shared:
        env.update(warm.shared_env(env))
        assert warm.ADDRESS_VAR in env
    else:
        env.pop(warm.ADDRESS_VAR, None)
    client = subprocess.Popen([sys.executable, "-c", CLIENT], env=env, stdout=subprocess.PIPE, text=True)
    try:
        pid, was_warm = client.stdout.readline().split()
    finally:
        client.kill()
        client.wait()
    assert was_warm == "True"
    assert _gone(int(pid)), "a forked kernel outlived the process that started it"
    if shared:  # the server lives on for the other processes it serves, and still forks
        server = warm.own_server(warm.KERNEL, dict(os.environ))
        time.sleep(0.5)
        assert server.proc.poll() is None and server.error is None, server.error
        assert json.loads(env[warm.ADDRESS_VAR])[0] == server.address
        assert warm.fork(warm.KERNEL, ["--version"], dict(os.environ), "/").wait(60) == 0


def test_a_kernel_starts_cold_and_says_why_where_warm_start_is_off_or_impossible(no_leaked_processes, monkeypatch):
    said = []

    async def go():
        km = PrivateSocketKernelManager(kernel_name="python3")
        monkeypatch.setattr(km.log, "warning", lambda fmt, *a: said.append(fmt % a))
        kc = await _started(km)
        try:
            prov = km.provisioner
            said_back = (await _run(kc, "print(6 * 7)"))["text"]
            return getattr(prov, "warm", None), getattr(prov, "cold_reason", None), said_back
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)

    def refuse(*a, **k):
        raise warm.Refused("the test's server cannot start")

    monkeypatch.setattr(warm, "fork", refuse)
    provisioner._SAID.clear()
    assert asyncio.run(go()) == (False, "the test's server cannot start", "42\n")
    assert said == ["dtlabs: this kernel starts cold: the test's server cannot start"]
    monkeypatch.undo()
    monkeypatch.setenv("DTLABS_WARM_KERNELS", "0")  # off: jupyter_client's own LocalProvisioner, as before
    assert asyncio.run(go()) == (None, None, "42\n")
    assert provisioner.why_cold([sys.executable, "-m", "ipykernel_launcher"]) == "c.DTLabs.warm_kernels is off"


SAME_USER_OTHER_GROUP = """
import os, sys
from lab_utils import warm
print(os.getgid(), warm.fork(warm.KERNEL, ["--version"], dict(os.environ), "/").wait(60), flush=True)
"""
OTHER_USER = """
import json, os, socket, sys
conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    conn.connect(json.loads(os.environ[sys.argv[1]])[0])
except PermissionError:  # the server's folder is its user's alone
    print(os.getuid(), "unreachable", flush=True)
    sys.exit()
conn.settimeout(60)
try:
    socket.send_fds(conn, [json.dumps({"argv": ["--version"], "env": {}, "cwd": "/"}).encode()], [0, 1, 2])
    print(os.getuid(), conn.recv(1 << 16).decode() or "closed", flush=True)
except OSError as exc:  # closed before or after the request was read
    print(os.getuid(), "closed", type(exc).__name__, flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start processes of another user and group")
def test_the_server_forks_for_its_own_user_whatever_the_group_and_for_no_other(no_leaked_processes, monkeypatch):
    """The server reads its caller's user from SO_PEERCRED (pid, uid, gid). It read the gid: an ordinary user, whose
    group id is not their user id, had every kernel refused ("Connection reset by peer") and started cold. Another
    user cannot reach its socket at all: it is a file in a folder of the server's user alone (an abstract name, as
    it was, let any local user connect)."""
    monkeypatch.delenv(warm.ADDRESS_VAR, raising=False)
    env = {**os.environ, **warm.shared_env(dict(os.environ))}
    assert warm.ADDRESS_VAR in env
    served = subprocess.run([sys.executable, "-c", SAME_USER_OTHER_GROUP], env=env, group=65534, extra_groups=[],
                            capture_output=True, text=True, timeout=120)
    # the forked kernel prints its version first, on the stdout it was handed
    assert served.stdout.splitlines()[-1].split() == ["65534", "0"], served.stdout + served.stderr
    # the other user's client needs only the standard library: the system's Python, which that user can run
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if not system_python:
        pytest.skip("no /usr/bin/python3 for the other user's client")
    refused = subprocess.run([system_python, "-I", "-c", OTHER_USER, warm.ADDRESS_VAR], env=env, user=65534, group=65534,
                             extra_groups=[], capture_output=True, text=True, timeout=120, cwd="/")
    assert refused.stdout.split()[:2] == ["65534", "unreachable"], refused.stdout + refused.stderr


UNDER_A_KERNEL = """
import os, subprocess, sys
# the child asks the server the grading shares (ADDRESS_VAR); its parent's command line is a kernel's or not
code = "import os; from lab_utils import warm; print(warm.fork(warm.KERNEL, ['--version'], dict(os.environ), '/', own=False).wait(60))"
child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
print(child.stdout.strip().splitlines()[-1] if child.returncode == 0 else "refused: " + child.stderr.strip()[-200:])
"""


def test_the_server_forks_nothing_a_kernel_started(no_leaked_processes, monkeypatch):
    """In unprotected grading the subject is a child of the grader kernel and of the grader's own user: a fork it
    asked the warm server for would run outside its Landlock domain. The server walks its caller's parents up to its
    own starter and refuses one that passes through a kernel."""
    monkeypatch.delenv(warm.ADDRESS_VAR, raising=False)
    env = {**os.environ, **warm.shared_env(dict(os.environ))}
    runs = {label: subprocess.run([sys.executable, "-c", UNDER_A_KERNEL, *extra], env=env, capture_output=True,
                                  text=True, timeout=120).stdout.strip().splitlines()[-1]
            for label, extra in (("plain", []), ("kernel", ["-m", "ipykernel_launcher", "-f", "x.json"]))}
    assert runs["plain"] == "0", runs
    assert "Refused: the warm server did not fork" in runs["kernel"], runs


def test_the_server_serves_only_kernels_of_its_import_environment(no_leaked_processes, monkeypatch):
    env = dict(os.environ)
    warm.own_server(warm.KERNEL, env)
    with pytest.raises(warm.Refused, match="import environment differs"):
        warm._request(warm.own_server(warm.KERNEL, env).address, ["--version"], {**env, "PYTHONPATH": "/elsewhere"},
                      "/", (0, 1, 2))
    child = warm.fork(warm.KERNEL, ["--version"], {**env, "OMP_NUM_THREADS": "1"}, "/")  # another key: another server
    assert child.wait(60) == 0


def test_doctor_says_whether_kernels_start_warm(monkeypatch):
    assert provisioner.doctor_line().startswith("kernels     warm")
    monkeypatch.setenv("DTLABS_WARM_KERNELS", "0")
    assert provisioner.doctor_line() == ("kernels     cold (each grader kernel starts a fresh interpreter): "
                                         "c.DTLabs.warm_kernels is off")


def test_the_warm_provisioner_is_a_registered_entry_point_and_only_our_manager_picks_it():
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.provisioning import KernelProvisionerFactory

    assert provisioner.NAME in KernelProvisionerFactory.instance().get_provisioner_entries()
    spec = PrivateSocketKernelManager(kernel_name="python3").kernel_spec
    assert spec.metadata["kernel_provisioner"]["provisioner_name"] == provisioner.NAME
    # JupyterLab's kernels (a student's) come from the plain spec: no provisioner named, LocalProvisioner
    assert "kernel_provisioner" not in KernelSpecManager().get_kernel_spec("python3").metadata


def test_an_install_without_the_entry_point_starts_kernels_cold_and_says_so(monkeypatch):
    """A venv installed before the entry point existed (pip install -e . registers it): kernels still start."""
    from jupyter_client.provisioning import KernelProvisionerFactory

    monkeypatch.setattr(KernelProvisionerFactory, "_check_availability", lambda self, name: name != provisioner.NAME)
    monkeypatch.setattr(KernelProvisionerFactory, "get_provisioner_entries", lambda self: {})
    assert "kernel_provisioner" not in PrivateSocketKernelManager(kernel_name="python3").kernel_spec.metadata
    assert "not registered" in provisioner.why_cold([sys.executable, "-m", "ipykernel_launcher"])


def test_a_kernel_of_another_interpreter_path_forks_from_a_server_on_that_path(tmp_path, no_leaked_processes):
    """A kernelspec reaching this venv through another path (tests/labs/test_labs.py's "My Courses" kernel) sees that path
    as sys.executable and hands it to what it starts: its kernels fork from a server started on that path. An
    interpreter that cannot run the server (no lab_utils there) starts its kernels cold, saying why."""
    link = tmp_path / "My Courses"
    link.symlink_to(sys.prefix)
    other = str(link) + sys.executable[len(sys.prefix):]
    assert provisioner.why_cold([other, "-m", "ipykernel_launcher", "-f", "x.json"]) is None
    assert warm.fork(warm.KERNEL, ["--version"], dict(os.environ), "/", executable=other).wait(60) == 0
    server = warm.own_server(warm.KERNEL, dict(os.environ), executable=other)
    assert psutil.Process(server.proc.pid).cmdline()[0] == other
    foreign = "/usr/bin/python3"
    if os.path.exists(foreign):
        with pytest.raises(warm.Refused):
            warm.fork(warm.KERNEL, ["--version"], {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "/",
                      executable=foreign)


@pytest.mark.slow
def test_an_autograde_forks_its_grader_kernel_from_the_grading_process_server(synthetic_course, tmp_path,
                                                                             no_leaked_processes, monkeypatch):
    """The nbgrader run an autograde starts is handed this process's kernel server (ADDRESS_VAR) and forks its
    grader kernel there: the server reaps it (its children's CPU grows) and no kernel says it started cold."""
    import shutil

    import nbformat

    from lab_utils import grading

    lab = "00_synthetic"
    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    rel = nbformat.read(str(root / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    src = nbformat.read(str(root / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    grading.submit(root, "alice", lab, grading.fill_solutions(rel, src))
    monkeypatch.delenv(warm.ADDRESS_VAR, raising=False)  # the grading process's own server, not an xdist controller's
    server = warm.own_server(warm.KERNEL, dict(os.environ))
    before = psutil.Process(server.proc.pid).cpu_times()
    run = grading.autograde(lab, course_root=root)
    after = psutil.Process(server.proc.pid).cpu_times()
    assert run.returncode == 0, run.output[-3000:]
    assert "starts cold" not in run.output, run.output[-3000:]
    assert after.children_user + after.children_system > before.children_user + before.children_system, (
        "no kernel forked by the grading process's server ended during the autograde")


def test_the_openblas_a_kernel_sets_threads_of_is_found_under_a_path_with_spaces():
    """A course under a folder with a space: the mapped library's path is the rest of the maps line, not its last
    word (a kernel forked in "/tmp/ci x/..." failed to set itself up)."""
    from lab_utils.warm.forked import mapped_files

    lines = ["7f00-7f10 r-xp 00000000 08:01 123   /tmp/my course/.venv/numpy.libs/libscipy_openblas64_-32a.so\n",
             "7f10-7f20 r--p 00000000 08:01 124   /usr/lib/libc.so.6\n", "7f20-7f30 rw-p 00000000 00:00 0\n"]
    assert mapped_files(lines, "openblas") == {"/tmp/my course/.venv/numpy.libs/libscipy_openblas64_-32a.so"}
