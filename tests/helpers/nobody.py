"""Another local user of the machine: ``eavesdrop.py`` run as user ``nobody`` on a Python that user can run (the course
venv's interpreter may live in a folder only root can enter, as /root/.pyenv does)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

EAVESDROP = Path(__file__).resolve().with_name("eavesdrop.py")
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
NOBODY = 65534


def why_not() -> str | None:
    """Why no process can be run as ``nobody`` here; None when one can."""
    if os.geteuid() != 0 or not SYSTEM_PYTHON:
        return "needs root (to run a process as nobody) and /usr/bin/python3 (a Python nobody can run)"
    return None


def eavesdrop(seconds: float, *needles: str) -> subprocess.Popen:
    """Start ``eavesdrop.py SECONDS NEEDLE...`` as ``nobody`` (its text on the command line: the checkout may be closed
    to that user); ``heard(proc)`` reads its verdict."""
    return subprocess.Popen([SYSTEM_PYTHON, "-I", "-c", EAVESDROP.read_text(), str(seconds), *needles], user=NOBODY,
                            group=NOBODY, extra_groups=[], cwd="/", stdout=subprocess.PIPE, text=True)


def heard(proc: subprocess.Popen, timeout: float = 60) -> dict:
    """The JSON ``eavesdrop.py`` printed: ``reached``, ``heard``, ``bytes``, ``uid``."""
    out, _ = proc.communicate(timeout=timeout)
    return json.loads(out)


@contextlib.contextmanager
def listening(needles: list, seconds: float = 1800):
    """``nobody`` listens on everything it can reach, endpoints that appear later included, for as long as the block
    runs (``eavesdrop.py --stdin --ready``: the needles on its stdin, in no command line ``nobody`` could read).
    Yields a dict that holds its verdict (``reached``, ``heard``, ``bytes``) once the block has ended."""
    proc = subprocess.Popen([SYSTEM_PYTHON, "-I", "-c", EAVESDROP.read_text(), "--stdin", "--ready", str(seconds)],
                            user=NOBODY, group=NOBODY, extra_groups=[], cwd="/", stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    verdict: dict = {}
    try:
        proc.stdin.write(json.dumps(needles) + "\n")
        proc.stdin.flush()
        said = proc.stderr.readline()  # "ready": the first round of connections is made
        assert said.strip() == "ready", f"the eavesdropper did not start: {said}"
        yield verdict
    finally:
        try:
            proc.stdin.close()  # the end of the scan
        except OSError:
            pass
        try:
            out = proc.stdout.read()
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        if out.strip():
            verdict.update(json.loads(out))


def hidden_lines(root: Path, lab: str) -> list:
    """The hidden tests' lines of ``lab`` in the course at ``root`` (those long enough to be its own): the needles
    another user listens for while the class is graded."""
    import nbformat

    from lab_utils.grading.course import split_hidden

    nb = nbformat.read(str(Path(root) / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    found = {line.strip() for c in nb.cells for line in split_hidden(c.source)[1] if len(line.strip()) >= 24}
    assert found, f"{lab} has no hidden test lines to listen for"
    return sorted(found)


CONNECT = """
import json, socket, sys
got = {}
for port in map(int, sys.argv[1:]):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"\\x00" * 64)  # junk, as a prober would send: the run must not notice
        got[port] = "connected"
    except OSError as exc:
        got[port] = type(exc).__name__
    finally:
        s.close()
print(json.dumps(got))
"""


def connect(ports) -> dict:
    """``nobody`` connects to each of ``ports`` on the machine's loopback and sends junk: {port: "connected" or the
    error's name}."""
    tried = subprocess.run([SYSTEM_PYTHON, "-I", "-c", CONNECT, *map(str, sorted(ports))], user=NOBODY, group=NOBODY,
                           extra_groups=[], cwd="/", capture_output=True, text=True, timeout=60)
    return json.loads(tried.stdout)


def listening_ports(pid: int) -> set:
    """The TCP ports process ``pid`` itself listens on (sockets among its descriptors), in its own network."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone
        return set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for name in ("tcp", "tcp6"):
        try:
            table = open(f"/proc/{pid}/net/{name}").read().splitlines()[1:]
        except OSError:
            return ports
        for line in table:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN, and this process's
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def machine_ports() -> set:
    """The ports something listens on in this process's network (the machine's loopback): a number the ranks use in
    a network of their own may be another program's here, and proves nothing."""
    return {int(line.split()[1].rsplit(":", 1)[1], 16) for name in ("tcp", "tcp6")
            for line in open(f"/proc/self/net/{name}").read().splitlines()[1:] if line.split()[3] == "0A"}
