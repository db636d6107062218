"""The memory plan of an ONNX graph: its activation tensors with their lifetimes (from the
node order as stored and static shapes), planned by :mod:`studio.core.memplan`, with the
weight, KV cache and I/O bytes beside it.

What counts as what:

- weights: initializers and Constant node outputs, at their stored dtype;
- folded: outputs of nodes whose inputs are all weights (or folded), e.g. the
  DequantizeLinear of a QDQ weight or a shape computation; a backend turns them into
  constants, so they are neither weights nor activations (their bytes are reported);
- KV cache: graph inputs named ``past_*`` and outputs named ``present_*`` (the naming of
  :mod:`studio.engine.llm_export`); the runtime owns those buffers, they are not planned;
- activations: every other graph input, node output and graph output. A step is one node
  that is not a constant; a graph input lives from step 0, a graph output to the last step.

The model is read without its external data (a graph past 2 GB keeps its weights in
``<graph>.onnx.data``): sizes come from shapes and dtypes only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.lazyimport import ORT_TOOLS, lazy_module
from studio.core.memplan import DEFAULT_ALIGNMENT, GraphMemory, Tensor, plan_memory
from studio.engine.onnx_import import open_onnx

onnx = lazy_module("onnx")
# onnxruntime.tools left bare: its __init__ imports torch, which shape inference does not need
symbolic_shape_infer = lazy_module("onnxruntime.tools.symbolic_shape_infer", bare=ORT_TOOLS)

# bits per element of the ONNX tensor types (TensorProto.DataType values)
_BITS = {1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64,
         14: 64, 15: 128, 16: 16, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4, 24: 8,
         25: 2, 26: 2}
_FLOAT_TYPES = {1, 10, 11, 16, 17, 18, 19, 20, 23, 24}
# ops whose output is not a function of their inputs: never folded into constants
_NOT_FOLDABLE = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                 "Multinomial", "Bernoulli", "If", "Loop", "Scan"}
_QDQ = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
KV_INPUT_PREFIX, KV_OUTPUT_PREFIX = "past_", "present_"

STATIC_HINT = ("export it with static shapes (fixed batch, prompt and context lengths, as the "
               "studio's export stage does)")


def dtype_name(elem_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"type{elem_type}"


def tensor_bytes(elem_type: int, shape: Iterable[int], what: str = "tensor") -> int:
    """Bytes of a dense tensor (sub-byte types packed, as ONNX stores them)."""
    bits = _BITS.get(int(elem_type))
    if bits is None:
        raise StudioError(f"{what} has element type {dtype_name(elem_type)}, which has no fixed "
                          "size: the memory plan handles numeric tensors only")
    return -(-math.prod(int(d) for d in shape) * bits // 8)


def _static_shape(vi: Any) -> tuple[int, list[int]] | None:
    """(elem type, dims) of a ValueInfo when its type and every dim are known, else None."""
    t = vi.type
    if not t.HasField("tensor_type"):
        return None
    tt = t.tensor_type
    if not tt.elem_type or not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        dims.append(int(d.dim_value))
    return int(tt.elem_type), dims


def _dims_text(vi: Any) -> str:
    dims = vi.type.tensor_type.shape.dim
    return "[" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                           for d in dims) + "]"


def _fix_input_dims(model: Any, dims: dict[str, int]) -> None:
    for vi in model.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_value") and d.dim_param in dims:
                d.dim_value = int(dims[d.dim_param])


def _infer(model: Any) -> tuple[Any, dict[str, tuple[int, list[int]]]]:
    """The model with inferred shapes and the static (type, dims) of every value it knows."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - an op onnx cannot infer: try ORT's inference below
        inferred = model
    known = _known(inferred)
    return inferred, known


def _known(model: Any) -> dict[str, tuple[int, list[int]]]:
    g = model.graph
    out = {}
    for vi in (*g.input, *g.value_info, *g.output):
        s = _static_shape(vi)
        if s is not None:
            out[vi.name] = s
    return out


def _symbolic(model: Any) -> dict[str, tuple[int, list[int]]]:
    """Shapes from ONNX Runtime's symbolic shape inference, which computes shape tensors
    (e.g. the Expand of a GQA key repeat) that onnx's own inference leaves unknown."""
    try:
        return _known(symbolic_shape_infer.SymbolicShapeInference.infer_shapes(model, auto_merge=False))
    except Exception:  # noqa: BLE001 - partial shapes are reported by the caller
        return {}


def _subgraph_inputs(node: Any) -> set[str]:
    """Outer-scope names read by the subgraphs of an If / Loop / Scan node."""
    used: set[str] = set()
    for a in node.attribute:
        graphs = ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                  list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else [])
        for sg in graphs:
            made = {i.name for i in sg.input} | {t.name for t in sg.initializer}
            for n in sg.node:
                used.update(x for x in n.input if x and x not in made)
                used.update(_subgraph_inputs(n) - made)
                made.update(n.output)
    return used


def _constant_value_shape(node: Any) -> tuple[int, list[int]] | None:
    """(type, dims) of a Constant node's value from its attribute."""
    for a in node.attribute:
        if a.name == "value":
            return int(a.t.data_type), [int(d) for d in a.t.dims]
        if a.name == "sparse_value":
            return int(a.sparse_tensor.values.data_type), [int(d) for d in a.sparse_tensor.dims]
        if a.name == "value_float":
            return 1, []
        if a.name == "value_int":
            return 7, []
        if a.name == "value_floats":
            return 1, [len(a.floats)]
        if a.name == "value_ints":
            return 7, [len(a.ints)]
    return None


def graph_memory(path: Path, dims: dict[str, int] | None = None,
                 alignment: int = DEFAULT_ALIGNMENT, top: int = 8) -> GraphMemory:
    """Plan the activations of the ONNX graph at ``path``. ``dims`` fixes named dynamic
    input dims (``{"batch": 1}``). StudioError (one line) for a file that is not an ONNX
    model or a graph whose shapes are not static."""
    gm, _ = analyse(path, dims, alignment, top)
    return gm


def activation_tensors(path: Path, dims: dict[str, int] | None = None) -> list[Tensor]:
    """The activation tensors :func:`graph_memory` plans, with their lifetimes."""
    return analyse(path, dims)[1]


def analyse(path: Path, dims: dict[str, int] | None = None,
            alignment: int = DEFAULT_ALIGNMENT, top: int = 8
            ) -> tuple[GraphMemory, list[Tensor]]:
    """:func:`graph_memory` and the tensor list it planned."""
    path = Path(path)
    model = open_onnx(path, check=False)
    g = model.graph
    if dims:
        _fix_input_dims(model, dims)
    inits = {t.name: (int(t.data_type), [int(d) for d in t.dims]) for t in g.initializer}
    for st in g.sparse_initializer:
        inits[st.values.name] = (int(st.values.data_type), [int(d) for d in st.dims])

    inferred, known = _infer(model)
    weights, folded, steps = _constants(g, inits, known, path)
    graph_inputs = [vi for vi in g.input if vi.name not in inits]
    graph_outputs = {vi.name for vi in g.output}
    activation_names = [vi.name for vi in graph_inputs
                        if not vi.name.startswith(KV_INPUT_PREFIX)]
    for node in steps:
        activation_names += [o for o in node.output
                             if o and not (o in graph_outputs and o.startswith(KV_OUTPUT_PREFIX))]
    _check_static(path, inferred, known, activation_names,
                  set(activation_names) | {vi.name for vi in graph_inputs} | graph_outputs)
    io = _lifetimes(steps, activation_names, known, graph_outputs)
    for vi in graph_inputs:
        if vi.name.startswith(KV_INPUT_PREFIX):
            io.kv_in += tensor_bytes(*known[vi.name], f"input {vi.name}")
    for name in graph_outputs:
        if name.startswith(KV_OUTPUT_PREFIX):
            io.kv_out += tensor_bytes(*known[name], f"output {name}")
        elif name in folded or name in weights:
            io.output_bytes += tensor_bytes(*(known.get(name) or weights[name]),
                                            f"output {name}")
    quantized, w_bytes, w_fp32, by_dtype = _weight_bytes(g, weights)
    # best effort: a folded shape computation may have no inferred shape
    folded_bytes = sum(tensor_bytes(*known[n], f"tensor {n}") for n in folded if n in known)

    labels = [(n.name or f"{n.op_type}_{i}", n.op_type) for i, n in enumerate(steps)]
    plan = plan_memory(io.tensors, len(steps), labels, alignment=alignment, top=top)
    notes = []
    if quantized:
        notes.append("QDQ graph planned as stored: each quantized activation is its float "
                     "tensor, its QuantizeLinear output and its DequantizeLinear output")
    gm = GraphMemory(
        graph=path.stem, path=str(path), plan=plan, weight_bytes=w_bytes,
        weight_bytes_fp32=w_fp32, weight_bytes_by_dtype=dict(sorted(by_dtype.items())),
        folded_bytes=folded_bytes, kv_cache_bytes=io.kv_in, kv_output_bytes=io.kv_out,
        input_bytes=io.input_bytes, output_bytes=io.output_bytes, nodes=len(g.node),
        notes=notes,
    )
    return gm, io.tensors


def _constants(g, inits: dict[str, tuple[int, list[int]]],
               known: dict[str, tuple[int, list[int]]], path: Path
               ) -> tuple[dict[str, tuple[int, list[int]]], set[str], list[Any]]:
    """The graph's constants — initializers, Constant outputs (``weights``) and what is
    computed from them alone (``folded``) — and the nodes that run."""
    # constants: initializers, Constant outputs and what is computed from them alone
    weights: dict[str, tuple[int, list[int]]] = dict(inits)
    folded: set[str] = set()
    steps: list[Any] = []  # the nodes that run
    for node in g.node:
        ins = [x for x in node.input if x]
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for o in node.output:
                if o:
                    shp = _constant_value_shape(node) or known.get(o)
                    if shp is None:
                        raise StudioError(f"Constant {node.name or o} in {path.name} has no "
                                          "readable value: re-export the model")
                    weights[o] = shp
            continue
        if (ins and node.op_type not in _NOT_FOLDABLE and not _subgraph_inputs(node)
                and all(x in weights or x in folded for x in ins)):
            folded.update(o for o in node.output if o)
            continue
        steps.append(node)
    return weights, folded, steps


def _check_static(path: Path, inferred, known: dict[str, tuple[int, list[int]]],
                  activation_names: list[str], needed: set[str]) -> None:
    """Every tensor planned has a static shape (the symbolic inference's where ONNX's has
    none, added to ``known``); else one line naming the first without."""
    missing = [n for n in needed if n not in known]
    if missing:
        known.update({k: v for k, v in _symbolic(inferred).items() if k not in known})
        missing = [n for n in missing if n not in known]
    if missing:
        vis = {vi.name: vi for vi in (*inferred.graph.input, *inferred.graph.value_info,
                                      *inferred.graph.output)}
        first = sorted(missing, key=lambda n: activation_names.index(n)
                       if n in activation_names else len(activation_names))[0]
        shape_text = f" (shape {_dims_text(vis[first])})" if first in vis else ""
        raise StudioError(
            f"{path.name}: {len(missing)} tensor(s) have no static shape, e.g. {first}{shape_text}: "
            f"{STATIC_HINT}, or give the dynamic dims their sizes"
        )


@dataclass
class _Lifetimes:
    """The activation tensors with their lifetimes over the steps that run, and the bytes
    of the graph's inputs, outputs and KV cache."""

    tensors: list[Tensor]
    input_bytes: int = 0
    output_bytes: int = 0
    kv_in: int = 0
    kv_out: int = 0


def _lifetimes(steps: list[Any], activation_names: list[str],
               known: dict[str, tuple[int, list[int]]], graph_outputs: set[str]) -> _Lifetimes:
    """Each activation from the step that makes it to the last that reads it (a graph
    output to the end; a graph input from the start)."""
    # lifetimes over the steps that run
    n_steps = len(steps)
    produced: dict[str, tuple[int, Any]] = {}
    last: dict[str, int] = {}
    for i, node in enumerate(steps):
        for x in (*node.input, *_subgraph_inputs(node)):
            if x:
                last[x] = i
        for o in node.output:
            if o:
                produced[o] = (i, node)
    end_step = max(n_steps - 1, 0)
    out = _Lifetimes([])
    for name in activation_names:
        etype, shape = known[name]
        nbytes = tensor_bytes(etype, shape, f"tensor {name}")
        if name in produced:
            start, node = produced[name]
            producer, op = node.name or f"{node.op_type}_{start}", node.op_type
            kind = "output" if name in graph_outputs else "intermediate"
        else:  # a graph input
            start, producer, op, kind = 0, "", "input", "input"
            out.input_bytes += nbytes
        end = end_step if name in graph_outputs else max(last.get(name, start), start)
        if kind == "output":
            out.output_bytes += nbytes
        out.tensors.append(Tensor(name, nbytes, start, end, producer, op, kind))
    return out


def _weight_bytes(g, weights: dict[str, tuple[int, list[int]]]
                  ) -> tuple[set[str], int, int, dict[str, int]]:
    """The weights that are quantized, their bytes as stored and as FP32, and the bytes by
    dtype."""
    # weights at their stored dtype, and as FP32
    qparams: set[str] = set()
    quantized: set[str] = set()
    for node in g.node:
        if node.op_type in _QDQ:
            qparams.update(x for x in node.input[1:3] if x)
            if node.op_type == "DequantizeLinear" and node.input and node.input[0] in weights:
                quantized.add(node.input[0])
    by_dtype: dict[str, int] = {}
    w_bytes = w_fp32 = 0
    for name, (etype, shape) in weights.items():
        b = tensor_bytes(etype, shape, f"weight {name}")
        w_bytes += b
        by_dtype[dtype_name(etype)] = by_dtype.get(dtype_name(etype), 0) + b
        if name in quantized or (etype in _FLOAT_TYPES and name not in qparams):
            w_fp32 += 4 * math.prod(shape)
        elif name not in qparams:
            w_fp32 += b
    return quantized, w_bytes, w_fp32, by_dtype
