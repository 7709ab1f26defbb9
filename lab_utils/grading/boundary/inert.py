"""A submitted notebook made inert: nothing in it can run in a browser that shows it.

A submission's markdown, attachments and outputs end up in pages opened in someone's Jupyter origin: the
instructor's formgrader (where a script could set its own scores through the formgrader's API, read ``solutions/``
and write the course) and the student's feedback page. nbconvert renders a markdown cell's raw HTML as it is, and
nbgrader's formgrade and feedback templates do so even with ``HTMLExporter.sanitize_html``. ``InertNotebook`` runs
last in autograde (so ``autograded/`` never holds live HTML) and again in every HTML export nbgrader makes from it
(feedback and the formgrader, ``nbgrader_run.apply_nbgrader_config``):

- a markdown cell is rendered as the exporters render it (nbconvert's markdown, its attachments embedded) and checked
  against an allow-list (bleach, the HTML5 parser browsers follow): tags, attributes, ``http``/``https``/``mailto``
  and relative links, relative and raster ``data:`` images only (a remote image tells a tracker who opened the page
  when). A URL is judged as the browser reads it (``_url``). A cell whose rendering the allow-list would change is
  shown as text: its source in a fenced block, under a line saying why;
- attachments keep only PNG, JPEG and GIF (an SVG or HTML attachment can carry script);
- raw cells and ``text/html`` outputs are cleaned by the same allow-list; outputs keep only types that render as
  text or raster images (``application/javascript``, ``image/svg+xml``, widget views, markdown outputs go);
- the notebook's widget state (rendered as script by nbconvert's templates) goes.

Behind that, the pages carry a Content-Security-Policy, so that what slipped through still cannot run: the feedback
page a meta tag that allows no script (``feedback.FeedbackPage``), and the formgrader's responses a header that
allows script only from the formgrader's own static folder and the page's own inline script, the part of the page
before the submission's cells (``FormgraderPolicy``, a Jupyter server extension: ``grader/jupyter_server_config.d``).
Both allow images only from the page's own origin and ``data:``.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import html as html_module
import re
from html.parser import HTMLParser

import bleach
from bleach.css_sanitizer import CSSSanitizer
from nbconvert.preprocessors import Preprocessor
from tornado.web import OutputTransform
from traitlets import Bool

TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "details", "div", "dl", "dt", "em", "h1", "h2", "h3",
    "h4", "h5", "h6", "hr", "i", "img", "kbd", "li", "mark", "ol", "p", "pre", "s", "small", "span", "strong", "sub",
    "summary", "sup", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul",
})
PROTOCOLS = frozenset({"http", "https", "mailto", "data"})  # data: only for raster images (_allowed)
RASTER = ("image/png", "image/jpeg", "image/gif")
_RASTER_DATA = re.compile(r"^data:image/(png|jpeg|gif);base64,[A-Za-z0-9+/=\s]*$")
_LINK = re.compile(r"^(https?:|mailto:|[^:/?#]*([/?#]|$))")  # a scheme we allow, or none: a relative link
_LOCAL = re.compile(r"^(?!//)[^:/?#]*([/?#]|$)")  # relative, on the page's own server (``//host/`` is remote)
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
        return bool(_LINK.match(_url(value)))
    if tag == "img" and name == "src":
        return bool(_LOCAL.match(_url(value)) or _RASTER_DATA.match(html_module.unescape(value).strip()))
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


def _url(value: str) -> str:
    """A URL attribute's value as a browser reads it, to judge its scheme: character references decoded by HTML5's
    rules, with or without the semicolon (``&colon;``, ``&#58``, ``&Tab;``: bleach leaves them, the browser does not),
    then every whitespace and control character dropped (the URL parser strips them at the ends and tabs and newlines
    anywhere), ``\\`` read as ``/``, lower case. Dropping more than the browser only refuses more."""
    return re.sub(r"[\x00-\x20\x7f-\x9f\s]+", "", html_module.unescape(value)).replace("\\", "/").lower()


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


def page_policy(scripts: str) -> str:
    """The Content-Security-Policy of a page that shows a submission, with ``scripts`` as its script sources."""
    return f"script-src {scripts}; img-src 'self' data:; object-src 'none'; base-uri 'none'"


FEEDBACK_POLICY = page_policy("'none'")  # the feedback page runs no script of its own
CELLS_START = 'id="notebook-container"'  # in nbgrader's formgrade page, what comes after this is the submission's


class _InlineScript(HTMLParser):
    """The script a page runs from its own text: inline ``<script>`` bodies and event-handler attributes."""

    _JS = {"", "text/javascript", "application/javascript", "module"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.bodies, self.handlers, self._body = [], [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.handlers += [v or "" for k, v in attrs.items() if k.startswith("on")]
        if tag == "script" and "src" not in attrs and (attrs.get("type") or "").strip().lower() in self._JS:
            self._body = []

    def handle_data(self, data):
        if self._body is not None:
            self._body.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._body is not None:
            self.bodies.append("".join(self._body))
            self._body = None


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def formgrader_policy(host: str, base_url: str, path: str, page: str | None) -> str | None:
    """The policy of the formgrader's response to ``path`` (``None``: not the formgrader's): script from its static
    folder, and the inline script of its own pages by hash. A submission's page trusts only what comes before the
    submission's cells; a file of a submission, a static file or an API answer trusts none."""
    rel = path[len(base_url.rstrip("/")) + 1:] if path.startswith(base_url.rstrip("/") + "/") else ""
    if not re.match(r"formgrader(/|$)", rel):
        return None
    own = ""
    if re.fullmatch(r"formgrader/submissions/[^/]+/?", rel):
        own = page.split(CELLS_START, 1)[0] if page and CELLS_START in page else ""
    elif not re.match(r"formgrader/(submissions|static|fonts|api)/", rel):
        own = page or ""
    parser = _InlineScript()
    parser.feed(own.replace("\r\n", "\n").replace("\r", "\n"))
    hashes = sorted({_hash(s) for s in parser.bodies} | {_hash(s) for s in parser.handlers})
    unsafe_hashes = ["'unsafe-hashes'"] if parser.handlers else []
    static = f"{host}{base_url.rstrip('/')}/formgrader/static/" if re.fullmatch(r"[\w.:\[\]-]+", host) else "'self'"
    return page_policy(" ".join([static, *unsafe_hashes, *hashes]))


class FormgraderPolicy(OutputTransform):
    """``formgrader_policy`` added to the Content-Security-Policy Jupyter sends (its ``frame-ancestors`` kept)."""

    def __init__(self, request, base_url: str = "/"):
        super().__init__(request)
        self._request, self._base_url = request, base_url

    def transform_first_chunk(self, status_code, headers, chunk, finishing):
        page = chunk.decode("utf-8", "replace") if "html" in headers.get("Content-Type", "") else None
        policy = formgrader_policy(self._request.host, self._base_url, self._request.path, page)
        if policy:
            kept = headers.get("Content-Security-Policy")
            headers["Content-Security-Policy"] = f"{kept}; {policy}" if kept else policy
        return status_code, headers, chunk


def _jupyter_server_extension_points():
    return [{"module": __name__}]


def _load_jupyter_server_extension(serverapp):
    """Every response of the formgrader carries ``formgrader_policy`` (first among the transforms: before any
    compression, it reads the page as written)."""
    serverapp.web_app.transforms.insert(0, functools.partial(FormgraderPolicy, base_url=serverapp.base_url))
