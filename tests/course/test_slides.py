"""The instructor decks: reveal.js pages built by nbconvert's slides exporter that open offline,
with fragments, speaker notes and KaTeX math, legible on a 1280 x 720 projector.

Every deck is built from its stored outputs (reveal.js and KaTeX from the npm registry,
cached in slides/.vendor/; skipped, saying why, when npm cannot fetch them) and opened in
headless Chromium (Debian's ``chromium``; skipped, saying why, when absent) in reveal.js's
print layout, one 1280 x 720 page per slide with every fragment shown. Each slide is checked
by ``deck_check.js`` (nothing overflows the slide, text >= 24 px, code >= 18 px, no raw
LaTeX, one figure at most) and screenshotted into ``$DECK_SCREENSHOTS`` (default: a temporary
folder, printed) for a person to look at. Every deck also runs from the top.
"""
import concurrent.futures
import os
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from support.chromium_pipe import Chromium
from reference_impl.course import deck_vendor, syllabus
from reference_impl.course.build_slides import DeckError, build_deck, deck_html, slide_count
from reference_impl.course.kernel import notebook_client
from support import REPO, TESTS

pytestmark = pytest.mark.slow

SLIDES = REPO / "slides"
DECKS = sorted(SLIDES.glob("*.ipynb"))
CHECK_SCRIPT = (TESTS / "support" / "deck_check.js").read_text()
MIN_SLIDES = 25


def slide_type(cell) -> str:
    return cell.metadata.get("slideshow", {}).get("slide_type") or "-"


def slide_groups(notebook) -> list[list]:
    """The cells of each slide, skipped cells left out."""
    groups = []
    for cell in notebook.cells:
        kind = slide_type(cell)
        if kind == "skip":
            continue
        if kind in ("slide", "subslide") or not groups:
            groups.append([])
        groups[-1].append(cell)
    return groups


def test_decks_exist():
    assert [deck.stem for deck in DECKS] == sorted(lab.notebook for lab in syllabus.LABS), (
        "one deck per lab of the syllabus, named as its notebook")


@pytest.mark.parametrize("deck", DECKS, ids=lambda path: path.stem)
def test_deck_is_a_lecture(deck):
    """25+ slides, speaker notes on every slide, step-by-step reveals, stored outputs current."""
    notebook = nbformat.read(deck, as_version=4)
    groups = slide_groups(notebook)
    assert slide_count(notebook) == len(groups)
    assert len(groups) >= MIN_SLIDES, f"{deck.name}: {len(groups)} slides, a lecture needs {MIN_SLIDES}+"
    silent = [number for number, cells in enumerate(groups, start=1)
              if not any(slide_type(cell) == "notes" and cell.source.strip() for cell in cells)]
    assert not silent, f"{deck.name}: slides {silent} have no speaker notes (a 'notes' cell)"
    assert any(slide_type(cell) == "fragment" for cell in notebook.cells), f"{deck.name}: no fragments"
    unexecuted = [index for index, cell in enumerate(notebook.cells) if cell.cell_type == "code"
                  and cell.source.strip() and not cell.execution_count]
    assert not unexecuted, (
        f"{deck.name}: code cells {unexecuted} were never run, so the built deck shows no output "
        "for them; run the deck from the top and save it (see slides/README.md)")


def run_from_the_top(deck: Path) -> None:
    notebook = nbformat.read(deck, as_version=4)
    notebook_client(notebook, SLIDES).execute()  # raises CellExecutionError naming the cell


@pytest.fixture(scope="module")
def deck_runs():
    """Every deck run from the top, three at a time (each mostly waits on its kernel and its
    ranks), started when a test first asks: ``deck_runs[deck]()`` waits for that deck's."""
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        yield {deck: pool.submit(run_from_the_top, deck).result for deck in DECKS}


@pytest.mark.parametrize("deck", DECKS, ids=lambda path: path.stem)
def test_deck_runs_from_the_top(deck, deck_runs):
    deck_runs[deck]()


def test_slide_metadata_becomes_fragments_notes_and_hidden_code():
    cell = nbformat.v4
    notebook = cell.new_notebook(cells=[
        cell.new_code_cell("import secrets", metadata={"slideshow": {"slide_type": "skip"}}),
        cell.new_markdown_cell("# Title", metadata={"slideshow": {"slide_type": "slide"}}),
        cell.new_markdown_cell("Answer: $\\frac{n-1}{n}$",
                               metadata={"slideshow": {"slide_type": "fragment"}}),
        cell.new_markdown_cell("say this at min 3", metadata={"slideshow": {"slide_type": "notes"}}),
        cell.new_code_cell("draw_it()", metadata={"slideshow": {"slide_type": "slide"},
                                                  "tags": ["hide-input"]},
                           outputs=[cell.new_output("display_data", data={
                               "image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})]),
    ])
    assert slide_count(notebook) == 2
    page = deck_html(notebook)
    assert re.search(r'class="[^"]*fragment[^"]*"[^>]*>.*?frac', page, re.DOTALL)
    assert re.search(r'<aside class="notes">.*?say this at min 3', page, re.DOTALL)
    assert "data:image/png;base64,iVBORw0KGgo=" in page
    assert "draw_it" not in page and "secrets" not in page
    notebook.cells.append(cell.new_markdown_cell('<img src="https://example.com/x.png">'))
    with pytest.raises(DeckError, match="example.com"):
        deck_html(notebook)


@pytest.fixture(scope="module")
def built_decks(tmp_path_factory) -> dict[str, Path]:
    """Every deck built from its stored outputs into one folder, with reveal.js and KaTeX."""
    try:
        modules = deck_vendor.ensure_installed()
    except deck_vendor.VendorError as error:
        pytest.skip(f"reveal.js/KaTeX unavailable, decks not built: {error}")
    out = tmp_path_factory.mktemp("decks")
    return {deck.stem: build_deck(deck, out, execute=False, modules=modules).html for deck in DECKS}


def test_built_decks_load_nothing_from_the_network(built_decks):
    for name, html in built_decks.items():
        page = html.read_text(encoding="utf-8")
        assert not re.search(r"(?:src|href)\s*=\s*[\"'](?:https?:)?//", re.sub(r"<a\b[^>]*>", "", page)), name
        assert not re.search(r"unpkg|cdnjs|jsdelivr|cdn\.", page), f"{name} names a CDN"
        for local in re.findall(r"""<(?:script|link)[^>]*(?:src|href)="([^"]+)""", page):
            assert (html.parent / local).is_file(), f"{name} loads {local}, which is not beside it"


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("Chromium not found: install Debian's `chromium` package to check the decks render")


def test_every_slide_of_every_deck_is_legible(built_decks, tmp_path_factory):
    chromium = find_chromium()
    shots = Path(os.environ.get("DECK_SCREENSHOTS") or tmp_path_factory.mktemp("deck-screenshots"))
    failures = []
    with Chromium(chromium, tmp_path_factory.mktemp("chromium-profile")) as browser:
        for name, html in built_decks.items():
            browser.open(f"{html.as_uri()}?print-pdf")
            browser.evaluate("new Promise(done => window.Reveal ? Reveal.on('pdf-ready', done) || "
                             "(document.querySelector('.pdf-page') && done()) : done())")
            report = browser.evaluate(CHECK_SCRIPT + "; window.deckCheck()")
            expected = slide_count(nbformat.read(SLIDES / f"{name}.ipynb", as_version=4))
            if len(report) != expected:
                failures.append(f"{name}: {len(report)} slides rendered, {expected} in the notebook")
            if not browser.evaluate("document.querySelectorAll('.katex').length"):
                failures.append(f"{name}: no typeset math (KaTeX) on any slide")
            (shots / name).mkdir(parents=True, exist_ok=True)
            for slide in report:
                browser.screenshot(shots / name / f"{slide['slide']:02d}.png", 0, slide["top"], 1280, 720)
                failures += [f"{name} slide {slide['slide']} ({slide['title']}): {problem}"
                             for problem in slide["problems"]]
    print(f"screenshots of every slide: {shots}", file=sys.stderr)
    assert not failures, f"{len(failures)} problem(s); screenshots in {shots}\n" + "\n".join(failures)
