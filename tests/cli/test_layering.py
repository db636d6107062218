"""The command line reaches the engine only through studio.services (like the GUI)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "studio" / "cli"


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


def test_building_the_parser_imports_no_command_work():
    """``studio --help`` reads the command registry and imports no command's module (each
    imports its work at its top: the services, numpy, torch behind them)."""
    code = (
        "import sys\n"
        "from studio.cli.main import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "mods = sorted(sys.modules)\n"
        "print(' '.join(m for m in mods if m.startswith('studio.') and not m.startswith("
        "'studio.cli')))\n"
        "print(' '.join(m for m in ('asyncio', 'numpy', 'torch', 'onnx', 'platformdirs') "
        "if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    studio_mods, heavy = r.stdout.splitlines()[-2:]
    # the errors and the third-party libraries' environment (set before any is imported);
    # pure, nothing imported beside the standard library
    assert studio_mods.split() == ["studio.core", "studio.core.errors", "studio.core.thirdparty"]
    assert heavy == ""
