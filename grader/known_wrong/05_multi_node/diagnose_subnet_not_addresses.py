# replaces: diagnose
# loses: test_diagnose
# mistake: compares the peer with this lab's subnet (10.77.0.x) instead of the nodes' addresses it is given
import re


def diagnose(log, addresses):
    """What stopped a multi-node run: "hostname", "interface", "unreachable", "timeout" or "ok" (the exercise)."""
    peers = re.findall(r"remote=\[([0-9a-fA-F.:]+)\]", log)
    if peers:
        peer = peers[-1]
        if peer == "127.0.1.1":
            return "hostname"
        if not peer.startswith("10.77.0."):
            return "interface"
        return "unreachable"
    if any(words in log for words in ("did not finish within", "timed out", "RendezvousTimeoutError",
                                      "RendezvousClosedError")):
        return "timeout"
    return "ok"
