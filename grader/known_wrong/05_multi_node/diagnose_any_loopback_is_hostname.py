# replaces: diagnose
# loses: test_diagnose
# mistake: takes every loopback peer (127.0.0.1 from GLOO_SOCKET_IFNAME=lo too) for the host-name line
import re


def diagnose(log, addresses):
    """What stopped a multi-node run: "hostname", "interface", "unreachable", "timeout" or "ok" (the exercise)."""
    peers = re.findall(r"remote=\[([0-9a-fA-F.:]+)\]", log)
    if peers:
        peer = peers[-1]
        if peer.startswith("127."):
            return "hostname"
        if peer not in set(addresses):
            return "interface"
        return "unreachable"
    if any(words in log for words in ("did not finish within", "timed out", "RendezvousTimeoutError",
                                      "RendezvousClosedError")):
        return "timeout"
    return "ok"
