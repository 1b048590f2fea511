"""The library's imports run one way: no circle of modules, no package importing one above it
in ``LAYERS``, and no library module importing an entry point. Read from the source with ``ast``
(nothing is imported), every import counted: at the top, inside functions, under
``TYPE_CHECKING``, and ``importlib.import_module`` with a literal name."""
import ast
from pathlib import Path

from support import REPO
from support.layers import LAYERS

LIBRARY = REPO / "reference_impl"
ENTRY_POINTS = {"train", "benchmarks", "course"}
# Imports being rewritten by another change (hybrid/ and train.py), as (importer, imported):
# each pair named here is excused from the checks until that change removes it. Empty now.
KNOWN_IN_PROGRESS: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(LIBRARY.rglob("*.py"))}


def known_module(name: str) -> str:
    """The longest prefix of a dotted name that is a module of the library: what importing
    ``reference_impl.comm.groups.RankLayout``-like names reaches."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def absolute(node: ast.ImportFrom, importer: str) -> str:
    """The module a ``from ... import`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = importer.split(".")
    if MODULES[importer].name != "__init__.py":
        package = package[:-1]
    package = package[:len(package) - node.level + 1]
    return ".".join(package + ([node.module] if node.module else []))


def imported_names(node: ast.AST, importer: str) -> list[str]:
    """The dotted names one node imports; a ``from`` import's names may be submodules."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        module = absolute(node, importer)
        return [f"{module}.{alias.name}" for alias in node.names]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        function = node.func.attr if isinstance(node.func, ast.Attribute) else \
            getattr(node.func, "id", "")
        if function in ("import_module", "__import__") and isinstance(node.args[0].value, str):
            return [node.args[0].value]
    return []


def import_graph() -> dict[str, set[str]]:
    """Every library module and the library modules it imports (itself left out)."""
    graph = {}
    for importer, path in MODULES.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in imported_names(node, importer):
                if name == "reference_impl" or name.startswith("reference_impl."):
                    targets.add(known_module(name))
        graph[importer] = {target for target in targets - {importer}
                           if (importer, target) not in KNOWN_IN_PROGRESS}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def package(module: str) -> str:
    """``reference_impl.pipeline.gpt_stages`` -> ``pipeline``; ``reference_impl.model`` ->
    ``model``; the package itself -> ``reference_impl``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


GRAPH = import_graph()


def test_the_graph_is_read():
    assert "reference_impl.pipeline.pipeline_schedules" in GRAPH[
        "reference_impl.pipeline.pipeline_executor"]
    assert "reference_impl.comm.groups" in GRAPH["reference_impl.figures.rank_groups"]


def test_every_package_has_a_layer():
    missing = sorted({package(module) for module in MODULES} - set(LAYERS))
    assert not missing, f"packages without a layer: {missing}; add each to LAYERS"


def test_no_circle_of_imports():
    found = cycles(GRAPH)
    assert not found, "circles of imports (each line: modules that import each other, " \
        "directly or through one another):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_import_runs_up_the_layers():
    upward = [f"{importer} (layer {LAYERS[package(importer)]}) imports {target} "
              f"(layer {LAYERS[package(target)]})"
              for importer, targets in sorted(GRAPH.items()) for target in sorted(targets)
              if LAYERS[package(target)] > LAYERS[package(importer)]]
    assert not upward, "imports up the layers of LAYERS:\n" + "\n".join(upward)


def test_the_library_imports_no_entry_point():
    found = [f"{importer} imports the entry point {target}"
             for importer, targets in sorted(GRAPH.items()) for target in sorted(targets)
             if package(importer) not in ENTRY_POINTS and package(target) in ENTRY_POINTS]
    assert not found, "\n".join(found)


def test_a_circle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_top_level_keeps_to_entry_points_and_the_base():
    """The top of ``reference_impl/`` holds the trainer and the few modules everything checks
    with; the rest lives in its package (the single-device model in ``model/``)."""
    top = sorted(path.name for path in LIBRARY.glob("*.py"))
    assert len(top) <= 8, f"{len(top)} modules at the top of reference_impl/: {top}"
    assert set(LAYERS) >= {Path(name).stem for name in top} - {"__init__"}, "a layer for each"
