"""labkit's folders are its layers (docs/architecture.md): a module imports only its own
layer and the layers below it, no modules import each other in a circle, and labkit's top
level keeps only the few modules every layer uses. Read from the source (ast), so a lazy
import inside a function counts as much as one at the top."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

LABKIT = Path(__file__).resolve().parent.parent / "labkit"
# bottom to top: each layer may import itself and the layers before it
LAYERS = ("base", "kafka", "storage", "checking", "faults", "pipelines", "spark", "flink",
          "experiments", "cost", "torture", "room", "widgets", "exercises", "cli")
BASE = {"settings", "paths", "proc", "forkserver", "progress", "appenv"}  # labkit's top level, below everything
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


# ---------------------------------------------------------------------------------------
# Issue 39: every experiment has one shape. What the done-when asks, each rule read from the
# source or the registry, each with a self-test on a planted violation (it can fail).

RECORD_LAYERS = ("experiments", "spark", "flink", "torture")
RECORD_METHODS = {"to_json", "summary", "timeline"}


def _is_protocol(cls: ast.ClassDef) -> bool:
    """An interface (typing.Protocol) names a record's methods without writing them."""
    return any((isinstance(b, ast.Name) and b.id == "Protocol")
               or (isinstance(b, ast.Attribute) and b.attr == "Protocol") for b in cls.bases)


def _is_property(function: ast.FunctionDef) -> bool:
    """A property is data (Spark's per-batch table is its run's ``timeline``), not a record's
    way of telling a run."""
    return any(isinstance(d, ast.Name) and d.id == "property" for d in function.decorator_list)


def record_classes(paths: dict[str, Path]) -> list[str]:
    """Classes of the experiment and engine layers that write a run's summary, JSON or
    timeline themselves (the one record is labkit.checking.record.RunRecord), and every
    mention of RunBasics (the base those classes shared) anywhere in labkit."""
    found = []
    for module, path in sorted(paths.items()):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            named = (node.id if isinstance(node, ast.Name) else
                     node.attr if isinstance(node, ast.Attribute) else
                     node.name if isinstance(node, (ast.ClassDef, ast.alias)) else None)
            if named == "RunBasics":
                found.append(f"{module}:{getattr(node, 'lineno', '')} names RunBasics")
            if (isinstance(node, ast.ClassDef) and layer_of(module) in RECORD_LAYERS
                    and not _is_protocol(node)):
                own = sorted(RECORD_METHODS & {f.name for f in node.body
                                               if isinstance(f, ast.FunctionDef)
                                               and not _is_property(f)})
                if own:
                    found.append(f"{module}.{node.name} defines {', '.join(own)}")
    return sorted(set(found))


def test_one_run_record_class():
    assert record_classes(MODULES) == []


DELETE_LAYERS = ("experiments", "spark", "torture")
# the one place topics go
CLEANUP = ("labkit.experiments.context", "RunContext._close_files_and_topics")


def topic_deletes(paths: dict[str, Path]) -> list[str]:
    """Calls of labkit.kafka.topics' ``delete`` in the experiment layers (however the module
    or the function was imported) outside the run context's cleanup."""
    found = []
    for module, path in sorted(paths.items()):
        if layer_of(module) not in DELETE_LAYERS:
            continue
        tree = ast.parse(path.read_text())
        modules, functions = set(), set()  # the names topics and its delete go by here
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "labkit.kafka":
                modules |= {a.asname or a.name for a in node.names if a.name == "topics"}
            elif isinstance(node, ast.ImportFrom) and node.module == "labkit.kafka.topics":
                functions |= {a.asname or a.name for a in node.names if a.name == "delete"}
            elif isinstance(node, ast.Import):
                modules |= {a.asname for a in node.names
                            if a.name == "labkit.kafka.topics" and a.asname}

        def visit(node: ast.AST, where: tuple[str, ...]) -> None:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                where = (*where, node.name)
            if isinstance(node, ast.Call):
                f = node.func
                deletes = ((isinstance(f, ast.Attribute) and f.attr == "delete"
                            and isinstance(f.value, ast.Name) and f.value.id in modules)
                           or (isinstance(f, ast.Name) and f.id in functions))
                if deletes and (module, ".".join(where)) != CLEANUP:
                    found.append(f"{module}:{node.lineno} ({'.'.join(where) or 'module'})")
            for child in ast.iter_child_nodes(node):
                visit(child, where)
        visit(tree, ())
    return found


def test_topics_are_deleted_only_by_the_run_contexts_cleanup():
    assert topic_deletes(MODULES) == []


MADE_UP_ENGINE = "Some engine"


def engine_listing_problems() -> list[str]:
    """What is wrong with `labkit scenario --help` once an experiment of an engine nobody
    wrote down is registered (in a copy of the registry): it must list it, and list every
    engine's experiments together, in the order the catalog first names the engines."""
    from typer.testing import CliRunner

    from labkit.cli import app
    from labkit.experiments import catalog, registry
    from labkit.experiments.parts import Workload, in_thread

    saved = registry._REGISTRY
    registry._REGISTRY = dict(catalog())
    try:
        registry.register(registry.Experiment(
            "made-up-engine-probe", "an experiment of an engine the CLI was never told of",
            group=MADE_UP_ENGINE, workload=lambda o: Workload("probe"),
            clients=in_thread(lambda run: None), checkers=lambda o: []))
        groups = {name: e.group for name, e in registry._REGISTRY.items()}
        shown = CliRunner().invoke(app, ["scenario", "--help"], env={"COLUMNS": "250"})
    finally:
        registry._REGISTRY = saved
    if shown.exit_code != 0:
        return [f"labkit scenario --help failed: {shown.exception or shown.output[-500:]!r}"]
    listed = [line.split()[1] for line in shown.output.splitlines()
              if line.startswith("│ ") and len(line.split()) > 1 and line.split()[1] in groups]
    problems = [f"{name} ({groups[name]}) is not listed" for name in groups if name not in listed]
    order = list(dict.fromkeys(groups.values()))  # engines as the catalog first names them
    runs = [groups[name] for i, name in enumerate(listed)
            if i == 0 or groups[listed[i - 1]] != groups[name]]
    if runs != order:
        problems.append(f"the listing's engines run {runs}, not {order}")
    return problems


def test_no_engine_list_is_written_down():
    assert engine_listing_problems() == []


def test_the_shape_checks_catch_what_they_look_for(tmp_path, monkeypatch):
    """Each rule above, on a planted violation."""
    made_up = tmp_path / "made_up.py"
    made_up.write_text(
        "from typing import Protocol\n"
        "from labkit.kafka import topics as t\n"
        "from labkit.kafka.topics import delete as drop\n"
        "from labkit.experiments.registry import RunBasics\n"
        "class Shape(Protocol):\n    def summary(self): ...\n"
        "class OwnRun(RunBasics):\n"
        "    def to_json(self):\n        t.delete('b', 'x')\n"
        "    def timeline(self):\n        drop('b', 'y')\n"
        "class RunContext:\n    def _close_files_and_topics(self):\n        t.delete('b', 'z')\n")
    assert record_classes({"labkit.experiments.made_up": made_up}) == [
        "labkit.experiments.made_up.OwnRun defines timeline, to_json",
        "labkit.experiments.made_up:4 names RunBasics",
        "labkit.experiments.made_up:7 names RunBasics"]
    assert record_classes({"labkit.checking.made_up": made_up}) == [
        "labkit.checking.made_up:4 names RunBasics", "labkit.checking.made_up:7 names RunBasics"]
    assert topic_deletes({"labkit.spark.made_up": made_up}) == [
        "labkit.spark.made_up:9 (OwnRun.to_json)", "labkit.spark.made_up:11 (OwnRun.timeline)",
        "labkit.spark.made_up:14 (RunContext._close_files_and_topics)"]
    assert topic_deletes({"labkit.experiments.context": made_up})[-1:] == [
        "labkit.experiments.context:11 (OwnRun.timeline)"]  # its own cleanup is the one
    assert topic_deletes({"labkit.cli.made_up": made_up}) == []  # other layers may


    # the list the CLI once had: an engine it does not name breaks `labkit scenario --help`
    from labkit.cli.scenarios import ScenarioGroup
    from labkit.experiments import catalog

    def hard_coded(self, ctx) -> list[str]:
        groups = ("Kafka", "Spark", "Any app")
        return [e.name for e in sorted(catalog().values(), key=lambda e: groups.index(e.group))]

    monkeypatch.setattr(ScenarioGroup, "list_commands", hard_coded)
    problems = engine_listing_problems()
    assert len(problems) == 1 and "labkit scenario --help failed" in problems[0], problems
