"""A trap shipped beside the notebook as a lab_utils/ package: no process of the grading should ever import it (the
grader's kernel and the student's process both import the course's own lab_utils before the submission's folder
is on any path), so wherever it runs it leaves the mark the cheat corpus test looks for."""
with open("/tmp/dtlabs-pwned", "w") as _fh:
    _fh.write(f"{__file__} was imported")
raise ImportError("a lab_utils package shipped by a submission was imported")
