"""Feedback without hidden tests: nbgrader's ``ClearHiddenTests`` on the autograded copy, plus redaction.

nbgrader's feedback HTML renders the autograded cells, hidden regions included. ``HideHiddenTests`` sits in
``GenerateFeedback.preprocessors`` (``grader/nbgrader_config.py``), so the CLI and the formgrader both use it:
the region becomes one comment line, and every cell's outputs lose each line that quotes a hidden line (an
IPython traceback prints the failing source line; an answer cell may print what it saw of a test's harness). A failing hidden check still shows its message, which
AUTHORING.md asks to be written for the student. A cell with hidden tests shows that message and nothing else: no
prints or figures (what the student's code printed under a hidden call could spell out its arguments; the grader
kernel already drops them, ``split/``, and feedback drops them again for any notebook that still holds them).

The page itself is ``FeedbackPage``: nbgrader's, with a Content-Security-Policy that runs no script (``boundary/inert.py``).
"""
from __future__ import annotations

import re

from nbconvert.exporters import HTMLExporter
from nbgrader.preprocessors import ClearHiddenTests

from lab_utils.grading.boundary.inert import FEEDBACK_POLICY
from lab_utils.grading.course import HIDDEN_MARKERS, split_hidden


def hidden_lines(source: str) -> list[str]:
    """The hidden region's lines worth redacting (short ones like ``)`` would redact everything)."""
    return [line.strip() for line in split_hidden(source)[1] if len(line.strip()) >= 8]


def redact(text: str, hidden: list[str]) -> str:
    if not hidden:
        return text
    return "\n".join("(hidden test line)" if any(h in line for h in hidden) else line for line in text.split("\n"))


class HideHiddenTests(ClearHiddenTests):
    placeholder = "# (hidden tests: not shown)"

    def preprocess(self, nb, resources):
        """Every output of the notebook is redacted against every hidden line: a test cell's traceback quotes its
        own, and an answer cell can print what it learnt of the tests (a harness's constants and code reach the
        student's process while it is graded)."""
        self._hidden = [h for c in nb.cells if c.cell_type == "code" and HIDDEN_MARKERS[0] in c.source
                        for h in hidden_lines(c.source)]
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code":
            return cell, resources
        hidden = getattr(self, "_hidden", None) or hidden_lines(cell.source)
        test_cell = HIDDEN_MARKERS[0] in cell.source
        if test_cell:
            out, inside = [], False
            for line in cell.source.split("\n"):
                if HIDDEN_MARKERS[0] in line:
                    inside = True
                    out.append(line[: len(line) - len(line.lstrip())] + self.placeholder)
                elif HIDDEN_MARKERS[1] in line:
                    inside = False
                elif not inside:
                    out.append(line)
            cell.source = "\n".join(out)
        if test_cell:
            cell["outputs"] = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["evalue"] = redact(output.get("evalue", ""), hidden)
                if test_cell:  # its traceback shows the test's own source lines: keep the "Error: message" line
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output['evalue']}"]
                else:
                    output["traceback"] = [redact(line, hidden) for line in output.get("traceback", [])]
            elif output.get("output_type") == "stream":
                output["text"] = redact(output.get("text", ""), hidden)
            elif output.get("output_type") in ("execute_result", "display_data"):
                data = output.get("data", {})
                for mime in ("text/plain", "text/html", "text/markdown"):
                    if isinstance(data.get(mime), str):
                        data[mime] = redact(data[mime], hidden)
        return cell, resources


class FeedbackPage(HTMLExporter):
    """nbgrader's feedback page (``GenerateFeedback.exporter_class``) with ``FEEDBACK_POLICY`` as a meta tag first in
    its head, before anything it could apply to: a file opened from disk or a release has no server to send a header.
    Whatever of the submission slipped past ``InertNotebook`` still runs no script and fetches no remote image."""

    def from_notebook_node(self, nb, resources=None, **kw):
        page, resources = super().from_notebook_node(nb, resources, **kw)
        meta = f'<meta http-equiv="Content-Security-Policy" content="{FEEDBACK_POLICY}">'
        head = re.search(r"<head\b[^>]*>", page, re.I)
        at = head.end() if head else 0  # no head: first in the document, where the parser opens one for it
        return page[:at] + "\n" + meta + page[at:], resources
