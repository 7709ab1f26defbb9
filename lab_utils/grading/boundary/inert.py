"""A submitted notebook made inert: nothing in it can run in a browser that shows it.

A submission's markdown, attachments and outputs end up in pages opened in someone's Jupyter origin: the
instructor's formgrader (where a script could set its own scores through the formgrader's API, read ``solutions/``
and write the course) and the student's feedback page. nbconvert renders a markdown cell's raw HTML as it is, and
nbgrader's formgrade and feedback templates do so even with ``HTMLExporter.sanitize_html``. ``InertNotebook`` runs
last in autograde (so ``autograded/`` never holds live HTML) and again in every HTML export nbgrader makes from it
(feedback and the formgrader, ``nbgrader_run.apply_nbgrader_config``):

- a markdown cell is rendered as the exporters render it (nbconvert's markdown, its attachments embedded) and checked
  against an allow-list (bleach, the HTML5 parser browsers follow): tags, attributes, ``http``/``https``/``mailto``
  links and raster ``data:`` images only. A cell whose rendering the allow-list would change is shown as text: its
  source in a fenced block, under a line saying why;
- attachments keep only PNG, JPEG and GIF (an SVG or HTML attachment can carry script);
- raw cells and ``text/html`` outputs are cleaned by the same allow-list; outputs keep only types that render as
  text or raster images (``application/javascript``, ``image/svg+xml``, widget views, markdown outputs go);
- the notebook's widget state (rendered as script by nbconvert's templates) goes.
"""
from __future__ import annotations

import re

import bleach
from bleach.css_sanitizer import CSSSanitizer
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "details", "div", "dl", "dt", "em", "h1", "h2", "h3",
    "h4", "h5", "h6", "hr", "i", "img", "kbd", "li", "mark", "ol", "p", "pre", "s", "small", "span", "strong", "sub",
    "summary", "sup", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul",
})
PROTOCOLS = frozenset({"http", "https", "mailto", "data"})  # data: only for raster images (_allowed)
RASTER = ("image/png", "image/jpeg", "image/gif")
_RASTER_DATA = re.compile(r"^data:image/(png|jpeg|gif);base64,[A-Za-z0-9+/=\s]*$")
_WEB = re.compile(r"^(https?:|mailto:|#|[^:]*$)", re.I)  # a scheme we allow, an anchor, or a relative path
_ALIGN = re.compile(r"^\s*text-align\s*:\s*(left|right|center)\s*;?\s*$")
_PLAIN = re.compile(r"^[\w\s.,:;%#-]*$")  # an attribute value with nothing a browser could act on
# class values the markdown renderer itself writes (pygments tokens, anchor links, a code block's language)
_CLASSES = {"span": re.compile(r"^[a-z0-9 ]{1,40}$"), "div": re.compile(r"^highlight( hl-[\w-]+)?$"),
            "a": re.compile(r"^anchor-link$"), "code": re.compile(r"^language-[\w+-]{1,40}$"),
            "pre": re.compile(r"^[\w -]{0,40}$")}
OUTPUTS_KEPT = frozenset({"text/plain", "text/latex", "application/json", "text/html", *RASTER})
NOTE = "*(This cell held HTML that could run in a browser; it is shown as the text the student wrote.)*"


def _allowed(tag: str, name: str, value: str) -> bool:
    """The allow-list's attributes: what markdown writes, with values that cannot run anything."""
    if name in ("title", "alt"):
        return True
    if tag == "a" and name == "href":
        return bool(_WEB.match(value.strip()))
    if tag == "img" and name == "src":
        return bool(_WEB.match(value.strip()) or _RASTER_DATA.match(value.strip()))
    if tag == "img" and name in ("width", "height"):
        return value.strip().isdigit()
    if tag in ("h1", "h2", "h3", "h4", "h5", "h6") and name == "id":  # nbconvert's heading anchors
        return len(value) <= 200
    if tag in ("td", "th") and name in ("align", "colspan", "rowspan"):
        return bool(_PLAIN.match(value))
    if tag in ("td", "th") and name == "style":  # a markdown table's column alignment
        return bool(_ALIGN.match(value))
    if tag == "details" and name == "open":
        return True
    if name == "class" and tag in _CLASSES:
        return bool(_CLASSES[tag].match(value))
    return False


_CSS = CSSSanitizer(allowed_css_properties=["text-align"])
_CLEANER = bleach.sanitizer.Cleaner(tags=TAGS, attributes=_allowed, protocols=PROTOCOLS, strip=False,
                                    strip_comments=True, css_sanitizer=_CSS)


def clean_html(html: str) -> str:
    """``html`` with everything outside the allow-list escaped (shown as text) or dropped."""
    return _CLEANER.clean(html or "")


def _schemes(html: str) -> set:
    """Every URL scheme bleach could find in ``html``'s attribute values: the text normalized as bleach normalizes a
    value (entities decoded, whitespace, controls and non-ASCII dropped, lower case), then each run of scheme
    characters before a colon, and every tail of it."""
    text = bleach.html5lib_shim.convert_entities(html)
    text = re.sub(r"[^\x00-\x7f]", "", re.sub(r"[`\000-\040\177-\240\s]+", "", text)).lower()
    return {run[i:] for run in re.findall(r"[a-z0-9+.\-]+(?=:)", text) for i in range(len(run))}


def _as_is(html: str) -> str:
    """``html`` through the same parser and serializer with every tag, attribute and URL in it allowed: what
    ``clean_html`` returns when the allow-list removes nothing (comments aside, which both drop)."""
    tags = {t.lower() for t in re.findall(r"<\s*/?\s*([A-Za-z][^\s/>]*)", html)} | TAGS
    cleaner = bleach.sanitizer.Cleaner(tags=tags, attributes=lambda *_: True, protocols=_schemes(html) | PROTOCOLS,
                                       strip=False, strip_comments=True, css_sanitizer=_CSS)
    return cleaner.clean(html)


def render_markdown(source: str, attachments: dict | None = None) -> str:
    """A markdown cell as nbconvert's HTML exporter renders it (``HTMLExporter.markdown2html``, images embedded)."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    renderer = IPythonRenderer(escape=False, attachments=attachments or {}, embed_images=False, path="",
                               anchor_link_text="¶", exclude_anchor_links=False)
    return MarkdownWithMath(renderer=renderer).render(source)


def inert_markdown(source: str, attachments: dict | None = None) -> bool:
    """Whether the allow-list keeps this markdown's rendering unchanged."""
    try:
        html = render_markdown(source, attachments)
    except Exception:  # noqa: BLE001 - markdown nbconvert cannot render (a missing attachment): shown as text
        return False
    return clean_html(html) == _as_is(html)


def as_text(source: str) -> str:
    """Markdown that shows ``source`` as text: a fenced block longer than any run of backticks in it."""
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", source)), default=0))
    return f"{NOTE}\n\n{fence}text\n{source}\n{fence}"


def _inert_outputs(outputs: list) -> list:
    for output in outputs:
        data = output.get("data")
        if output.get("output_type") not in ("display_data", "execute_result") or not isinstance(data, dict):
            continue
        for mime in list(data):
            if mime not in OUTPUTS_KEPT or not isinstance(data[mime], (str, list, dict)):
                del data[mime]
            elif mime == "text/html":
                html = data[mime] if isinstance(data[mime], str) else "".join(data[mime])
                data[mime] = clean_html(html)
        if not data:
            data["text/plain"] = "(an output that could run in a browser, not shown)"
        metadata = output.get("metadata")
        if isinstance(metadata, dict):
            metadata.pop("text/html", None)  # e.g. isolated=True: an iframe of its own
    return outputs


class InertNotebook(Preprocessor):
    """The module docstring, as an nbconvert preprocessor (autograde, feedback, formgrader)."""

    enabled = Bool(True, help="nbgrader registers its preprocessors as they are: on unless a config turns it off"
                   ).tag(config=True)

    def preprocess(self, nb, resources):
        nb.metadata.pop("widgets", None)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, cell_index):
        if "attachments" in cell:
            kept = {}
            for name, bundle in (cell.get("attachments") or {}).items():
                raster = {m: v for m, v in (bundle or {}).items() if m in RASTER and isinstance(v, str)}
                if raster:
                    kept[name] = raster
            cell["attachments"] = kept
        if cell.cell_type == "markdown":
            if not inert_markdown(cell.source, cell.get("attachments")):
                cell.source = as_text(cell.source)
                cell.pop("attachments", None)
        elif cell.cell_type == "raw":
            cell.source = clean_html(cell.source)
        elif cell.cell_type == "code":
            _inert_outputs(cell.get("outputs", []))
        return cell, resources
