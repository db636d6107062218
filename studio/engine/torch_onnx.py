"""Writing a traced torch model's weights into its ONNX file without holding them twice:
the exporter's initializer table kept while it traces without parameters
(:func:`initializers_kept`), then written a tensor at a time as external data
(:func:`write_initializers`), the output head's Transpose folded into its weight."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module

onnx = lazy_module("onnx")
helper = lazy_module("onnx.helper")
torch = lazy_module("torch")

#: the graph input a traced output head's weight comes in by; its Transpose is folded into
#: the initializer ``lm_head.weight`` (stored [in, out], as the exporter folds it)
HEAD_INPUT = "lm_head.weight.untransposed"


@contextlib.contextmanager
def initializers_kept() -> Iterator[dict[str, Any]]:
    """The initializers torch's TorchScript exporter gives the graph (the parameters and the
    constants it folded), by name, kept while ``torch.onnx.export(..., export_params=False)``
    runs. Serializing them inside the exporter held about three more copies of a part's
    weights (measured: 0.63 GiB of weights traced at a 2.74 GiB peak, 1.05 GiB without them);
    :func:`write_initializers` writes them to the file one tensor at a time instead. (The
    exporter's initializer table is not public: this keeps the table its de-duplication
    step returns, the one it would serialize.)"""
    kept: dict[str, Any] = {}
    real = torch._C._jit_pass_onnx_deduplicate_initializers

    def keep(graph, params, training):
        out = real(graph, params, training)
        kept.clear()
        kept.update(out)
        return out

    torch._C._jit_pass_onnx_deduplicate_initializers = keep
    try:
        yield kept
    finally:
        torch._C._jit_pass_onnx_deduplicate_initializers = real


def write_initializers(raw: Path, weights: dict[str, Any]) -> None:
    """Turn the graph inputs of ``raw`` that are ``weights`` (traced without parameters) into
    initializers kept as external data in ``raw``'s ``.data`` file, written a tensor at a
    time straight from torch's memory."""
    if not weights:
        raise StudioError("torch's exporter gave no initializer table; the static-KV exporter "
                          "needs torch 2.13")
    model = onnx.load(str(raw), load_external_data=False)
    weights = _fold_head_transpose(model, weights)
    inputs = [i for i in model.graph.input if i.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    data = raw.with_name(raw.name + ".data")
    offset = 0
    with open(data, "wb") as f:
        for name, value in weights.items():
            arr = value.detach().cpu().numpy()
            t = onnx.TensorProto()
            t.name = name
            t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
            t.dims.extend(arr.shape)
            t.data_location = onnx.TensorProto.EXTERNAL
            for k, v in (("location", data.name), ("offset", str(offset)),
                         ("length", str(arr.nbytes))):
                entry = t.external_data.add()
                entry.key, entry.value = k, v
            _write_rows(f, arr)
            offset += arr.nbytes
            model.graph.initializer.append(t)
    onnx.save(model, str(raw))


def _fold_head_transpose(model, weights: dict[str, Any]) -> dict[str, Any]:
    """The output head traced as the input :data:`HEAD_INPUT` reaches its MatMul through a
    Transpose: fold it into the initializer ``lm_head.weight`` (the transposed view, written
    a slice at a time), as the exporter folds a parameter's."""
    if HEAD_INPUT not in weights:
        return weights
    weights = dict(weights)
    w = weights.pop(HEAD_INPUT)
    graph = model.graph
    folded = []
    for node in graph.node:
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        if node.op_type == "Transpose" and node.input[0] == HEAD_INPUT and perm in (None, [1, 0]):
            folded.append(node)
    rename = {n.output[0]: "lm_head.weight" for n in folded}
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in rename:
                node.input[k] = rename[name]
    keep = [n for n in graph.node if n not in folded]
    del graph.node[:]
    graph.node.extend(keep)
    if folded:
        weights["lm_head.weight"] = w.t()
    if any(HEAD_INPUT in n.input for n in graph.node):  # used otherwise too: as it is
        weights[HEAD_INPUT] = w
    else:
        inputs = [i for i in graph.input if i.name != HEAD_INPUT]
        del graph.input[:]
        graph.input.extend(inputs)
    return weights


#: bytes of a transposed weight made contiguous at a time when it is written
WRITE_CHUNK = 64 << 20


def _write_rows(f, arr) -> None:
    """Write ``arr`` in C order. A MatMul weight comes out of the exporter as a transposed
    view of the Linear's weight: it is made contiguous a slice of rows at a time (an 8 B
    model's 128 k x 4096 head made whole would be 2 GiB more at once)."""
    if arr.flags.c_contiguous or arr.ndim == 0:
        f.write(arr.data if arr.nbytes else b"")
        return
    step = max(1, WRITE_CHUNK // max(1, arr[:1].nbytes))
    for a in range(0, arr.shape[0], step):
        f.write(np.ascontiguousarray(arr[a:a + step]).data)
