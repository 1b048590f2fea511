"""Build the instructor decks (``slides/*.ipynb``) into reveal.js HTML that opens offline.

    python -m reference_impl.course.build_slides                      # every deck in slides/
    python -m reference_impl.course.build_slides slides/lab1_rank_groups.ipynb --out /tmp/decks
    python -m reference_impl.course.build_slides --no-execute         # use the stored outputs

Each deck is executed first (in its own folder, on a kernel running this Python), so its
demos and figures are fresh; ``--no-execute`` uses the outputs stored in the notebook. The
notebook file itself is never changed. The HTML is nbconvert's slides exporter
(``jupyter nbconvert --to slides``) with the kit's template (``deck_template/``): reveal.js
and KaTeX from the npm registry (``deck_vendor.py``), copied beside ``<out>/<deck>.html``
(default ``slides/build/``). The exit status is 1 if any deck failed; the others are still
built.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbconvert import SlidesExporter
from nbformat.reader import NotJSONError
from traitlets.config import Config

from reference_impl.course import deck_vendor
from reference_impl.course.kernel import notebook_client

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = "deck_template"
# Cell tags, as in Jupyter Book, applied by nbconvert's TagRemovePreprocessor.
REMOVE_INPUT = {"hide-input", "remove-input"}
REMOVE_OUTPUT = {"hide-output", "remove-output"}
REMOVE_CELL = {"remove-cell"}
# A URL the browser would fetch while showing the page: src=, href= (except on <a>, which
# fetches only when clicked), @import and CSS url().
FETCHED_URL = re.compile(r"""(?:<(?!a\b)\w+[^>]*?\b(?:src|href)\s*=\s*["']?|@import\s+(?:url\()?"""
                         r"""\s*["']?|url\(\s*["']?)\s*((?:https?:)?//[^"'\s)>]+)""", re.IGNORECASE)


class DeckError(ValueError):
    """A deck that cannot be presented offline."""


@dataclass
class BuiltDeck:
    """What one build produced."""

    notebook: Path
    html: Path
    slides: int
    seconds: float


def slide_count(notebook) -> int:
    """Slides (reveal.js sections) the deck's ``slideshow.slide_type`` metadata makes."""
    kinds = [cell.metadata.get("slideshow", {}).get("slide_type") or "-"
             for cell in notebook.cells if not REMOVE_CELL & set(cell.metadata.get("tags", []))]
    shown = [kind for kind in kinds if kind not in ("skip", "notes")]
    starts = sum(kind in ("slide", "subslide") for kind in shown)
    return starts + (1 if shown and shown[0] not in ("slide", "subslide") else 0)


def deck_html(notebook) -> str:
    """The reveal.js page of ``notebook``, loading reveal.js/ and katex/ from beside it."""
    config = Config()
    config.SlidesExporter.reveal_url_prefix = "reveal.js"
    config.SlidesExporter.reveal_theme = "white"
    config.SlidesExporter.exclude_input_prompt = True
    config.SlidesExporter.exclude_output_prompt = True
    config.TagRemovePreprocessor.enabled = True
    config.TagRemovePreprocessor.remove_input_tags = REMOVE_INPUT
    config.TagRemovePreprocessor.remove_all_outputs_tags = REMOVE_OUTPUT
    config.TagRemovePreprocessor.remove_cell_tags = REMOVE_CELL
    exporter = SlidesExporter(config=config, template_name=TEMPLATE,
                              extra_template_basedirs=[str(Path(__file__).parent)])
    page, _ = exporter.from_notebook_node(notebook)
    fetched = sorted(set(FETCHED_URL.findall(page)))
    if fetched:
        raise DeckError(f"the deck would load {len(fetched)} URL(s) from the network, so it "
                        f"would not open offline: {', '.join(fetched[:5])}; embed images instead")
    return page


def build_deck(path: Path, out_dir: Path, execute: bool = True, modules: Path | None = None) -> BuiltDeck:
    """Execute (unless ``execute`` is false) and build one deck to ``out_dir/<name>.html``."""
    start = time.perf_counter()
    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    if execute:
        notebook_client(notebook, path.parent.resolve()).execute()
    page = deck_html(notebook)
    out_dir.mkdir(parents=True, exist_ok=True)
    deck_vendor.copy_beside(out_dir, modules or deck_vendor.ensure_installed())
    target = out_dir / f"{path.stem}.html"
    target.write_text(page, encoding="utf-8")
    return BuiltDeck(path, target, slide_count(notebook), time.perf_counter() - start)


def default_decks() -> list[Path]:
    """Every ``slides/*.ipynb`` of this repository (or of the current folder)."""
    folder = REPO / "slides" if (REPO / "slides").is_dir() else Path("slides")
    return sorted(folder.glob("*.ipynb"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impl.course.build_slides",
        description="Build slide decks (notebooks) into reveal.js HTML that opens offline.")
    parser.add_argument("decks", nargs="*", type=Path, metavar="DECK.ipynb",
                        help="decks to build (default: every slides/*.ipynb)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="where the HTML goes (default: build/ next to each deck)")
    parser.add_argument("--no-execute", dest="execute", action="store_false",
                        help="use the outputs stored in the notebooks instead of running them")
    args = parser.parse_args(argv)
    decks = args.decks or default_decks()
    if not decks:
        parser.error("no decks found in slides/: name them, or run from the repository root")
    try:
        modules = deck_vendor.ensure_installed()
    except deck_vendor.VendorError as error:
        print(f"cannot build the decks: {error}", file=sys.stderr)
        return 1
    failed = 0
    for deck in decks:
        try:
            built = build_deck(deck, args.out or deck.parent / "build", args.execute, modules)
        except (OSError, DeckError, CellExecutionError, CellTimeoutError, DeadKernelError,
                NotJSONError, nbformat.ValidationError) as error:
            failed += 1
            print(f"FAILED {deck}: {error}", file=sys.stderr)
            continue
        slides = f"{built.slides} slide{'' if built.slides == 1 else 's'}"
        print(f"built {_shown(built.html)} ({slides}, {built.seconds:.1f} s)")
    return 1 if failed else 0


def _shown(path: Path) -> str:
    """``path`` relative to the current folder when it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
