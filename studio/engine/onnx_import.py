"""ONNX files: open them with a clear error for files that are not valid ONNX models."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module

onnx = lazy_module("onnx")


def match(path: Path) -> bool:
    return Path(path).is_file() and Path(path).suffix.lower() == ".onnx"


def open_onnx(path: Path, check: bool = True) -> Any:
    """Load (and check) an ONNX model without its external data; StudioError if corrupt."""
    path = Path(path)
    if not path.is_file():
        raise StudioError(f"{path} does not exist: give the path of an .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=False)
        if check:
            # by path: a model's external data is found beside it, not beside the caller
            onnx.checker.check_model(str(path))
    except Exception as exc:  # protobuf DecodeError, ValidationError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StudioError(f"{path.name} is not a valid ONNX model ({first[:160]}): re-export it") from None
    return model


@dataclass
class OnnxNode:
    name: str
    op_type: str
    module: str  # "model.layers.0.self_attn.q_proj" for "/model/layers.0/self_attn/q_proj/MatMul"
    outputs: list[tuple[str, list[int | str]]]
    params: int
    #: the tensors it reads that are no weight (graph inputs, other nodes' outputs)
    inputs: list[str] = field(default_factory=list)


@dataclass
class OnnxGraph:
    path: Path
    nodes: list[OnnxNode]
    inputs: list[tuple[str, list[int | str]]]
    outputs: list[tuple[str, list[int | str]]]
    parameters: int
    opset: int


def module_of_node(name: str) -> str:
    """The module path of an exported node name (drops the op's own name)."""
    parts = [p for p in name.split("/") if p]
    return ".".join(parts[:-1])


def _shape(t: Any) -> list[int | str]:
    dims = t.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]


def read_onnx_graph(path: Path) -> OnnxGraph:
    """Nodes of an ONNX file with output shapes (shape inference) and parameter counts."""
    path = Path(path)
    model = open_onnx(path, check=False)
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - shapes are a nicety; the nodes still show
        pass
    g = model.graph
    sizes = {t.name: math.prod(t.dims) if t.dims else 1 for t in g.initializer}
    shapes = {v.name: _shape(v) for v in (*g.value_info, *g.input, *g.output)}
    nodes = []
    for i, n in enumerate(g.node):
        name = n.name or f"{n.op_type}_{i}"
        nodes.append(
            OnnxNode(
                name=name,
                op_type=n.op_type,
                module=module_of_node(name),
                outputs=[(o, shapes.get(o, [])) for o in n.output],
                params=sum(sizes.get(x, 0) for x in n.input),
                inputs=[x for x in n.input if x and x not in sizes],
            )
        )
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return OnnxGraph(
        path=path,
        nodes=nodes,
        inputs=[(v.name, _shape(v)) for v in g.input if v.name not in sizes],
        outputs=[(v.name, _shape(v)) for v in g.output],
        parameters=int(sum(sizes.values())),
        opset=int(opset),
    )
