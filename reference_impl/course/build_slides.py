"""Build the instructor decks (``slides/*.ipynb``) into self-contained HTML that opens offline.

    python -m reference_impl.course.build_slides                      # every deck in slides/
    python -m reference_impl.course.build_slides slides/lab1_rank_groups.ipynb --out /tmp/decks
    python -m reference_impl.course.build_slides --no-execute         # use the stored outputs

Each deck is executed first (in its own folder, on a kernel running this Python), so its
demos and figures are fresh; ``--no-execute`` renders the outputs stored in the notebook. The
notebook file itself is never changed. Each deck becomes ``<out>/<deck>.html``, by default
``slides/build/`` (see ``render_deck.py`` for how cells become slides). The exit status is 1
if any deck failed; the others are still built.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbformat.reader import NotJSONError

from reference_impl.course.kernel import notebook_client
from reference_impl.course.render_deck import DeckError, render_deck, split_slides

REPO = Path(__file__).resolve().parents[2]


@dataclass
class BuiltDeck:
    """What one build produced."""

    notebook: Path
    html: Path
    slides: int
    seconds: float


def build_deck(path: Path, out_dir: Path, execute: bool = True) -> BuiltDeck:
    """Execute (unless ``execute`` is false) and render one deck to ``out_dir/<name>.html``."""
    start = time.perf_counter()
    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    if execute:
        notebook_client(notebook, path.parent.resolve()).execute()
    page = render_deck(notebook, base_dir=path.parent)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{path.stem}.html"
    target.write_text(page, encoding="utf-8")
    return BuiltDeck(path, target, len(split_slides(notebook.cells)), time.perf_counter() - start)


def default_decks() -> list[Path]:
    """Every ``slides/*.ipynb`` of this repository (or of the current folder)."""
    folder = REPO / "slides" if (REPO / "slides").is_dir() else Path("slides")
    return sorted(folder.glob("*.ipynb"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impl.course.build_slides",
        description="Build slide decks (notebooks) into self-contained offline HTML.")
    parser.add_argument("decks", nargs="*", type=Path, metavar="DECK.ipynb",
                        help="decks to build (default: every slides/*.ipynb)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="where the HTML goes (default: build/ next to each deck)")
    parser.add_argument("--no-execute", dest="execute", action="store_false",
                        help="render the outputs stored in the notebooks instead of running them")
    args = parser.parse_args(argv)
    decks = args.decks or default_decks()
    if not decks:
        parser.error("no decks found in slides/: name them, or run from the repository root")
    failed = 0
    for deck in decks:
        try:
            built = build_deck(deck, args.out or deck.parent / "build", args.execute)
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
