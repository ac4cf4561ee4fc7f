"""The package's import graph: no cycle, and no module imports a layer above its own.

Every import counts, including those inside functions and under ``TYPE_CHECKING`` (a deferred import
still couples the modules). The layers, bottom to top, are written down in docs/architecture.md:

core -> io | engine -> judge -> pipeline -> report | retrain | integrations -> cli

A module's layer is its top folder. Package ``__init__`` files are modules too: importing
``collapse_doctor.engine.stats.silence`` from outside ``engine.stats`` runs ``engine/stats/__init__.py`` (and
``engine/__init__.py``) first, so such an import is also an edge to each package init it passes through.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "collapse_doctor"

LAYERS: dict[str, int] = {
    "core": 0,
    "io": 1,
    "engine": 1,
    "judge": 2,
    "pipeline": 3,
    "report": 4,
    "retrain": 4,
    "integrations": 4,
    "cli": 5,
    "__main__": 5,
    "": 6,
}
"""Each folder of the package (and the root's ``__init__``, the Python API, at the top), bottom to top."""
FORBIDDEN = {("judge", "io"), ("engine", "io"), ("io", "engine"), ("engine", "judge")}
"""Edges between siblings or downwards that would hide a data flow (detectors read values, never files)."""


def _modules() -> dict[str, Path]:
    """``{dotted name relative to collapse_doctor: file}``; a package is its ``__init__`` ("" is the root)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name if name in modules else None


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _passed_inits(source: str, source_package: str, target: str, modules: dict[str, Path]) -> list[str]:
    """The package inits an import of ``target`` runs that ``source`` has not run already (its own packages)."""
    parts = target.split(".")
    inits = [".".join(parts[:n]) for n in range(1, len(parts))]
    own = source_package.split(".") if source_package else []
    mine = {".".join(own[:n]) for n in range(1, len(own) + 1)}
    return [i for i in inits if i in modules and i not in mine and i != source]


def import_graph() -> dict[str, set[str]]:
    """``{module: modules it imports}`` inside the package (names relative to ``collapse_doctor``; "" is the
    package root), counting the package inits each import passes through."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = _package_of(name, path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - node.level + 1]
                    module = ".".join(["collapse_doctor", *base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                targets = [f"{module}.{a.name}" for a in node.names]
            for target in targets:
                if target != "collapse_doctor" and not target.startswith("collapse_doctor."):
                    continue
                relative = target.removeprefix("collapse_doctor").removeprefix(".")
                resolved = _resolve(relative, modules)
                if resolved is None:
                    resolved = ""  # a name of the root package (``from collapse_doctor import diagnose``)
                for found in [*_passed_inits(name, package, resolved, modules), resolved]:
                    if found != name:
                        graph[name].add(found)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _area(module: str) -> str:
    return module.split(".")[0]


def test_no_import_cycle() -> None:
    assert _cycles(import_graph()) == []


def test_the_root_holds_only_layer_folders() -> None:
    loose = sorted(p.name for p in PACKAGE.iterdir() if p.suffix == ".py" and p.stem not in ("__init__", "__main__"))
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert not loose, f"modules at the package root: {loose}; put each in its layer's folder"
    assert set(folders) == set(LAYERS) - {"", "__main__"}, "a new folder needs its layer here and in architecture.md"


def test_every_module_has_a_layer() -> None:
    unplaced = sorted({_area(m) for m in import_graph()} - set(LAYERS))
    assert not unplaced, f"add {unplaced} to LAYERS here and to docs/architecture.md"


def test_no_upward_or_forbidden_import() -> None:
    bad = []
    for module, targets in import_graph().items():
        for target in targets:
            src, dst = _area(module), _area(target)
            if src == dst:
                continue
            if LAYERS[dst] > LAYERS[src] or (src, dst) in FORBIDDEN:
                bad.append(f"{module} -> {target}")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


def test_the_checker_sees_cycles_inits_and_function_level_imports() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    graph = import_graph()
    # pipeline.scan.scan_run imports advantages inside the function; relative and TYPE_CHECKING imports count too
    assert "engine.advantages" in graph["pipeline.scan"]
    assert "engine.stats.chunk" in graph["engine.stats.logged"]
    # an import from outside a package passes through its init; one from inside does not
    assert "engine.stats" in graph["engine.reduce"]
    assert "engine.stats" not in graph["engine.stats.logged"]
