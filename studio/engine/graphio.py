"""Quantized graph I/O: the HTP graphs take and give their edge tensors as the integers the
NPU computes with, not as floats it converts at every edge of every pass.

A QDQ graph from the quantizer takes a float at each input and quantizes it at once
(``input -> QuantizeLinear -> DequantizeLinear -> consumers``) and gives each output through
a final pair (``... -> QuantizeLinear -> DequantizeLinear -> output``). On the HTP the first
``QuantizeLinear`` and the last ``DequantizeLinear`` are real work: the whole KV cache is
converted on the way in and the new rows and the logits on the way out, every token. Here
that edge pair is cut: the input becomes the ``QuantizeLinear``'s integer type and feeds its
``DequantizeLinear`` directly; the output is the ``QuantizeLinear``'s integer result.
Nothing inside the graph changes, so the graph computes what it computed on the integers the
host now hands it.

What the host does instead (:class:`EncodedSession`, wrapped around each compiled graph's
session): it quantizes a float it feeds (the attention masks) with the input's encoding,
passes integers through (the KV cache rows, the residual stream between parts: the host
keeps them as the graph gives them, half the bytes of float32 at 16 bits) and dequantizes
the logits, one row of V values.

For integers to be copied unchanged, both ends of each such edge carry one encoding:

- **the KV cache** — each ``past_*`` input and the ``present_*`` rows of every graph of a
  part (prefill, decode) take one encoding per cache tensor, the union of the ranges the
  quantizer calibrated for them (:func:`unify_cache`);
- **the residual stream between parts** — the taking part's input takes the handing part's
  output encoding (as Genie's bundle does).

An edge that is not a per-tensor pair (an INT8 KV cache is already uint8; ids are integers)
is left as it is. ``io_encodings.json`` beside the compiled graphs records every encoding.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_bytes, atomic_write_json
from studio.core.lazyimport import lazy_module
from studio.core.parts import hidden_name
from studio.engine.kvquant import topological_order

onnx = lazy_module("onnx")
helper = lazy_module("onnx.helper")
numpy_helper = lazy_module("onnx.numpy_helper")

IO_ENCODINGS_FILE = "io_encodings.json"
#: the outputs the host reads as floats (the wrapper dequantizes them); every other
#: quantized output (cache rows, hand-offs) stays integer on the host
FLOAT_OUTPUTS = ("logits",)
HANDOFF = hidden_name(0).removesuffix("0")

_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127),
           np.dtype(np.uint16): (0, 65535), np.dtype(np.int16): (-32768, 32767)}


def _cache_key(name: str) -> str | None:
    """``key_3`` for ``past_key_3`` / ``present_key_3``; None for any other tensor."""
    for prefix in ("past_", "present_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return None


class _Graph:
    """One graph's edge pairs: the input ``QuantizeLinear``s and output ``DequantizeLinear``s
    that can be cut, and their encodings."""

    def __init__(self, model) -> None:
        self.model, g = model, model.graph
        self.inits = {i.name: i for i in g.initializer}
        self.consumers: dict[str, list] = {}
        self.producer: dict[str, Any] = {}
        for n in g.node:
            for t in n.input:
                self.consumers.setdefault(t, []).append(n)
            for t in n.output:
                self.producer[t] = n
        self.in_q: dict[str, list] = {}  # float input -> its QuantizeLinear(s)
        self.out_pair: dict[str, tuple[Any, Any]] = {}  # output -> (Q, DQ)
        for inp in g.input:
            if inp.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
                continue
            users = self.consumers.get(inp.name, [])
            if users and all(u.op_type == "QuantizeLinear" and self._scalar(u) for u in users) \
                    and len({self._key(u) for u in users}) == 1:
                self.in_q[inp.name] = users
        for out in g.output:
            if out.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
                continue
            dq = self.producer.get(out.name)
            if dq is None or dq.op_type != "DequantizeLinear" or not self._scalar(dq):
                continue
            q = self.producer.get(dq.input[0])
            if q is None or q.op_type != "QuantizeLinear" or self._key(q) != self._key(dq) \
                    or len(self.consumers.get(q.output[0], [])) != 1:
                continue
            self.out_pair[out.name] = (q, dq)

    def _scalar(self, node) -> bool:
        if len(node.input) < 3 or not all(x in self.inits for x in node.input[1:3]):
            return False
        return all(len(self.inits[x].dims) == 0 or int(np.prod(self.inits[x].dims)) == 1
                   for x in node.input[1:3]) and \
            not any(a.name == "block_size" for a in node.attribute)

    def _key(self, node) -> tuple:
        s, z = (self._np_value(x) for x in node.input[1:3])
        return float(s), int(z), z.dtype.str

    def _np_value(self, name: str):
        return numpy_helper.to_array(self.inits[name]).reshape(())

    def encoding(self, name: str) -> dict[str, Any]:
        """The encoding of the edge pair of ``name`` (an input or output found above)."""
        node = self.in_q[name][0] if name in self.in_q else self.out_pair[name][0]
        s, z = (self._np_value(x) for x in node.input[1:3])
        return {"dtype": str(z.dtype), "scale": float(s), "zero_point": int(z)}

    def set_encoding(self, name: str, enc: dict[str, Any]) -> None:
        """Point the edge pair of ``name`` at constants of its own holding ``enc``."""
        s_name, z_name = f"{name}_io_scale", f"{name}_io_zero_point"
        for k, v in ((s_name, np.float32(enc["scale"])),
                     (z_name, np.asarray(enc["zero_point"], dtype=enc["dtype"]))):
            t = numpy_helper.from_array(np.asarray(v), k)
            if k in self.inits:
                self.inits[k].CopyFrom(t)
            else:
                self.model.graph.initializer.append(t)
                self.inits[k] = self.model.graph.initializer[-1]
        if name in self.in_q:
            nodes = [*self.in_q[name],
                     *(d for q in self.in_q[name] for d in self.consumers.get(q.output[0], []))]
        else:
            q, dq = self.out_pair[name]
            nodes = [q, *self.consumers.get(q.output[0], [])]
        for n in nodes:
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
                raise StudioError(f"{name}: its QuantizeLinear feeds {n.op_type}, not a "
                                  "DequantizeLinear; this graph's edge is not a Q/DQ pair")
            n.input[1], n.input[2] = s_name, z_name

    def cut(self) -> dict[str, dict[str, Any]]:
        """Cut every edge pair found; the encodings of the tensors now integer."""
        g = self.model.graph
        encodings: dict[str, dict[str, Any]] = {}
        drop: list = []
        for inp in g.input:
            if inp.name not in self.in_q:
                continue
            enc = encodings[inp.name] = self.encoding(inp.name)
            for q in self.in_q[inp.name]:
                for dq in self.consumers.get(q.output[0], []):
                    dq.input[0] = inp.name
                drop.append(q)
            inp.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(
                np.dtype(enc["dtype"]))
        for out in g.output:
            if out.name not in self.out_pair:
                continue
            enc = encodings[out.name] = self.encoding(out.name)
            q, dq = self.out_pair[out.name]
            inside = list(self.consumers.get(out.name, []))
            drop.append(dq)
            q.output[0] = out.name
            if inside:  # consumers inside the graph keep reading the float through a DQ
                mid = f"{out.name}_io_dq"
                for n in inside:
                    for j, t in enumerate(n.input):
                        if t == out.name:
                            n.input[j] = mid
                g.node.append(helper.make_node("DequantizeLinear",
                                               [out.name, dq.input[1], dq.input[2]], [mid],
                                               name=f"{out.name}_io_DQ"))
            out.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(
                np.dtype(enc["dtype"]))
        kept = [n for n in g.node if not any(n is d for d in drop)]

        ordered = topological_order(kept, {i.name for i in g.input} | set(self.inits))
        del g.node[:]
        g.node.extend(ordered)
        del g.value_info[:]
        return encodings


def union(encodings: list[dict[str, Any]]) -> dict[str, Any]:
    """One encoding of the same integer type covering every range in ``encodings``."""
    dtypes = {e["dtype"] for e in encodings}
    if len(dtypes) != 1:
        raise StudioError(f"one edge is quantized as {' and '.join(sorted(dtypes))} in different "
                          "graphs; quantize them with the same activation bits")
    dt = np.dtype(dtypes.pop())
    qmin, qmax = _RANGES[dt]
    lo = min(e["scale"] * (qmin - e["zero_point"]) for e in encodings)
    hi = max(e["scale"] * (qmax - e["zero_point"]) for e in encodings)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / (qmax - qmin) or 1.0
    zero = int(np.clip(round(qmin - lo / scale), qmin, qmax))
    return {"dtype": str(dt), "scale": float(scale), "zero_point": zero}


def unify_cache(graphs: dict[str, _Graph]) -> dict[str, dict[str, Any]]:
    """Give each cache tensor's edges in every graph one encoding (the union of theirs)."""
    edges: dict[str, list[tuple[_Graph, str]]] = {}
    for gr in graphs.values():
        for name in [*gr.in_q, *gr.out_pair]:
            key = _cache_key(name)
            if key is not None:
                edges.setdefault(key, []).append((gr, name))
    out = {}
    for key, where in edges.items():
        enc = out[key] = union([gr.encoding(name) for gr, name in where])
        for gr, name in where:
            gr.set_encoding(name, enc)
    return out


def cache_encodings(path: Path) -> dict[str, dict[str, Any]]:
    """The one encoding per cache tensor (``key_0``, ``value_0``, ...) of the QDQ graph at
    ``path``: the union of its ``past_*`` input and ``present_*`` rows' ranges."""
    gr = _Graph(onnx.load(str(path), load_external_data=False))
    return unify_cache({"graph": gr})


def set_cache_encodings(model, encodings: dict[str, dict[str, Any]]) -> int:
    """Point the cache edges of ``model`` (a QDQ ModelProto, edited in place) at
    ``encodings`` (:func:`cache_encodings`); the number of edges set."""
    gr = _Graph(model)
    done = 0
    for name in [*gr.in_q, *gr.out_pair]:
        key = _cache_key(name)
        if key is not None and key in encodings:
            gr.set_encoding(name, encodings[key])
            done += 1
    return done


def quantize_io(src_dir: Path, dst_dir: Path, graphs: tuple[str, ...],
                handoff_in: dict[str, dict[str, dict]] | None = None) -> dict[str, Any]:
    """Write ``graphs`` of ``src_dir`` (one part's, or a model's) with quantized I/O into
    ``dst_dir`` and its ``io_encodings.json``; their external weights are linked, not copied.
    ``handoff_in`` ({graph: {tensor: encoding}}) gives the residual stream a part takes the
    encoding of the part that hands it. Returns ``{"graphs": {graph: {tensor: encoding}},
    "handoff_out": {graph: {tensor: encoding}}}``."""
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    loaded: dict[str, _Graph] = {}
    for g in graphs:
        path = src_dir / f"{g}.onnx"
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # noqa: BLE001 - any parse failure is a corrupt file
            raise StudioError(f"cannot read {path} ({exc}); re-run the quantize stage") from None
        loaded[g] = _Graph(model)
    if not any(gr.in_q or gr.out_pair for gr in loaded.values()):
        raise StudioError(f"the graphs in {src_dir} have no quantized edge to take as integers "
                          "(a float graph): htp.graph_io = \"quantized\" needs a quantized "
                          "scheme (W8A16, W4A16, W8A8)")
    unify_cache(loaded)
    handoff_out: dict[str, dict[str, dict]] = {}
    for g, gr in loaded.items():
        for name, enc in (handoff_in or {}).get(g, {}).items():
            if name in gr.in_q:
                gr.set_encoding(name, enc)
        handoff_out[g] = {n: gr.encoding(n) for n in gr.out_pair if n.startswith(HANDOFF)}
    encodings = {}
    for g, gr in loaded.items():
        encodings[g] = gr.cut()
        onnx.checker.check_model(gr.model)
        atomic_write_bytes(dst_dir / f"{g}.onnx", gr.model.SerializeToString())
    # the rest of the folder (graph.json, the external weights the graphs name by location),
    # linked: a graph folder of its own; other graphs are left out (their I/O is float)
    for f in src_dir.iterdir():
        if f.is_file() and f.suffix != ".onnx" and f.name != IO_ENCODINGS_FILE \
                and not (dst_dir / f.name).exists():
            try:
                os.link(f, dst_dir / f.name)
            except OSError:
                shutil.copy2(f, dst_dir / f.name)
    atomic_write_json(dst_dir / IO_ENCODINGS_FILE, {"graphs": encodings})
    return {"graphs": encodings, "handoff_out": handoff_out}


def read_encodings(folder: Path, graph: str) -> dict[str, dict[str, Any]]:
    """The quantized I/O of ``graph`` compiled in ``folder`` ({} for float I/O)."""
    path = Path(folder) / IO_ENCODINGS_FILE
    if not path.is_file():
        return {}
    try:
        return dict(json.loads(path.read_text())["graphs"].get(graph, {}))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StudioError(f"{path} is unreadable ({exc}); re-run the compile stage") from None


def quantize(value, enc: dict[str, Any]):
    dt = np.dtype(enc["dtype"])
    qmin, qmax = _RANGES[dt]
    q = np.rint(np.asarray(value, np.float32) / np.float32(enc["scale"])) + enc["zero_point"]
    return np.clip(q, qmin, qmax).astype(dt)


def dequantize(value, enc: dict[str, Any]):
    return ((np.asarray(value).astype(np.float32) - np.float32(enc["zero_point"]))
            * np.float32(enc["scale"]))


class EncodedSession:
    """A session of a graph with quantized I/O, as the host uses it: a float fed to an
    integer input is quantized with its encoding (an integer passes as it is: the cache and
    the residual stream the graphs hand each other); the logits come back dequantized, other
    integer outputs as they are (``all_float``: every output dequantized, for a comparison
    that reads hand-offs and cache rows as values). ``get_inputs`` gives the graph's own
    types."""

    def __init__(self, session, encodings: dict[str, dict[str, Any]], all_float: bool = False):
        self.session, self.io_encodings = session, dict(encodings)
        self.all_float = all_float

    def get_inputs(self):
        return self.session.get_inputs()

    def get_outputs(self):
        return self.session.get_outputs()

    def __getattr__(self, name: str):
        return getattr(self.session, name)

    def run(self, output_names, feeds, run_options=None):
        enc = self.io_encodings
        fed = {k: (quantize(v, enc[k]) if k in enc and np.asarray(v).dtype.kind == "f" else v)
               for k, v in feeds.items()}
        names = output_names or [o.name for o in self.session.get_outputs()]
        got = self.session.run(names, fed, run_options)
        return [dequantize(v, enc[n]) if n in enc and (self.all_float or n in FLOAT_OUTPUTS)
                else v
                for n, v in zip(names, got, strict=True)]


def as_floats(session):
    """``session`` giving every output as floats (a runner that keeps a float32 cache and
    residual stream: it hands them back as floats, which the session quantizes again)."""
    if isinstance(session, EncodedSession):
        return EncodedSession(session.session, session.io_encodings, all_float=True)
    return session


def encoded(session, folder: Path, graph: str, all_float: bool = False):
    """``session`` wrapped for the quantized I/O recorded in ``folder`` (itself when none)."""
    enc = read_encodings(folder, graph)
    return EncodedSession(session, enc, all_float) if enc else session
