"""lab_utils.grading.boundary.inert: what a submission wrote is kept from running in a page, and the course's own
markdown is left as it is. The pages themselves are opened in Chromium by tests/grading/boundary/test_browser_formgrader.py."""
from __future__ import annotations

import base64

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell

from lab_utils import grading
from lab_utils.grading.boundary.inert import NOTE, InertNotebook, inert_markdown, render_markdown

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


@pytest.mark.parametrize("source", LIVE)
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
