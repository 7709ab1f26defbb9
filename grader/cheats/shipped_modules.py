# attack: ship torch.py, cloudpickle.py and a lab_utils/ package beside the notebook, and write numpy.py from the answer cell: a grader that imports from the submission's folder (its working directory, '' on its path) runs them with the instructor's rights
# defended-by: split
# needs: a grader that imports torch (Lab 01's does; the synthetic lab's does not)
# ships: shipped/shipped_modules
with open("torch.py") as _fh, open("numpy.py", "w") as _out:
    _out.write(_fh.read())  # the same trap under another name, written while the submission runs
