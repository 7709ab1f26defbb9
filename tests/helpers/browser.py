"""A throwaway JupyterLab server and a headless Chromium that drives it, for ``tests/labs/test_browser.py``.

Nothing here touches the repository's ``labs/``, the user's Jupyter settings or another engineer's kernels:
the server serves a temporary copy of ``labs/`` with its own config, runtime, settings and workspace dirs,
and cleanup kills only the processes this server started (found by parentage, recorded by pid).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

# Flags that keep a root, headless Chromium quiet on a closed network (no sync, updates, field trials).
CHROMIUM_ARGS = [
    "--no-sandbox",  # we run as root in a container
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--metrics-recording-only",
    "--password-store=basic",
]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# The open notebook's cells and outputs in JupyterLab's page.
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"
CELLS = f"{NOTEBOOK} .jp-Notebook .jp-Cell"
OUTPUTS = f"{NOTEBOOK} .jp-OutputArea-output"

# JupyterLab user settings for a quiet, deterministic page: no news/update toasts (they would fetch from
# the internet), every cell kept in the DOM so the test can address cell i as the i-th .jp-Cell.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def find_chromium() -> tuple[str | None, str]:
    """(path, "") of a Chromium that starts, or (None, why not)."""
    candidates = [os.environ.get("DTLABS_CHROMIUM")] + [shutil.which(n) for n in CHROMIUM_NAMES]
    tried = []
    for path in filter(None, candidates):
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append(f"{path}: {exc}")
            continue
        if out.returncode == 0 and "chrom" in out.stdout.lower():
            return path, ""
        tried.append(f"{path}: exit {out.returncode} {(out.stdout + out.stderr).strip()[:120]}")
    why = "; ".join(tried) or f"none of {', '.join(CHROMIUM_NAMES)} on PATH and DTLABS_CHROMIUM unset"
    return None, f"no runnable Chromium ({why}); run .ci/install-browser (apt-get install chromium)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _is_kernel(p: psutil.Process) -> bool:
    try:
        return "ipykernel_launcher" in " ".join(p.cmdline()) or "ipykernel" in p.name()
    except psutil.Error:
        return False


class JupyterLabServer:
    """``jupyter lab`` on 127.0.0.1 with a token, serving ``root``, isolated under ``home``."""

    def __init__(self, root: Path, home: Path):
        self.root = Path(root)
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.proc: subprocess.Popen | None = None
        self.log_path = self.home / "jupyterlab.log"
        self.seen: dict[int, psutil.Process] = {}  # every descendant ever observed, for cleanup

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.base}/{path.lstrip('/')}?token={self.token}"

    def env(self) -> dict:
        env = dict(os.environ)
        dirs = {}
        for key, sub in [("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                         ("JUPYTERLAB_SETTINGS_DIR", "lab-settings"),
                         ("JUPYTERLAB_WORKSPACES_DIR", "lab-workspaces"), ("IPYTHONDIR", "ipython")]:
            dirs[key] = self.home / sub
            dirs[key].mkdir(parents=True, exist_ok=True)
            env[key] = str(dirs[key])
        for rel, value in LAB_SETTINGS.items():
            f = dirs["JUPYTERLAB_SETTINGS_DIR"] / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(value))
        # as `make lab` does: the course's nbgrader config (grader/) is in force for Validate and the formgrader
        grader = str(Path(__file__).resolve().parents[2] / "grader")
        env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (grader, env.get("JUPYTER_CONFIG_PATH")) if p)
        env.pop("MPLBACKEND", None)  # let the kernel use matplotlib-inline, as a student's would
        env.pop("JUPYTER_TOKEN", None)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self, timeout: float = 60.0) -> None:
        self.spawn()
        self.wait_ready(timeout)

    def spawn(self) -> None:
        # The same entry point `make lab` uses (.venv/bin/jupyter lab), from the running interpreter's venv.
        cmd = [sys.executable, "-m", "jupyterlab",
               "--no-browser", "--ip=127.0.0.1", f"--port={self.port}", "--port-retries=0",
               f"--ServerApp.root_dir={self.root}", f"--IdentityProvider.token={self.token}",
               "--ServerApp.open_browser=False",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--ServerApp.shutdown_no_activity_timeout=600",  # a leaked server still goes away
               "--MappingKernelManager.cull_idle_timeout=600",
               # a kernel that dies mid-test is a failure to see, not one to hide by restarting it (and the
               # cleanup kills kernels before the server: no restarts racing the shutdown)
               "--KernelManager.autorestart=False"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # CI containers run as root; jupyter refuses without it
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=self.env(), stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise RuntimeError(f"jupyter lab did not answer within {timeout:.0f}s:\n{self.log_tail()}")

    def api(self, path: str, method: str = "GET", timeout: float = 5.0, body=None):
        data = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
        req = urllib.request.Request(self.url(path), method=method, data=data,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
        return json.loads(body) if body else None

    def start_kernel_for(self, notebook: str, kernel_name: str = "python3") -> dict:
        """Create the notebook's session now, so its kernel boots while the browser loads the page
        (JupyterLab then joins the existing session for that path, as it does when a tab is reopened)."""
        return self.api("api/sessions", method="POST", timeout=30, body={
            "path": notebook, "name": Path(notebook).name, "type": "notebook", "kernel": {"name": kernel_name}})

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def remember_descendants(self) -> None:
        """Record every process below the server now (kernels, the launcher's zygote, dtlabs-rank*)."""
        if self.proc is not None:
            for p in _descendants(self.proc.pid):
                self.seen.setdefault(p.pid, p)

    def stop(self) -> list[str]:
        """Shut kernels and server down, then kill whatever they left. Returns what had to be killed."""
        if self.proc is None:
            return []
        self.remember_descendants()
        # Kernels first, hard: a polite shutdown_request costs seconds per kernel on a busy machine, and a
        # killed kernel takes the launcher's zygote and ranks with it (PR_SET_PDEATHSIG), the path a
        # student's "Restart kernel" on a stuck launch also takes. The survivor sweep below checks it.
        kernels = [p for p in self.seen.values() if _is_kernel(p)]
        for p in kernels:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(kernels, timeout=5)
        try:  # then the server, politely
            self.api("api/shutdown", method="POST")
        except (urllib.error.URLError, OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # the server's own group (it was started setsid)
                self.proc.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=5)
        killed = []
        for pid, p in self.seen.items():  # kernels run in their own sessions: kill them by recorded pid
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    killed.append(f"{pid} {p.name()}")
                    p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs([p for p in self.seen.values()], timeout=5)
        self._log.close()
        return killed


def dev_notebook(path: Path) -> None:
    """A tiny stand-in for Lab 01, for developing the browser test before the real lab exists.

    Only used when DTLABS_BROWSER_DEV_NOTEBOOK=1: the real test needs the released Lab 01.
    """
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Lab 01 stand-in\nA launch, a figure and a widget."),
        nbformat.v4.new_code_cell("WORLD_SIZE = 2\nBACKEND = 'auto'\nSTEPS = 5\nSEED = 0"),
        nbformat.v4.new_code_cell("%matplotlib inline\nimport matplotlib.pyplot as plt\nfrom lab_utils import launch"),
        nbformat.v4.new_code_cell(
            "def stub():\n    raise NotImplementedError()\nstub()"),
        nbformat.v4.new_code_cell(
            "import torch, torch.distributed as dist\n"
            "def hello():\n"
            "    t = torch.ones(2) * (dist.get_rank() + 1)\n"
            "    dist.all_reduce(t)\n"
            "    print(f'all_reduce gives {t.tolist()}')\n"
            "    return t.sum().item()\n"
            "results = launch(hello, world_size=WORLD_SIZE, backend=BACKEND, timeout=60)\nresults"),
        nbformat.v4.new_code_cell(
            "fig, ax = plt.subplots(figsize=(5, 3))\n"
            "ax.bar(['rank 0', 'rank 1'], results)\nax.set_title('sum after all_reduce')\nplt.show()"),
        nbformat.v4.new_code_cell("import ipywidgets as w\nw.IntSlider(value=2, min=1, max=8, description='ranks')"),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def wait_prompt(page, i: int, pattern: str, timeout_ms: float) -> bool:
    """Wait until cell i's input prompt (``[ ]:``, ``[*]:``, ``[3]:``) matches ``pattern``."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(
            "([sel, i, pat]) => { const c = document.querySelectorAll(sel)[i];"
            " const p = c && c.querySelector('.jp-InputArea-prompt');"
            " return !!p && new RegExp(pat).test(p.innerText.trim()); }",
            arg=[CELLS, i, pattern], timeout=timeout_ms)
        return True
    except PlaywrightTimeout:
        return False
