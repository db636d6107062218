"""Weights quantized a slice at a time, beside ONNX Runtime's quantizer.

ONNX Runtime's ``quantize_static`` loads the graph with every weight and quantizes each weight
whole, in float arithmetic with temporaries of its size: an 8 B model's head part (2.8 GiB of
FP32 weights, 2.1 GiB of them the output head) peaked at 8.98 GiB in it. Its weight scales
depend only on each weight's minimum and maximum (per tensor, or per channel along an axis),
and its integers only on those scales. So:

1. :func:`stand_in` gives the quantizer a copy of the graph whose large weights are small
   tensors with the same minimum and maximum along the quantization axis (two rows, or two
   columns) — computed here reading each weight a slice of rows at a time — and with the shapes
   the real weights give every tensor, so the quantizer sees the same graph;
2. the quantizer writes its QDQ graph as usual: the same nodes, the same scales, small integer
   tensors where the large ones go;
3. :func:`put_weights` writes each large weight's integers with those scales through the
   quantizer's own ``quantize_nparray``, a slice of rows at a time, into a file beside the
   quantized graph, and points the graph's tensor at it.

The result is the graph ONNX Runtime writes itself, byte for byte (tested on every scheme and
granularity this path takes); block-wise (LPBQ) weights, any rank but 2 and other calibration
paths stay with the quantizer's own path (:func:`streamable`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from studio.core.lazyimport import lazy_module

onnx = lazy_module("onnx")
numpy_helper = lazy_module("onnx.numpy_helper")
quant_utils = lazy_module("onnxruntime.quantization.quant_utils")

#: weights at least this large (bytes of FP32) are quantized here, a slice at a time
STREAM_ABOVE = 16 << 20

#: bytes of FP32 rows read at a time
SLICE_BYTES = 64 << 20

#: the file beside the quantized graph that holds the weights written here
WEIGHTS_FILE = "streamed-weights.bin"


class NotStreamable(Exception):
    """The quantizer wrote something this path does not reproduce: quantize the usual way."""


@dataclass(frozen=True)
class Original:
    """Where a large FP32 weight's values are, and the stand-in given for it."""
    name: str
    file: Path
    offset: int
    rows: int
    cols: int
    axis: int | None
    stand_in_dims: tuple[int, int]

    def row_slices(self, even: bool = False):
        step = max(1, SLICE_BYTES // (4 * self.cols))
        if even and self.cols % 2 and step % 2:
            step += 1  # 4-bit values pack two to a byte: every slice but the last even
        for r0 in range(0, self.rows, step):
            yield r0, min(self.rows, r0 + step)

    def read(self, r0: int, r1: int) -> np.ndarray:
        with open(self.file, "rb") as f:
            f.seek(self.offset + 4 * r0 * self.cols)
            return np.fromfile(f, dtype=np.float32, count=(r1 - r0) * self.cols).reshape(
                r1 - r0, self.cols)


def _external(init) -> dict[str, str] | None:
    if init.data_location != onnx.TensorProto.EXTERNAL:
        return None
    return {e.key: e.value for e in init.external_data}


def streamable(init, axis: int | None, block_size: int = 0) -> bool:
    """Whether a weight goes through this path: FP32 of rank 2, in external data, at least
    :data:`STREAM_ABOVE` bytes, quantized per tensor or per channel along axis 0 or 1."""
    if (init.data_type != onnx.TensorProto.FLOAT or len(init.dims) != 2 or block_size
            or axis not in (None, 0, 1, -1, -2) or _external(init) is None):
        return False
    return 4 * init.dims[0] * init.dims[1] >= STREAM_ABOVE


def stand_in(model_path: Path, overrides: dict[str, list[dict]], block_size: int = 0
             ) -> tuple[Path, dict[str, Original]]:
    """Write beside ``model_path`` the graph the quantizer is given: the shapes inferred on the
    real graph, and every :func:`streamable` weight replaced by its stand-in (row 0 the
    minimum, row 1 the maximum of each column; for axis 0 the columns hold each row's).
    ``overrides``: the quantizer's ``TensorQuantOverrides``, whose first entry's ``axis`` is a
    weight's per-channel axis (none: per tensor). Returns the graph and the weights replaced
    (empty: nothing to do, quantize the usual way)."""
    model_path = Path(model_path)
    inferred = model_path.with_name(model_path.stem + "-shapes.onnx")
    onnx.shape_inference.infer_shapes_path(str(model_path), str(inferred))
    try:
        model = onnx.load(str(inferred), load_external_data=False)
    finally:
        inferred.unlink(missing_ok=True)
    originals: dict[str, Original] = {}
    for init in model.graph.initializer:
        axis = (overrides.get(init.name) or [{}])[0].get("axis")
        if not streamable(init, axis, block_size):
            continue
        axis = None if axis is None else axis % 2
        ext = _external(init) or {}  # streamable: in external data
        rows, cols = int(init.dims[0]), int(init.dims[1])
        orig = Original(init.name, model_path.parent / ext["location"],
                        int(ext.get("offset", 0)), rows, cols, axis,
                        (rows, 2) if axis == 0 else (2, cols))
        if axis == 0:
            lo, hi = np.empty(rows, np.float32), np.empty(rows, np.float32)
            for r0, r1 in orig.row_slices():
                part = orig.read(r0, r1)
                lo[r0:r1], hi[r0:r1] = part.min(axis=1), part.max(axis=1)
            values = np.stack([lo, hi], axis=1)
        else:
            lo, hi = np.full(cols, np.inf, np.float32), np.full(cols, -np.inf, np.float32)
            for r0, r1 in orig.row_slices():
                part = orig.read(r0, r1)
                np.minimum(lo, part.min(axis=0), out=lo)
                np.maximum(hi, part.max(axis=0), out=hi)
            values = np.stack([lo, hi], axis=0)
        init.CopyFrom(numpy_helper.from_array(values, init.name))
        originals[init.name] = orig
    if not originals:
        return model_path, {}
    out = model_path.with_name(model_path.stem + "-stand-in.onnx")
    onnx.save(model, str(out))  # the other weights stay in the files they point into
    return out, originals


def _pack4(q: np.ndarray) -> np.ndarray:
    """Two 4-bit values to a byte, the first in the low half (the quantizer's
    ``pack_bytes_to_4bit``, without its Python loop)."""
    b = q.reshape(-1).view(np.uint8) & 0xF
    if b.size % 2:
        b = np.append(b, np.uint8(0))
    return (b[0::2] | (b[1::2] << 4)).astype(np.uint8)


def put_weights(out: Path, originals: dict[str, Original]) -> None:
    """Replace, in the quantized graph ``out``, each stand-in's integers by the real weight's,
    quantized with the scales the quantizer chose, a slice of rows at a time (and a weight
    the quantizer left in float by its real values). Raises :class:`NotStreamable` when the
    graph holds a stand-in this does not recognise."""
    out = Path(out)
    model = onnx.load(str(out))
    inits = {t.name: t for t in model.graph.initializer}
    dq = {n.input[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    data = out.with_name(WEIGHTS_FILE)
    with open(data, "wb") as f:
        w = _WeightFile(f, data.name)
        for name, orig in originals.items():
            qname = name + quant_utils.TENSOR_NAME_QUANT_SUFFIX
            if name in inits:  # left in float by the quantizer (an excluded node)
                w.write_float(inits[name], orig)
            if qname not in inits:
                continue
            t, node = inits[qname], dq.get(qname)
            if node is None or len(node.input) < 3 or any(
                    a.name == "block_size" and a.i for a in node.attribute):
                raise NotStreamable(f"{qname}: not read by a per-tensor or per-channel "
                                    "DequantizeLinear")
            w.write_quantized(t, node, orig, inits, qname)
    for name, orig in originals.items():
        for t in model.graph.initializer:
            if (t.name not in w.done and t.name.startswith(name)
                    and tuple(t.dims) == orig.stand_in_dims):
                raise NotStreamable(f"{t.name}: a stand-in the quantizer copied")
    onnx.save(model, str(out))


class _WeightFile:
    """The graph's new weight file, written in order: each initializer pointed at its bytes
    there (``done``: the initializers written)."""

    def __init__(self, f, name: str) -> None:
        self.f, self.name = f, name
        self.done: set[str] = set()

    def external(self, t, dims, data_type) -> int:
        """``t`` made an external initializer of ``dims`` and ``data_type``; where its bytes
        start."""
        offset = self.f.tell()
        t.ClearField("raw_data")
        for field in ("float_data", "int32_data", "int64_data"):
            t.ClearField(field)
        del t.dims[:]
        t.dims.extend(dims)
        t.data_type = data_type
        t.data_location = onnx.TensorProto.EXTERNAL
        del t.external_data[:]
        return offset

    def point(self, t, offset: int) -> None:
        for k, v in (("location", self.name), ("offset", str(offset)),
                     ("length", str(self.f.tell() - offset))):
            e = t.external_data.add()
            e.key, e.value = k, v
        self.done.add(t.name)

    def write_float(self, t, orig: Original) -> None:
        """A weight the quantizer left in float, by its real values."""
        offset = self.external(t, (orig.rows, orig.cols), onnx.TensorProto.FLOAT)
        for r0, r1 in orig.row_slices():
            self.f.write(orig.read(r0, r1).tobytes())
        self.point(t, offset)

    def write_quantized(self, t, node, orig: Original, inits: dict, qname: str) -> None:
        """The real weight quantized with the scales the quantizer chose (its
        DequantizeLinear ``node``'s), a slice of rows at a time."""
        qtype = t.data_type
        scale = numpy_helper.to_array(inits[node.input[1]])
        zp = np.asarray(numpy_helper.to_array(inits[node.input[2]])).astype(
            quant_utils.ONNX_TYPE_TO_NP_TYPE[qtype])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % 2
        if scale.size == 1:
            scale, zp = scale.reshape(()), zp.reshape(())
        elif (orig.axis is None or axis != orig.axis
              or scale.size != (orig.rows if axis == 0 else orig.cols)):
            raise NotStreamable(f"{qname}: its scales do not match the stand-in's axis")
        four = qtype in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)
        offset = self.external(t, (orig.rows, orig.cols), qtype)
        for r0, r1 in orig.row_slices(even=four):
            if scale.ndim == 0:
                s, z = scale, zp
            elif axis == 1:
                s, z = scale.reshape(1, -1), zp.reshape(1, -1)
            else:
                s, z = scale[r0:r1].reshape(-1, 1), zp[r0:r1].reshape(-1, 1)
            q = quant_utils.quantize_nparray(qtype, orig.read(r0, r1), s, z)
            self.f.write((_pack4(q) if four else
                          np.asarray(q, dtype=onnx.helper.tensor_dtype_to_np_dtype(qtype))
                          ).tobytes())
        self.point(t, offset)
