"""Shipped beside the notebook (and as .dtlabs_pkg/sitecustomize.py, usercustomize.py): Python's site module imports
it when an interpreter starts with this folder on its path. Outside the subject's boundary it would be free to
trace the grader; here it only leaves the mark the cheat corpus test looks for, with where it ran."""
import os
import threading


def _mark():
    with open("/tmp/dtlabs-pwned", "a") as fh:
        fh.write(f"{__file__} ran at the start of pid {os.getpid()} (a thread started here escapes Landlock)\n")


threading.Thread(target=_mark).start()
