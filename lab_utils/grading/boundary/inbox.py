"""A class's submissions in: a class folder read through the id door and copied as data, the instructor's
submission times, and the digest that says whether a submission changed since it was last graded."""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from lab_utils.grading.boundary import ids
from lab_utils.grading.boundary.files import copy_submission
from lab_utils.grading.course import WORK


def read_timestamps(path: Path | str) -> dict:
    """The instructor's submission times (``--timestamps FILE``): a CSV with a header naming the columns ``student``
    and ``timestamp`` (and ``lab``, where one student's labs differ). Returns (student, lab or None) -> the time as
    written, each checked as nbgrader parses ``timestamp.txt``. ``ValueError`` says which row is wrong."""
    import csv

    from nbgrader.utils import parse_utc

    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
            columns = [(c or "").strip() for c in reader.fieldnames or []]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"cannot read the submission times {path}: {exc}") from None
    if not {"student", "timestamp"} <= set(columns):
        raise ValueError(f"{path}: no column 'student' and 'timestamp' in its header (it has: {', '.join(columns)}); "
                         "e.g. student,timestamp / ann,2025-10-01 23:12:00 UTC")
    times = {}
    for n, row in enumerate(rows, start=2):
        row = {(k or "").strip(): (v or "").strip() for k, v in row.items()}
        try:
            parse_utc(row["timestamp"])
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"{path}, row {n}: {row['timestamp']!r} is not a time nbgrader reads: {exc}") from None
        times[(row["student"], row.get("lab") or None)] = row["timestamp"]
    return times


STAMP = "timestamp.txt"  # nbgrader's submission time, beside the notebook


def collect(src: Path, submitted: Path, times: dict | None) -> tuple[list[str], list]:
    """Copy a class folder (<student>/<lab>/...) into the course's submitted/ as data: every student folder that
    passes the door (``ids.scan``: a real folder named by a valid id) with ``files.copy_submission`` (no link
    followed). The student's own ``timestamp.txt`` is never kept: the submission time is the instructor's
    (``times``, from ``--timestamps``) or none. Returns (a line for each student whose folder lost something,
    what the door refused: (student as shown, lab or None, reason))."""
    notes = []
    scanned = ids.scan(src)
    for lab, students in scanned.found.items():
        shown = ids.shown(lab)  # a lab folder's name is the student's too
        for student in students:
            dest = submitted / student / lab
            if dest.exists():
                shutil.rmtree(dest)
            copied = copy_submission(src / student / lab, dest)
            if copied.left_out:
                notes.append(f"   {student}/{shown}: {copied.note()}")
            stamp = dest / STAMP
            if stamp.exists() or stamp.is_symlink():
                stamp.unlink()
                if times is None:
                    notes.append(f"   {student}/{shown}: its own {STAMP} is ignored (the submission time is the "
                                 "instructor's: --timestamps FILE)")
            if times is not None:
                when = times.get((student, lab)) or times.get((student, None))
                if when:
                    stamp.write_text(when)
                else:
                    notes.append(f"   {student}/{shown}: no submission time in --timestamps: no late penalty")
    return notes, scanned.refused


def submission_digest(course_root: Path, lab: str, student: str) -> str:
    """A digest of the submission's regular files (links and special files are never opened) and of the lab's
    source: a re-run regrades a submission when either changed. Each file is framed by its name's length, its name,
    its kind, its length and its bytes, so no two different submissions give the same stream."""
    sub = course_root / WORK / "submitted" / student / lab
    h = hashlib.sha256()

    def frame(*parts: bytes) -> None:
        for part in parts:
            h.update(len(part).to_bytes(8, "big") + part)

    for dirpath, dirnames, filenames in os.walk(sub, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath, name)
            info = os.lstat(path)
            regular = stat.S_ISREG(info.st_mode)
            frame(os.fsencode(path.relative_to(sub)), b"file" if regular else f"mode {info.st_mode:o}".encode(),
                  path.read_bytes() if regular else b"")
    frame(b"source", (course_root / "solutions" / lab / f"{lab}.ipynb").read_bytes())
    return h.hexdigest()
