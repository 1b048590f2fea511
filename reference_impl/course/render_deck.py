"""Render a notebook as one self-contained HTML slide deck that opens offline.

Cells become slides by the standard Jupyter/RISE metadata ``cell.metadata.slideshow.slide_type``:

    "slide", "subslide"    start a new slide
    "fragment", "-", none  continue the current slide (fragments are shown at once)
    "notes"                speaker notes of the current slide (hidden; press N to show)
    "skip"                 left out (still executed: a good place for imports and helpers)

A code cell shows its code (highlighted by pygments) and then its outputs: text as
``<pre>``, images embedded as ``data:`` URIs, HTML as it is. Tags ``hide-input`` and
``hide-output`` drop the code or the outputs. Markdown is rendered by nbconvert's
``markdown2html``; its images, from cell attachments or from files next to the deck, are
embedded too.

The page carries its own CSS and a few dozen lines of JavaScript (``deck_assets.py``), no
library and no URL, so the file shows the same on a laptop with no network. A deck that
would load anything from the network (an image, script, stylesheet or font) is refused with
:class:`DeckError`; hyperlinks are left alone, since they load nothing until clicked.
"""
from __future__ import annotations

import base64
import html
import mimetypes
import re
from dataclasses import dataclass, field
from pathlib import Path

from nbconvert.filters import markdown2html, strip_ansi
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from reference_impl.course.deck_assets import DECK_CSS, DECK_JS

NEW_SLIDE = ("slide", "subslide")
# Which representation of an output is shown, when it has several: the richest, as in Jupyter.
OUTPUT_MIME_ORDER = ("text/html", "text/markdown", "image/svg+xml", "image/png", "image/jpeg",
                     "text/plain")
IMAGE_MIMES = ("image/svg+xml", "image/png", "image/jpeg")
_FORMATTER = HtmlFormatter(cssclass="highlight")
_IMG_SRC = re.compile(r'(<img\b[^>]*?\bsrc=")([^"]+)(")')
# Anything the browser would fetch by itself when the page opens.
_EXTERNAL_RESOURCE = re.compile(
    r"""(?:<(?!a\b)[a-z][^>]*?\b(?:src|href|srcset|poster|data)\s*=\s*["']?"""
    r"""|@import\s+(?:url\()?\s*["']?|url\(\s*["']?)\s*((?:https?:)?//[^\s"')>]*)""",
    re.IGNORECASE)


class DeckError(ValueError):
    """The notebook cannot become an offline deck (it references the network)."""


@dataclass
class Slide:
    """The cells shown on one slide, and its speaker notes."""

    cells: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def slide_type(cell) -> str:
    """The cell's ``slideshow.slide_type``; ``"-"`` (continue) when it has none."""
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type") or "-"


def split_slides(cells) -> list[Slide]:
    """Group cells into slides by their slide_type (see the module docstring)."""
    slides: list[Slide] = []
    early_notes = []  # notes before the first shown cell belong to the first slide
    for cell in cells:
        kind = slide_type(cell)
        if kind == "skip":
            continue
        if kind == "notes":
            (slides[-1].notes if slides else early_notes).append(cell)
            continue
        if kind in NEW_SLIDE or not slides:
            slides.append(Slide())
        slides[-1].cells.append(cell)
    if slides:
        slides[0].notes[:0] = early_notes
    return slides


def render_deck(notebook, title: str | None = None, base_dir: str | Path = ".") -> str:
    """The whole deck as one HTML page; ``base_dir`` resolves images linked from markdown."""
    slides = split_slides(notebook.cells)
    if not slides:
        raise DeckError("the notebook has no cells to show")
    language = notebook.get("metadata", {}).get("language_info", {}).get("name", "python")
    renderer = _CellRenderer(_lexer(language), Path(base_dir))
    title = title or _first_heading(notebook.cells) or "Slides"
    sections = "\n".join(_section(number, slide, renderer)
                         for number, slide in enumerate(slides, start=1))
    page = _PAGE.format(title=html.escape(title), slides=sections, js=DECK_JS,
                        css=DECK_CSS + _FORMATTER.get_style_defs(".highlight"))
    external = sorted(set(_EXTERNAL_RESOURCE.findall(page)))
    if external:
        raise DeckError("the deck would load from the network, so it would not open offline: "
                        + ", ".join(external) + " (embed the file, or save it next to the deck "
                        "and link it by its relative path)")
    return page


def _section(number: int, slide: Slide, renderer: _CellRenderer) -> str:
    """One slide: its cells, then its notes (hidden); a slide opening with ``# `` is a title."""
    first = slide.cells[0]
    title = first.cell_type == "markdown" and first.source.lstrip().startswith("# ")
    body = "\n".join(renderer.cell(cell) for cell in slide.cells)
    notes = "\n".join(renderer.cell(cell) for cell in slide.notes)
    return (f'<section class="slide{" title-slide" if title else ""}" id="slide-{number}">\n'
            f'<div class="slide-body">\n{body}\n</div>\n'
            + (f'<aside class="notes">\n{notes}\n</aside>\n' if notes else "")
            + "</section>")


class _CellRenderer:
    """Turns one notebook cell into HTML."""

    def __init__(self, lexer, base_dir: Path):
        self.lexer = lexer
        self.base_dir = base_dir

    def cell(self, cell) -> str:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell.cell_type == "markdown":
            content = self.markdown(cell.source, cell.get("attachments"))
            return f'<div class="cell markdown">{content}</div>'
        if cell.cell_type == "raw":
            return cell.source if _raw_format(cell) in ("text/html", "html") else ""
        parts = []
        if cell.source.strip() and "hide-input" not in tags:
            parts.append(highlight(cell.source, self.lexer, _FORMATTER))
        outputs = [] if "hide-output" in tags else _merge_streams(cell.get("outputs", []))
        parts.extend(self.output(output) for output in outputs)
        # A cell with a figure gets the space left on the slide (see DECK_CSS).
        has_image = any(_shown_mime(output) in IMAGE_MIMES for output in outputs)
        css_class = "cell code has-image" if has_image else "cell code"
        return f'<div class="{css_class}">{"".join(parts)}</div>' if parts else ""

    def markdown(self, source: str, attachments=None) -> str:
        for name, bundle in (attachments or {}).items():
            mime, data = next(iter(bundle.items()))
            source = source.replace(f"attachment:{name}", _data_uri(mime, data))
        return _IMG_SRC.sub(self._embed_local_image, markdown2html(source))

    def _embed_local_image(self, match) -> str:
        """``<img src="figure.png">`` of a file next to the deck, as a data: URI."""
        src = html.unescape(match.group(2))
        path = self.base_dir / src
        if ":" in src or not path.is_file():
            return match.group(0)
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        data = base64.b64encode(path.read_bytes()).decode()
        return match.group(1) + _data_uri(mime, data) + match.group(3)

    def output(self, output) -> str:
        kind = output.get("output_type")
        if kind == "stream":
            return _pre(output.get("text", ""), f"output stream {output.get('name', 'stdout')}")
        if kind == "error":
            return _pre("\n".join(output.get("traceback", [])), "output error")
        mime = _shown_mime(output)
        content = output["data"][mime] if mime else ""
        content = "".join(content) if isinstance(content, list) else content
        if mime == "text/html":
            return f'<div class="output html">{content}</div>'
        if mime == "text/markdown":
            return f'<div class="output markdown">{self.markdown(content)}</div>'
        if mime in IMAGE_MIMES:
            if mime == "image/svg+xml":
                content = base64.b64encode(content.encode()).decode()
            return f'<div class="output image"><img src="{_data_uri(mime, content)}" alt=""></div>'
        if mime == "text/plain":
            return _pre(content, "output result")
        return ""


def _shown_mime(output) -> str | None:
    """Which of a display output's representations is shown (None for streams and errors)."""
    data = output.get("data", {})
    return next((mime for mime in OUTPUT_MIME_ORDER if mime in data), None)


def _merge_streams(outputs) -> list:
    """Consecutive stdout (or stderr) outputs as one, so they show as one block."""
    merged = []
    for output in outputs:
        previous = merged[-1] if merged else {}
        if (output.get("output_type") == previous.get("output_type") == "stream"
                and output.get("name") == previous.get("name")):
            merged[-1] = {**merged[-1], "text": merged[-1]["text"] + output["text"]}
        else:
            merged.append(output)
    return merged


def _pre(text: str, css_class: str) -> str:
    return f'<pre class="{css_class}">{html.escape(strip_ansi(text).rstrip())}</pre>'


def _data_uri(mime: str, base64_data: str) -> str:
    return f"data:{mime};base64,{''.join(base64_data.split())}"


def _raw_format(cell) -> str:
    metadata = cell.get("metadata", {})
    return (metadata.get("raw_mimetype") or metadata.get("format") or "").lower()


def _lexer(language: str):
    try:
        return get_lexer_by_name(language)
    except ClassNotFound:
        return get_lexer_by_name("text")


def _first_heading(cells) -> str | None:
    for cell in cells:
        if cell.cell_type == "markdown":
            match = re.search(r"^#{1,2}\s+(.+)$", cell.source, re.MULTILINE)
            if match:
                return match.group(1).strip()
    return None


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{css}
</style>
</head>
<body>
<main class="deck">
{slides}
<div class="slide-number" aria-live="polite"></div>
</main>
<script>
{js}
</script>
</body>
</html>
"""
