"""The services modules import each other in one direction: the graph of their imports (at
the top and inside functions alike) has no cycle, so every one of them could sit at the top,
and each module imports alone, first, in a fresh interpreter state. The same holds for the
whole package: no module of the studio reaches itself through the imports it runs (only
imports for type checkers, under ``if TYPE_CHECKING:``, are left out)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "studio" / "services"


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module(p): p for p in sorted(SERVICES.rglob("*.py"))}


def _imported(node: ast.AST) -> list[str]:
    """The services modules an import statement names."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    out = []
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name.startswith("studio.services.") and name not in out:
            out.append(name)
    return out


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {m for node in ast.walk(tree) for m in _imported(node) if m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (a list of modules, the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        if m in path:
            return path[path.index(m):] + [m]
        if m in done:
            return None
        path.append(m)
        for n in sorted(graph.get(m, ())):
            found = visit(n)
            if found:
                return found
        path.pop()
        done.add(m)
        return None

    for m in sorted(graph):
        found = visit(m)
        if found:
            return found
    return None


def test_the_services_import_graph_has_no_cycle():
    graph = import_graph()
    assert "studio.services.history" in graph["studio.services.reports"]  # the graph is read
    cycle = find_cycle(graph)
    assert cycle is None, "services import cycle: " + " -> ".join(cycle or [])


def studio_graph() -> dict[str, set[str]]:
    """Every studio module's imports of studio modules, at the top and inside functions, but
    not those under ``if TYPE_CHECKING:`` (never run)."""
    modules = {_module(p): p for p in sorted((ROOT / "studio").rglob("*.py"))}

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            found |= {m for m in map(resolve, names) if m.startswith("studio.") and m != name}
        graph[name] = found
    return graph


def test_no_studio_module_imports_itself_round_a_circle():
    """core, engine, services, worker, ui and cli alike (the engine's export, runtime,
    vision, quantize and parts modules included)."""
    graph = studio_graph()
    assert "studio.engine.qdq" in graph["studio.engine.vision"]  # the graph is read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_leaves_import_no_other_services_module():
    graph = import_graph()
    for leaf in ("versions", "edits", "workers"):
        assert graph[f"studio.services.{leaf}"] == set(), leaf


def test_each_services_module_imports_alone():
    """Each module imported first, with no studio module loaded before it (a cycle held
    apart by import order would fail here)."""
    names = sorted(MODULES)
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for m in [m for m in sys.modules if m == 'studio' or m.startswith('studio.')]:\n"
        "        del sys.modules[m]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as exc:\n"
        "        if getattr(exc, 'name', '') and not exc.name.startswith('studio'):\n"
        "            continue  # an optional third-party package this machine lacks\n"
        "        raise\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
