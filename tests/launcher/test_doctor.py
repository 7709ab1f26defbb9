"""`dtlabs doctor` tells a student what a launch would use, and fails with a fix when it cannot work."""
from __future__ import annotations

import re
import subprocess

import lab_utils.launcher.backend as env
from lab_utils import cgroups
from lab_utils.launcher.doctor import doctor
from lab_utils.status import Status


def test_doctor_reports_the_setup_and_a_working_all_reduce():
    lines = []
    assert doctor(out=lines.append) is Status.DONE, "\n".join(lines)
    text = "\n".join(lines)
    for word in ("torch", "gloo", "GPUs", "backend", "all-reduce  ok", "kernels     ipc", "runtime", "all good"):
        assert word in text
    # the CPU budget with where it came from, the memory limit and the memory in use (lab_utils.cgroups)
    budget = cgroups.cpu_budget()
    assert f"CPU budget  {budget.cpus}: {budget.source}" in text, text
    assert re.search(r"memory      limit (none|\d+ MB), \d+ MB in use \(", text), text
    # the ranks' own network where this machine lets an ordinary user make one (unshare -Urn), else the warning
    own = subprocess.run(["unshare", "--user", "--map-current-user", "--net", "true"], capture_output=True)
    assert ("ranks' net  private" if own.returncode == 0 else "ranks' net  shared: ") in text, text


def test_doctor_fails_with_a_fix_hint_when_no_backend_works(monkeypatch):
    monkeypatch.setattr(env.dist_module(), "is_gloo_available", lambda: False)
    lines = []
    assert doctor(out=lines.append) is Status.INCOMPLETE
    text = "\n".join(lines)
    assert "PROBLEM     this torch build has no gloo backend" in text and "fix:" in text
