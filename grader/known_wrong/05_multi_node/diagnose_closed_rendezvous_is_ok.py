# replaces: diagnose
# loses: test_diagnose
# mistake: counts only timeouts as a rendezvous nobody answered, so the agent that finds it closed (RendezvousClosedError) is "ok"
import re


def diagnose(log, addresses):
    """What stopped a multi-node run: "hostname", "interface", "unreachable", "timeout" or "ok" (the exercise)."""
    peers = re.findall(r"remote=\[([0-9a-fA-F.:]+)\]", log)
    if peers:
        peer = peers[-1]
        if peer == "127.0.1.1":
            return "hostname"
        if peer not in set(addresses):
            return "interface"
        return "unreachable"
    if any(words in log for words in ("did not finish within", "timed out", "RendezvousTimeoutError")):
        return "timeout"
    return "ok"
