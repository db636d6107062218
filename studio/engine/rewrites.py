"""Known equivalent rewrites for ops the HTP refuses, and the partition a CPU fallback makes.

The QNN EP here refuses some ops outright (``Erf``, ``Celu``; see the HTP notes). The seed's
advice for an unsupported operator: replace it with an equivalent subgraph, or let that part
run on the CPU — and check accuracy and speed after each move. This module holds both:

* a catalogue of rewrites by graph surgery on the float graph (before quantization), each
  exact in float arithmetic — :func:`apply_rewrites` applies them, :func:`check_rewrite`
  compares the rewritten graph with the original on sample inputs (ONNX Runtime, CPU);
* :func:`partition` — which nodes the HTP leaves to the CPU, how many NPU↔CPU transitions
  that makes and how many bytes cross them per inference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_bytes
from studio.core.lazyimport import lazy_module
from studio.engine import qnn
from studio.engine.graphdata import compare_outputs
from studio.engine.onnx_import import open_onnx
from studio.engine.onnxio import PROTOBUF_LIMIT, save_onnx_atomic, weight_bytes

helper = lazy_module("onnx.helper")
numpy_helper = lazy_module("onnx.numpy_helper")
onnx = lazy_module("onnx")
ort = lazy_module("onnxruntime")

MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class Rewrite:
    name: str
    refused: str  # the op the HTP refuses
    description: str
    apply: Callable[[Any], list[str]]  # rewrites the model in place; returns the nodes replaced


def _consumers(graph) -> dict[str, list]:
    out: dict[str, list] = {}
    for n in graph.node:
        for x in n.input:
            out.setdefault(x, []).append(n)
    return out


def _scalar(graph, name: str) -> float | None:
    """The value of a one-element initializer or Constant ``name``, else None."""
    for t in graph.initializer:
        if t.name == name:
            a = numpy_helper.to_array(t)
            return float(a.reshape(-1)[0]) if a.size == 1 else None
    for n in graph.node:
        if n.op_type == "Constant" and n.output[0] == name:
            for a in n.attribute:
                if a.name == "value":
                    v = numpy_helper.to_array(a.t)
                    return float(v.reshape(-1)[0]) if v.size == 1 else None
    return None


def _other(node, name: str) -> str:
    return node.input[1] if node.input[0] == name else node.input[0]


def _close(value: float | None, want: float, rtol: float = 1e-4) -> bool:
    return value is not None and abs(value - want) <= rtol * abs(want)


def _gelu_tail(g, cons, producer, x: str, t: str) -> list | None:
    """The Muls after ``1 + erf(...)`` (tensor ``t``) that make ``x * 0.5 * (...)``: by x then
    by 0.5, by 0.5 then by x, or by a ``Mul(x, 0.5)`` made beside; None if they are not."""

    def only(tensor):
        nxt = cons.get(tensor, [])
        return nxt[0] if len(nxt) == 1 and nxt[0].op_type == "Mul" else None

    first = only(t)
    if first is None:
        return None
    o = _other(first, t)
    if o == x or _close(_scalar(g, o), 0.5):
        second = only(first.output[0])
        if second is None:
            return None
        o2 = _other(second, first.output[0])
        if (o == x and _close(_scalar(g, o2), 0.5)) or (o != x and o2 == x):
            return [first, second]
        return None
    half = producer.get(o)
    if (half is not None and half.op_type == "Mul" and x in half.input
            and _close(_scalar(g, _other(half, x)), 0.5)
            and len(cons.get(half.output[0], [])) == 1):
        return [half, first]
    return None


def _erf_gelu(model) -> list[str]:
    """Exact GELU exported as ``x * 0.5 * (1 + erf(x / sqrt 2))`` (BERT's, at opset < 20) in
    any of its usual orders → one ``com.microsoft`` ``Gelu`` (the same function; the HTP
    runs it)."""
    g = model.graph
    cons = _consumers(g)
    producer = {o: n for n in g.node for o in n.output}
    done: list[str] = []
    drop: set[int] = set()
    for erf in [n for n in g.node if n.op_type == "Erf"]:
        scaled = producer.get(erf.input[0])
        if scaled is None or scaled.op_type not in ("Div", "Mul"):
            continue
        x, k_name = scaled.input[0], scaled.input[1]
        if scaled.op_type == "Mul" and _scalar(g, x) is not None:  # Mul(1/sqrt 2, x)
            x, k_name = k_name, x
        k = _scalar(g, k_name)
        if not (_close(k, math.sqrt(2.0)) if scaled.op_type == "Div"
                else _close(k, 1 / math.sqrt(2.0))):
            continue
        add = cons.get(erf.output[0], [])
        if len(add) != 1 or add[0].op_type != "Add" or not _close(
                _scalar(g, _other(add[0], erf.output[0])), 1.0):
            continue
        chain = _gelu_tail(g, cons, producer, x, add[0].output[0])
        if chain is None:
            continue
        if len(cons.get(scaled.output[0], [])) != 1:
            continue
        out = chain[-1].output[0]
        group = [scaled, erf, add[0], *chain]
        drop.update(id(n) for n in group)
        name = erf.name.rsplit("/", 1)[0] + "/Gelu" if "/" in erf.name else f"{erf.name}_gelu"
        g.node.insert(list(g.node).index(chain[-1]) + 1,
                      helper.make_node("Gelu", [x], [out], name=name, domain=MS_DOMAIN))
        # ONNX's shape inference does not know com.microsoft's Gelu: its output's type is
        # given here, so that calibration sees a float tensor to range (a Gemm's bias after
        # it is quantized with that range's scale)
        if not any(v.name == out for v in g.value_info):
            g.value_info.append(helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT,
                                                              None))
        done.append(erf.name)
    if done:
        keep = [n for n in g.node if id(n) not in drop]
        del g.node[:]
        g.node.extend(keep)
        if not any(o.domain == MS_DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return done


def _celu(model) -> list[str]:
    """``Celu(x, alpha)`` → ``alpha * Elu(x / alpha)`` (the same function; the HTP runs Elu)."""
    def build(n, b, const):
        alpha = next((a.f for a in n.attribute if a.name == "alpha"), 1.0)
        x, y = n.input[0], n.output[0]
        if alpha == 1.0:
            return [helper.make_node("Elu", [x], [y], alpha=1.0, name=f"{b}/Elu")]
        return [helper.make_node("Mul", [x, const("inv_alpha", 1 / alpha)], [f"{b}/scaled"],
                                 name=f"{b}/Mul"),
                helper.make_node("Elu", [f"{b}/scaled"], [f"{b}/elu"], alpha=1.0,
                                 name=f"{b}/Elu"),
                helper.make_node("Mul", [f"{b}/elu", const("alpha", alpha)], [y],
                                 name=f"{b}/Mul_1")]

    return _replace_each(model, "Celu", build)


def _replace_each(model, op_type: str, build) -> list[str]:
    """Replace every ``op_type`` node by the nodes ``build(node, base, const)`` returns
    (``const(suffix, value)`` names a new float32 scalar initializer), in place."""
    g = model.graph
    done = []
    for i, n in enumerate(list(g.node)):
        if n.op_type != op_type or n.domain not in ("", "ai.onnx"):
            continue
        base = n.name or f"{op_type.lower()}_{i}"

        def const(suffix: str, value, base=base) -> str:
            name = f"{base}/{suffix}"
            g.initializer.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
            return name

        new = build(n, base, const)
        at = list(g.node).index(n)
        g.node.remove(n)
        for k, m in enumerate(new):
            g.node.insert(at + k, m)
        done.append(n.name or base)
    return done


def _softsign(model) -> list[str]:
    """``Softsign(x)`` → ``x / (1 + |x|)``."""
    def build(n, b, const):
        x, y = n.input[0], n.output[0]
        return [helper.make_node("Abs", [x], [f"{b}/abs"], name=f"{b}/Abs"),
                helper.make_node("Add", [f"{b}/abs", const("one", 1.0)], [f"{b}/den"],
                                 name=f"{b}/Add"),
                helper.make_node("Div", [x, f"{b}/den"], [y], name=f"{b}/Div")]

    return _replace_each(model, "Softsign", build)


def _hyperbolic(op_type: str):
    """``Cosh(x)`` → ``(exp(x) + exp(-x)) / 2``; ``Sinh(x)`` → ``(exp(x) - exp(-x)) / 2``."""
    def build(n, b, const):
        x, y = n.input[0], n.output[0]
        return [helper.make_node("Exp", [x], [f"{b}/ep"], name=f"{b}/Exp"),
                helper.make_node("Neg", [x], [f"{b}/neg"], name=f"{b}/Neg"),
                helper.make_node("Exp", [f"{b}/neg"], [f"{b}/en"], name=f"{b}/Exp_1"),
                helper.make_node("Add" if op_type == "Cosh" else "Sub", [f"{b}/ep", f"{b}/en"],
                                 [f"{b}/sum"], name=f"{b}/Combine"),
                helper.make_node("Mul", [f"{b}/sum", const("half", 0.5)], [y], name=f"{b}/Mul")]

    return lambda model: _replace_each(model, op_type, build)


def _opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _reduce_via_sum(op_type: str, first: str):
    """``ReduceSumSquare`` → ``ReduceSum(x·x)``, ``ReduceL1`` → ``ReduceSum(|x|)``: the same
    axes and keepdims (ReduceSum takes its axes as an input from opset 13)."""
    def apply(model) -> list[str]:
        opset = _opset(model)

        def build(n, b, const):
            x, y = n.input[0], n.output[0]
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            pre = (helper.make_node("Mul", [x, x], [f"{b}/sq"], name=f"{b}/Mul")
                   if first == "square" else
                   helper.make_node("Abs", [x], [f"{b}/sq"], name=f"{b}/Abs"))
            inputs = [f"{b}/sq"]
            keep = {k: v for k, v in attrs.items() if k in ("keepdims", "noop_with_empty_axes")}
            if opset >= 13:
                if len(n.input) > 1 and n.input[1]:
                    inputs.append(n.input[1])  # opset 18: axes as an input already
                elif "axes" in attrs:
                    axes = f"{b}/axes"
                    model.graph.initializer.append(numpy_helper.from_array(
                        np.asarray(attrs["axes"], np.int64), axes))
                    inputs.append(axes)
                if opset < 18:
                    keep.pop("noop_with_empty_axes", None)
            elif "axes" in attrs:
                keep["axes"] = attrs["axes"]
            return [pre, helper.make_node("ReduceSum", inputs, [y], name=f"{b}/ReduceSum",
                                          **keep)]

        return _replace_each(model, op_type, build)

    return apply


#: what a mask constant becomes: exp(-100) is 0 in float32 next to any attention score,
#: and the quantized mask keeps a usable step (the LLM export masks with the same value)
MASK_VALUE = -100.0


def _huge_mask(model) -> list[str]:
    """Float constants at the float's lowest (``torch.finfo.min``, ≤ -1e30: the value an
    exported attention mask fills hidden slots with) → :data:`MASK_VALUE`. The same softmax
    in float arithmetic; quantized, a range reaching -3.4e38 leaves the mask and the scores
    added to it no resolution at all (MiniLM W8A16: embedding cosine 0.03 vs FP32)."""
    done = []
    for t in model.graph.initializer:
        if t.data_type in (1, 10, 11) and 0 < _numel(t) <= 16:
            a = numpy_helper.to_array(t)
            if (a <= -1e30).all():
                t.CopyFrom(numpy_helper.from_array(np.full_like(a, MASK_VALUE), t.name))
                done.append(t.name)
    for n in model.graph.node:
        if n.op_type != "Constant":
            continue
        for at in n.attribute:
            if at.name == "value" and at.t.data_type in (1, 10, 11) and 0 < _numel(at.t) <= 16:
                a = numpy_helper.to_array(at.t)
                if (a <= -1e30).all():
                    at.t.CopyFrom(numpy_helper.from_array(np.full_like(a, MASK_VALUE),
                                                          at.t.name))
                    done.append(n.output[0])
    return done


def _numel(t) -> int:
    n = 1
    for d in t.dims:
        n *= int(d)
    return n


CATALOGUE: tuple[Rewrite, ...] = (
    Rewrite("erf-gelu", "Erf", "exact GELU built from Erf (x·½·(1 + erf(x/√2))) → one Gelu op",
            _erf_gelu),
    Rewrite("celu", "Celu", "Celu(x, α) → α·Elu(x/α)", _celu),
    Rewrite("softsign", "Softsign", "Softsign(x) → x / (1 + |x|)", _softsign),
    Rewrite("cosh", "Cosh", "Cosh(x) → (exp(x) + exp(−x)) / 2", _hyperbolic("Cosh")),
    Rewrite("sinh", "Sinh", "Sinh(x) → (exp(x) − exp(−x)) / 2", _hyperbolic("Sinh")),
    Rewrite("reduce-sum-square", "ReduceSumSquare", "ReduceSumSquare(x) → ReduceSum(x·x)",
            _reduce_via_sum("ReduceSumSquare", "square")),
    Rewrite("reduce-l1", "ReduceL1", "ReduceL1(x) → ReduceSum(|x|)",
            _reduce_via_sum("ReduceL1", "abs")),
)
#: rewrites that make a graph quantizable rather than placeable: applied before every
#: quantization of a graph (the same function in float arithmetic, checked like the others)
PREPARE: tuple[Rewrite, ...] = (
    Rewrite("mask-min", "", f"attention-mask constants at the float's lowest → {MASK_VALUE:g} "
            "(the same softmax; quantizable)", _huge_mask),
)


def apply_rewrites(src: Path, dst: Path, names: list[str] | None = None) -> list[dict[str, Any]]:
    """Apply the catalogue's rewrites (or those named, from the catalogue or
    :data:`PREPARE`) to the float graph ``src``, writing ``dst``; returns what each did:
    ``[{"rewrite", "refused", "description", "nodes"}]`` (only those that found something)."""
    known = {r.name: r for r in (*PREPARE, *CATALOGUE)}
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        raise StudioError(f"unknown rewrite(s) {', '.join(unknown)}; the catalogue has "
                          f"{', '.join(known)}")
    open_onnx(Path(src))  # a clear line for a file that is not a valid model
    model = onnx.load(str(src))
    applied = []
    for r in (*PREPARE, *CATALOGUE):
        if (r.name not in names) if names is not None else r in PREPARE:
            continue
        nodes = r.apply(model)
        if nodes:
            applied.append({"rewrite": r.name, "refused": r.refused,
                            "description": r.description, "nodes": nodes})
    outputs = {o.name for o in model.graph.output}
    used = {x for n in model.graph.node for x in n.input} | outputs
    nodes = [n for n in model.graph.node if n.op_type != "Constant" or n.output[0] in used]
    if len(nodes) != len(model.graph.node):  # the replaced ops' Constant nodes
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    keep = [t for t in model.graph.initializer if t.name in used]
    if len(keep) != len(model.graph.initializer):  # the replaced ops' constants
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
    Path(dst).parent.mkdir(parents=True, exist_ok=True)

    if weight_bytes(model) > PROTOBUF_LIMIT:  # past one file's 2 GB: weights beside it
        save_onnx_atomic(model, Path(dst))
        onnx.checker.check_model(str(dst))  # by path: past the protobuf limit
        return applied
    onnx.checker.check_model(model)
    atomic_write_bytes(Path(dst), model.SerializeToString())
    return applied


def check_rewrite(original: Path, rewritten: Path, feeds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rewritten graph against the original on ``feeds`` (FP32, ONNX Runtime on the CPU,
    graph optimizations off so neither is refused into the other): per output the worst
    cosine and max |error| over the feeds."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    a = ort.InferenceSession(str(original), so, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(rewritten), so, providers=["CPUExecutionProvider"])
    return compare_outputs(a, b, feeds)


#: ops whose output has the shape and type of their (first) input
_ELEMENTWISE = frozenset({"Abs", "Celu", "Elu", "Erf", "Exp", "Gelu", "HardSigmoid",
                          "HardSwish", "Identity", "LeakyRelu", "Log", "Neg", "Reciprocal",
                          "Relu", "Round", "Selu", "Sigmoid", "Sign", "Softplus", "Softsign",
                          "Sqrt", "Tanh"})


def partition(onnx_path: Path, chip, fp16: bool = False) -> dict[str, Any]:
    """Where a graph runs when the CPU may take what the HTP refuses: the placement report
    (each refused node with the EP's reason) plus the NPU↔CPU transitions — tensors made on
    one side and read on the other — and the bytes they carry per inference."""
    report = qnn.placement_report(onnx_path, chip, fp16=fp16)
    model = onnx.load(str(onnx_path), load_external_data=False)
    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - sizes then unknown, the counts still hold
        typed = model
    inits_by_name = {t.name: t for t in model.graph.initializer}

    def itemsize(elem_type: int) -> int:
        return int(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)

    # tensor -> (dims, item size) where shape inference knows them
    known: dict[str, tuple[list[int], int]] = {}
    for v in (*typed.graph.value_info, *typed.graph.input, *typed.graph.output):
        t = v.type.tensor_type
        dims = [int(d.dim_value) for d in t.shape.dim]
        if t.elem_type and all(d > 0 for d in dims):
            known[v.name] = (dims, itemsize(t.elem_type))
    # Q/DQ outputs keep their input's shape (shape inference may leave them out); a
    # QuantizeLinear's output has its zero point's type, a DequantizeLinear's is float32
    for n in model.graph.node:  # (and element-wise ops keep their input's shape and type)
        if n.output and n.output[0] not in known and n.input and n.input[0] in known:
            dims, item = known[n.input[0]]
            if n.op_type == "QuantizeLinear":
                item = (itemsize(inits_by_name[n.input[2]].data_type)
                        if len(n.input) > 2 and n.input[2] in inits_by_name else 1)
            elif n.op_type == "DequantizeLinear":
                item = 4
            elif n.op_type not in _ELEMENTWISE:
                continue
            known[n.output[0]] = (dims, item)
    sizes = {name: int(np.prod(dims, dtype=np.int64)) * item
             for name, (dims, item) in known.items()}
    cpu = {n["name"] for n in report["cpu_nodes"]}
    inits = {t.name for t in model.graph.initializer}
    side = {}  # tensor -> "cpu" | "npu" (where it is made)
    for n in model.graph.node:
        for o in n.output:
            side[o] = "cpu" if n.name in cpu else "npu"
    crossings: dict[str, dict[str, Any]] = {}
    for n in model.graph.node:
        here = "cpu" if n.name in cpu else "npu"
        for x in n.input:
            if x and x not in inits and x in side and side[x] != here:
                crossings.setdefault(x, {"tensor": x, "from": side[x], "to": here,
                                         "bytes": sizes.get(x)})
    counted = [c["bytes"] for c in crossings.values() if c["bytes"] is not None]
    return {**report, "transitions": len(crossings),
            "crossings": sorted(crossings.values(), key=lambda c: c["tensor"]),
            "bytes_crossing": sum(counted) if len(counted) == len(crossings) else None}
