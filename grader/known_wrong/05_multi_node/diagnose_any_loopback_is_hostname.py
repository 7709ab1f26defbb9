# replaces: diagnose
# loses: test_diagnose
# mistake: takes every loopback peer (127.0.0.1 from GLOO_SOCKET_IFNAME=lo too) for the host-name line
import re


def diagnose(log, addresses):
    """What stopped a multi-node run: "hostname", "interface", "firewall" or "ok" (see the exercise)."""
    peers = re.findall(r"remote=\[([0-9a-fA-F.:]+)\]", log)
    if peers:
        peer = peers[-1]
        if peer.startswith("127."):
            return "hostname"
        if peer not in set(addresses):
            return "interface"
        return "firewall"
    if any(words in log for words in ("did not finish within", "RendezvousTimeoutError", "timed out")):
        return "firewall"
    return "ok"
