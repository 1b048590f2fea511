"""reveal.js and KaTeX for the decks, installed from the npm registry at build time and copied
beside the built HTML, so a deck opens with no network and no third-party code lives in the
repository.

The packages are installed once into a cache (``slides/.vendor/``, ignored by git, or
``$DECK_VENDOR_DIR``) with ``npm install --prefix <cache> reveal.js@5 katex@0.16``; each build
copies the files a deck loads into ``<out>/reveal.js/`` and ``<out>/katex/``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("reveal.js@5", "katex@0.16")
# What a deck page loads, relative to each package (the template names the same paths).
FILES = {
    "reveal.js": ["dist/reveal.js", "dist/reveal.css", "dist/theme/white.css",
                  "dist/theme/fonts", "plugin/notes/notes.js"],
    "katex": ["dist/katex.min.js", "dist/katex.min.css", "dist/contrib/auto-render.min.js",
              "dist/fonts"],
}


class VendorError(RuntimeError):
    """reveal.js or KaTeX could not be installed (no npm, or no registry)."""


def cache_dir() -> Path:
    """Where the npm packages are installed: ``$DECK_VENDOR_DIR`` or ``slides/.vendor/``."""
    return Path(os.environ.get("DECK_VENDOR_DIR") or REPO / "slides" / ".vendor")


def installed(cache: Path | None = None) -> Path | None:
    """The ``node_modules`` folder holding every needed file, or None if something is missing."""
    modules = (cache or cache_dir()) / "node_modules"
    complete = all((modules / package / name).exists()
                   for package, names in FILES.items() for name in names)
    return modules if complete else None


def ensure_installed(cache: Path | None = None, timeout: float = 300) -> Path:
    """Install reveal.js and KaTeX into the cache unless already there; their ``node_modules``."""
    cache = cache or cache_dir()
    modules = installed(cache)
    if modules:
        return modules
    npm = shutil.which("npm")
    if npm is None:
        raise VendorError(
            "the decks need reveal.js and KaTeX from the npm registry, and `npm` is not on PATH: "
            "install Node.js (Debian: `apt-get install nodejs npm`), or put the packages in "
            f"{cache}/node_modules by hand (`npm install --prefix {cache} {' '.join(PACKAGES)}`)")
    cache.mkdir(parents=True, exist_ok=True)
    command = [npm, "install", "--prefix", str(cache), *PACKAGES,
               "--no-audit", "--no-fund", "--no-save", "--loglevel=error"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise VendorError(f"`{' '.join(command)}` took over {timeout:.0f} s: is the npm "
                          "registry reachable from this machine?") from None
    modules = installed(cache)
    if result.returncode != 0 or modules is None:
        raise VendorError(
            f"`{' '.join(command)}` failed (exit status {result.returncode}), so the decks "
            "cannot be built: the npm registry must be reachable once, to fill the cache.\n"
            + result.stderr[-1500:])
    return modules


def copy_beside(out_dir: Path, modules: Path) -> None:
    """Copy the files a deck loads into ``out_dir/reveal.js/`` and ``out_dir/katex/``."""
    for package, names in FILES.items():
        for name in names:
            source = modules / package / name
            target = out_dir / package / name.removeprefix("dist/") if package == "katex" \
                else out_dir / package / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target, dirs_exist_ok=True)
            else:
                shutil.copy2(source, target)
