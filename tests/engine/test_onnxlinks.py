"""External data with several hard links (what the part cache leaves behind) loads: through
onnx and through ONNX Runtime's quantizer, with onnx's other guards kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


def _linked_model(folder: Path) -> tuple[Path, np.ndarray]:
    """A MatMul graph whose weight lies in ``weights.data``, that file hard-linked elsewhere
    as the part cache links a finished part."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir()
    path = folder / "part.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="weights.data",
                    size_threshold=0)
    os.link(folder / "weights.data", folder.parent / "cached-weights.data")
    assert (folder / "weights.data").stat().st_nlink == 2
    return path, w


def test_a_linked_weights_file_loads_where_plain_onnx_refuses_it(tmp_path):
    path, w = _linked_model(tmp_path / "part")
    # onnx alone (a fresh interpreter without the studio) refuses the file
    plain = subprocess.run([sys.executable, "-c", f"import onnx; onnx.load({str(path)!r})"],
                           capture_output=True, text=True)
    assert plain.returncode != 0 and "multiple hard links" in plain.stderr
    import onnx
    from onnx import numpy_helper

    import studio.engine  # noqa: F401  (installs the opener)

    model = onnx.load(str(path))
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[0]), w)


def test_onnxs_other_guards_stay(tmp_path):
    import onnx
    from onnx.checker import ValidationError

    import studio.engine  # noqa: F401

    path, _ = _linked_model(tmp_path / "part")
    model = onnx.load(str(path), load_external_data=False)
    for location in ("../cached-weights.data", str(tmp_path / "cached-weights.data"),
                     "missing.data"):
        entry = next(e for e in model.graph.initializer[0].external_data if e.key == "location")
        entry.value = location
        bad = tmp_path / "part" / "bad.onnx"
        onnx.save_model(model, str(bad))
        with pytest.raises(ValidationError):
            onnx.load(str(bad))


def test_onnx_runtimes_quantizer_reads_a_linked_part(tmp_path):
    """The quantizer loads the model by path with onnx (the studio cannot hand it the
    weights): the opener is what lets it read a part the cache linked."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static

    import studio.engine  # noqa: F401

    path, _ = _linked_model(tmp_path / "part")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"x": np.ones((1, 64), np.float32)}])

        def get_next(self):
            return next(self.feeds, None)

    out = tmp_path / "q.onnx"
    quantize_static(str(path), str(out), Reader(), weight_type=QuantType.QInt8,
                    activation_type=QuantType.QUInt16)
    import onnx

    assert any(n.op_type == "DequantizeLinear" for n in onnx.load(str(out)).graph.node)


def test_a_job_reads_an_artifacts_external_data_from_its_own_folder(tmp_path):
    """A job sees an input artifact's graph from a folder of its own (scratch files land
    there, not in the artifact): linked, not symlinked — ONNX Runtime refuses a symlink's
    target as external data outside the model's folder, which failed every weight rounding
    of a graph past 256 MB. The rounding's session with an extra output, on such a graph."""
    from studio.engine.onnxio import private_input
    from studio.engine.rounding import _session

    path, w = _linked_model(tmp_path / "artifact")
    local = private_input(path, tmp_path / "job")
    assert not local.is_symlink() and (local.parent / "weights.data").stat().st_nlink == 3
    sess = _session(path, ["y"], {}, tmp_path / "job2")
    x = np.ones((1, 64), np.float32)
    np.testing.assert_allclose(sess.run(["y"], {"x": x})[0], x @ w, rtol=1e-5)
    assert (path.parent / "weights.data").read_bytes() == (
        tmp_path / "cached-weights.data").read_bytes()
