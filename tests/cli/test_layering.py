"""The command line reaches the engine only through studio.services (like the GUI)."""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "studio" / "cli"


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement in ``path`` names (at any depth: function-level
    imports count), with its line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.lineno, node.module))
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
    return out


def test_no_cli_module_imports_the_engine():
    files = sorted(CLI.rglob("*.py"))
    assert CLI / "main.py" in files
    bad = [f"{f.name}:{line} imports {mod}" for f in files for line, mod in _imports(f)
           if mod == "studio.engine" or mod.startswith("studio.engine.")]
    assert not bad, bad


def test_the_check_sees_function_level_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from studio.engine import hf_import\n    import studio.engine.report\n")
    assert {m for _, m in _imports(f)} >= {"studio.engine", "studio.engine.report"}
