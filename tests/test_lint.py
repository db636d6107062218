"""House rules: ruff, the import-linter layer contracts, a core that needs no Qt."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = shutil.which("ruff")
    assert ruff, "ruff is part of the test extra"
    r = subprocess.run([ruff, "check", "studio", "tests", "benchmarks"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_mypy_clean_on_core_and_services():
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_contracts_hold():
    exe = shutil.which("lint-imports")
    assert exe, "import-linter is part of the test extra"
    r = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_and_services_import_without_qt():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('PySide6', 'shiboken6', 'pyqtgraph', 'qasync'):\n"
        "            raise ImportError('Qt is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import studio.cli.main, studio.services.session, studio.services.pipeline\n"
        "import studio.worker.stages\n"
        "heavy = [m for m in ('torch', 'onnx', 'onnxruntime', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_help_lists_the_batch_mode():
    r = subprocess.run([sys.executable, "-m", "studio.cli", "--help"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0
    assert "--batch" in r.stdout
