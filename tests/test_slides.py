"""The instructor decks build to self-contained HTML that renders offline.

The lab 1 deck is executed and built: the page must have one slide per "slide"/"subslide"
cell, embedded figures and nothing to fetch from the network. Headless Chromium (Debian's
``chromium``) then opens it: the deck's script must count the slides and follow the URL hash,
and a screenshot must show something. Every deck also builds from its stored outputs.
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import nbformat
import pytest

from reference_impl.course.render_deck import DeckError, render_deck, split_slides

SLIDES = Path(__file__).resolve().parents[1] / "slides"
EXECUTED_DECK = SLIDES / "lab1_rank_groups.ipynb"
BUILD = [sys.executable, "-m", "reference_impl.course.build_slides"]
# A URL the browser would follow: in src/href attributes, @import and CSS url().
EXTERNAL_URL = re.compile(r"""(?:\b(?:src|href)\s*=\s*["']?|@import\s+(?:url\()?\s*["']?"""
                          r"""|url\(\s*["']?)\s*(?:https?:)?//""", re.IGNORECASE)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def expected_slide_count(path: Path) -> int:
    """Slides the deck should have, counted from its cells' slideshow metadata."""
    kinds = [cell.metadata.get("slideshow", {}).get("slide_type") or "-"
             for cell in nbformat.read(path, as_version=4).cells]
    shown = [kind for kind in kinds if kind not in ("skip", "notes")]
    starts = sum(kind in ("slide", "subslide") for kind in shown)
    return starts + (1 if shown and shown[0] not in ("slide", "subslide") else 0)


def slide_sections(page: str) -> list[str]:
    return re.split(r'<section class="slide[^"]*"', page)[1:]


@pytest.fixture(scope="module")
def built_deck(tmp_path_factory) -> Path:
    """The lab 1 deck, executed and built into a temporary folder."""
    out = tmp_path_factory.mktemp("decks")
    result = subprocess.run(BUILD + [str(EXECUTED_DECK), "--out", str(out)],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"building {EXECUTED_DECK.name} failed:\n{result.stderr[-3000:]}"
    return out / f"{EXECUTED_DECK.stem}.html"


def test_built_deck_has_every_slide_embeds_figures_and_fetches_nothing(built_deck):
    page = built_deck.read_text(encoding="utf-8")
    assert len(slide_sections(page)) == expected_slide_count(EXECUTED_DECK)
    assert "data:image/png;base64," in page, "the deck's matplotlib figures are not embedded"
    external = EXTERNAL_URL.findall(page)
    assert not external, f"the deck refers to the network, so it would not open offline: {external}"
    assert "<script src" not in page and "<link" not in page, "CSS and JS must be inlined"


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("Chromium not found: install Debian's `chromium` package to check decks render")


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                            capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, (
        f"chromium failed (exit status {result.returncode}):\n{result.stderr[-2000:]}")
    return result


def test_deck_renders_in_headless_chromium(built_deck, tmp_path):
    chromium = find_chromium()
    page = built_deck.read_text(encoding="utf-8")
    # Open the first slide with a figure by its URL hash (1-based), as a presenter would.
    figure_slide = next(number for number, section in enumerate(slide_sections(page), start=1)
                        if "data:image/png" in section)
    url = f"{built_deck.as_uri()}#{figure_slide}"

    dom = run_chromium(chromium, tmp_path / "profile", "--dump-dom", url).stdout
    body = re.search(r"<body[^>]*>", dom)
    assert body, f"no <body> in the DOM chromium dumped:\n{dom[:500]}"
    attributes = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(0)))
    assert attributes.get("data-slide-count") == str(expected_slide_count(EXECUTED_DECK)), (
        f"the deck's script did not run or miscounted: <body> is {body.group(0)}")
    assert attributes.get("data-current") == str(figure_slide), (
        f"the URL hash #{figure_slide} did not select that slide: <body> is {body.group(0)}")

    screenshot = tmp_path / "slide.png"
    run_chromium(chromium, tmp_path / "profile", f"--screenshot={screenshot}",
                 "--window-size=1280,720", url)
    pixels = matplotlib.image.imread(screenshot)
    assert pixels.shape[:2] == (720, 1280)
    assert pixels[..., :3].std() > 0.05, "the screenshot of the figure slide is blank"


def test_every_deck_builds_from_its_stored_outputs(tmp_path):
    decks = sorted(SLIDES.glob("*.ipynb"))
    assert decks, f"no decks in {SLIDES}"
    result = subprocess.run(BUILD + ["--no-execute", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"building the decks failed:\n{result.stderr[-3000:]}"
    for deck in decks:
        page = (tmp_path / f"{deck.stem}.html").read_text(encoding="utf-8")
        assert len(slide_sections(page)) == expected_slide_count(deck), deck.name
        # Hyperlinks are allowed here (they fetch nothing until clicked); nothing else is.
        without_links = re.sub(r"<a\b[^>]*>", "", page)
        assert not EXTERNAL_URL.findall(without_links), f"{deck.name} would load from the network"
        cells = nbformat.read(deck, as_version=4).cells
        unexecuted = [index for index, cell in enumerate(cells) if cell.cell_type == "code"
                      and cell.source.strip() and not cell.execution_count]
        assert not unexecuted, (
            f"{deck.name}: code cells {unexecuted} were never run, so --no-execute shows no "
            "output for them; run the deck from the top and save it (see slides/README.md)")


def test_slide_types_tags_and_offline_check():
    cell = nbformat.v4
    cells = [
        cell.new_code_cell("import secrets", metadata={"slideshow": {"slide_type": "skip"}}),
        cell.new_markdown_cell("# Title"),  # no metadata: starts the first slide
        cell.new_markdown_cell("## Two", metadata={"slideshow": {"slide_type": "slide"}}),
        cell.new_markdown_cell("more", metadata={"slideshow": {"slide_type": "fragment"}}),
        cell.new_markdown_cell("say this", metadata={"slideshow": {"slide_type": "notes"}}),
        cell.new_code_cell("draw()", metadata={"slideshow": {"slide_type": "subslide"},
                                               "tags": ["hide-input"]},
                           outputs=[cell.new_output("display_data", data={
                               "image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})]),
        cell.new_markdown_cell("gone", metadata={"slideshow": {"slide_type": "skip"}}),
    ]
    notebook = cell.new_notebook(cells=cells)
    assert [len(slide.cells) for slide in split_slides(notebook.cells)] == [1, 2, 1]
    page = render_deck(notebook)
    sections = slide_sections(page)
    assert len(sections) == 3
    assert "say this" in sections[1] and 'class="notes"' in sections[1]
    assert "data:image/png;base64,iVBORw0KGgo=" in sections[2] and "draw" not in sections[2]
    assert "secrets" not in page and "gone" not in page

    notebook.cells.append(cell.new_markdown_cell('<img src="https://example.com/x.png">'))
    with pytest.raises(DeckError, match="example.com"):
        render_deck(notebook)
