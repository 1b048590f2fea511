"""Which implementation the graded tests check: the reference, or a student's files.

``--impl reference`` (default) imports ``reference_impl.<module>``; ``--impl labs`` loads the
student files in ``labs/``; ``--impl PATH`` loads ``PATH/<module>.py`` from a submitted copy of
``labs/``. An :class:`Implementation` is small and picklable, so a rank function can take one
as an argument and load the module inside the rank.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import cloudpickle

REPO = Path(__file__).resolve().parents[2]
LIBRARY = Path(__file__).resolve().parents[1]


def reference_module_name(name: str) -> str:
    """``"groups"`` -> ``"reference_impl.comm.groups"``: student files are flat, the library is
    in subpackages, and every module name in it is unique."""
    found = sorted(LIBRARY.glob(f"*/{name}.py"))
    if len(found) != 1:
        raise ModuleNotFoundError(f"no single reference module named {name!r} (found {found})")
    return ".".join(("reference_impl", found[0].parent.name, name))


@dataclass(frozen=True)
class Implementation:
    source: str  # "reference", or the absolute path of a folder of student modules

    @classmethod
    def from_option(cls, value: str) -> "Implementation":
        if value == "reference":
            return cls("reference")
        folder = Path(value).expanduser().resolve()
        if value == "labs" and not folder.is_dir():
            folder = REPO / "labs"  # the kit's own student files, from anywhere
        if not folder.is_dir():
            raise ValueError(f"--impl {value}: {folder} is not a folder")
        return cls(str(folder))

    @property
    def name(self) -> str:
        return self.source

    def module(self, name: str):
        """The module ``name`` (e.g. ``"collectives"``) of this implementation."""
        if self.source == "reference":
            return importlib.import_module(reference_module_name(name))
        path = Path(self.source) / f"{name}.py"
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: the submission needs every student "
                                    f"file of labs/ ({name}.py among them)")
        key = f"_graded_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}_{name}"
        if key not in sys.modules:
            spec = importlib.util.spec_from_file_location(key, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[key] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[key]
                raise
            # Loaded by path, it cannot be imported by name in a rank: what it defines
            # travels to the ranks by value.
            cloudpickle.register_pickle_by_value(module)
        return sys.modules[key]
