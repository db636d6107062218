"""Reading and writing ONNX files the studio's graphs live in: a graphs folder's spec
(``graph.json``: :func:`load_spec`), a model's weight bytes from its initializers' dims
(:func:`weight_bytes`, no serializing), a model light enough to infer shapes past
protobuf's 2 GB (:func:`weight_free`), and an atomic save that puts a large model's weights
beside it (:func:`save_onnx_atomic`), and a job's private view of a model file
(:func:`private_input`)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import link_or_copy
from studio.core.graphspec import migrate
from studio.core.lazyimport import lazy_module

onnx = lazy_module("onnx")
external_data_helper = lazy_module("onnx.external_data_helper")

#: the format of a graphs folder's ``graph.json``
SPEC_FORMAT = "qstudio.llm-static-kv/1"
#: the prefill graph's input of a vision-language model's image rows
IMAGE_EMBEDS = "image_embeds"
#: past this many weight bytes a model's weights go beside it (protobuf's 2 GB limit)
PROTOBUF_LIMIT = 1_900_000_000


def load_spec(graphs_dir: Path) -> dict:
    """Read ``graph.json`` of an exported (or quantized) graphs folder."""
    path = Path(graphs_dir) / "graph.json"
    if not path.is_file():
        raise StudioError(f"{graphs_dir} has no graph.json: export the model first (export_llm)")
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StudioError(f"cannot read {path}: {exc}; re-run the export") from None
    if spec.get("format") != SPEC_FORMAT:
        raise StudioError(f"{path} is not a QStudio LLM graph spec; re-run the export")

    return migrate(spec)


def weight_bytes(model) -> int:
    """The bytes of a model's initializers, from their dims and types (no serializing)."""
    total = 0
    for t in model.graph.initializer:
        n = int(np.prod(t.dims)) if len(t.dims) else 1
        total += n * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    return total


def weight_free(model):
    """A copy of ``model`` whose large initializers carry only name, dims and type: enough
    for shape inference, and serializable past protobuf's 2 GB limit."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    g = light.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    g.value_info.extend(model.graph.value_info)
    for t in model.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        if n > 4096:
            # declared as a typed input instead of carrying its data
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            g.initializer.append(t)
    return light


def save_onnx_atomic(model, path: Path, external: bool | None = None) -> list[Path]:
    """Save an ONNX model next to ``path`` via a temp name, then move it into place.

    Models over the 2 GB protobuf limit get one external data file ``<name>.data``
    (``external``: True / False decides instead). Returns the files written.
    """
    path = Path(path)
    tmp_dir = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.stem}."))
    try:
        tmp = tmp_dir / path.name
        # decided without serializing: ByteSize() itself fails past 2 GB
        big = not _no_external(model) or weight_bytes(model) > PROTOBUF_LIMIT
        if external if external is not None else big:
            onnx.save_model(
                model,
                str(tmp),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=path.name + ".data",
                size_threshold=1024,
            )
        else:
            onnx.save_model(model, str(tmp))
        written = []
        for f in sorted(tmp_dir.iterdir()):
            os.replace(f, path.parent / f.name)
            written.append(path.parent / f.name)
        return written
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _no_external(model) -> bool:
    return not any(external_data_helper.uses_external_data(t) for t in model.graph.initializer)


def private_input(src: Path, work: Path) -> Path:
    """``src`` seen from a folder of this job's own: the quantizer writes scratch files
    beside the model it reads (``<model>-inferred.onnx``), and ``src`` lies in an input
    artifact that other jobs may be reading at the same moment. Hard links to the model and
    the files beside it (its external data) keep it in place: not symlinks, whose target
    ONNX Runtime refuses as external data "escaping the model directory" (every weight
    rounding of a graph past 256 MB failed so), and a writer here replaces files, never
    writes into one (onnx's own writer refuses a linked file)."""
    folder = work / "input"
    folder.mkdir(parents=True, exist_ok=True)
    for f in src.parent.iterdir():
        if f.is_file() and not (folder / f.name).exists():
            link_or_copy(f.resolve(), folder / f.name)
    return folder / src.name
