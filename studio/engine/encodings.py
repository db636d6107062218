"""QNN / AIMET encodings: the per-tensor quantization of a QDQ model, out and back in.

Export writes the legacy encodings format that ``qnn-onnx-converter
--quantization_overrides`` takes and AIMET (``"version": "0.6.1"``) loads::

    {"version": "0.6.1",
     "activation_encodings": {tensor: [{"bitwidth": 16, "dtype": "int", "is_symmetric": "False",
                                        "scale": s, "offset": o, "min": lo, "max": hi}]},
     "param_encodings": {weight: [one entry per channel, same fields]}}

``offset`` is the negated *unsigned* zero point (−128 for a symmetric signed 8-bit weight),
as AIMET and QNN define it; ``min`` / ``max`` are the represented range.

Import reads that format (and AIMET's 2.0.0 list format) and turns it into recipe overrides
in the recipe module's vocabulary: a weight-only pattern per weight (``….weight`` = INT4 /
INT8 / INT16) and a node pattern per activation (the ONNX node that computes it) wherever
the bitwidth differs from the scheme's default. Tensors that no pattern can name (graph
inputs) are reported, not silently dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json, parse_json, read_input
from studio.core.lazyimport import lazy_module
from studio.core.recipe import SCHEME_PRECISIONS
from studio.core.resources import resources_dir

onnx = lazy_module("onnx")
numpy_helper = lazy_module("onnx.numpy_helper")
jsonschema = lazy_module("jsonschema")

VERSION = "0.6.1"
_BITS = {"uint8": 8, "int8": 8, "uint16": 16, "int16": 16, "uint4": 4, "int4": 4}


def _entry(scale: float, zp: int, dtype: str) -> dict[str, Any]:
    bits = _BITS[dtype]
    signed = dtype.startswith("int")
    unsigned_zp = zp + (1 << (bits - 1)) if signed else zp
    qmax = (1 << bits) - 1
    symmetric = signed and zp == 0
    return {
        "bitwidth": bits, "dtype": "int", "is_symmetric": "True" if symmetric else "False",
        "scale": float(scale), "offset": int(-unsigned_zp),
        "min": float(scale * (0 - unsigned_zp)), "max": float(scale * (qmax - unsigned_zp)),
    }


def export_encodings(qdq_model: str | Path) -> dict[str, Any]:
    """The encodings of every quantized tensor of a QDQ ONNX model."""
    model = onnx.load(str(qdq_model))
    inits = {t.name: t for t in model.graph.initializer}
    acts: dict[str, list[dict[str, Any]]] = {}
    params: dict[str, list[dict[str, Any]]] = {}
    for n in model.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(n.input) < 3:
            continue
        scale_t, zp_t = inits.get(n.input[1]), inits.get(n.input[2])
        if scale_t is None or zp_t is None:
            continue
        scale = numpy_helper.to_array(scale_t).astype(np.float64).reshape(-1)
        zp = numpy_helper.to_array(zp_t).astype(np.int64).reshape(-1)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(zp_t.data_type).name
        if dtype not in _BITS:
            continue
        block = next((a.i for a in n.attribute if a.name == "block_size"), 0)
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:  # a weight
            name = n.input[0].removesuffix("_quantized")
            if block:
                raise StudioError(
                    f"{name} is quantized block-wise (LPBQ, blocks of {block}): the QNN "
                    "encodings-override format (0.6.1) has no block-wise encodings; export "
                    "a per_channel recipe"
                )
            if zp.size == 1 and scale.size > 1:
                zp = np.repeat(zp, scale.size)
            params[name] = [_entry(s, int(z), dtype) for s, z in zip(scale, zp, strict=True)]
        elif n.op_type == "QuantizeLinear":  # an activation (the float tensor it quantizes)
            name = n.input[0].removesuffix("_QuantizeLinear_Input")
            acts.setdefault(name, [_entry(scale[0], int(zp[0]), dtype)])
    enc = {"version": VERSION, "activation_encodings": dict(sorted(acts.items())),
           "param_encodings": dict(sorted(params.items()))}
    problem = schema_problem(enc)
    if problem:  # a bug of ours, not the user's: never write a file QNN would refuse
        raise StudioError(f"the encodings of {qdq_model} do not follow the QNN format: {problem}")
    return enc


SCHEMA_FILE = "qnn-encodings-0.6.1.schema.json"


def schema() -> dict[str, Any]:
    """The JSON Schema of the QNN / AIMET legacy encodings format (``resources/schemas``),
    written from AIMET's published encoding format specification."""
    return json.loads((resources_dir() / "schemas" / SCHEMA_FILE).read_text(encoding="utf-8"))


def schema_problem(data: Any) -> str | None:
    """None when ``data`` follows the legacy (0.4 to 0.6) encodings schema, else the first
    problem in one line (where, and what)."""
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    e = errors[0]
    where = "/".join(str(p) for p in e.absolute_path) or "the top level"
    return f"at {where}: {e.message}"


def write_encodings(qdq_model: str | Path, out: str | Path) -> dict[str, int]:
    enc = export_encodings(qdq_model)
    atomic_write_json(Path(out), enc)
    return {"activations": len(enc["activation_encodings"]),
            "params": len(enc["param_encodings"])}


#: the largest encodings JSON read (an 8B model's per-tensor encodings are some MB)
MAX_ENCODINGS_BYTES = 512 << 20


def read_encodings(path: str | Path) -> tuple[dict[str, int], dict[str, int]]:
    """(activation bitwidths, weight bitwidths) from an encodings file (0.6.1 / 1.0.0 dicts,
    or 2.0.0 lists); StudioError for anything else."""
    path = Path(path)
    data = parse_json(read_input(path, MAX_ENCODINGS_BYTES, "the encodings file"),
                      f"the encodings file {path}")
    if not isinstance(data, dict) or not ({"activation_encodings", "param_encodings"} & set(data)):
        raise StudioError(f"{path} is not an encodings file: it needs activation_encodings "
                          "and/or param_encodings")
    version = str(data.get("version", "0.4.0"))  # the spec: no version means 0.4
    if version.startswith("0."):
        problem = schema_problem({"version": version, **data})
        if problem:
            raise StudioError(f"{path} does not follow the QNN encodings format {version} "
                              f"{problem}; fix or re-export it")

    def bits(section: str) -> dict[str, int]:
        raw = data.get(section) or {}
        out: dict[str, int] = {}
        if isinstance(raw, list):  # 2.0.0: [{"name", "output_dtype", ...}]
            for e in raw:
                dt = str(e.get("output_dtype", ""))
                b = _BITS.get(dt) or int("".join(c for c in dt if c.isdigit()) or 0)
                if "name" in e and b:
                    out[e["name"]] = b
            return out
        if not isinstance(raw, dict):
            raise StudioError(f"{path}: {section} must be a table of tensor name -> encodings")
        for name, entries in raw.items():
            entry = entries[0] if isinstance(entries, list) and entries else entries
            if not isinstance(entry, dict) or "bitwidth" not in entry:
                raise StudioError(f"{path}: {section}[{name!r}] has no bitwidth")
            if str(entry.get("dtype", "int")) == "float":
                out[name] = 32 if int(entry["bitwidth"]) >= 32 else 16
                continue
            out[name] = int(entry["bitwidth"])
        return out

    return bits("activation_encodings"), bits("param_encodings")


def encodings_to_overrides(path: str | Path, fp32_model: str | Path,
                           scheme: str) -> tuple[dict[str, str], list[str]]:
    """Recipe overrides that reproduce an encodings file's bitwidths on the graph
    ``fp32_model`` under ``scheme``, and the tensors no pattern can name."""
    acts, params = read_encodings(path)
    model = onnx.load(str(fp32_model), load_external_data=False)
    producer = {o: n.name for n in model.graph.node for o in n.output}
    constants = {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    inits = {t.name for t in model.graph.initializer}
    w_default, a_default = SCHEME_PRECISIONS[scheme]
    name_of = {4: "INT4", 8: "INT8", 16: "INT16", 32: "FP32"}
    overrides: dict[str, str] = {}
    unnamed: list[str] = []
    for w, b in sorted(params.items()):
        prec = name_of.get(b)
        if prec is None or w not in inits:
            unnamed.append(w)
            continue
        if prec != w_default:
            if not w.endswith(".weight"):
                unnamed.append(w)
                continue
            overrides[w] = prec
    graph_inputs = {i.name for i in model.graph.input}
    for t, b in sorted(acts.items()):
        if (t not in producer and t not in graph_inputs) or t in constants:
            # made by the quantizer itself (precision converts), or a constant: it follows
            # the tensors around it
            continue
        prec = name_of.get(b)
        node = producer.get(t)
        if prec is None or node is None:
            if prec != a_default:
                unnamed.append(t)
            continue
        if prec != a_default:
            overrides[node] = prec
    return overrides, unnamed
