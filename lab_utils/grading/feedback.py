"""Feedback without hidden tests: nbgrader's ``ClearHiddenTests`` on the autograded copy, plus redaction.

nbgrader's feedback HTML renders the autograded cells, hidden regions included. ``HideHiddenTests`` sits in
``GenerateFeedback.preprocessors`` (``grader/nbgrader_config.py``), so the CLI and the formgrader both use it:
the region becomes one comment line, and the cell's outputs lose every line that quotes a hidden line (an
IPython traceback prints the failing source line). A failing hidden check still shows its message, which
AUTHORING.md asks to be written for the student.
"""
from __future__ import annotations

from nbgrader.preprocessors import ClearHiddenTests

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

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code" or HIDDEN_MARKERS[0] not in cell.source:
            return cell, resources
        hidden = hidden_lines(cell.source)
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
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                # a traceback shows source lines: keep only the final "Error: message" line
                output["evalue"] = redact(output.get("evalue", ""), hidden)
                output["traceback"] = [f"{output.get('ename', 'Error')}: {output['evalue']}"]
            elif output.get("output_type") == "stream":
                output["text"] = redact(output.get("text", ""), hidden)
        return cell, resources
