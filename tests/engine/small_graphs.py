"""Small ONNX graphs the graph tests build: an MLP with an activation the HTP refuses (or
its rewrite) and a CNN exported from torch with a dynamic batch."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np


def mlp(path, act: str):
    """x [1, 16] -> MatMul [16, 32] -> an activation; ``act``: an Erf-GELU form, Celu, or an
    op the HTP refuses (Softsign, Cosh, Sinh; ReduceSumSquare and ReduceL1 over the last
    axis, giving [1, 1])."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.RandomState(0)
    inits = [numpy_helper.from_array((rng.randn(16, 32) * 0.3).astype(np.float32), "W")]

    def const(name, v):
        inits.append(numpy_helper.from_array(np.array(v, np.float32), name))
        return name

    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="fc")]
    if act == "gelu-div":  # torch's exact GELU at opset 17: x * 0.5 * (1 + erf(x / sqrt 2))
        nodes += [helper.make_node("Div", ["h", const("s", math.sqrt(2))], ["d"], name="act/Div"),
                  helper.make_node("Erf", ["d"], ["e"], name="act/Erf"),
                  helper.make_node("Add", ["e", const("one", 1.0)], ["a"], name="act/Add"),
                  helper.make_node("Mul", ["h", "a"], ["m"], name="act/Mul"),
                  helper.make_node("Mul", ["m", const("half", 0.5)], ["y"], name="act/Mul_1")]
    elif act == "gelu-mul":  # erf(x * 1/sqrt 2), the halving first
        nodes += [helper.make_node("Mul", ["h", const("s", 1 / math.sqrt(2))], ["d"],
                                   name="act/Mul"),
                  helper.make_node("Erf", ["d"], ["e"], name="act/Erf"),
                  helper.make_node("Add", [const("one", 1.0), "e"], ["a"], name="act/Add"),
                  helper.make_node("Mul", ["h", const("half", 0.5)], ["hh"], name="act/Mul_1"),
                  helper.make_node("Mul", ["hh", "a"], ["y"], name="act/Mul_2")]
    elif act == "celu":
        nodes += [helper.make_node("Celu", ["h"], ["y"], alpha=0.7, name="act/Celu")]
    elif act in ("Softsign", "Cosh", "Sinh"):  # element-wise ops the HTP refuses
        nodes += [helper.make_node(act, ["h"], ["y"], name=f"act/{act}")]
    elif act in ("ReduceSumSquare", "ReduceL1"):  # over the last axis, kept: [1, 1]
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "axes"))
        nodes += [helper.make_node(act, ["h", "axes"], ["y"], keepdims=1, name=f"act/{act}")]
    out = [1, 1] if act.startswith("Reduce") else [1, 32]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                       [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    opset = 18 if act.startswith("Reduce") else 17  # axes as an input from opset 18
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


FEEDS = [{"x": np.random.RandomState(i).randn(1, 16).astype(np.float32)} for i in range(6)]




def cnn(path: Path) -> Path:
    """Conv-BN-ReLU-pool-Linear with two outputs (logits and the pooled features), exported
    with a dynamic batch dimension."""
    import torch

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.fc = torch.nn.Linear(8, 5)

        def forward(self, image):
            h = torch.relu(self.bn(self.conv(image)))
            pooled = h.mean(dim=(2, 3))
            return self.fc(pooled), pooled

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(Net().eval(), (torch.randn(1, 3, 16, 16),), str(path),
                          input_names=["image"], output_names=["logits", "features"],
                          opset_version=17, dynamo=False, dynamic_axes={"image": {0: "batch"}})
    return path
