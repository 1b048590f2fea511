"""The kit's pytest plugin on the command line of a pytest run the kit starts, where needed.

Installed (``pip install -e .``), the plugin loads through its ``pytest11`` entry point. Some
editable installs register no entry point; a run the kit starts then names the plugin with
``-p``. Never both: the plugin would be registered twice, which pytest refuses.
"""
from __future__ import annotations

from importlib.metadata import entry_points

PLUGIN = "reference_impl.course.pytest_plugin"


def plugin_args() -> list[str]:
    """``[]`` where the entry point loads the plugin, else ``["-p", PLUGIN]``."""
    registered = any(point.value == PLUGIN for point in entry_points(group="pytest11"))
    return [] if registered else ["-p", PLUGIN]
