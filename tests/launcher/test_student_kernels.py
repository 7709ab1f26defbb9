"""Student kernels on Unix sockets only their user can reach (lab_utils/launcher/kernel_channels.py): a real Jupyter
server of the course's environment, with the config the package installs, starts a kernel through its REST API; user
``nobody`` listens on every socket and loopback port it can reach while a cell prints a secret, and hears nothing of
it, against the same server told ``--KernelManager.transport=tcp``, where it hears it. A runtime folder too deep for a
socket address, or open to others, moves the sockets to a private folder; ``dtlabs doctor`` says which, and warns.
nbgrader's Validate button, which the same server runs, is heard by nobody either, against the server with this
extension disabled, where its kernel is jupyter_client's on TCP and nobody hears it."""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import nbformat
from jupyter_client import AsyncKernelManager, BlockingKernelClient

from helpers import nobody
from lab_utils.launcher import kernel_channels
from lab_utils.launcher.kernel_channels import FOLDER_PREFIX, StudentKernelManager, ValidateKernelManager

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(kernel_channels.CONFIG)
CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
SECRET_CELL = "import time\nfor _ in range(30):\n    print({!r}, flush=True)\n    time.sleep(0.1)\n"
VALIDATED = "the notebook was validated"  # the cell's last words, in the Validate button's answer
WHERE_CELL = ("import json\nfrom ipykernel import get_connection_info\ninfo = json.loads(get_connection_info())\n"
              "with open('validate-kernel.json', 'w') as fh:\n    json.dump({'transport': info['transport'], "
              "'ip': info['ip']}, fh)\n")  # where the validating kernel listens, written down for the test
VALIDATE_URL = "assignments/validate"  # nbgrader.server_extensions.validate_assignment's handler
DOCTOR_CELL = "from lab_utils.launcher import kernel_channels\nprint('problems', kernel_channels.report())\n"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture
def user_config(tmp_path, monkeypatch) -> Path:
    """An empty user config folder: root's own ~/.jupyter stays out of what is tested."""
    folder = tmp_path / "user-config"
    folder.mkdir()
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(folder))
    return folder


@pytest.fixture
def short_folder():
    """A folder whose path leaves room for a socket address (tmp_path's may not)."""
    folder = tempfile.mkdtemp(prefix="dtk-", dir="/tmp")
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def test_the_environment_has_the_server_config_that_enables_private_kernels():
    installed = Path(sys.prefix, "etc", "jupyter", *CONFIG.parts[1:])
    assert installed.is_file() and installed.read_text() == (ROOT / CONFIG).read_text(), (
        f"{installed} is missing or differs from {CONFIG}: `make install` (or `pip install .`) puts it there")


@contextmanager
def _server(tmp_path: Path, runtime: Path, *args: str):
    """A `jupyter server` of this environment (its config files, the user's left out), on a free port."""
    token = secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_CONFIG_DIR": str(tmp_path / "user-config")}
    cmd = [sys.executable, "-m", "jupyter_server", "--ServerApp.port=0", "--ServerApp.open_browser=False",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}", *args]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = tmp_path / "server.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=tmp_path)
    info_file = runtime / f"jpserver-{proc.pid}.json"
    try:
        deadline = time.monotonic() + 90
        while not info_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert info_file.exists(), f"the server did not start:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)  # written whole before anyone reads it
        info = json.loads(info_file.read_text())
        yield lambda method, path, body=None: _api(info, token, method, path, body)
    finally:
        children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        for child in children:  # a kernel the server did not stop
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


def _api(info: dict, token: str, method: str, path: str, body=None):
    url = f"http://127.0.0.1:{info['port']}{info['base_url']}{path}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with NO_PROXY.open(req, timeout=60) as r:
        text = r.read()
    return json.loads(text) if text else None


def _run(kc: BlockingKernelClient, code: str) -> str:
    printed = []
    reply = kc.execute_interactive(code, timeout=60, output_hook=lambda m: printed.append(m["content"].get("text", "")))
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(printed)


def _secret_in_a_student_kernel(tmp_path: Path, runtime: Path, *server_args: str) -> dict:
    """Through a server's REST API, a kernel whose cell prints a secret for 3 s while ``nobody`` listens for 2;
    what the kernel bound, what nobody heard, the doctor in the kernel, and what its sockets left once deleted."""
    secret = f"dtlabs-secret-{secrets.token_hex(8)}"
    with _server(tmp_path, runtime, *server_args) as api:
        kernel = api("POST", "api/kernels", {"name": "python3"})
        info = json.loads((runtime / f"kernel-{kernel['id']}.json").read_text())
        sockets = [f"{info['ip']}-{info[f'{c}_port']}" for c in CHANNELS] if info["transport"] == "ipc" else []
        kc = BlockingKernelClient(connection_file=str(runtime / f"kernel-{kernel['id']}.json"))
        kc.load_connection_file()
        kc.start_channels(hb=False)  # a client without its manager reads a heartbeat not yet heard as a dead kernel
        try:
            kc.wait_for_ready(timeout=60)
            t0 = time.monotonic()
            listener = nobody.eavesdrop(2, secret)
            printed = _run(kc, SECRET_CELL.format(secret))
            heard = nobody.heard(listener)
            heard["listened_s"] = round(time.monotonic() - t0, 1)
            doctor = _run(kc, DOCTOR_CELL)
        finally:
            kc.stop_channels()
        folder = os.path.dirname(info["ip"])
        folder_mode = os.stat(folder).st_mode & 0o7777 if sockets else None
        bound = [s for s in sockets if os.path.exists(s)]
        api("DELETE", f"api/kernels/{kernel['id']}")
        left = [s for s in sockets if os.path.exists(s)]
    assert secret in printed, printed
    return {"info": info, "heard": heard, "secret": secret, "doctor": doctor, "sockets": sockets, "bound": bound,
            "left": left, "folder": folder, "folder_mode": folder_mode,
            "runtime_mode": os.stat(runtime).st_mode & 0o777}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["runtime folder", "too deep for a socket address"])
def test_another_user_hears_nothing_of_a_student_kernel(tmp_path, short_folder, user_config, where):
    """IOPub publishes every cell's source and output to any subscriber, no key asked: on private sockets no other
    local user can connect to a channel. In a runtime folder too deep for an address, they go to a folder of their
    own."""
    if nobody.why_not():
        pytest.skip(nobody.why_not())
    if not kernel_channels.UNIX_SOCKETS:
        pytest.skip("no Unix sockets for ZeroMQ's ipc here: kernels stay on TCP (the doctor says so)")
    deep = tmp_path / "a home with spaces" / "and deep folders" / ("x" * 40)
    runtime = short_folder / "runtime" if where == "runtime folder" else deep / ".local/share/jupyter/runtime"
    got = _secret_in_a_student_kernel(tmp_path, runtime)
    info, heard = got["info"], got["heard"]
    assert info["transport"] == "ipc", f"the server started its kernel on {info['transport']}: {info}"
    assert got["runtime_mode"] == 0o700  # (and sticky: jupyter_core keeps temp-folder cleaners off it)
    if where == "runtime folder":
        assert got["folder"] == str(runtime), got
    else:
        assert os.path.basename(got["folder"]).startswith(FOLDER_PREFIX) and got["folder_mode"] == 0o700, got
        assert not os.path.exists(got["folder"]), "the kernel's own socket folder outlived it"
    assert got["bound"] == got["sockets"] and not got["left"], got
    assert heard["uid"] == nobody.NOBODY and not heard["heard"], heard
    assert not [r for r in heard["reached"] if any(s in r for s in got["sockets"])], heard
    assert "this kernel ipc" in got["doctor"] and "problems []" in got["doctor"], got["doctor"]
    print(f"\n{where}: nobody reached {len(heard['reached'])} endpoints, got {heard['bytes']} bytes, "
          f"heard {heard['heard']} in {heard['listened_s']} s; sockets {got['sockets'][0]} ..")


@pytest.mark.slow
def test_the_eavesdropper_hears_a_student_kernel_on_tcp(tmp_path, short_folder, user_config):
    """The control: the same server told to use TCP (what jupyter_client does unless told otherwise), where the same
    listener hears the secret, so its silence above is the transport's doing; the doctor in that kernel says so."""
    if nobody.why_not():
        pytest.skip(nobody.why_not())
    got = _secret_in_a_student_kernel(tmp_path, short_folder / "runtime", "--KernelManager.transport=tcp")
    assert got["info"]["transport"] == "tcp", got["info"]
    assert [got["secret"]] == sorted({n for _, n in got["heard"]["heard"]}), got["heard"]
    assert "this kernel tcp" in got["doctor"], got["doctor"]
    assert "WARNING     this kernel listens on TCP" in got["doctor"], got["doctor"]
    print(f"\ntcp: nobody got {got['heard']['bytes']} bytes, heard the secret on {got['heard']['heard']}")


def test_a_runtime_folder_others_can_enter_keeps_no_socket(short_folder):
    """jupyter_core makes the runtime folder 0700 only when it makes it: one made otherwise is not used for sockets."""
    runtime = short_folder / "runtime"
    runtime.mkdir(mode=0o755)
    runtime.chmod(0o755)
    km = StudentKernelManager(connection_file=str(runtime / "kernel-1234.json"))
    folder = os.path.dirname(km.ip)
    try:
        assert km.transport == "ipc" and os.path.basename(folder).startswith(FOLDER_PREFIX), km.ip
        assert os.stat(folder).st_mode & 0o7777 == 0o700 and kernel_channels.private(folder)
        assert kernel_channels.why_not_beside(str(runtime / "kernel-1234-ipc")) == "others can enter that folder"
    finally:
        asyncio.run(km.cleanup_resources())
    assert not os.path.exists(folder)
    runtime.chmod(0o700)
    beside = StudentKernelManager(connection_file=str(runtime / "kernel-1234.json"))
    assert beside.ip == str(runtime / "kernel-1234-ipc"), "a private runtime folder keeps the sockets"


def test_the_doctor_says_kernels_use_private_sockets(short_folder, user_config, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(short_folder))
    short_folder.chmod(0o700)
    lines = []
    assert kernel_channels.report(lines.append) == [], lines
    text = "\n".join(lines)
    assert "kernels     ipc: Unix sockets in the runtime folder (StudentKernelManager)" in text, text
    assert f"runtime     {short_folder} (mode 0700, yours)" in text and "WARNING" not in text, text


@pytest.mark.parametrize("config", [
    ("jupyter_server_config.json", {"KernelManager": {"transport": "tcp"}}, "remove it"),
    ("jupyter_server_config.d/off.json", {"ServerApp": {"jpserver_extensions": {kernel_channels.__name__: False}}},
     "dtlabs-kernels.json in"),
], ids=["transport tcp", "extension off"])
def test_the_doctor_warns_when_kernels_would_listen_on_tcp(tmp_path, user_config, monkeypatch, config):
    """Another user could subscribe: a WARNING line and a problem with its fix (``dtlabs doctor`` prints it, fails)."""
    name, content, fix = config
    folder = tmp_path / "course-config"  # on JUPYTER_CONFIG_PATH: in a venv, the env's config outranks the user's
    path = [str(folder), os.getenv("JUPYTER_CONFIG_PATH")]
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", os.pathsep.join(filter(None, path)))
    (folder / name).parent.mkdir(parents=True)
    (folder / name).write_text(json.dumps(content))
    lines = []
    problems = kernel_channels.report(lines.append)
    text = "\n".join(lines)
    assert "kernels     tcp: ports of 127.0.0.1" in text and "WARNING     JupyterLab's kernels listen on TCP" in text
    assert len(problems) == 1 and fix in problems[0], problems


def test_the_validate_button_gets_private_sockets_and_nothing_else_is_rebound(monkeypatch):
    """nbgrader's ``Execute`` reads the name ``AsyncKernelManager`` of its module when it is made: the extension
    rebinds it to ``ValidateKernelManager`` (no config can choose Execute's manager), a manager of anyone else's left
    alone. Its kernel's sockets go to a 0700 folder of its own, removed with it."""
    execute = pytest.importorskip("nbgrader.preprocessors.execute")
    monkeypatch.setattr(execute, "AsyncKernelManager", AsyncKernelManager)  # as nbgrader has it; put back after
    assert kernel_channels.private_validation() is True and kernel_channels.private_validation() is True
    assert execute.Execute().kernel_manager_class is ValidateKernelManager

    class Theirs(AsyncKernelManager):
        pass

    monkeypatch.setattr(execute, "AsyncKernelManager", Theirs)
    assert kernel_channels.private_validation() is False and execute.AsyncKernelManager is Theirs
    if not kernel_channels.UNIX_SOCKETS:
        return
    km = ValidateKernelManager()
    folder = os.path.dirname(km.ip)
    try:
        assert km.transport == "ipc" and os.path.basename(folder).startswith(FOLDER_PREFIX), km.ip
        assert os.stat(folder).st_mode & 0o7777 == 0o700 and kernel_channels.private(folder)
    finally:
        asyncio.run(km.cleanup_resources())
    assert not os.path.exists(folder)


def _validated_while_nobody_listens(tmp_path: Path, runtime: Path, *server_args: str) -> dict:
    """nbgrader's Validate button (its REST endpoint, as the JupyterLab extension calls it) on a notebook whose grade
    cell prints a secret for 3 s, while ``nobody`` listens on everything it can reach; what it heard, the answer, where
    the validating kernel listened (the cell wrote it down) and the server's log."""
    secret = f"dtlabs-secret-{secrets.token_hex(8)}"
    source = f"{WHERE_CELL}{SECRET_CELL.format(secret)}assert False, {VALIDATED!r}\n"
    cell = nbformat.v4.new_code_cell(source, metadata={"nbgrader": {
        "grade": True, "grade_id": "secret", "locked": True, "points": 1, "schema_version": 3, "solution": False}})
    nb = nbformat.v4.new_notebook(cells=[cell], metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, str(tmp_path / "validate-me.ipynb"))
    with _server(tmp_path, runtime, *server_args) as api:
        with nobody.listening([secret]) as heard:
            t0 = time.monotonic()
            answer = api("POST", VALIDATE_URL, {"path": "validate-me.ipynb"})
            took = round(time.monotonic() - t0, 1)
    kernel = json.loads((tmp_path / "validate-kernel.json").read_text())
    failed = answer["value"].get("failed", []) if answer["success"] else []
    assert answer["success"] and len(failed) == 1 and VALIDATED in failed[0]["raw_error"], (
        f"the Validate button did not run the notebook: {answer}")
    return {"secret": secret, "heard": heard, "kernel": kernel, "took_s": took,
            "log": (tmp_path / "server.log").read_text()}


@pytest.mark.slow
def test_another_user_hears_nothing_of_the_validate_button(tmp_path, short_folder, user_config):
    """nbgrader's Validate button runs the whole notebook in a kernel of its own, which nbgrader starts with
    jupyter_client's ``AsyncKernelManager`` (TCP) whatever the config says: in a server with this extension, that
    kernel is on Unix sockets in a 0700 folder of its own, and ``nobody`` hears nothing of it."""
    if nobody.why_not():
        pytest.skip(nobody.why_not())
    if not kernel_channels.UNIX_SOCKETS:
        pytest.skip("no Unix sockets for ZeroMQ's ipc here: kernels stay on TCP (the doctor says so)")
    got = _validated_while_nobody_listens(tmp_path, short_folder / "runtime")
    kernel, heard = got["kernel"], got["heard"]
    assert "dtlabs: nbgrader's Validate button runs notebooks on Unix sockets" in got["log"], got["log"][-3000:]
    folder = os.path.dirname(kernel["ip"])
    assert kernel["transport"] == "ipc" and os.path.basename(folder).startswith(FOLDER_PREFIX), kernel
    assert not os.path.exists(folder), "the validating kernel's socket folder outlived it"
    assert heard["uid"] == nobody.NOBODY and not heard["heard"], heard
    assert not [r for r in heard["reached"] if kernel["ip"] in r], heard
    print(f"\nvalidate: {got['took_s']} s; nobody reached {len(heard['reached'])} endpoints, got {heard['bytes']} "
          f"bytes, heard {heard['heard']}; the kernel on {kernel['ip']}-*")


@pytest.mark.slow
def test_the_eavesdropper_hears_the_validate_button_without_the_extension(tmp_path, short_folder, user_config):
    """The control: the same server with this extension disabled (nbgrader's name left as it is), where the Validate
    button's kernel listens on TCP and the same listener hears the secret."""
    if nobody.why_not():
        pytest.skip(nobody.why_not())
    got = _validated_while_nobody_listens(tmp_path, short_folder / "runtime",
                                          f"--ServerApp.jpserver_extensions={kernel_channels.__name__}=False")
    assert "dtlabs:" not in got["log"], got["log"][-3000:]
    assert got["kernel"]["transport"] == "tcp", got["kernel"]
    assert [got["secret"]] == sorted({n for _, n in got["heard"]["heard"]}), got["heard"]
    print(f"\nvalidate without the extension: {got['took_s']} s; nobody got {got['heard']['bytes']} bytes, heard the "
          f"secret on {got['heard']['heard']}")
