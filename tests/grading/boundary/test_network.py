"""lab_utils.grading.boundary.network: as the separate user a submission shares the host's network, so grading closes
it (all but loopback) to that uid with a firewall rule of its own, and says so on every grade line where it cannot.

Root only (a rule, a network namespace). The target is a listener in a network namespace this test makes, on the
far end of a veth pair (host end 10.213.0.1, listener 10.213.0.2 and fd13:213::2): no packet leaves the machine.
The probes run as a uid of their own (a forked child that drops to it: the owner match needs no passwd entry, and
no other test's separate user is touched). Without the rule the probes reach the listener (the control); with it
TCP and UDP, IPv4 and IPv6, are refused at once, while loopback and root's own connections go on working.
"""
from __future__ import annotations

import errno
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
import uuid
from pathlib import Path

import pytest

from lab_utils.grading import outcomes
from lab_utils.grading.boundary import network

# one worker for the whole file: its namespace's addresses and the firewall's tables are the machine's, and two tests
# at once on two workers (the nft and iptables cases) took each other's rules away
pytestmark = pytest.mark.xdist_group("firewall")
UID = 64213  # the probes' uid; UID + 1: a neighbour the rule must leave alone
NS = f"dtl-net-test-{os.getpid()}"
HOST_IF, NS_IF = f"dtlh{os.getpid() % 100000}", f"dtln{os.getpid() % 100000}"
HOST4, FAR4, HOST6, FAR6 = "10.213.0.1", "10.213.0.2", "fd13:213::1", "fd13:213::2"
REPO = Path(__file__).resolve().parents[3]

LISTENER = r"""
import select, socket, sys
port, log = int(sys.argv[1]), open(sys.argv[2], "a", buffering=1)
tcp = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
tcp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("::", port)); tcp.listen(16)
udp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
udp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
udp.bind(("::", port))
print("ready", flush=True)
while True:
    for s in select.select([tcp, udp], [], [])[0]:
        if s is udp:
            data, peer = udp.recvfrom(4096)
            log.write("udp " + data.decode(errors="replace") + "\n")
        else:
            conn, peer = tcp.accept()
            conn.settimeout(2)
            try:
                data = conn.recv(4096)
            except OSError:
                data = b""
            log.write("tcp " + data.decode(errors="replace") + "\n")
            conn.close()
"""


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "root only: a firewall rule and a network namespace"
    if not shutil.which("ip"):
        return "no `ip` (Debian: iproute2)"
    if not (shutil.which("nft") or shutil.which("iptables")):
        return "neither nft nor iptables here (Debian: apt-get install nftables iptables; .ci/install-deploy)"
    probe = subprocess.run(["ip", "netns", "add", NS + "-probe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"no network namespace can be made here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", NS + "-probe"], capture_output=True)
    return None


WHY_NOT = _why_not()
root_only = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr}"


@pytest.fixture(scope="module")
def far_end():
    """A listener (TCP and UDP, IPv4 and IPv6) in a network namespace of this test's, reached over a veth pair."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    tables = _nft_tables()  # iptables-nft makes its own tables (ip filter, ip6 filter): put back as found
    log = Path(tempfile.mkdtemp(prefix="dtlabs-net-")) / "heard.log"
    log.touch()
    listener = None
    try:
        _ip("netns", "add", NS)
        _ip("link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
        _ip("link", "set", NS_IF, "netns", NS)
        _ip("addr", "add", f"{HOST4}/30", "dev", HOST_IF)
        _ip("-6", "addr", "add", f"{HOST6}/64", "dev", HOST_IF, "nodad")
        _ip("link", "set", HOST_IF, "up")
        _ip("-n", NS, "addr", "add", f"{FAR4}/30", "dev", NS_IF)
        _ip("-n", NS, "-6", "addr", "add", f"{FAR6}/64", "dev", NS_IF, "nodad")
        _ip("-n", NS, "link", "set", NS_IF, "up")
        _ip("-n", NS, "link", "set", "lo", "up")
        with socket.socket() as s:  # a port number; the listener binds it in its own namespace
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        listener = subprocess.Popen(["ip", "netns", "exec", NS, sys.executable, "-c", LISTENER, str(port), str(log)],
                                    stdout=subprocess.PIPE, text=True)
        ready = select.select([listener.stdout], [], [], 30)[0]
        assert ready and listener.stdout.readline().strip() == "ready", "the listener in the namespace did not start"
        yield types.SimpleNamespace(port=port, log=log)
    finally:
        network.remove(UID)
        if listener is not None:
            listener.kill()
            listener.wait(timeout=10)
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)  # its end of the veth pair goes with it
        subprocess.run(["ip", "link", "del", HOST_IF], capture_output=True)
        shutil.rmtree(log.parent, ignore_errors=True)
        for table in _nft_tables() - tables:
            if "dtlabs" not in table:  # network.remove's own; the rest were made by iptables for this test
                subprocess.run(["nft", "delete", "table", *table.split()], capture_output=True)


def _nft_tables() -> set:
    if not shutil.which("nft"):
        return set()
    out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return {line.removeprefix("table ").strip() for line in out.splitlines() if line.startswith("table ")}


def _heard(far_end, token: str, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        if token in far_end.log.read_text():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _as_uid(uid: int, probe, *args) -> str:
    """``probe(*args)`` in a forked child that dropped to ``uid`` (no groups); its answer, or why it gave none."""
    "x".encode("idna")  # the child cannot import codecs after the drop: this Python may lie in a private folder
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            answer = probe(*args)
        except BaseException as exc:  # noqa: BLE001 - said to the parent
            answer = f"probe failed: {exc!r}"
        os.write(w, answer.encode()[:4000])
        os._exit(0)
    os.close(w)
    try:
        if not select.select([r], [], [], 20)[0]:
            os.kill(pid, signal.SIGKILL)
            return "probe hung"
        return os.read(r, 4096).decode()
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def _tcp(host: str, port: int, token: str) -> str:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    start = time.monotonic()
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect((host, port))
            s.sendall(token.encode())
            return "reached"
        except OSError as exc:
            return f"refused {errno.errorcode.get(exc.errno, exc.errno)} in {time.monotonic() - start:.2f} s"


def _udp(host: str, port: int, token: str) -> str:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(token.encode(), (host, port))
            return "sent"
        except OSError as exc:
            return f"refused {errno.errorcode.get(exc.errno, exc.errno)}"


def _loopback(host: str) -> str:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as server, socket.socket(family, socket.SOCK_STREAM) as client:
        server.bind((host, 0))
        server.listen(1)
        client.settimeout(5)
        client.connect(server.getsockname()[:2])
        conn, _ = server.accept()
        with conn:
            client.sendall(b"ping")
            return "loopback " + conn.recv(4).decode()


def _token(what: str) -> str:
    return f"DTL-{what}-{uuid.uuid4().hex[:12]}"


def _outside(far_end, uid: int) -> dict:
    """What ``uid`` reached of the far end: TCP over IPv4 and IPv6, UDP over IPv4 and IPv6."""
    got = {}
    for name, probe, host in (("tcp4", _tcp, FAR4), ("tcp6", _tcp, FAR6), ("udp4", _udp, FAR4), ("udp6", _udp, FAR6)):
        token = _token(name)
        said = _as_uid(uid, probe, host, far_end.port, token)
        got[name] = (said, _heard(far_end, token, 3.0 if said in ("reached", "sent") else 0.5))
    return got


@root_only
def test_without_the_rule_the_separate_user_reaches_the_namespace(far_end):
    """The control: with no rule, a process of that uid reaches the far end by every way the rule must close."""
    network.remove(UID)
    got = _outside(far_end, UID)
    assert all(heard for _, heard in got.values()), f"the far end should hear every probe without the rule: {got}"


def _uses(tool: str, monkeypatch) -> None:
    if tool == "iptables":
        if not (shutil.which("iptables") and shutil.which("ip6tables")):
            pytest.skip("no iptables and ip6tables here (Debian: apt-get install iptables)")
        real = shutil.which
        monkeypatch.setattr(network.shutil, "which", 
                            lambda name, *a, **k: None if name == "nft" else real(name, *a, **k))
    elif not shutil.which("nft"):
        pytest.skip("no nft here (Debian: apt-get install nftables)")


def _ours(tool: str) -> int:
    """How many rules of ``UID``'s the firewall holds."""
    tag = f"dtlabs-subject-{UID}"
    if tool == "nft":
        out = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True).stdout
        return out.count(f'"{tag}"')
    return sum(subprocess.run([t, "-w", "-S"], capture_output=True, text=True).stdout.count(tag)
               for t in ("iptables", "ip6tables"))


@root_only
@pytest.mark.parametrize("tool", ["nft", "iptables"])
def test_the_rule_closes_all_but_loopback_to_that_uid_once_and_comes_off(far_end, tool, monkeypatch):
    _uses(tool, monkeypatch)
    network.remove(UID)
    try:
        assert network.close(UID) is None
        assert network.close(UID) is None, "closing again (every grading checks) must hold, not fail"
        got = _outside(far_end, UID)
        leaked = {k: v for k, v in got.items() if v[1] or not v[0].startswith("refused")}
        assert not leaked, f"the separate user reached the namespace through the rule: {leaked}"
        slow = {k: v[0] for k, v in got.items() if k.startswith("tcp") and float(v[0].split(" in ")[1][:-2]) > 1.0}
        assert not slow, f"a connect must be refused at once, not wait for a timeout: {slow}"
        assert _ours(tool) == (2 if tool == "nft" else 4), "closing twice must not add the rules twice"
        assert _as_uid(UID, _loopback, "127.0.0.1") == "loopback ping", "the ranks' loopback must stay open"
        if socket.has_ipv6 and Path("/proc/net/if_inet6").exists():
            assert _as_uid(UID, _loopback, "::1") == "loopback ping"
        token = _token("root")
        assert _tcp(FAR4, far_end.port, token) == "reached" and _heard(far_end, token, 3), "root's own traffic was cut"
        token = _token("neighbour")
        assert _as_uid(UID + 1, _tcp, FAR4, far_end.port, token) == "reached" and _heard(far_end, token, 3), (
            "the rule must hold the subject's uid only")
    finally:
        network.remove(UID)
    assert _ours(tool) == 0, "remove left a rule"
    token = _token("after")
    assert _as_uid(UID, _tcp, FAR4, far_end.port, token) == "reached" and _heard(far_end, token, 3)


@root_only
def test_the_phone_home_cheat_reaches_nothing_through_the_rule(far_end):
    """grader/cheats/phone_home.py pointed at the namespace: it reaches the far end without the rule, nothing
    with it."""
    text = (REPO / "grader" / "cheats" / "phone_home.py").read_text()
    assert '_HOME = ("198.51.100.7", 9)' in text
    program = text.replace('_HOME = ("198.51.100.7", 9)', f'_HOME = ("{FAR4}", {far_end.port})')

    def cheat() -> str:
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(program, "phone_home.py", "exec"), {"__name__": "__main__"})
        return out.getvalue()

    network.remove(UID)
    try:
        before = far_end.log.read_text().count("DTLABS-PHONE-HOME")
        assert "reached: ['tcp', 'udp (sent)']" in _as_uid(UID, cheat)
        assert _heard(far_end, "DTLABS-PHONE-HOME udp", 3)
        assert far_end.log.read_text().count("DTLABS-PHONE-HOME") > before
        assert network.close(UID) is None
        heard = far_end.log.read_text().count("DTLABS-PHONE-HOME")
        said = _as_uid(UID, cheat)
        assert "reached: nothing" in said, said
        time.sleep(0.5)
        assert far_end.log.read_text().count("DTLABS-PHONE-HOME") == heard, "the far end heard the cheat"
    finally:
        network.remove(UID)


def test_where_no_rule_can_be_installed_the_grade_line_says_the_submission_had_the_network(tmp_path, monkeypatch):
    """No nft or iptables on PATH: close says why, and the user mode's grading writes the note into the run's report,
    which every grade line, record and results.json is made from (``submission.grade_submission``)."""
    from lab_utils.grading.boundary import sandbox
    from lab_utils.grading.split import session as session_mod

    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    why = network.close(UID)
    assert why and "neither nft nor iptables" in why

    class NotStarted(Exception):
        pass

    def no_subject(*a, **k):  # the note is written before the subject starts; none is started here
        raise NotStarted

    network.for_grading.cache_clear()
    monkeypatch.setattr(sandbox, "require", lambda *a, **k: "user")
    monkeypatch.setattr(sandbox, "subject_user", lambda: (types.SimpleNamespace(pw_uid=UID, pw_gid=UID), None))
    monkeypatch.setattr(session_mod, "SubjectProcess", no_subject)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    monkeypatch.setenv("TMPDIR", os.environ.get("TMPDIR", "/tmp"))
    report = tmp_path / "report.txt"
    umask = os.umask(0o022)
    try:
        with pytest.raises(NotStarted):
            session_mod.GradingSession().start(report_path=str(report), work_root=str(tmp_path))
    finally:
        os.umask(umask)
        network.for_grading.cache_clear()
    lines = [x for x in report.read_text().splitlines() if x.strip()]
    assert len(lines) == 1, lines
    reason = outcomes.Reason.parse(f"sandbox: {lines[0]}")  # as grade_submission reads the report back
    assert reason.kind is outcomes.Kind.UNPROTECTED
    assert str(reason).startswith("sandbox: the submission had the network (neither nft nor iptables"), str(reason)


def test_a_closed_network_puts_nothing_on_the_grade_line(monkeypatch):
    monkeypatch.setattr(network, "close", lambda uid: None)
    network.for_grading.cache_clear()
    try:
        assert network.grade_note(UID) is None
    finally:
        network.for_grading.cache_clear()


@pytest.mark.parametrize("closes", [True, False], ids=["closed", "open"])
def test_doctor_grading_says_what_network_the_separate_user_has(tmp_path, monkeypatch, closes):
    """``dtlabs doctor --grading`` in the user mode: the network closed to the subject's uid, or open and why."""
    from lab_utils.grading import canary, course
    from lab_utils.grading.boundary import sandbox
    from lab_utils.settings import DTLabs

    if closes and WHY_NOT:
        pytest.skip(WHY_NOT)
    if not closes:
        (tmp_path / "empty").mkdir()
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(course, "find_course_root", lambda root=None: tmp_path)
    monkeypatch.setattr(course, "discover_labs", lambda root: [])  # no canary here: the boundary's lines only
    monkeypatch.setattr(sandbox, "mode", lambda *a: "user")
    monkeypatch.setattr(sandbox, "exposure", lambda *a, **k: [])
    monkeypatch.setattr(sandbox, "subject_user", lambda: (types.SimpleNamespace(pw_uid=UID, pw_gid=UID), None))
    lines = []
    try:
        assert canary.doctor(settings=DTLabs(), out=lines.append), "\n".join(lines)
    finally:
        network.remove(UID)
    said = [x for x in lines if x.startswith("network     ")]
    expected = (f"network     closed to uid {UID} but loopback" if closes else
                "network     OPEN to the submission (neither")
    assert len(said) == 1 and said[0].startswith(expected), "\n".join(lines)


@root_only
def test_without_cap_net_admin_close_says_why_at_once():
    """Docker's default drops CAP_NET_ADMIN: no tool can install the rule, and close says so instead of hanging."""
    if not shutil.which("setpriv"):
        pytest.skip("no setpriv (Debian: util-linux)")
    code = ("import time; t = time.monotonic()\n"
            "from lab_utils.grading.boundary import network\n"
            f"why = network.close({UID})\n"
            "print(round(time.monotonic() - t, 2)); print(why)\n")
    done = subprocess.run(["setpriv", "--bounding-set", "-net_admin", "--", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    seconds, why = done.stdout.split("\n", 1)
    assert "refused the rule" in why and float(seconds) < 30, done.stdout
    network.remove(UID)
