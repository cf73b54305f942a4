"""The package's import graph, read from the source (every import, TYPE_CHECKING blocks and
function bodies included: a cycle hidden from the interpreter is still a cycle in the
design), with the folders mapped into ``inferwatch`` as pyproject.toml maps them."""

import ast
import gc
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVING_MODULE_LINES = 400  # a module past this holds more than one role


def _modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module the wheel ships."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    modules = {}
    for package, folder in mapping.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def _parse(path: Path) -> ast.Module:
    """``ast.parse`` with the collector held off: late in the suite a collected object's
    finalizer (an asyncio task an earlier test left pending logs itself) may run inside the
    parse, and CPython 3.11's AST constructor then fails with "recursion depth mismatch"."""
    gc.disable()
    try:
        return ast.parse(path.read_text())
    finally:
        gc.enable()


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base]) if base else ".".join(up)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def test_the_package_has_no_import_cycle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle_hidden_behind_type_checking():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from inferwatch.serving.server import X\n"
    path = ROOT / ".pytest-import-probe.py"
    path.write_text(source)
    try:
        assert _imports("probe", path, _modules()) == {"inferwatch.serving.server"}
    finally:
        path.unlink()


def test_the_map_covers_every_folder_of_the_package():
    modules = _modules()
    for name in ("inferwatch.cli", "inferwatch.serving.proxy", "inferwatch.drift.ab.stats", "inferwatch.alerts.spec",
                 "inferwatch.exporters.collector", "inferwatch.dashboards.generate", "inferwatch.deploy.monitoring"):
        assert name in modules


def test_only_the_entry_point_imports_the_cli():
    importers = {m for m, targets in _graph().items() if "inferwatch.cli" in targets}
    assert importers <= {"inferwatch.__main__"}, f"modules importing the CLI: {sorted(importers)}"


def test_no_gateway_module_holds_more_than_one_role():
    long = {p.name: n for p in (ROOT / "serving").glob("*.py")
            if (n := len(p.read_text().splitlines())) > SERVING_MODULE_LINES}
    assert long == {}, f"serving modules over {SERVING_MODULE_LINES} lines: {long}"


def test_no_module_imports_another_ones_private_names():
    modules = _modules()
    flagged = []
    for module, path in modules.items():
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("inferwatch"):
                flagged += [f"{module}: {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert flagged == []


COMPONENTS = ("serving", "drift", "alerts", "exporters", "dashboards", "deploy")
BELOW = ("common", "config")  # what the components stand on


def _layer(module: str) -> str:
    """The package a module belongs to at the top of inferwatch: a component, common,
    config, or the application layer (the CLI, `up`, the demo, the generate step)."""
    part = module.split(".")[1] if module.count(".") else ""
    return part if part in COMPONENTS + BELOW else ("root" if module == "inferwatch" else "app")


def test_the_components_stand_on_common_and_config_only():
    """The CLI, `up`'s orchestration and the demo sit above the components; what a component
    imports from inferwatch/ is common/ and config/ (and the version, from the root)."""
    upward = sorted(f"{m} -> {t}" for m, targets in _graph().items() if _layer(m) in COMPONENTS
                    for t in targets if _layer(t) == "app")
    assert upward == []


def test_common_and_config_import_no_component():
    graph = _graph()
    for layer, allowed in (("common", {"common"}), ("config", {"common", "config"})):
        found = sorted(f"{m} -> {t}" for m, targets in graph.items() if _layer(m) == layer
                       for t in targets if _layer(t) not in allowed)
        assert found == [], layer


def _package(module: str, modules: dict[str, Path]) -> str:
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def test_drift_and_its_ab_package_import_each_other_one_way_only():
    """``drift.ab`` stands on ``drift``; the service (``drift.service``) on both. Nothing in
    ``drift`` itself imports ``drift.ab`` or the service."""
    modules, graph = _modules(), _graph()
    edges = {(_package(m, modules), _package(t, modules)) for m, targets in graph.items() for t in targets}
    drift, ab, service = "inferwatch.drift", "inferwatch.drift.ab", "inferwatch.drift.service"
    assert (ab, drift) in edges and (drift, ab) not in edges
    assert {(drift, service), (ab, service)}.isdisjoint(edges)
