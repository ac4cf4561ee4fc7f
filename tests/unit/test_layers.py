"""The package's import graph: no cycle, and no module imports a layer above its own.

Every import counts, including those inside functions and under ``TYPE_CHECKING`` (a deferred import
still couples the modules). The layers, bottom to top, are written down in docs/architecture.md:

values -> io | engine -> detectors -> pipeline -> outputs and commands -> cli
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "collapse_doctor"

VALUES = {
    "errors",
    "findings",
    "numbers",
    "text_safety",
    "json_text",
    "smoothing",
    "options",
    "config",
    "schema",
    "series",
    "scalars",
    "result",
}
"""Frozen values and pure helpers every layer shares; they import only each other."""
ENGINE = {
    "advantages",
    "lazy_torch",
    "stats",
    "batching",
    "workers",
    "parallel",
    "cluster",
    "memory",
    "reduce",
    "algorithm",
    "summary",
    "budget",
    "weights",
}
"""Recomputation and reduction: rollouts to per-step series, and the run's summary."""
LAYERS: dict[str, int] = {
    **dict.fromkeys(VALUES, 0),
    "io": 1,
    **dict.fromkeys(ENGINE, 1),
    "detectors": 2,
    "pipeline": 3,
    "incremental": 3,
    "export": 3,
    "simulate": 3,
    "compare": 3,
    "report": 4,
    "watch": 4,
    "retrain": 4,
    "integrations": 4,
    "diagnosis": 4,
    "cli": 5,
    "__main__": 5,
}
FORBIDDEN = {("detectors", "io"), ("engine", "io"), ("io", "engine")}
"""Edges between siblings that would hide a data flow (detectors read values, never files)."""
ALLOWED = {("io", "batching")}
"""Readers cut their record batches into the engine's chunks (batching is their shared interface)."""


def _modules() -> dict[str, Path]:
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
    return name or None


def import_graph() -> dict[str, set[str]]:
    """``{module: modules it imports}`` inside the package (names relative to ``collapse_doctor``)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules if name}
    for name, path in modules.items():
        if not name:
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
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
                if not target.startswith("collapse_doctor."):
                    continue
                resolved = _resolve(target.removeprefix("collapse_doctor."), modules)
                if resolved and resolved != name:
                    graph[name].add(resolved)
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
    top = module.split(".")[0]
    return "engine" if top in ENGINE else top


def test_no_import_cycle() -> None:
    assert _cycles(import_graph()) == []


def test_every_module_has_a_layer() -> None:
    unplaced = sorted({m.split(".")[0] for m in import_graph()} - set(LAYERS))
    assert not unplaced, f"add {unplaced} to LAYERS here and to docs/architecture.md"


def test_no_upward_or_forbidden_import() -> None:
    bad = []
    for module, targets in import_graph().items():
        for target in targets:
            src, dst = module.split(".")[0], target.split(".")[0]
            if src == dst:
                continue
            if (_area(module), dst) in ALLOWED:
                continue
            if LAYERS[dst] > LAYERS[src] or (_area(module), _area(target)) in FORBIDDEN:
                bad.append(f"{module} -> {target}")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


def test_the_checker_sees_cycles_and_function_level_imports() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    graph = import_graph()
    # pipeline.scan_run imports advantages inside the function; relative and TYPE_CHECKING imports count too
    assert "advantages" in graph["pipeline"]
    assert "stats.chunk" in graph["stats.logged"]


@pytest.mark.parametrize("value", sorted(VALUES))
def test_values_import_only_values(value: str) -> None:
    graph = import_graph()
    above = sorted(t for t in graph.get(value, set()) if t.split(".")[0] not in VALUES)
    assert not above, f"{value} imports {above}"
