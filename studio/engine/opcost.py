"""Per-node cost of an ONNX graph for the performance model: MACs, DRAM bytes, dependencies.

Shapes come from ONNX shape inference, so the graph needs static input shapes.

* MACs: MatMul (``prod(out) x K``), Gemm, Conv (``out elements x C_in/group x kernel``) and
  the attention ops (``Attention``, ``MultiHeadAttention``, ``GroupQueryAttention``:
  ``2 x B x S_q x S_kv x hidden``); every other op has 0 MACs (memory-bound).
* DRAM bytes: the weights a node reads, at their *stored* size — an initializer feeding a
  ``DequantizeLinear`` counts at the initializer's type (int4 = half a byte, int8 = 1,
  uint16 = 2), a float initializer at its float size — plus its activations in and out,
  an activation that passed through a Q/DQ pair counted at the quantized type.
* ``QuantizeLinear`` / ``DequantizeLinear`` are folded into their neighbours by the HTP
  compiler: they stay in the table (so dependencies hold) with 0 MACs and 0 bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from studio.core.catalog import Chip
from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.core.perfmodel import (
    ChipPerf,
    Efficiency,
    GraphEstimate,
    OpGraph,
    estimate_ops,
    load_fit,
)
from studio.core.profile import layer_of

onnx = lazy_module("onnx")

_QDQ = ("QuantizeLinear", "DequantizeLinear")
_ATTENTION = ("Attention", "MultiHeadAttention", "GroupQueryAttention")
_UNARY = ("Relu", "Sigmoid", "Tanh", "Gelu", "Erf", "Neg", "Sqrt", "Reciprocal", "Exp", "Softmax",
          "Cast", "Identity", "LayerNormalization", "SimplifiedLayerNormalization", "Clip")
_BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "Where")


def _bytes_per_elem(elem_type: int) -> float:
    table: dict[int, int] = {
        onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4,
        onnx.TensorProto.INT8: 8, onnx.TensorProto.UINT8: 8,
        onnx.TensorProto.BOOL: 8, onnx.TensorProto.INT16: 16, onnx.TensorProto.UINT16: 16,
        onnx.TensorProto.FLOAT16: 16, onnx.TensorProto.BFLOAT16: 16, onnx.TensorProto.FLOAT: 32,
        onnx.TensorProto.INT32: 32, onnx.TensorProto.UINT32: 32, onnx.TensorProto.INT64: 64,
        onnx.TensorProto.UINT64: 64, onnx.TensorProto.DOUBLE: 64,
    }
    return table.get(int(elem_type), 32) / 8


def _shape(vi) -> tuple[int, ...] | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value") or d.dim_value <= 0:
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


_GATHERS = {"Gather", "GatherElements", "GatherND", "Slice"}


def op_costs(onnx_path: str | Path) -> OpGraph:
    """Columnar per-node costs of the graph at ``onnx_path`` (node order = graph order)."""
    path = Path(onnx_path)
    try:
        model = onnx.load(str(path), load_external_data=False)
        model = onnx.shape_inference.infer_shapes(model)
    except FileNotFoundError:
        raise StudioError(f"ONNX file {path} not found") from None
    except Exception as e:  # onnx raises DecodeError / ValidationError / InferenceError
        raise StudioError(f"{path.name} is not a readable ONNX model ({e})") from None
    g = model.graph
    t = _Tensors.of(g)
    names, types, layers, macs, dram = [], [], [], [], []
    producer: dict[str, int] = {}
    edges: list[tuple[int, int]] = []
    for idx, node in enumerate(g.node):
        name = node.name or f"{node.op_type}_{idx}"
        for inp in node.input:
            if inp in producer:
                edges.append((producer[inp], idx))
        for out in node.output:
            producer[out] = idx
        layer = layer_of(node.name)
        if layer is None:
            layer = next((x for x in (layer_of(o) for o in node.output) if x is not None), None)
        m, b = t.node_cost(node)
        names.append(name)
        types.append(node.op_type)
        layers.append(-1 if layer is None else layer)
        macs.append(m)
        dram.append(b)
    return OpGraph(names, types, np.array(layers, np.int64), np.array(macs),
                   np.array(dram), np.array(sorted(set(edges)), np.int64).reshape(-1, 2))


class _Tensors:
    """A graph's tensors: each one's shape (shape inference's, filled in where it stopped),
    the element size it is stored at, and the quantized initializer behind each weight's
    DequantizeLinear."""

    def __init__(self, shapes: dict[str, tuple[int, ...] | None], stored: dict[str, float],
                 weight_src: dict[str, str]) -> None:
        self.shapes, self.stored, self.weight_src = shapes, stored, weight_src

    @classmethod
    def of(cls, g) -> _Tensors:
        shapes: dict[str, tuple[int, ...] | None] = {}
        etype: dict[str, int] = {}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            shapes[vi.name] = _shape(vi)
            etype[vi.name] = vi.type.tensor_type.elem_type
        inits = {t.name: t for t in g.initializer}
        for name, t in inits.items():
            shapes[name] = tuple(int(d) for d in t.dims)
            etype[name] = t.data_type
        _fill_shapes(g, shapes)
        # a Q's output type: its zero point's, else its output_dtype attribute, else uint8
        for node in g.node:
            if node.op_type == "QuantizeLinear" and node.output and node.output[0] not in etype:
                zp = inits.get(node.input[2]) if len(node.input) > 2 else None
                attr = next((x.i for x in node.attribute if x.name == "output_dtype"), 0)
                etype[node.output[0]] = zp.data_type if zp is not None else (attr or 2)  # 2: UINT8
        # the stored element size of each tensor: an activation between a Q and a DQ is held
        # at the quantized type on both sides (the HTP keeps it quantized)
        stored: dict[str, float] = {n: _bytes_per_elem(t) for n, t in etype.items()}
        weight_src: dict[str, str] = {}  # DQ output -> quantized initializer
        for node in g.node:
            if node.op_type == "DequantizeLinear" and node.input and node.output:
                src = node.input[0]
                stored[node.output[0]] = stored.get(src, 4.0)
                if src in inits:
                    weight_src[node.output[0]] = src
            elif node.op_type == "QuantizeLinear" and node.input and node.output:
                if node.output[0] in etype and node.input[0] not in inits:
                    stored[node.input[0]] = _bytes_per_elem(etype[node.output[0]])
        return cls(shapes, stored, weight_src)

    def elems(self, name: str) -> int | None:
        s = self.shapes.get(name)
        return int(np.prod(s)) if s is not None else None

    def tensor_bytes(self, name: str) -> float:
        n = self.elems(name)
        return 0.0 if n is None else n * self.stored.get(name, 4.0)

    def node_cost(self, node) -> tuple[float, float]:
        """A node's MACs and the bytes it moves: a lookup its rows, a Q / DQ nothing, any
        other op its inputs (a weight at its quantized size) and outputs."""
        tensor_bytes = self.tensor_bytes
        m, b = 0.0, 0.0
        if node.op_type in _GATHERS and node.input:
            # a lookup reads the rows it returns (an embedding row per token), not the table
            out_b = sum(tensor_bytes(o) for o in node.output if o)
            b = 2 * out_b + sum(tensor_bytes(i) for i in node.input[1:2] if i)
        elif node.op_type not in _QDQ:
            m = _macs(node, self.shapes)
            for inp in node.input:
                if not inp:
                    continue
                if inp in self.weight_src:
                    b += tensor_bytes(self.weight_src[inp])
                else:
                    b += tensor_bytes(inp)
            b += sum(tensor_bytes(o) for o in node.output if o)
        return m, b


def _fill_shapes(g, shapes: dict[str, tuple[int, ...] | None]) -> None:
    """Where shape inference stopped (it may, on 16-bit Q/DQ), the shapes of Q / DQ,
    element-wise ops and MatMul from their inputs, in graph (topological) order."""
    for node in g.node:
        if not node.output or shapes.get(node.output[0]) is not None:
            continue
        ins = [shapes.get(i) for i in node.input if i]
        if not ins or ins[0] is None:
            continue
        try:
            if node.op_type in _QDQ or node.op_type in _UNARY:
                shapes[node.output[0]] = ins[0]
            elif node.op_type in _BINARY and all(x is not None for x in ins):
                shapes[node.output[0]] = tuple(np.broadcast_shapes(*ins))  # type: ignore[arg-type]
            elif node.op_type == "MatMul" and len(ins) == 2 and ins[1] is not None \
                    and len(ins[0]) >= 2 and len(ins[1]) >= 2:
                batch = np.broadcast_shapes(ins[0][:-2], ins[1][:-2])
                shapes[node.output[0]] = (*batch, ins[0][-2], ins[1][-1])
        except ValueError:
            continue


def _macs(node, shapes) -> float:
    def s(i: int) -> Any:
        return shapes.get(node.input[i]) if len(node.input) > i and node.input[i] else None

    out = shapes.get(node.output[0]) if node.output else None
    op = node.op_type
    if op == "MatMul" and s(0) and out is not None:
        return float(np.prod(out)) * s(0)[-1]
    if op == "Gemm" and s(0) and out is not None:
        trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0)
        k = s(0)[0] if trans_a else s(0)[-1]
        return float(np.prod(out)) * k
    if op == "Conv" and s(1) and out is not None:
        w = s(1)  # (C_out, C_in/group, k...)
        return float(np.prod(out)) * float(np.prod(w[1:]))
    if op in _ATTENTION and s(0) and out is not None:
        q = s(0)
        kv = s(1) if s(1) else q
        if len(q) == 3 and len(kv) >= 3:  # (B, S, hidden); K (B, S_kv, hidden_kv) or 4-D
            s_kv = kv[1] if len(kv) == 3 else kv[2]
            return 2.0 * q[0] * q[1] * s_kv * q[2]
        if len(q) == 4 and len(kv) == 4:  # (B, heads, S, head_dim)
            return 2.0 * q[0] * q[1] * q[2] * kv[2] * q[3]
    return 0.0


def estimate_graph(onnx_path: str | Path, chip: Chip,
                   eff: Efficiency | None = None) -> tuple[GraphEstimate, ChipPerf]:
    """Per-op estimated times and their schedule across the chip's HTP cores (``estimated``)."""
    perf = ChipPerf.of(chip)
    graph = op_costs(onnx_path)
    return estimate_ops(graph, perf, eff if eff is not None else load_fit()[0]), perf
