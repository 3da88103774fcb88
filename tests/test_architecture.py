"""labkit's folders are its layers (docs/architecture.md): a module imports only its own
layer and the layers below it, no modules import each other in a circle, and labkit's top
level keeps only the few modules every layer uses. Read from the source (ast), so a lazy
import inside a function counts as much as one at the top."""
from __future__ import annotations

import ast
from pathlib import Path

LABKIT = Path(__file__).resolve().parent.parent / "labkit"
# bottom to top: each layer may import itself and the layers before it
LAYERS = ("base", "kafka", "storage", "checking", "faults", "pipelines", "spark", "flink",
          "experiments", "torture", "room", "widgets", "exercises", "cli")
BASE = {"settings", "paths", "proc", "progress", "appenv"}  # labkit's top level, below everything
# Modules over ~450 lines, each still to be split along its ideas; none may grow, and the
# list may only shrink (docs/architecture.md names them).
OVERSIZE: dict[str, int] = {}
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = path.relative_to(LABKIT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in LABKIT.rglob("*.py")}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in BASE:
        return "base"
    return parts[1]


def imports_of(path: Path) -> set[str]:
    """The labkit modules ``path`` imports (a package's own submodules included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("labkit"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("labkit")}
    return found & set(MODULES)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{m} ({layer_of(m)}) imports {d} ({layer_of(d)})"
            for m, deps in sorted(graph.items()) for d in sorted(deps)
            if LAYERS.index(layer_of(d)) > LAYERS.index(layer_of(m))]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a circle (Tarjan).
    A package's __init__ importing its own submodules is not a circle."""
    edges = {m: {d for d in deps if not d.startswith(m + ".") and not m.startswith(d + ".")}
             for m, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


GRAPH = {m: imports_of(p) - {m} for m, p in MODULES.items()}


def test_every_module_sits_in_a_known_layer():
    assert {layer_of(m) for m in MODULES} <= set(LAYERS), sorted(
        m for m in MODULES if layer_of(m) not in LAYERS)


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(GRAPH) == []


def test_no_modules_import_each_other_in_a_circle():
    assert circles(GRAPH) == []


def test_the_checks_catch_what_they_look_for():
    """The two rules above, on a made-up graph that breaks them."""
    made_up = {"labkit.kafka.cluster": {"labkit.experiments.failover"},
               "labkit.experiments.failover": {"labkit.experiments.reorder"},
               "labkit.experiments.reorder": {"labkit.experiments.failover"}}
    assert upward_imports(made_up) == [
        "labkit.kafka.cluster (kafka) imports labkit.experiments.failover (experiments)"]
    assert circles(made_up) == [["labkit.experiments.failover", "labkit.experiments.reorder"]]


# The database drivers: only the storage layer's adapter talks to them (labkit.storage.db).
DATABASE_DRIVERS = ("sqlite3", "psycopg")


def driver_imports(paths: dict[str, Path]) -> list[str]:
    """Modules outside labkit/storage/ that import a database driver (lazily too)."""
    found = []
    for module, path in sorted(paths.items()):
        if layer_of(module) == "storage":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"{module} imports {n}" for n in names
                      if n.split(".")[0] in DATABASE_DRIVERS]
    return found


def test_only_the_storage_layer_talks_to_a_database_driver():
    assert driver_imports(MODULES) == []


def test_the_driver_check_catches_what_it_looks_for(tmp_path):
    made_up = tmp_path / "sink.py"
    made_up.write_text("def f():\n    import psycopg.pq\n    from sqlite3 import connect\n")
    assert driver_imports({"labkit.pipelines.sink": made_up,
                           "labkit.storage.db": made_up}) == [
        "labkit.pipelines.sink imports psycopg.pq", "labkit.pipelines.sink imports sqlite3"]


def test_labkit_top_level_keeps_at_most_eight_modules():
    top = sorted(p.name for p in LABKIT.glob("*.py"))
    assert len(top) <= 8, top
    assert {p.removesuffix(".py") for p in top} <= BASE | {"__init__", "cli"}, top


def test_no_module_grows_past_its_size():
    sizes = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    too_big = {m: n for m, n in sizes.items() if n > OVERSIZE.get(m, MAX_LINES)}
    assert too_big == {}, f"split these along their ideas: {too_big}"
    assert all(sizes[m] > MAX_LINES for m in OVERSIZE), \
        f"under {MAX_LINES} lines now: take them off OVERSIZE: " \
        f"{[m for m in OVERSIZE if sizes[m] <= MAX_LINES]}"
