"""Tiny real ONNX models for the QNN tests: a 16-wide MatMul + Add (layer 0) + Relu (layer 1),
optionally followed by an op the HTP rejects, and its W8A16 QDQ version."""

from __future__ import annotations

from pathlib import Path

import numpy as np

WIDTH = 16


def float_model(path: Path, with_mod: bool = False) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((WIDTH, WIDTH)) * 0.3).astype(np.float32)
    b = (rng.standard_normal((WIDTH,)) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["mm"], name="/model/layers.0/mlp/MatMul"),
        helper.make_node("Add", ["mm", "B"], ["ad"], name="/model/layers.0/mlp/Add"),
        helper.make_node(
            "Relu", ["ad"], ["r" if with_mod else "y"], name="/model/layers.1/act/Relu"
        ),
    ]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    if with_mod:
        # fmod=1 is an op the QNN HTP rejects ("QNN Mod Op only support fmod == 0").
        nodes.append(
            helper.make_node("Mod", ["r", "M"], ["y"], name="/model/layers.1/the_Mod", fmod=1)
        )
        inits.append(numpy_helper.from_array(np.full((WIDTH,), 0.75, np.float32), "M"))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def quantize_w8a16(src: Path, dst: Path) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    rng = np.random.default_rng(1)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(
                [{"x": rng.standard_normal((1, WIDTH)).astype(np.float32)} for _ in range(8)]
            )

        def get_next(self):
            return next(self.it, None)

    cfg = get_qnn_qdq_config(
        str(src), Reader(), activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8
    )
    quantize(str(src), str(dst), cfg)
    return dst
