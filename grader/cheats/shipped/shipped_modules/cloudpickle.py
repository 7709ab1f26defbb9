"""A trap shipped beside the notebook as torch.py (and cloudpickle.py, lab_utils/__init__.py; the cell writes it
as numpy.py too): in the grader's kernel it leaves the mark the cheat corpus test looks for, then fails that
import; in the student's own process it never runs (the subject imports the real torch before the submission's
folder is on its path)."""
import sys

_proxy = sys.modules.get("lab_utils.grading.split.proxy")
if _proxy is not None and getattr(_proxy, "_SESSION", None) is not None:
    with open("/tmp/dtlabs-pwned", "w") as _fh:
        _fh.write(f"{__file__} was imported by the grader")
    raise ImportError("the grader imported a module from the submission's folder")
