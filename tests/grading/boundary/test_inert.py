"""lab_utils.grading.boundary.inert: what a submission wrote is kept from running in a page, and the course's own
markdown is left as it is. The pages themselves are opened in Chromium by tests/grading/boundary/test_browser_formgrader.py."""
from __future__ import annotations

import base64
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell

from helpers import REPO
from helpers.cheat_corpus import header

from lab_utils import grading
from lab_utils.grading.boundary.inert import (
    CELLS_START, FEEDBACK_POLICY, NOTE, InertNotebook, clean_html, formgrader_policy, inert_markdown, render_markdown,
)
from lab_utils.grading.feedback import FeedbackPage

LIVE = [
    "<script>alert(1)</script>",
    "[x](javascript:alert(1))",
    "<a href='jav&#x09;ascript:alert(1)'>x</a>",
    "<a href=' javascript:alert(1)'>x</a>",
    "<a href='data:text/html,<script>alert(1)</script>'>x</a>",
    "<img src=x onerror=alert(1)>",
    "<iframe src='javascript:alert(1)'></iframe>",
    "<object data=x></object>",
    "<embed src=x>",
    "<style>body { display: none }</style>",
    "<p style='position:fixed;top:0;left:0;width:100%;height:100%'>log in again</p>",
    "<div class='modal'>x</div>",
    "<svg><script>alert(1)</script></svg>",
    "<math><mi xlink:href='javascript:alert(1)'>x</mi></math>",
    "<form action=x><button>x</button></form>",
    "<meta http-equiv=refresh content='0;url=http://example.com'>",
    "<base href=http://example.com/>",
    "![svg](data:image/svg+xml;base64,PHN2Zz4=)",
    "<details open ontoggle=alert(1)><summary>x</summary></details>",
]
# A link's scheme as the browser reads it: character references decoded with or without their semicolon, whitespace
# and control characters dropped, any case (issue 46, part 6: the first three ran in the formgrader before)
ENCODED = [
    '<a href="javascript&colon;alert(1)">x</a>',
    '<a href="java&Tab;script:alert(1)">x</a>',
    '<a href="javascript&#58alert(1)">x</a>',
    '<a href="javascript&#x3a alert(1)">x</a>',
    '<a href="javascript&#0000058;alert(1)">x</a>',
    '<a href="&#x6A;avascript:alert(1)">x</a>',
    '<a href="jav&#x09;ascript:alert(1)">x</a>',
    '<a href="java&NewLine;script&colon;alert(1)">x</a>',
    '<a href="JaVaScRiPt:alert(1)">x</a>',
    '<a href="&#x6A;ava&Tab;ScRiPt&#58alert(1)">x</a>',
    '<a href=" \tjavascript:alert(1)">x</a>',
    '<a href="\x01\x1fjavascript:alert(1)">x</a>',
    '<a href="&#32;&#1;javascript&colon;alert(1)">x</a>',
    '<a href="vbscript:msgbox(1)">x</a>',
    '<a href="data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==">x</a>',
    '<a href="data&colon;text/html,<script>alert(1)</script>">x</a>',
    '<img src="data&colon;image/svg+xml,<svg onload=alert(1)>">',
    header(REPO / "grader" / "cheats" / "entity_encoded_links.py")["markdown"],
]
REMOTE_IMAGES = [
    "<img src=http://tracker.example/pixel.png>",
    '<img src="https://tracker.example/pixel.png">',
    "![t](http://tracker.example/pixel.png)",
    '<img src="//tracker.example/pixel.png">',
    '<img src="/\\tracker.example/pixel.png">',
    '<img src="&#104;ttp://tracker.example/pixel.png">',
]
KEPT = [
    "[a](https://pytorch.org/docs)", "[a](http://example.com/?a=1&b=2)", "[a](mailto:ta@example.edu)", "[a](#section)",
    "[a](other.ipynb)", "[a](../data/notes.md?x=1:2)", "![p](figure.png)", "![p](images/figure.png)",
    "![png](data:image/png;base64,iVBORw0KGgo=)", '<img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">',
    '<a href="https://example.com/?a=1&amp;b=2">x</a>',
]


@pytest.mark.parametrize("source", LIVE + ENCODED + REMOTE_IMAGES)
def test_markdown_that_could_run_is_shown_as_text(source):
    assert not inert_markdown(source), source
    cell = new_markdown_cell(source)
    nb, _ = InertNotebook().preprocess(new_notebook(cells=[cell]), {})
    shown = nb.cells[0].source
    assert shown.startswith(NOTE) and source in shown, shown
    assert inert_markdown(shown), "what replaces it must pass the allow-list"
    html = render_markdown(shown)
    assert not any(f"<{tag}" in html for tag in ("script", "iframe", "img", "a ", "svg", "style")), html


def test_every_labs_own_markdown_is_left_as_it_is():
    """The allow-list is wide enough for the course: headings (their anchors), tables with alignment, code, math,
    links and images render as they did."""
    changed = []
    for path in sorted((grading.REPO_ROOT / "solutions").glob("*/*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown" and not inert_markdown(cell.source, cell.get("attachments")):
                changed.append(f"{path.name}: {cell.source[:80]!r}")
    assert not changed, "\n".join(changed)
    for source in ["# A title\n\nSome **bold**, `code`, $x^2$ and a [link](https://pytorch.org).",
                   "| a | b |\n|--:|:-:|\n| 1 | 2 |", "```python\nx = 1\n```", "<details><summary>s</summary>t</details>",
                   "![png](data:image/png;base64,iVBORw0KGgo=)"]:
        assert inert_markdown(source), source


def test_attachments_outputs_raw_cells_and_widget_state():
    svg = base64.b64encode(b"<svg onload='alert(1)'/>").decode()
    png = "iVBORw0KGgo="
    md = new_markdown_cell("![p](attachment:p.png)", attachments={"p.png": {"image/png": png, "image/svg+xml": svg},
                                                                  "s.svg": {"image/svg+xml": svg}})
    code = new_code_cell("x", outputs=[
        new_output("display_data", data={"text/html": "<b onclick='alert(1)'>hi</b><script>alert(1)</script>",
                                         "application/javascript": "alert(1)", "image/svg+xml": "<svg/>",
                                         "text/markdown": "[x](javascript:alert(1))", "text/plain": "hi"},
                   metadata={"text/html": {"isolated": True}}),
        new_output("display_data", data={"application/javascript": "alert(1)"}),
        new_output("stream", name="stdout", text="<script>printed text is escaped by the template</script>"),
    ])
    raw = new_raw_cell("<script>alert(1)</script>", metadata={"raw_mimetype": "text/html"})
    nb = new_notebook(cells=[md, code, raw], metadata={"widgets": {"application/vnd.jupyter.widget-state+json": {}}})
    nb, _ = InertNotebook().preprocess(nb, {})
    assert nb.cells[0].attachments == {"p.png": {"image/png": png}}
    assert nb.cells[0].source == "![p](attachment:p.png)", "a raster attachment renders as it did"
    first, second, _ = nb.cells[1].outputs
    assert set(first.data) == {"text/html", "text/plain"}, first.data
    assert "<script" not in first.data["text/html"] and "onclick" not in first.data["text/html"], first.data
    assert "text/html" not in first.metadata
    assert set(second.data) == {"text/plain"}, second.data
    assert "<script" not in nb.cells[2].source
    assert "widgets" not in nb.metadata


@pytest.mark.parametrize("source", KEPT)
def test_web_and_relative_links_and_local_and_data_images_are_kept(source):
    assert inert_markdown(source), source


def test_an_html_output_loses_encoded_links_and_remote_images_and_keeps_the_rest():
    cleaned = clean_html("".join(ENCODED[:13]) + REMOTE_IMAGES[1] + KEPT[-1] + KEPT[-2])
    assert "href" not in cleaned.replace('href="https://example.com/?a=1&amp;b=2"', ""), cleaned
    assert "tracker" not in cleaned and 'src="data:image/gif;base64,R0lGODlhAQABAAAAACw="' in cleaned, cleaned


def test_the_feedback_page_carries_a_policy_that_runs_no_script():
    """The policy is a meta tag before anything in the page could run or load (a meta policy covers only what comes
    after it), as nbgrader's feedback template renders the page."""
    nb = new_notebook(cells=[new_markdown_cell("$x^2$ and text")])
    templates = Path(_nbgrader_templates())  # as nbgrader's GenerateFeedback configures its exporter
    exporter = FeedbackPage(template_name="feedback", extra_template_basedirs=[str(templates)],
                            extra_template_paths=[str(templates.parent / "static/node_modules/bootstrap/dist/css")])
    page, _ = exporter.from_notebook_node(nb, {"nbgrader": {"notebook": "lab", "score": 0, "max_score": 2,
                                                            "late_penalty": 0}})
    meta = f'<meta http-equiv="Content-Security-Policy" content="{FEEDBACK_POLICY}">'
    head = page.index("<head>")
    assert page.index(meta) == head + len("<head>\n"), page[:400]
    assert page.index(meta) < min(page.index(t) for t in ("<script", "<img", "<style", "<link") if t in page)
    assert "script-src 'none'" in FEEDBACK_POLICY and "img-src 'self' data:" in FEEDBACK_POLICY


def _nbgrader_templates() -> str:
    import nbgrader.server_extensions.formgrader.handlers as handlers

    return handlers.template_path


def test_the_formgraders_policy_trusts_only_the_pages_own_inline_script():
    """Script from the formgrader's static folder and, by hash, the inline script (and event handlers) its templates
    wrote before the submission's cells; nothing of the submission, nothing on a submission's file or an API answer."""
    own = '<html><head><script>var submission_id = "1";</script><span onclick="toggle_name(true);"></span>'
    theirs = "<script>window.DTLABS_PWNED = 1</script><b onclick=\"steal()\">x</b>"
    page = f'{own}<div class="container" {CELLS_START}>{theirs}</div></html>'
    policy = formgrader_policy("127.0.0.1:8888", "/", "/formgrader/submissions/abc/", page)
    assert policy.startswith("script-src 127.0.0.1:8888/formgrader/static/ 'unsafe-hashes' 'sha256-"), policy
    assert policy.count("'sha256-") == 2 and "img-src 'self' data:" in policy and "'unsafe-inline'" not in policy
    with_theirs = formgrader_policy("127.0.0.1:8888", "/", "/formgrader/submissions/abc/", page.replace(
        CELLS_START, "x"))
    assert with_theirs.count("'sha256-") == 0, "no marker: nothing of that page is trusted"
    for path in ("/formgrader/submissions/abc/evil.html", "/formgrader/static/js/formgrade.js",
                 "/formgrader/api/grades"):
        assert "'sha256-" not in formgrader_policy("127.0.0.1:8888", "/", path, page), path
    assert formgrader_policy("h:1", "/base/", "/base/formgrader/gradebook", own).count("'sha256-") == 2
    assert "h:1/base/formgrader/static/" in formgrader_policy("h:1", "/base/", "/base/formgrader/gradebook", own)
    assert formgrader_policy("h:1", "/", "/lab", own) is None and formgrader_policy("h:1", "/", "/files/x", "") is None
