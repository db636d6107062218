"""Block-wise (LPBQ) 4-bit weights, reduced to one MatMul on the real HTP simulator.

Two causes made the sample's W4A16 per-block graphs wrong on the simulator while the same
QDQ graph was right on the host: a weight whose input dimension is not a whole number of
blocks (the sample's down_proj: 688 inputs, blocks of 32) comes out wrong whatever the
options, and the HTP's block-quant optimization computes blocks under 32 wrong. The
quantizer keeps such weights per channel (and says so), and blocks under 32 compile
without the optimization."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from studio.core.catalog import default_chip_key
from studio.core.progress import RecordingProgress
from studio.engine import qnn
from studio.engine.qdq import quantize_graph

pytestmark = pytest.mark.slow  # each test quantizes and opens the HTP simulator (~10 s)


def _cos(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _matmul(path, k: int, n: int = 64, m: int = 16):
    rng = np.random.default_rng(k)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    w[:, :4] *= 8  # a few large output channels, so that blocks matter
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="/mm/MatMul")], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    feeds = [{"x": rng.standard_normal((1, m, k)).astype(np.float32)} for _ in range(3)]
    return feeds


def _weight_dq(path):
    model = onnx.load(str(path))
    node = next(n for n in model.graph.node if n.op_type == "DequantizeLinear"
                and n.input[0].startswith("W"))
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("k, blocks", [(256, True), (688, False)])
def test_a_weight_is_blocked_only_where_its_inputs_are_whole_blocks(tmp_path, k, blocks):
    feeds = _matmul(tmp_path / "mm.onnx", k)
    progress = RecordingProgress()
    info = quantize_graph(tmp_path / "mm.onnx", tmp_path / "q.onnx",
                          {"scheme": "W4A16", "weight_granularity": "per_block",
                           "block_size": 32, "samples": 3}, feeds, progress)
    dq = _weight_dq(tmp_path / "q.onnx")
    if blocks:
        assert dq == {"axis": 0, "block_size": 32} and "per_channel_not_blocks" not in info
    else:
        assert dq == {"axis": 1}  # one scale per output channel
        why = info["per_channel_not_blocks"]["W"]
        assert "688 is not a multiple of the block size 32" in why
        assert any("W: 4-bit per channel, not in blocks" in line for line in progress.lines)
    x = feeds[0]
    host = ort.InferenceSession(str(tmp_path / "q.onnx"),
                                providers=["CPUExecutionProvider"]).run(None, x)[0]
    opts = {"enable_block_quant_weight_optimization": "1"}
    htp = qnn.make_session(tmp_path / "q.onnx", default_chip_key(), strict=True,
                           extra_options=opts, threads=1).run(None, x)[0]
    assert _cos(htp, host) > 0.999  # before: -0.19 at 688 inputs in blocks of 32
    ref = x["x"] @ numpy_helper.to_array(onnx.load(str(tmp_path / "mm.onnx")).graph.initializer[0])
    assert _cos(host, ref) > 0.98


def test_blocks_under_32_run_right_without_the_block_optimization(tmp_path):
    """Blocks of 16 on the simulator: right without the HTP's block-quant optimization (the
    options the compile stage gives them), where with it they come out wrong."""
    from studio.core.catalog import default_chip_key, get_chip
    from studio.core.settings import SECTION_KEYS, Htp
    from studio.core.stages.compile import CompiledWeights
    from studio.worker.stages._llm import htp_options

    chip = get_chip(default_chip_key())

    def Settings(block: int) -> CompiledWeights:  # what htp_options reads of a stage's settings
        return CompiledWeights({"quantization.scheme": "W4A16",
                                "quantization.weight_granularity": "per_block",
                                "quantization.block_size": block,
                                **{f"htp.{k}": Htp.default(k) for k in SECTION_KEYS["htp"]}})

    assert htp_options(Settings(32), chip) == {"enable_block_quant_weight_optimization": "1"}
    assert htp_options(Settings(16), chip) == {}
    feeds = _matmul(tmp_path / "mm.onnx", 256)
    quantize_graph(tmp_path / "mm.onnx", tmp_path / "q.onnx",
                   {"scheme": "W4A16", "weight_granularity": "per_block", "block_size": 16,
                    "samples": 3}, feeds)
    assert _weight_dq(tmp_path / "q.onnx") == {"axis": 0, "block_size": 16}
    x = feeds[0]
    host = ort.InferenceSession(str(tmp_path / "q.onnx"),
                                providers=["CPUExecutionProvider"]).run(None, x)[0]
    htp = qnn.make_session(tmp_path / "q.onnx", default_chip_key(), strict=True,
                           extra_options=htp_options(Settings(16), chip), threads=1).run(None, x)[0]
    assert _cos(htp, host) > 0.999
