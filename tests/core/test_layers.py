"""core/ is layered: a module imports only its own layer and the layers below it, and no
import chain ever comes back to where it started. Every import counts, also the ones inside
functions, since those run too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "core"
# Bottom to top. "errors" is the leaf module every layer shares; the entry modules
# (core.train, core.generate, core.export, core.eval, core.monitor's __main__) sit with the
# command lines.
LAYERS = [
    "errors",
    "platform",
    "config",
    "models",
    "runs",
    "data",
    "weights",
    "training",
    "use",
    "monitor",
    "cli",
]
ENTRY = {"train", "generate", "export", "eval"}
# `python -m core.monitor`: the package's own few-line entry, a command line like the others
ENTRY_MODULES = {"core.monitor.__main__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in CORE.rglob("*.py")}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The core modules this file imports (`from core.x import y` counts core.x.y when y is a
    module, else core.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "core"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "core":
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
    return found & known


def layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:  # core/__init__
        return 0
    name = parts[1]
    if name in ENTRY or module in ENTRY_MODULES:
        return LAYERS.index("cli")
    return LAYERS.index(name)


def graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {m: imports_of(p, set(modules)) - {m} for m, p in modules.items()}


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{m} ({LAYERS[layer_of(m)]}) imports {d} ({LAYERS[layer_of(d)]})"
        for m, deps in edges.items()
        for d in deps
        if layer_of(d) > layer_of(m)
    )


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_core_module_belongs_to_a_layer():
    for module in all_modules():
        layer_of(module)  # raises ValueError for a subpackage missing from LAYERS


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(graph()) == []


def test_core_has_no_import_cycles():
    assert cycles(graph()) == []


def test_the_checks_catch_a_cycle_and_an_upward_import():
    edges = graph()
    edges["core.models.model"] = edges["core.models.model"] | {"core.training.trainer"}
    assert any("core.models.model" in c for c in cycles(edges))
    assert "core.models.model (models) imports core.training.trainer (training)" in (
        upward_imports(edges)
    )


@pytest.mark.parametrize(
    "package", [p.name for p in CORE.iterdir() if (p / "__init__.py").exists()]
)
def test_each_subpackage_says_what_lives_there(package):
    doc = ast.get_docstring(ast.parse((CORE / package / "__init__.py").read_text()))
    assert doc and len(doc) > 80, f"core/{package}/__init__.py needs its paragraph"


def test_core_never_imports_qt():
    for path in CORE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "PySide6" not in text and "pyqtgraph" not in text, path
