"""The separate user's network closed, all but loopback: a firewall rule the grader owns on the subject's uid.

Bubblewrap gives a subject a network namespace with loopback only. The separate user (``sandbox`` mode ``user``)
shares the host's network, so without this a submission could reach any host the grader can: send out what it
read, or fetch an answer. ``close(uid)`` adds an owner-match rule on the output path: packets of that uid's sockets
that leave through any interface but ``lo`` are rejected (IPv4 and IPv6; TCP with a reset, everything else with an
ICMP error, so a connect or a send fails at once instead of hanging). Loopback stays open: the subject's ranks meet
over it (TCPStore, gloo's pairs), on ephemeral ports. nftables first (table ``inet dtlabs``, chain ``output``),
else iptables and ip6tables (chain ``DTLABS-OUTPUT``, jumped to from ``OUTPUT``); the rules carry the uid in a
comment, so ``close`` adds them once, finds them on every later grading, and ``remove`` takes them away.

Why a firewall and not Landlock: Landlock's network rules (ABI 4+) allow TCP bind and connect by port only, not by
address, so they cannot keep loopback's ephemeral ports open while closing the same ports elsewhere, and they
say nothing of UDP. Where no rule can be installed (no ``nft`` or ``iptables``, no CAP_NET_ADMIN as in Docker's
default, an error), ``close`` returns why, and every grade in that mode says the submission had the network
(``outcomes.network_open``).
"""
from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache

from lab_utils.grading import outcomes

TABLE = "dtlabs"  # nft: table inet dtlabs, chain output
CHAIN = "output"
IPT_CHAIN = "DTLABS-OUTPUT"  # iptables and ip6tables: a chain of ours, jumped to from OUTPUT
TIMEOUT = 15  # seconds for one tool call: a stuck firewall tool is an error, never a hang


def _tag(uid: int) -> str:
    return f"dtlabs-subject-{int(uid)}"


def _run(argv: list[str]) -> tuple[bool, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"{argv[0]} could not run: {exc}"
    return done.returncode == 0, (done.stdout if done.returncode == 0 else
                                  (done.stderr.strip() or f"exit {done.returncode}")[-300:])


# ------------------------------------------------------------------------------------------ nftables
def _nft_rules(nft: str, uid: int) -> list[str] | None:
    """Our rules for ``uid`` in the chain (with their handles), or None if the table or chain is not there."""
    ok, out = _run([nft, "-a", "list", "chain", "inet", TABLE, CHAIN])
    if not ok or "hook output" not in out:
        return None
    return [line for line in out.splitlines() if f'comment "{_tag(uid)}"' in line]


NFT_RULES = {"tcp reset": 'meta skuid {uid} oifname != "lo" meta l4proto tcp reject with tcp reset comment "{tag}"',
             "icmpx": 'meta skuid {uid} oifname != "lo" reject with icmpx type admin-prohibited comment "{tag}"'}


def _nft_missing(nft: str, uid: int) -> list[str]:
    """Which of ``NFT_RULES`` the chain lacks for ``uid`` (all of them where there is no chain)."""
    rules = _nft_rules(nft, uid)
    return [key for key in NFT_RULES if rules is None or not any(key in line for line in rules)]


def _nft_close(nft: str, uid: int) -> str | None:
    # only what is missing is added, nothing taken away: another grading's subject may be running under these rules
    missing = _nft_missing(nft, uid)
    if not missing:
        return None
    script = (f"add table inet {TABLE}\n"
              f"add chain inet {TABLE} {CHAIN} {{ type filter hook output priority 0; policy accept; }}\n"
              + "".join(f"add rule inet {TABLE} {CHAIN} " + NFT_RULES[key].format(uid=int(uid), tag=_tag(uid)) + "\n"
                        for key in missing))
    try:
        done = subprocess.run([nft, "-f", "-"], input=script, capture_output=True, text=True, errors="replace",
                              timeout=TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{nft} could not run: {exc}"
    if done.returncode != 0:
        return f"{nft} refused the rule: " + (done.stderr.strip() or f"exit {done.returncode}")[-300:]
    return f"{nft} took the rule but does not list it" if _nft_missing(nft, uid) else None


def _nft_remove(nft: str, uid: int) -> None:
    for line in _nft_rules(nft, uid) or []:
        handle = line.rsplit("# handle", 1)[-1].strip()
        if handle.isdigit():
            _run([nft, "delete", "rule", "inet", TABLE, CHAIN, "handle", handle])
    ok, out = _run([nft, "list", "chain", "inet", TABLE, CHAIN])
    if ok and "dtlabs-subject-" not in out:  # nobody's rules left: the table goes too
        _run([nft, "delete", "table", "inet", TABLE])


# ------------------------------------------------------------------------------------------ iptables
def _ipt_rules(uid: int, v6: bool) -> list[list[str]]:
    unreachable = "icmp6-adm-prohibited" if v6 else "icmp-admin-prohibited"
    match = ["-m", "owner", "--uid-owner", str(int(uid)), "!", "-o", "lo", "-m", "comment", "--comment", _tag(uid)]
    return [[*match, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
            [*match, "-j", "REJECT", "--reject-with", unreachable]]


def _ipt_close(tool: str, uid: int, v6: bool) -> str | None:
    _run([tool, "-w", "-N", IPT_CHAIN])  # already there is fine: the checks below decide
    if not _run([tool, "-w", "-C", "OUTPUT", "-j", IPT_CHAIN])[0]:
        ok, why = _run([tool, "-w", "-I", "OUTPUT", "1", "-j", IPT_CHAIN])
        if not ok:
            return f"{tool} refused the rule: {why}"
    for rule in _ipt_rules(uid, v6):
        if not _run([tool, "-w", "-C", IPT_CHAIN, *rule])[0]:
            ok, why = _run([tool, "-w", "-A", IPT_CHAIN, *rule])
            if not ok:
                return f"{tool} refused the rule: {why}"
    return None


def _ipt_remove(tool: str, uid: int, v6: bool) -> None:
    for rule in _ipt_rules(uid, v6):
        while _run([tool, "-w", "-D", IPT_CHAIN, *rule])[0]:
            pass
    ok, out = _run([tool, "-w", "-S", IPT_CHAIN])
    if ok and "dtlabs-subject-" not in out:
        _run([tool, "-w", "-D", "OUTPUT", "-j", IPT_CHAIN])
        _run([tool, "-w", "-X", IPT_CHAIN])


# ------------------------------------------------------------------------------------------ the interface
def close(uid: int) -> str | None:
    """Close the network but loopback to ``uid`` (at once if already closed). None where it is closed, else why it
    stays open."""
    why = []
    nft = shutil.which("nft")
    if nft:
        failed = _nft_close(nft, uid)
        if not failed:
            return None
        why.append(failed)
    ipt, ip6t = shutil.which("iptables"), shutil.which("ip6tables")
    if ipt and ip6t:
        failed = _ipt_close(ipt, uid, False) or _ipt_close(ip6t, uid, True)
        if not failed:
            return None
        why.append(failed)
    elif not nft:
        why.append("neither nft nor iptables and ip6tables are on PATH (Debian: apt-get install nftables)")
    return "; ".join(why)


def remove(uid: int) -> None:
    """Take ``uid``'s rules away (and our table or chain once no uid's rules are left in it)."""
    if nft := shutil.which("nft"):
        _nft_remove(nft, uid)
    for tool, v6 in ((shutil.which("iptables"), False), (shutil.which("ip6tables"), True)):
        if tool:
            _ipt_remove(tool, uid, v6)


@lru_cache(maxsize=None)
def for_grading(uid: int) -> str | None:
    """``close(uid)`` once per grading process (the sandbox starts, the grade line's note): None, or why it is open."""
    return close(uid)


def grade_note(uid: int) -> str | None:
    """The grade line's words where the network stays open to ``uid`` (``outcomes.network_open``), else None."""
    why = for_grading(uid)
    return str(outcomes.network_open(why)) if why else None


def describe(uid: int) -> str:
    """``dtlabs doctor --grading``: the network the separate user has (closing it first, as grading would)."""
    why = close(uid)
    if why:
        return f"OPEN to the submission ({why}); every grade line in this mode says so"
    nft = shutil.which("nft")
    where = f"nft table inet {TABLE}" if nft and not _nft_missing(nft, uid) else f"iptables chain {IPT_CHAIN}"
    return f"closed to uid {int(uid)} but loopback ({where})"
