"""The seed's three ways past an op the HTP refuses, on the real QNN EP (HTP simulator):
strict names the node and the EP's reason; partition lets the CPU take it and counts the
NPU↔CPU transitions and the bytes crossing them; the rewrite catalogue replaces it with the
same function the HTP runs (exact in FP32, checked against the original graph)."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.errors import StudioError
from studio.engine import qnn, rewrites
from tests.engine.small_graphs import FEEDS, mlp

CHIP = "snapdragon-8-gen-3"


def _quantize(src, dst):
    """W8A16 QDQ for the HTP (ONNX Runtime's QNN quantizer, calibrated on FEEDS)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(FEEDS)

        def get_next(self):
            return next(self.it, None)

    import onnx

    cfg = get_qnn_qdq_config(onnx.load(str(src)), Reader(), activation_type=QuantType.QUInt16,
                             weight_type=QuantType.QUInt8)
    quantize(str(src), str(dst), cfg)
    return dst


def _cpu(path, feed):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def _cos(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("form", ["gelu-div", "gelu-mul"])
def test_erf_gelu_becomes_one_gelu_op_with_the_same_numbers(form, tmp_path):
    import onnx

    src = mlp(tmp_path / "m.onnx", form)
    done = rewrites.apply_rewrites(src, tmp_path / "rw.onnx")
    assert [(d["rewrite"], d["refused"], d["nodes"]) for d in done] == [
        ("erf-gelu", "Erf", ["act/Erf"])]
    ops = [n.op_type for n in onnx.load(str(tmp_path / "rw.onnx")).graph.node]
    assert ops == ["MatMul", "Gelu"]
    check = rewrites.check_rewrite(src, tmp_path / "rw.onnx", FEEDS)
    assert check["samples"] == 6 and check["max_abs_error"] < 1e-6
    assert check["worst_cosine"] > 0.999999


def test_strict_partition_and_rewrite_on_the_htp(tmp_path):
    """The quantized Erf-GELU MLP: strict names the node and the EP's reason; partition runs
    it with the Erf on the CPU (two transitions, 64 bytes each way); the rewritten graph is
    NPU-resident and computes what the original does."""
    src = mlp(tmp_path / "m.onnx", "gelu-div")
    q = _quantize(src, tmp_path / "m_q.onnx")
    with pytest.raises(StudioError) as err:
        qnn.make_session(q, CHIP, strict=True)
    msg = err.value.message
    assert "act/Erf" in msg and "Operators of type `Erf` are not supported" in msg
    assert "\n" not in msg

    part = rewrites.partition(q, CHIP)
    assert not part["all_on_npu"] and part["qnn_subgraphs"] == 2
    assert "act/Erf" in {n["name"] for n in part["cpu_nodes"]}
    assert part["transitions"] == 2 and part["bytes_crossing"] == 2 * 32 * 2  # uint16 [1, 32]
    assert {(c["from"], c["to"]) for c in part["crossings"]} == {("npu", "cpu"), ("cpu", "npu")}
    mixed = qnn.make_session(q, CHIP, strict=False)
    ref = _cpu(src, FEEDS[0])
    assert _cos(mixed.run(None, FEEDS[0])[0], ref) > 0.999

    rewrites.apply_rewrites(src, tmp_path / "rw.onnx")
    rq = _quantize(tmp_path / "rw.onnx", tmp_path / "rw_q.onnx")
    placed = rewrites.partition(rq, CHIP)
    assert placed["all_on_npu"] and placed["transitions"] == 0 and placed["cpu_nodes"] == []
    npu = qnn.make_session(rq, CHIP, strict=True)
    assert _cos(npu.run(None, FEEDS[0])[0], ref) > 0.999


def test_celu_becomes_elu_and_runs_on_the_htp(tmp_path):
    src = mlp(tmp_path / "m.onnx", "celu")
    done = rewrites.apply_rewrites(src, tmp_path / "rw.onnx")
    assert [d["rewrite"] for d in done] == ["celu"]
    assert rewrites.check_rewrite(src, tmp_path / "rw.onnx", FEEDS)["max_abs_error"] < 1e-6
    assert not rewrites.partition(_quantize(src, tmp_path / "q.onnx"), CHIP)["all_on_npu"]
    rq = _quantize(tmp_path / "rw.onnx", tmp_path / "rw_q.onnx")
    assert rewrites.partition(rq, CHIP)["all_on_npu"]


@pytest.mark.parametrize("op,rewrite", [("Softsign", "softsign"), ("Cosh", "cosh"),
                                        ("Sinh", "sinh"), ("ReduceSumSquare", "reduce-sum-square"),
                                        ("ReduceL1", "reduce-l1")])
def test_more_refused_ops_rewrite_onto_the_htp(op, rewrite, tmp_path):
    """Ops the QNN EP refuses here (measured: 'Operators of type `OP` are not supported by
    QNN EP'), each rewritten into ops it takes, numerically the same function in FP32."""
    src = mlp(tmp_path / "m.onnx", op)
    refused = rewrites.partition(_quantize(src, tmp_path / "q.onnx"), CHIP)
    assert [n["op_type"] for n in refused["cpu_nodes"]
            if n["op_type"] not in ("QuantizeLinear", "DequantizeLinear")] == [op]
    done = rewrites.apply_rewrites(src, tmp_path / "rw.onnx")
    assert [d["rewrite"] for d in done] == [rewrite] and done[0]["refused"] == op
    check = rewrites.check_rewrite(src, tmp_path / "rw.onnx", FEEDS)
    assert check["worst_cosine"] > 0.999999 and check["max_abs_error"] < 1e-4, check
    rq = _quantize(tmp_path / "rw.onnx", tmp_path / "rw_q.onnx")
    assert rewrites.partition(rq, CHIP)["all_on_npu"]


@pytest.mark.slow
def test_the_minilm_encoders_gelus_rewrite_exactly(tmp_path):
    """BERT's exact GELU, as torch exports it at opset 17, in each of MiniLM's 6 layers."""
    from studio.engine import encoder

    enc = encoder.load_encoder()
    src = encoder.export_onnx(enc, tmp_path / "minilm.onnx", seq_len=16)
    done = rewrites.apply_rewrites(src, tmp_path / "rw.onnx")
    assert [(d["rewrite"], len(d["nodes"])) for d in done] == [("erf-gelu", 6)]
    feeds = [enc.tokenize([t], seq_len=16) for t in ("def read_file(path):", "a quick fox")]
    check = rewrites.check_rewrite(src, tmp_path / "rw.onnx", feeds)
    assert check["worst_cosine"] > 0.999999 and check["max_abs_error"] < 1e-5
    # its attention mask fills hidden slots with float32's lowest: quantized, that range
    # leaves no resolution; -100 is the same softmax
    done = rewrites.apply_rewrites(src, tmp_path / "mask.onnx", ["mask-min"])
    assert [(d["rewrite"], len(d["nodes"])) for d in done] == [("mask-min", 1)]
    assert rewrites.check_rewrite(src, tmp_path / "mask.onnx", feeds)["max_abs_error"] == 0.0


def test_bad_input_is_one_line(tmp_path):
    src = mlp(tmp_path / "m.onnx", "celu")
    with pytest.raises(StudioError, match="unknown rewrite.*the catalogue has mask-min, erf-gelu, celu"):
        rewrites.apply_rewrites(src, tmp_path / "rw.onnx", ["tanh-gelu"])
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(StudioError, match="not a valid ONNX model"):
        rewrites.apply_rewrites(bad, tmp_path / "rw.onnx")
    with pytest.raises(StudioError, match="at least one sample input"):
        rewrites.check_rewrite(src, src, [])


@pytest.mark.parametrize("opset", [11, 13])
def test_the_reduce_rewrites_keep_axes_given_as_attributes(opset, tmp_path):
    """Before opset 18 the reductions take their axes as an attribute (ReduceSum takes them
    as an input from 13 on): the rewrite carries them over either way."""
    import onnx
    from onnx import TensorProto, helper

    x = np.random.RandomState(1).randn(2, 3, 4).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("ReduceSumSquare", ["x"], ["y"], axes=[1, 2], keepdims=0, name="r")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "r.onnx")
    assert rewrites.apply_rewrites(tmp_path / "r.onnx", tmp_path / "rw.onnx")[0]["rewrite"] == (
        "reduce-sum-square")
    got = _cpu(tmp_path / "rw.onnx", {"x": x})
    np.testing.assert_allclose(got, (x * x).sum(axis=(1, 2)), rtol=1e-5)
