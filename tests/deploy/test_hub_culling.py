"""The course's JupyterHub config (grader/hub/jupyterhub_config.py) takes back what sits idle, on a real hub with
short timeouts: after a ``launch`` cell, a user's idle kernel is shut down by their server although a client is still
connected to it, as an open JupyterLab tab is (20 s here, 20 min in a class), and the launcher's zygote goes with it;
then their idle server is stopped by jupyterhub-idle-culler running as the hub's service with only its scopes (60 s
here, 1 h in a class), and none of the user's processes is left.

The hub is a second one, of this test's own (its own state folder and ports, the course's config unchanged, read
through a wrapper that only moves the ports and adds the test's API token), so it runs beside the hub of
tests/deploy/test_hub.py; its user is one of its own (dtl-carol, made and removed here), so the other tests' counts of
their students' processes are untouched. The fast checks of the same config: tests/grading/test_hub_config.py.
"""
from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from deploy_helpers import APART, REPO, TIMINGS, TORCH_SPEC, home, once, processes_of, report, wait_for
from hub_api import Kernel

pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group(APART)]  # which worker: conftest.py

HUB_PREFIX = Path(os.environ.get("DTLABS_HUB_PREFIX", "/opt/dtlabs"))
USER = "dtl-carol"
PORT, HUB_API_PORT, PROXY_API_PORT = 8100, 8181, 8101  # the other hub: 8000, 8081, 8001
KERNEL_IDLE, SERVER_IDLE = 20, 60

WRAPPER = '''# this test's hub: the course's config, on other ports, with the test's token
c = get_config()  # noqa: F821
load_subconfig({config!r})  # noqa: F821
c.JupyterHub.hub_port = {hub_api_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
# the hub reads the proxy's activity every 10 s, not 5 min: exact enough for a 60 s timeout (the course's 1 h needs
# no such change); and the server does not shut itself down first, so that it is the culler that stops it
c.JupyterHub.last_activity_interval = 10
c.Spawner.args = [a for a in c.Spawner.args if "shutdown_no_activity_timeout" not in a] + [
    "--ServerApp.shutdown_no_activity_timeout=3600"]
c.JupyterHub.services = c.JupyterHub.services + [{{"name": "culling-test", "api_token": {token!r}}}]
c.JupyterHub.load_roles = c.JupyterHub.load_roles + [
    {{"name": "culling-test", "scopes": ["admin:users", "admin:servers", "access:servers"],
      "services": ["culling-test"]}}
]
'''


def _hub_environment() -> None:
    """The hub's environment as grader/hub/hub.sh install makes it, once per run: the same ``once`` as conftest.py's
    HubInstall (whichever asks first installs, the other waits), with the same TORCH_SPEC, so the same environment."""
    if not shutil.which("npm"):
        pytest.skip("no npm for configurable-http-proxy; `make test-deploy` installs it (.ci/install-deploy)")

    def install():
        t0 = time.monotonic()
        res = subprocess.run([str(REPO / "grader" / "hub" / "hub.sh"), "install"], capture_output=True, text=True,
                             timeout=1200, env={**os.environ, "TORCH_SPEC": TORCH_SPEC})
        return {"returncode": res.returncode, "output": (res.stdout + res.stderr)[-3000:],
                "seconds": time.monotonic() - t0}

    got = once("hub-install", install)
    assert got["returncode"] == 0, f"grader/hub/hub.sh install failed:\n{got['output']}"


def _living(user: str, but: str = "") -> dict:
    """pid -> name of what ``user`` runs (not zombies, which their parent is about to reap), but those whose command
    line has ``but``."""
    import psutil

    out = {}
    for p in processes_of(user):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not (but and but in " ".join(p.cmdline())):
                out[p.pid] = p.name()
        except psutil.Error:  # ended meanwhile
            pass
    return out


@pytest.fixture
def carol():
    """A user of this test's own, removed at the end with whatever they still run. Not the ``passwords`` fixture's
    users: asking for it would have this run kill, at its end, whatever those users run (another run's too)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it creates a Unix user and starts JupyterHub (run `make test-deploy` as root)")
    made = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", USER], check=True)
        made = True
    os.chmod(home(USER), 0o750)
    try:
        yield USER
    finally:
        for p in processes_of(USER):
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - ended meanwhile
                pass
        if made:
            subprocess.run(["userdel", "-r", USER], capture_output=True)


@pytest.fixture
def culling_hub(carol):
    """The course's hub config with short timeouts, on ports of its own; its URL, the test's token, its log."""
    _hub_environment()
    state = Path(tempfile.mkdtemp(prefix="dtlabs-culling-hub-"))
    token = secrets.token_hex(32)
    (state / "jupyterhub_config.py").write_text(WRAPPER.format(
        config=str(REPO / "grader" / "hub" / "jupyterhub_config.py"), hub_api_port=HUB_API_PORT,
        proxy_api_port=PROXY_API_PORT, token=token))
    env = {**os.environ, "DTLABS_HUB_PREFIX": str(HUB_PREFIX), "DTLABS_HUB_STATE": str(state),
           "DTLABS_HUB_PORT": str(PORT), "DTLABS_HUB_GROUPS": "nobody-logs-in-here",
           "DTLABS_HUB_CULL_TIMEOUT": str(SERVER_IDLE), "DTLABS_HUB_CULL_EVERY": "10",
           "DTLABS_HUB_KERNEL_CULL_TIMEOUT": str(KERNEL_IDLE), "DTLABS_HUB_KERNEL_CULL_EVERY": "5",
           "PATH": f"{HUB_PREFIX}/node/bin:{HUB_PREFIX}/venv/bin:/usr/local/bin:/usr/bin:/bin"}
    log = open(state / "jupyterhub.log", "w")
    hub = subprocess.Popen([str(HUB_PREFIX / "venv" / "bin" / "jupyterhub"), "-f", str(state / "jupyterhub_config.py")],
                           cwd=state, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    import requests

    http = requests.Session()
    http.headers["Authorization"] = f"token {token}"
    url = f"http://127.0.0.1:{PORT}"

    def answers():
        assert hub.poll() is None, "the hub exited:\n" + (state / "jupyterhub.log").read_text()[-3000:]
        try:
            return http.get(f"{url}/hub/api/", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_for(answers, 90, "the culling test's hub")
        yield {"url": url, "http": http, "log": state / "jupyterhub.log"}
    finally:
        os.killpg(hub.pid, signal.SIGTERM)  # the hub stops the servers, the proxy and the culler it started
        try:
            hub.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(hub.pid, signal.SIGKILL)
            hub.wait(10)
        log.close()
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.timeout(1500)  # with hub.sh install when this test is the first to need it (up to 1200 s)
def test_an_idle_kernel_then_an_idle_server_go_away(culling_hub, carol):
    url, http = culling_hub["url"], culling_hub["http"]
    api = f"{url}/hub/api/users/{carol}"
    log = culling_hub["log"]

    def server():
        return http.get(api, timeout=30).json().get("servers", {}).get("")

    t0 = time.monotonic()
    got = http.post(api, timeout=30)
    assert got.status_code in (201, 409), got.text  # 409: the user exists already
    started = http.post(f"{api}/server", timeout=120)
    assert started.status_code in (201, 202), started.text
    wait_for(lambda: (server() or {}).get("ready"), 180, f"{carol}'s server")
    base = f"{url}/user/{carol}"
    wait_for(lambda: http.get(f"{base}/api/status", timeout=30).status_code == 200, 60, "the server through the proxy")
    ready = time.monotonic()
    TIMINGS["culling: a server up on the test's hub"] = ready - t0

    # a notebook's kernel runs a launch (the launcher's zygote stays, warm, for the next one) and is left with its
    # channels still open, as a JupyterLab tab left open on it
    kernel = http.post(f"{base}/api/kernels", json={"name": "python3"}, timeout=120)
    assert kernel.status_code == 201, kernel.text
    kernel_id = kernel.json()["id"]
    channels = Kernel(base.replace("http://", "ws://") + f"/api/kernels/{kernel_id}/channels", http.headers[
        "Authorization"].split()[1])
    try:
        out = channels.run("from lab_utils import launch\n"
                           "def rank_pid():\n    import os\n    return os.getpid()\n"
                           "print('ranks', launch(rank_pid, world_size=2, timeout=150))", timeout=240)
        assert "ranks [" in out, out
        held = _living(carol, but="jupyterhub-singleuser")
        assert "dtlabs-zygote" in held.values(), held
        ran = time.monotonic()

        # the kernel first: its server shuts it down after KERNEL_IDLE s without a message, client or not, and the
        # zygote with it; the server stays up
        def kernel_gone():
            ids = [k["id"] for k in http.get(f"{base}/api/kernels", timeout=30).json()]
            return kernel_id not in ids
        wait_for(kernel_gone, KERNEL_IDLE + 60, "the idle kernel to be culled", poll=2)
        kernel_culled = time.monotonic()
        assert server() is not None, "the server went before its kernel was culled"
        wait_for(lambda: not (set(_living(carol)) & set(held)), 30, f"the kernel's processes to end ({held})")
        TIMINGS["culling: idle kernel and zygote gone after (s)"] = kernel_culled - ran
    finally:
        channels.close()

    # then the server: the hub's culler stops it, and the user runs nothing any more
    wait_for(lambda: server() is None, SERVER_IDLE + 150, "the idle server to be culled", poll=2)
    TIMINGS["culling: idle server culled after (s)"] = time.monotonic() - ready
    text = log.read_text()
    assert f"Culling server {carol}" in text, "the server stopped, but not by jupyterhub-idle-culler:\n" + text[-3000:]
    wait_for(lambda: not _living(carol), 30, f"{carol}'s processes to end")
    report(f"[deploy] culling: kernel (and zygote) culled {kernel_culled - ran:.0f} s after its last cell, client "
           f"connected (timeout {KERNEL_IDLE} s); server culled by jupyterhub-idle-culler "
           f"{time.monotonic() - kernel_culled:.0f} s later (timeout {SERVER_IDLE} s)")
