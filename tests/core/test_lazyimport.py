"""Heavy libraries declared at a module's top and loaded on first use (studio.core.lazyimport)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_the_library_loads_at_the_first_attribute_read_and_not_before():
    out = _run(
        "import sys\n"
        "from studio.core.lazyimport import lazy_module\n"
        "onnx = lazy_module('onnx')\n"
        "helper = lazy_module('onnx.helper')\n"
        "print('onnx' in sys.modules, repr(onnx))\n"
        "print(onnx.TensorProto.FLOAT, 'onnx' in sys.modules, repr(onnx))\n"
        "print(helper.make_tensor_value_info('x', onnx.TensorProto.FLOAT, [1]).name)\n"
        "print(onnx.load is sys.modules['onnx'].load)\n"
    )
    assert out.splitlines() == [
        "False <lazy module 'onnx' (not loaded yet)>",
        "1 True <lazy module 'onnx' (loaded)>",
        "x",
        "True",
    ]


def test_an_engine_module_loads_onnx_only_when_its_work_runs(tmp_path):
    """studio.engine.opcost declares onnx at its top: importing it loads nothing heavy; the
    first function that reads a graph does."""
    out = _run(
        "import sys\n"
        "import studio.engine.opcost as m\n"
        "print(sorted({'onnx', 'onnxruntime', 'torch'} & set(sys.modules)))\n"
        "m._bytes_per_elem(1)  # its table reads onnx.TensorProto\n"
        "print('onnx' in sys.modules)\n"
    )
    assert out.splitlines() == ["[]", "True"]


@pytest.mark.parametrize("declared", [
    "lazy_module('no_such_library_here')",
    "lazy_module('no_such_library_here.sub', bare='no_such_library_here')",  # a bare package
])
def test_a_missing_library_fails_where_it_is_used_with_its_name(declared):
    out = _run(
        "from studio.core.lazyimport import lazy_module\n"
        f"m = {declared}\n"
        "try:\n"
        "    m.thing\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc.name)\n"
    )
    assert out == "no_such_library_here"


@pytest.mark.slow  # finding a submodule imports its package: torch, transformers, onnx
def test_every_declared_lazy_module_exists():
    """A typo in a declaration would surface only when the code runs: each one is found."""
    names = set()
    for path in (ROOT / "studio").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "lazy_module"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                names.add(node.args[0].value)
                names.update(a.value for a in node.args[1:] if isinstance(a, ast.Constant))
    assert len(names) > 30
    missing = []
    for name in sorted(names):
        if name.split(".")[0] in ("ray", "optuna", "netron"):
            continue  # optional extras
        if importlib.util.find_spec(name) is None:
            missing.append(name)
    assert missing == []


def test_a_bare_package_gives_its_submodules_without_running_its_init():
    """ONNX Runtime's tools package imports torch in its ``__init__``: left bare, the QNN
    quantization helpers and the shape inference load without torch, and a name only the
    ``__init__`` gives still comes (the ``__init__`` runs then)."""
    out = _run(
        "import sys\n"
        "import studio.engine.qdq as q, studio.engine.memplan as m, studio.engine.sensitivity as s\n"
        "q.ortq_qnn.get_qnn_qdq_config, q.ortq_qnn.qnn_preprocess_model\n"
        "s.ortq_qnn.get_qnn_qdq_config\n"
        "q.fusion_lpnorm.FusionLpNormalization, q.fusion_spacetodepth.FusionSpaceToDepth\n"
        "m.symbolic_shape_infer.SymbolicShapeInference\n"
        "print('torch' in sys.modules)\n"
        "import onnxruntime.tools as tools\n"
        "print(tools.infer_input_info.__name__, 'torch' in sys.modules)\n"
    )
    assert out.splitlines() == ["False", "infer_input_info True"]

