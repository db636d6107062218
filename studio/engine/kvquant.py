"""INT8 KV cache: the static-KV graphs with 8-bit cache I/O.

Each ``past_key_{i}`` / ``past_value_{i}`` input becomes uint8 followed by a per-head
``DequantizeLinear`` (axis 1 of ``[1, KV, C, D]``), and each ``present_*`` output is written
through a ``QuantizeLinear`` with the same scales, so the host copies uint8 rows straight into
a cache a quarter of the FP32 one (half of a 16-bit one) and nothing re-quantizes the whole
cache at the graph edge every step.

In a QDQ (quantized) graph the edge already holds a Q/DQ pair per cache tensor (float input
-> Q(16-bit) -> DQ -> consumers): the pair is replaced, not stacked: the uint8 input feeds the
consumers' DequantizeLinear with the 8-bit scales, and the producer of a ``present`` output
is quantized to uint8 directly. What is left of Q/DQ at the edge is one 8-bit DQ per cache
input and one Q per new row.

Scales are symmetric (zero point 128) per layer, tensor (key / value) and KV head, from the
max |x| of the FP32 cache over calibration text (:func:`calibrate_kv_scales`). The QNN EP
refuses a standalone Q or DQ with per-channel (per-axis) quantization ("QNN EP does not
support a standalone Q op with per-channel quantization"), so graphs for the HTP take one
scale per layer and tensor (``per_head=False``: the largest of its heads); the host CPU
takes the per-head ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_bytes, atomic_write_json
from studio.core.lazyimport import lazy_module

onnx = lazy_module("onnx")
helper = lazy_module("onnx.helper")
numpy_helper = lazy_module("onnx.numpy_helper")

ZERO_POINT = 128
KV_SCALES_FILE = "kv_scales.json"


def calibrate_kv_scales(gen, ids: list[int]) -> dict[str, list[float]]:
    """Per-head scales ``{"past_key_0": [s_h, ...], ...}`` from the FP32 cache ``gen`` holds
    after teacher-forcing ``ids`` (at most C tokens): max |x| over positions and head_dim / 127."""
    n = min(len(ids), gen.context_len)
    if n < 2:
        raise StudioError("INT8 KV calibration needs at least 2 tokens of calibration text")
    gen.teacher_forced_logits(ids[:n])
    scales: dict[str, list[float]] = {}
    for i, (k, v) in enumerate(gen.cache):
        for name, arr in ((f"past_key_{i}", k), (f"past_value_{i}", v)):
            if arr.dtype != np.float32:
                raise StudioError("INT8 KV scales come from the FP32 export's cache, "
                                  f"not a {arr.dtype} one")
            amax = np.abs(arr[0, :, :n, :]).max(axis=(1, 2)).astype(np.float64)
            scales[name] = [float(max(a, 1e-6) / 127.0) for a in amax]
    return scales


def kv_bytes(spec: dict, bits: int) -> int:
    """Bytes of the whole static cache by formula: 2 (K and V) x layers x KV heads x C x
    head_dim x bits / 8."""
    return (2 * int(spec["num_layers"]) * int(spec["num_kv_heads"]) * int(spec["context_length"])
            * int(spec["head_dim"]) * bits // 8)


def _const(name: str, values, dtype) -> Any:
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def _redirect(nodes, old: str, new: str) -> None:
    for n in nodes:
        for j, t in enumerate(n.input):
            if t == old:
                n.input[j] = new


def topological_order(nodes: list, available: set[str]) -> list:
    """``nodes`` in an order where every input is produced before it is read."""
    have = set(available) | {""}
    out: list = []
    todo = list(nodes)
    while todo:
        rest = []
        for n in todo:
            if all(t in have for t in n.input):
                out.append(n)
                have.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(todo):
            names = ", ".join(n.name for n in rest[:3])
            raise StudioError(f"INT8 KV edit left a cycle or a dangling input at {names}")
        todo = rest
    return out


def per_tensor(scales: dict[str, list[float]]) -> dict[str, list[float]]:
    """One scale per layer and tensor: the largest of its heads' (what the HTP accepts)."""
    return {k: [max(v)] for k, v in scales.items()}


#: ops that only move values: their output can keep the input's 8-bit scale exactly
_MOVES = {"Concat", "Unsqueeze", "Squeeze", "Expand", "Reshape", "Transpose", "Slice",
          "Identity", "Flatten"}


def _carry_8bit(consumers: dict[str, list], seeds: dict[str, tuple[str, str]]) -> int:
    """In a QDQ graph, keep the cache 8-bit through the ops that only move it (the concat
    with the new row, the GQA repeat, the transpose) up to the attention MatMuls, which take
    8-bit K and V beside 16-bit activations: each such op's output Q/DQ pair takes the
    cache's 8-bit scale instead of a 16-bit one, so the HTP never widens the whole cache.
    Returns the number of pairs changed."""
    changed = 0
    todo = list(seeds)
    while todo:
        t = todo.pop()
        scale = seeds[t]
        for n in consumers.get(t, []):
            if n.op_type not in _MOVES or not n.output:
                continue
            data = list(n.input) if n.op_type == "Concat" else [n.input[0]]
            if any(seeds.get(x) != scale for x in data):
                continue  # a concat with a tensor of another scale stays as it is
            qs = consumers.get(n.output[0], [])
            if len(qs) != 1 or qs[0].op_type != "QuantizeLinear":
                continue
            dqs = consumers.get(qs[0].output[0], [])
            if not dqs or any(d.op_type != "DequantizeLinear" for d in dqs):
                continue
            for node in (qs[0], *dqs):
                node.input[1], node.input[2] = scale
            changed += 1
            for d in dqs:
                if d.output[0] not in seeds:
                    seeds[d.output[0]] = scale
                    todo.append(d.output[0])
    return changed


def int8_kv_model(model, scales: dict[str, list[float]]):
    """Return ``model`` (an ONNX ModelProto, float or QDQ; edited in place) with uint8 cache
    I/O. ``scales`` names the ``past_*`` inputs; ``present_*`` outputs take the scales of
    the same layer and tensor. A list of one scale is per tensor (no ``axis``)."""
    g = model.graph
    edit = _KV8Edit(g)
    done = 0
    for inp in g.input:
        if inp.name in scales:
            edit.cache_input(inp, scales[inp.name])
            done += 1
    for out in g.output:
        if not out.name.startswith("present_"):
            continue
        key = "past_" + out.name[len("present_"):]
        if key in scales:
            edit.cache_output(out, key, scales[key])
            done += 1
    if not done:
        raise StudioError("the graph has no past_* / present_* cache tensors to make INT8")
    if edit.seeds:
        _carry_8bit(edit.consumers, edit.seeds)
    kept = [n for n in g.node if not any(n is d for d in edit.drop)]
    ordered = topological_order([*edit.new_nodes, *kept],
                                {i.name for i in g.input} | set(edit.inits))
    del g.node[:]
    g.node.extend(ordered)
    del g.value_info[:]
    onnx.checker.check_model(model)
    return model


class _KV8Edit:
    """:func:`int8_kv_model`'s edit of one graph: who reads and makes each tensor, the
    nodes to drop and to add, and the 8-bit DequantizeLinear outputs of a QDQ graph (with
    their scale) whose readers take 8 bits too."""

    def __init__(self, g) -> None:
        self.g = g
        self.consumers: dict[str, list] = {}
        self.producer: dict[str, Any] = {}
        for node in g.node:
            for t in node.input:
                self.consumers.setdefault(t, []).append(node)
            for t in node.output:
                self.producer[t] = node
        self.inits = {i.name: i for i in g.initializer}
        self.drop: list = []
        self.new_nodes: list = []
        self.seeds: dict[str, tuple[str, str]] = {}  # 8-bit DQ outputs -> their scale

    def add_scale(self, stem: str, values: list[float]) -> tuple[str, str]:
        g, inits = self.g, self.inits
        s_name, z_name = f"{stem}_kv8_scale", f"{stem}_kv8_zero_point"
        if s_name not in inits:
            one = len(values) == 1  # per tensor: scalar scale and zero point
            g.initializer.extend([
                _const(s_name, values[0] if one else values, np.float32),
                _const(z_name, ZERO_POINT if one else [ZERO_POINT] * len(values), np.uint8)])
            inits[s_name] = g.initializer[-2]
            inits[z_name] = g.initializer[-1]
        return s_name, z_name

    def cache_input(self, inp, values: list[float]) -> None:
        """A ``past_*`` input made uint8: its QDQ edge's DequantizeLinears read it directly,
        or (a float graph) a DequantizeLinear is added before its readers."""
        if inp.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
            raise StudioError(f"graph input {inp.name} is not float; is this graph already INT8 KV?")
        s_name, z_name = self.add_scale(inp.name, values)
        axis: dict[str, Any] = {"axis": 1} if len(values) > 1 else {}
        users = self.consumers.get(inp.name, [])
        qs = [n for n in users if n.op_type == "QuantizeLinear"]
        if users and len(qs) == len(users):  # QDQ edge: input -> Q -> DQ(s) -> consumers
            for q in qs:
                for dq in self.consumers.get(q.output[0], []):
                    if dq.op_type != "DequantizeLinear":
                        raise StudioError(f"{inp.name}: a QuantizeLinear at the edge feeds "
                                          f"{dq.op_type}, not a DequantizeLinear")
                    del dq.input[:]
                    dq.input.extend([inp.name, s_name, z_name])
                    self.seeds[dq.output[0]] = (s_name, z_name)
                    if axis:
                        dq.attribute.append(helper.make_attribute("axis", 1))
                self.drop.append(q)
        else:
            dq_out = f"{inp.name}_kv8_dq"
            _redirect(users, inp.name, dq_out)
            self.new_nodes.append(helper.make_node(
                "DequantizeLinear", [inp.name, s_name, z_name], [dq_out],
                name=f"{inp.name}_kv8_DQ", **axis))
        inp.type.tensor_type.elem_type = onnx.TensorProto.UINT8

    def cache_output(self, out, key: str, values: list[float]) -> None:
        """A ``present_*`` output made uint8 with its ``past_*`` input's scales: quantized
        from the float its 16-bit QDQ pair wraps (its readers in the graph reading the 8-bit
        value), or from the output itself in a float graph."""
        producer, consumers = self.producer, self.consumers
        s_name, z_name = self.add_scale(key, values)
        axis: dict[str, Any] = {"axis": 1} if len(values) > 1 else {}
        src = producer.get(out.name)
        internal = [n for n in consumers.get(out.name, [])
                    if not any(n is d for d in self.drop)]
        x = None
        if src is not None and src.op_type == "DequantizeLinear":
            q = producer.get(src.input[0])
            if q is not None and q.op_type == "QuantizeLinear" and \
                    len(consumers.get(src.input[0], [])) == 1:
                x = q.input[0]  # the float the 16-bit QDQ pair wraps
                self.drop.append(src)
                if len(consumers.get(q.output[0], [])) == 1:
                    self.drop.append(q)
                if internal:  # layers that read the new row read its 8-bit value too
                    dq_out = f"{out.name}_kv8_dq"
                    self.seeds[dq_out] = (s_name, z_name)
                    _redirect(internal, out.name, dq_out)
                    self.new_nodes.append(helper.make_node(
                        "DequantizeLinear", [out.name, s_name, z_name], [dq_out],
                        name=f"{out.name}_kv8_DQ", **axis))
        if x is None:  # float graph (or a DQ shared elsewhere): quantize the output itself
            x = f"{out.name}_kv8_float"
            src_node = producer[out.name]
            for j, t in enumerate(src_node.output):
                if t == out.name:
                    src_node.output[j] = x
            _redirect(internal, out.name, x)
        self.new_nodes.append(helper.make_node("QuantizeLinear", [x, s_name, z_name],
                                               [out.name], name=f"{out.name}_kv8_Q", **axis))
        out.type.tensor_type.elem_type = onnx.TensorProto.UINT8


def write_int8_kv_graphs(src_dir: Path, out_dir: Path, scales: dict[str, list[float]],
                         graphs: tuple[str, ...] = ("prefill", "decode", "verify"),
                         per_head: bool = True) -> list[str]:
    """Write INT8-KV copies of the graphs of ``src_dir`` that exist into ``out_dir`` (atomic
    per file), with ``kv_scales.json``; ``per_head=False`` for graphs bound for the HTP.
    Returns the graphs written."""
    if not per_head:
        scales = per_tensor(scales)

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in graphs:
        src = src_dir / f"{name}.onnx"
        if not src.is_file():
            continue
        try:
            model = onnx.load(str(src))
        except Exception as exc:  # noqa: BLE001 - any parse failure is a corrupt file
            raise StudioError(f"cannot read {src} ({exc}); re-run the stage that wrote it") from None
        int8_kv_model(model, scales)
        atomic_write_bytes(out_dir / f"{name}.onnx", model.SerializeToString())
        written.append(name)
    if "decode" not in written:
        raise StudioError(f"{src_dir} has no decode.onnx to make INT8 KV")
    atomic_write_json(out_dir / KV_SCALES_FILE, {
        "zero_point": ZERO_POINT, "granularity": "per_head" if per_head else "per_tensor",
        "axis": 1 if per_head else None, "scales": scales})
    return written
