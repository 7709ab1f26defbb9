"""Known-wrong answers (``grader/known_wrong/NN_topic/<mistake>.py``): read for the tests that prove the hidden
tests catch them (format in AUTHORING.md)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lab_utils.grading import REPO_ROOT


@dataclass
class KnownWrong:
    """One ``grader/known_wrong/NN_topic/<mistake>.py`` (format in AUTHORING.md)."""

    path: Path
    replaces: str
    loses: list
    mistake: str
    source: str
    nightly: str | None = None  # why it is graded only by the nightly job (DTLABS_FULL=1), if it is

    @property
    def name(self) -> str:
        return self.path.stem


def read_known_wrong(path: Path | str) -> KnownWrong:
    path = Path(path)
    header, body, in_header = {}, [], True
    for line in path.read_text().split("\n"):
        m = re.match(r"^#\s*(replaces|loses|mistake|nightly)\s*:\s*(.*?)\s*$", line) if in_header else None
        if m:
            header[m.group(1)] = m.group(2)
            continue
        in_header = False
        body.append(line)
    for key in ("replaces", "loses", "mistake"):
        if not header.get(key):
            raise ValueError(f"{path}: missing header line '# {key}: ...' (see AUTHORING.md, Known-wrong submissions)")
    loses = [x.strip() for x in header["loses"].split(",") if x.strip()]
    return KnownWrong(path, header["replaces"], loses, header["mistake"], "\n".join(body).strip("\n"),
                      header.get("nightly"))


def known_wrong(lab: str, root: Path | str = REPO_ROOT, *, per_push: bool = False) -> list[KnownWrong]:
    """A lab's known-wrong answers; ``per_push``: without those marked ``# nightly:`` (graded by DTLABS_FULL=1)."""
    folder = Path(root) / "grader" / "known_wrong" / lab
    found = [read_known_wrong(p) for p in sorted(folder.glob("*.py"))] if folder.is_dir() else []
    return [kw for kw in found if not (per_push and kw.nightly)]
