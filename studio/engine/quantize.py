"""QDQ quantization of the static-KV graphs for the QNN HTP backend.

Uses ``onnxruntime.quantization.execution_providers.qnn``: ``qnn_preprocess_model``, then
``get_qnn_qdq_config`` with a calibration reader fed by :mod:`studio.engine.calibration`,
then ``quantize``. The prefill and decode graphs are calibrated separately (their own
feeds), with the same weights and so the same weight scales.

Recipe::

    {"scheme": "W8A16" | "W8A8" | "W4A16" | "FP16",
     "weight_granularity": "per_tensor" | "per_channel" | "per_block",
     "calibration_method": "MinMax" | "Entropy" | "Percentile",
     "block_size": 32,                  # per_block (LPBQ) only
     "samples": 4,                      # calibration windows
     "weight_rounding": "nearest" | "seqmse" | "adaround" | "gptq" | "seqmse_gptq",
     "rounding_samples": 32,            # windows the rounding fits layers on (not nearest)
     "overrides": {pattern: precision}}

``weight_rounding`` other than nearest (per-channel weights only): the integer weights of every
MatMul the recipe quantizes per channel (4-bit, or 8-bit where an override says so; float and
16-bit layers are left alone) are chosen by :mod:`studio.engine.rounding` once per model, from
both graphs' calibration inputs, and stored alike in the prefill, decode and verify graphs.

Schemes: W8A16 = QUInt8 weights, QUInt16 activations; W8A8 = QUInt8 / QUInt8; W4A16 = QInt4
weights (per channel, or block-wise LPBQ: ``axis 0`` overrides with the quantizer's
``BlockSize`` and an opset-21 blocked DequantizeLinear; compile then needs
``enable_block_quant_weight_optimization``), QUInt16 activations; FP16 copies the float
graphs (the HTP runs them with ``enable_htp_fp16_precision=1``). Defaults and the scheme
vocabulary are :mod:`studio.core.recipe`'s.

``per_channel`` goes through explicit ``init_overrides`` on every MatMul weight
(``QInt8``, axis 1, symmetric): the QNN config's ``per_channel=True`` leaves MatMul weights
per tensor.

Overrides: a pattern (``fnmatch``, case-sensitive) is matched against ONNX node names, HF
module paths of nodes (``model.layers.3.mlp.down_proj``; a pattern also covers everything
below the module it names, so ``model.layers.3`` is the whole layer, and may leave out
leading parts: ``layers.3``, ``mlp``) and initializer names.

- A pattern that names nodes sets the precision of what they compute: ``INT8`` / ``INT16``
  the activations they output, ``INT4`` their MatMul weights (per channel, symmetric),
  ``FP16`` (or ``FP32``) leaves them unquantized (float on the HTP, which then needs
  ``enable_htp_fp16_precision=1``).
- A pattern that names only weights (``*.down_proj.weight``) sets the weights' precision:
  ``INT8``, ``INT16``, ``INT4``.

The HTP MatMul takes (u8,u8), (u8,u16) and (u16,u8): 16-bit weights under 16-bit
activations are rejected before any calibration is run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.progress import NullProgress, Progress, SubProgress
from studio.core.recipe import (
    CALIBRATION_METHODS,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CALIBRATION_METHOD,
    DEFAULT_GRANULARITY,
    DEFAULT_ROUNDING_SAMPLES,
    DEFAULT_SCHEME,
    DEFAULT_WEIGHT_ROUNDING,
    EMBEDDING_PRECISIONS,
    GRANULARITIES,
    SCHEME_PRECISIONS,
    SCHEMES,
    WEIGHT_ROUNDINGS,
    activation_bits,
    activation_point,
    covers,
    covers_node,
    is_float_precision,
    is_float_scheme,
    is_weight_only,
    module_of_node,
    weight_bits,
    weight_precision,
)
from studio.engine.weightstore import WEIGHTS_FILE, WeightStore, shared_store

# Aliases the engine accepts for the recipe module's precisions (FP16/FP32 = left float).
PRECISIONS = {
    "INT8": "INT8",
    "A8": "INT8",
    "8": "INT8",
    "INT16": "INT16",
    "A16": "INT16",
    "16": "INT16",
    "INT4": "INT4",
    "W4": "INT4",
    "4": "INT4",
    "FP16": "FLOAT",
    "FP32": "FLOAT",
    "FLOAT": "FLOAT",
}
DEFAULT_SAMPLES = 4
MAX_SAMPLES = 4096
GRAPHS = ("prefill", "decode")
_BITS = {"uint8": 8, "int8": 8, "uint16": 16, "int16": 16, "uint4": 4, "int4": 4}


# ---------------------------------------------------------------------------- the recipe


def normalize_recipe(recipe: dict) -> dict:
    """Check a recipe and fill in defaults; StudioError on anything unusable."""
    if not isinstance(recipe, dict):
        raise StudioError("the quantization recipe must be a table with at least a scheme")
    unknown = set(recipe) - {
        "scheme",
        "weight_granularity",
        "samples",
        "overrides",
        "decode_per_window",
        "given",
        "calibration_method",
        "block_size",
        "weight_rounding",
        "rounding_samples",
        "vision_scheme",
        "vision_overrides",
        "embedding",
    }
    if unknown:
        raise StudioError(
            f"unknown quantization setting(s) {', '.join(sorted(unknown))}; "
            "use scheme, weight_granularity, samples, overrides"
        )
    scheme = str(recipe.get("scheme", DEFAULT_SCHEME)).upper()
    if scheme not in SCHEMES:
        raise StudioError(
            f"unknown quantization scheme {recipe.get('scheme')!r}; use one of {', '.join(SCHEMES)}"
        )
    gran = str(recipe.get("weight_granularity", DEFAULT_GRANULARITY)).lower().replace("-", "_")
    if gran not in GRANULARITIES:
        raise StudioError(
            f"unknown weight granularity {recipe.get('weight_granularity')!r}; use per_tensor or per_channel"
        )
    samples = recipe.get("samples", DEFAULT_SAMPLES)
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= MAX_SAMPLES:
        raise StudioError(
            f"calibration samples must be a whole number from 1 to {MAX_SAMPLES} (got {samples!r})"
        )
    per_window = recipe.get("decode_per_window", 4)
    if isinstance(per_window, bool) or not isinstance(per_window, int) or not 1 <= per_window <= 64:
        raise StudioError(
            f"decode_per_window must be a whole number from 1 to 64 (got {per_window!r})"
        )
    norm, given = _normal_overrides(recipe.get("overrides"), recipe.get("given") or {})
    vision_norm, _ = _normal_overrides(recipe.get("vision_overrides"), {})
    vision_scheme = str(recipe.get("vision_scheme") or "").upper()
    if vision_scheme and vision_scheme not in SCHEMES:
        raise StudioError(f"unknown vision scheme {recipe.get('vision_scheme')!r}; use one of "
                          f"{', '.join(SCHEMES)} (or leave it empty: the recipe's scheme)")
    method = str(recipe.get("calibration_method", DEFAULT_CALIBRATION_METHOD))
    if method not in CALIBRATION_METHODS:
        raise StudioError(
            f"unknown calibration method {method!r}; use one of {', '.join(CALIBRATION_METHODS)}"
        )
    block = recipe.get("block_size", DEFAULT_BLOCK_SIZE)
    if gran == "per_block" and weight_bits(scheme) != 4:
        raise StudioError("per_block (LPBQ) weights are 4-bit: use it with scheme W4A16")
    rounding = str(recipe.get("weight_rounding", DEFAULT_WEIGHT_ROUNDING)).lower()
    if rounding not in WEIGHT_ROUNDINGS:
        raise StudioError(f"unknown weight rounding {recipe.get('weight_rounding')!r}; use one "
                          f"of {', '.join(WEIGHT_ROUNDINGS)}")
    if rounding != DEFAULT_WEIGHT_ROUNDING and not is_float_scheme(scheme) \
            and gran != "per_channel":
        raise StudioError(f"weight rounding {rounding} works on per-channel weights: set the "
                          f"weight granularity per_channel (it is {gran}), or rounding nearest")
    r_samples = recipe.get("rounding_samples", DEFAULT_ROUNDING_SAMPLES)
    if isinstance(r_samples, bool) or not isinstance(r_samples, int) or \
            not 1 <= r_samples <= MAX_SAMPLES:
        raise StudioError(f"rounding samples must be a whole number from 1 to {MAX_SAMPLES} "
                          f"(got {r_samples!r})")
    embedding = str(recipe.get("embedding", "auto"))
    if embedding not in EMBEDDING_PRECISIONS:
        raise StudioError(f"unknown embedding precision {embedding!r}; use one of "
                          f"{', '.join(EMBEDDING_PRECISIONS)}")
    return {
        "embedding": embedding,
        "weight_rounding": rounding,
        "rounding_samples": r_samples,
        "calibration_method": method,
        "block_size": int(block),
        "given": given,
        "scheme": scheme,
        "weight_granularity": gran,
        "samples": samples,
        "overrides": norm,
        "decode_per_window": per_window,
        "vision_scheme": vision_scheme,
        "vision_overrides": vision_norm,
    }


def _normal_overrides(overrides: Any, given_in: dict) -> tuple[dict[str, str], dict[str, str]]:
    """A recipe's override rules (pattern -> precision) in the quantizer's precision names,
    and each as the user gave it."""
    overrides = overrides or {}
    if not isinstance(overrides, dict):
        raise StudioError("quantization overrides must be a table of pattern = precision")
    norm: dict[str, str] = {}
    given: dict[str, str] = {}
    for pattern, value in overrides.items():
        if not isinstance(pattern, str) or not pattern.strip():
            raise StudioError(
                "an override pattern is empty; name nodes, layers or weights (globs allowed)"
            )
        key = str(value).upper().replace("-", "").replace("_", "")
        if key not in PRECISIONS:
            raise StudioError(
                f"override {pattern!r} = {value!r}: unknown precision; use INT8, INT16, INT4 or FP16"
            )
        norm[pattern] = PRECISIONS[key]
        given[pattern] = given_in.get(pattern) or (
            key if is_float_precision(key) else PRECISIONS[key]
        )
    return norm, given


# ---------------------------------------------------------------------------- graph helpers


def _float_tensors(model) -> set[str]:
    import onnx

    typed = onnx.shape_inference.infer_shapes(model)
    out = set()
    for v in (*typed.graph.value_info, *typed.graph.output, *typed.graph.input):
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            out.add(v.name)
    return out


def _matmul_weights(model) -> dict[str, str]:
    """MatMul weight initializer -> the MatMul node's name (weights as input 1)."""
    inits = {t.name: t for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in inits:
            if len(inits[node.input[1]].dims) == 2:
                out[node.input[1]] = node.name
    return out


def resolve_overrides(model, recipe: dict) -> dict:
    """Map the recipe to the ORT quantizer's tensor overrides for one graph.

    Returns ``{"init_overrides", "nodes_to_exclude", "patterns", "per_channel_weights"}``
    where ``patterns`` says what each pattern covered in this graph.
    """
    from onnxruntime.quantization import QuantType

    scheme = recipe["scheme"]
    act16 = activation_bits(scheme) == 16
    act_default = "INT16" if act16 else "INT8"
    inits = {t.name for t in model.graph.initializer}
    weights = _matmul_weights(model)
    floats = _float_tensors(model)

    weight_prec: dict[str, str] = {}
    act_prec: dict[str, str] = {}
    weight_rule: dict[str, str] = {}  # tensor / node -> the pattern that set it
    act_rule: dict[str, str] = {}
    exclude: dict[str, str] = {}  # node -> pattern
    report: dict[str, dict] = {}
    chains = _score_chains(model)
    for pattern, prec in recipe["overrides"].items():
        nodes = [] if is_weight_only(pattern) else [
            n for n in model.graph.node
            if n.op_type != "Constant" and covers_node(pattern, n.name)
        ]
        named = {n.name for n in nodes}
        nodes += [c for n in list(nodes) for c in chains.get(n.name, []) if c.name not in named]
        named_inits = sorted(i for i in inits if covers(pattern, i))
        entry: dict[str, Any] = {"precision": prec, "nodes": len(nodes), "tensors": []}
        if nodes:
            for n in nodes:
                if prec == "FLOAT":
                    # float supersedes what earlier patterns set on this node
                    exclude[n.name] = pattern
                    for t in n.output:
                        act_prec.pop(t, None)
                        act_rule.pop(t, None)
                    if n.op_type == "MatMul" and n.input[1] in weights:
                        weight_prec.pop(n.input[1], None)
                        weight_rule.pop(n.input[1], None)
                    entry["tensors"].extend(o for o in n.output if o in floats)
                    continue
                exclude.pop(n.name, None)  # a later quantized pattern re-quantizes the node
                if prec == "INT4":
                    if n.op_type == "MatMul" and n.input[1] in weights:
                        weight_prec[n.input[1]] = "INT4"
                        weight_rule[n.input[1]] = pattern
                        entry["tensors"].append(n.input[1])
                else:
                    for o in n.output:
                        if o in floats and o not in inits:
                            act_prec[o] = prec
                            act_rule[o] = pattern
                            entry["tensors"].append(o)
        elif named_inits:
            for w in named_inits:
                weight_prec[w] = prec
                weight_rule[w] = pattern
                entry["tensors"].append(w)
                if prec != "FLOAT" and weights.get(w) in exclude:
                    exclude.pop(weights[w])  # its MatMul is quantized again
        report[pattern] = entry

    # HTP MatMul: no 16-bit weight under a 16-bit activation.
    for w, prec in weight_prec.items():
        if prec != "INT16" or w not in weights:
            continue
        node = next(n for n in model.graph.node if n.name == weights[w])
        a = node.input[0]
        a_prec = act_prec.get(a, act_default)
        if a_prec == "INT16":
            raise StudioError(
                f"override makes weight {w} 16-bit under 16-bit activations, which the HTP MatMul "
                "does not run; keep MatMul weights INT8 (or make the activations INT8)"
            )

    qtype = {
        "INT8": QuantType.QUInt8,
        "INT16": QuantType.QUInt16,
    }
    init_overrides: dict[str, list[dict]] = {}
    default_act = QuantType.QUInt16 if act16 else QuantType.QUInt8
    for name, prec in act_prec.items():
        if qtype[prec] != default_act:
            init_overrides[name] = [{"quant_type": qtype[prec]}]
    per_channel = 0
    w_default = weight_precision(scheme)
    blocked = recipe["weight_granularity"] == "per_block"
    for w in weights:
        prec = weight_prec.get(w) or w_default
        if prec == "FLOAT" or weights[w] in exclude:
            continue
        if prec == "INT4":
            # per channel (axis 1 of the [in, out] MatMul weight), or block-wise along the
            # input axis (LPBQ; the block size is the quantizer's BlockSize option)
            init_overrides[w] = [{"quant_type": QuantType.QInt4, "axis": 0 if blocked else 1,
                                  "symmetric": True}]
            per_channel += 1
        elif prec == "INT16":
            init_overrides[w] = [{"quant_type": QuantType.QUInt16}]
        elif recipe["weight_granularity"] in ("per_channel", "per_block"):
            init_overrides[w] = [{"quant_type": QuantType.QInt8, "axis": 1, "symmetric": True}]
            per_channel += 1
    for name, prec in weight_prec.items():
        if name not in weights and prec in ("INT8", "INT16"):
            init_overrides[name] = [{"quant_type": qtype[prec]}]
    table = embedding_table(model) if recipe.get("embedding", "auto") == "INT8" else None
    if table is not None:  # quantization.embedding = "INT8": the token table at 8 bits
        init_overrides[table] = [{"quant_type": QuantType.QUInt8}]
    for name in [n for n in weight_prec if weight_prec[n] == "FLOAT"]:
        for node in model.graph.node:
            if name in node.input:
                exclude.setdefault(node.name, weight_rule[name])
    return {
        "init_overrides": init_overrides,
        "nodes_to_exclude": sorted(exclude),
        "patterns": report,
        "per_channel_weights": per_channel,
        "layers": _applied_layers(model, recipe, weights, weight_prec, weight_rule, act_prec,
                                  act_rule, exclude),
    }


def embedding_table(model) -> str | None:
    """The token embedding table of a graph: the initializer a Gather reads at the token ids
    (a graph input); None in a graph without one (a later part)."""
    inits = {t.name for t in model.graph.initializer}
    ids = {i.name for i in model.graph.input if "input_ids" in i.name}
    return next((n.input[0] for n in model.graph.node if n.op_type == "Gather"
                 and n.input[0] in inits and n.input[1] in ids), None)


def _score_chains(model) -> dict[str, list]:
    """The attention-score point is the whole path from Q·Kᵀ to the softmax: for each scores
    MatMul (:func:`activation_point`), the nodes between it and its Softmax (scaling, the
    mask, soft-capping), so that a precision set on the scores reaches the tensor the
    softmax reads."""
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    chains: dict[str, list] = {}
    for n in model.graph.node:
        point = activation_point(n.name)
        if point is None or not point.endswith(".scores"):
            continue
        module = module_of_node(n.name)
        chain, frontier, seen = [], [n], {n.name}
        for _ in range(8):
            nxt = []
            for f in frontier:
                for c in (c for o in f.output for c in consumers.get(o, [])):
                    if c.name in seen or module_of_node(c.name) != module:
                        continue
                    seen.add(c.name)
                    if c.op_type == "Softmax":
                        continue
                    nxt.append(c)
            chain += nxt
            frontier = nxt
        chains[n.name] = [c for c in chain if c.op_type != "Constant"]
    return chains


def _applied_layers(model, recipe, weights, weight_prec, weight_rule, act_prec, act_rule,
                    exclude) -> list[dict[str, str]]:
    """What each weighted layer (a MatMul with a weight) got, and which rule set it: the
    quantizer's own record, which the recipe module's ``effective_precisions`` must match."""
    scheme, gran = recipe["scheme"], recipe["weight_granularity"]
    given = recipe.get("given") or {}
    w_default, a_default = SCHEME_PRECISIONS[scheme]
    base = f"scheme {scheme} ({gran})"
    nodes = {n.name: n for n in model.graph.node}
    out = []
    for w, node_name in weights.items():
        node = nodes[node_name]
        layer = module_of_node(node_name)
        if node_name in exclude:
            pattern = exclude[node_name]
            prec = given.get(pattern, "FP16")
            rule = f"override {pattern!r}"
            out.append({"layer": layer, "weight": prec, "activation": prec,
                        "weight_rule": rule, "activation_rule": rule})
            continue
        o = node.output[0]
        out.append({
            "layer": layer,
            "weight": weight_prec.get(w, w_default),
            "activation": act_prec.get(o, a_default),
            "weight_rule": f"override {weight_rule[w]!r}" if w in weight_rule else base,
            "activation_rule": f"override {act_rule[o]!r}" if o in act_rule else base,
        })
    # the key activations (attention scores, softmax, residual stream): what their node's
    # output got; for a point computed by several nodes (the two residual adds), the last
    points: dict[str, Any] = {}
    for n in model.graph.node:
        point = activation_point(n.name)
        if point is not None and n.output:
            points[point] = n
    for point, node in points.items():
        if node.name in exclude:
            pattern = exclude[node.name]
            prec, rule = given.get(pattern, "FP16"), f"override {exclude[node.name]!r}"
        else:
            o = node.output[0]
            prec = act_prec.get(o, a_default)
            rule = f"override {act_rule[o]!r}" if o in act_rule else base
        out.append({"layer": point, "weight": "", "activation": prec,
                    "weight_rule": "", "activation_rule": rule})
    return sorted(out, key=lambda r: r["layer"])


def matmul_precisions(model) -> dict[str, int]:
    """Count MatMuls by (input 0 bits, input 1 bits) of a QDQ model, e.g. ``"16x8": 14``.

    ``w`` marks a constant (weight) input 1. ``f`` means a float input.
    """
    import onnx

    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}

    def info(name: str) -> tuple[str, bool]:
        node = producer.get(name)
        if node is None or node.op_type != "DequantizeLinear":
            return "f", False
        src = node.input[0]
        const = src in inits or (src in producer and producer[src].op_type == "Constant")
        zp = node.input[2] if len(node.input) > 2 else ""
        if zp in inits:
            dt = onnx.helper.tensor_dtype_to_np_dtype(inits[zp].data_type).name
        elif src in inits:
            dt = onnx.helper.tensor_dtype_to_np_dtype(inits[src].data_type).name
        else:
            dt = "uint8"
        return str(_BITS.get(dt, "?")), const

    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "MatMul":
            continue
        a, _ = info(node.input[0])
        b, const = info(node.input[1])
        key = f"{a}x{b}{'w' if const else ''}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def check_overrides(graphs_dir: Path, recipe: dict) -> dict[str, dict]:
    """Resolve the recipe's overrides on the FP32 graphs; StudioError for a pattern that
    matches nothing or an override the HTP cannot run. Returns the resolution per graph."""
    return check_overrides_in([Path(graphs_dir)], recipe)[0]


def check_overrides_in(folders: list[Path], recipe: dict) -> list[dict[str, dict]]:
    """:func:`check_overrides` over the graphs of several folders (the parts of a model): a
    pattern must match in one of them. Returns the resolution per folder and graph."""
    import onnx

    recipe = normalize_recipe(recipe)
    res = [{
        g: resolve_overrides(
            onnx.load(str(Path(folder) / f"{g}.onnx"), load_external_data=False), recipe
        )
        for g in GRAPHS
    } for folder in folders]
    for pattern in recipe["overrides"]:
        if all(not r[g]["patterns"][pattern]["tensors"] for r in res for g in GRAPHS):
            raise StudioError(
                f"override pattern {pattern!r} matches no node, layer or weight; "
                "use names like model.layers.0, *.mlp.* or model.layers.0.mlp.down_proj.weight"
            )
    return res


# ---------------------------------------------------------------------------- running it


class _LogToProgress(logging.Handler):
    """Forwards the quantizer's log warnings into the job log."""

    def __init__(self, progress: Progress):
        super().__init__(level=logging.WARNING)
        self.progress = progress
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage().strip().splitlines()[0] if record.getMessage().strip() else ""
        if "pre-processing" in msg:  # advice for dynamic-shape vision models, not for us
            return
        if msg and msg not in self.seen:
            self.seen.add(msg)
            self.progress.log(f"quantizer: {msg}")


def _reader(feeds: list[dict], progress: Progress):
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self.i = 0

        def get_next(self):
            progress.check()
            if self.i >= len(feeds):
                return None
            progress.update(self.i / len(feeds), f"calibrating: graph input {self.i + 1}/{len(feeds)} (made from the "
                            "calibration windows)")
            self.i += 1
            return feeds[self.i - 1]

        def rewind(self):
            self.i = 0

    return _Reader()


def _preprocess_fuses(src: Path) -> bool:
    """Whether ONNX Runtime's QNN preprocessing would change ``src``: its fusions (GELU from
    Erf, LpNormalization from ReduceL2, SpaceToDepth from Reshape / Transpose), tried on the
    graph's structure. The preprocessing itself first optimizes the whole graph in an ONNX
    Runtime session (weights loaded and prepacked: 7.7 GiB of anonymous memory for an 8 B
    model's 2.8 GiB head part) and writes nothing when no fusion applies — as for every
    decoder the studio exports; a fusion the optimization alone would make possible is not
    seen here (none of the studio's graphs has one)."""
    import onnx
    from onnxruntime.quantization.execution_providers.qnn.fusion_lpnorm import (
        FusionLpNormalization,
    )
    from onnxruntime.quantization.execution_providers.qnn.fusion_spacetodepth import (
        FusionSpaceToDepth,
    )
    from onnxruntime.quantization.fusions import FusionGelu
    from onnxruntime.quantization.onnx_model import ONNXModel

    model = ONNXModel(onnx.load(str(src), load_external_data=False))
    return any([fusion(model).apply() for fusion in (FusionGelu, FusionLpNormalization,
                                                     FusionSpaceToDepth)])


def _takes_calibration_cache() -> bool:
    """Whether this ONNX Runtime's ``quantize_static`` reads a calibration cache (1.32 on)."""
    import inspect

    from onnxruntime.quantization import calibrate, quantize_static

    return ("calibration_cache_path" in inspect.signature(quantize_static).parameters
            and hasattr(calibrate, "save_tensors_data"))


def _mapped_ranges(model_path: Path, config, feeds: list[dict], progress: Progress
                   ) -> Path | None:
    """The min-max ranges ONNX Runtime's quantizer would calibrate, computed without the
    copies of the weights its own calibration holds, saved as its calibration cache (a file
    in ``model_path``'s folder) for ``quantize_static(..., calibration_cache_path=...)``;
    None for the other calibration methods (the quantizer then calibrates itself).

    The quantizer's calibration loads the graph with its weights, writes the augmented graph
    with a copy of them and runs it in a session that prepacks every MatMul weight: about
    three copies beside the one it quantizes (an 8 B model's head part, 2.8 GiB of weights:
    8.8 GiB of anonymous memory). Here the same calibrater (:class:`MinMaxCalibrater`: the
    same tensors, the same ReduceMin / ReduceMax, the same reduction) reads the graph's
    structure only, writes the augmented graph beside the weights file it points into, and
    runs it without prepacking: the weights stay the file's pages."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization import calibrate as cal

    opts = config.extra_options or {}
    if config.calibrate_method != CalibrationMethod.MinMax or opts.get("CalibStridedMinMax"):
        return None
    if not _takes_calibration_cache():  # an ONNX Runtime before 1.32: it calibrates itself
        return None

    class Mapped(cal.MinMaxCalibrater):
        def create_inference_session(self):
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.add_session_config_entry("session.disable_prepacking", "1")
            # ONNX Runtime's default order ran the calibration's ReduceMin / ReduceMax nodes
            # (appended to the graph) late, so every activation of the pass stayed alive:
            # Qwen2.5-VL-3B's vision tower at 8 of its 32 blocks peaked at 7.8 GiB here and
            # the whole tower past 23 GiB. The priority-based order frees each tensor once
            # its reductions ran: 2.3 GiB.
            so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
            self.infer_session = ort.InferenceSession(
                self.augmented_model_path, sess_options=so, providers=["CPUExecutionProvider"])

    def structure(path: Path):
        # shape inference as the quantizer's loader does it, in the same folder, so the
        # graph's external-data locations stay valid; the weights are not read
        inferred = Path(path).with_name(Path(path).stem + "-inferred.onnx")
        onnx.shape_inference.infer_shapes_path(str(path), str(inferred))
        model = onnx.load(str(inferred), load_external_data=False)
        inferred.unlink()
        return model

    model_path = Path(model_path)
    real = cal.load_model_with_shape_infer
    cal.load_model_with_shape_infer = structure  # what CalibraterBase loads the graph with
    try:
        calibrator = Mapped(
            model_path, config.op_types_to_quantize,
            str(model_path.with_name(model_path.stem + "-augmented.onnx")),
            symmetric=opts.get("CalibTensorRangeSymmetric", False),
            moving_average=opts.get("CalibMovingAverage", False),
            averaging_constant=opts.get("CalibMovingAverageConstant", 0.01),
            max_intermediate_outputs=opts.get("CalibMaxIntermediateOutputs"),
            use_external_data_format=False)
    finally:
        cal.load_model_with_shape_infer = real
    augmented = Path(calibrator.augmented_model_path)
    try:
        calibrator.augment_graph()
        calibrator.create_inference_session()
        calibrator.collect_data(_reader(feeds, progress))
        ranges = calibrator.compute_data()
    finally:
        del calibrator
        augmented.unlink(missing_ok=True)
    cache = model_path.with_name(model_path.stem + "-ranges.json")
    cal.save_tensors_data(ranges, cache)
    return cache


def static_quantize(model_path: Path, out: Path, config, ranges: Path | None = None) -> None:
    """ONNX Runtime's ``quantize_static`` with a ``get_qnn_qdq_config`` config, reading the
    activation ranges from ``ranges`` (its calibration cache: :func:`_mapped_ranges`; when
    the file does not exist yet it calibrates and writes it) or, without one, calibrating
    itself."""
    from onnxruntime.quantization import quantize_static

    quantize_static(
        str(model_path), str(out), config.calibration_data_reader,
        calibrate_method=config.calibrate_method, quant_format=config.quant_format,
        activation_type=config.activation_type, weight_type=config.weight_type,
        op_types_to_quantize=config.op_types_to_quantize,
        nodes_to_quantize=config.nodes_to_quantize,
        nodes_to_exclude=config.nodes_to_exclude, per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        use_external_data_format=config.use_external_data_format,
        calibration_providers=config.calibration_providers,
        extra_options=config.extra_options,
        **({"calibration_cache_path": str(ranges)} if ranges else {}))


def _quantize_streamed(model_path: Path, out: Path, config, ranges: Path | None,
                       progress: Progress) -> None:
    """:func:`static_quantize`, the graph's large weights quantized a slice at a time beside
    it (:mod:`studio.engine.qdq_weights`: the same graph, without the quantizer's whole-weight
    copies). Needs the ranges computed already (the stand-ins cannot be calibrated on); a
    graph the streamed path does not reproduce is quantized the usual way."""
    from studio.engine import qdq_weights

    opts = config.extra_options or {}
    if ranges is None:
        static_quantize(model_path, out, config, ranges)
        return
    stood, originals = qdq_weights.stand_in(model_path, opts.get("TensorQuantOverrides", {}),
                                            opts.get("BlockSize", 0))
    if not originals:
        static_quantize(model_path, out, config, ranges)
        return
    try:
        static_quantize(stood, out, config, ranges)
        progress.log(f"{len(originals)} large weights quantized a slice at a time")
        qdq_weights.put_weights(out, originals)
    except qdq_weights.NotStreamable as exc:
        progress.log(f"{exc}: quantizing the whole graph at once")
        static_quantize(model_path, out, config, ranges)
    finally:
        stood.unlink(missing_ok=True)


#: what ORT's quantizer appends to the name of a graph output's float tensor
_OUTPUT_SUFFIX = "_QuantizeLinear_Input"


def activation_encodings(qdq_path: Path) -> dict[str, list[dict[str, Any]]]:
    """The activation scales of a QDQ graph as ``TensorQuantOverrides`` (tensor -> [{scale,
    zero_point, quant_type}]): every non-initializer tensor a QuantizeLinear reads."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType

    model = onnx.load(str(qdq_path), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    out: dict[str, list[dict[str, Any]]] = {}
    for n in model.graph.node:
        if n.op_type != "QuantizeLinear" or n.input[0] in inits or len(n.input) < 3:
            continue
        if n.input[1] not in inits or n.input[2] not in inits:
            continue
        scale = numpy_helper.to_array(inits[n.input[1]])
        zp = numpy_helper.to_array(inits[n.input[2]])
        if scale.size != 1:
            continue
        qt = {np.dtype("uint16"): QuantType.QUInt16, np.dtype("uint8"): QuantType.QUInt8,
              np.dtype("int16"): QuantType.QInt16, np.dtype("int8"): QuantType.QInt8}.get(zp.dtype)
        if qt is None:
            continue
        enc = [{"scale": scale.reshape(()).astype(np.float32), "zero_point": zp.reshape(()),
                "quant_type": qt}]
        out[n.input[0]] = enc
        if n.input[0].endswith(_OUTPUT_SUFFIX):  # a graph output, renamed by the quantizer
            out[n.input[0][:-len(_OUTPUT_SUFFIX)]] = enc
    return out


def private_input(src: Path, work: Path) -> Path:
    """``src`` seen from a folder of this job's own: the quantizer writes scratch files
    beside the model it reads (``<model>-inferred.onnx``), and ``src`` lies in an input
    artifact that other jobs may be reading at the same moment. Hard links to the model and
    the files beside it (its external data) keep it in place: not symlinks, whose target
    ONNX Runtime refuses as external data "escaping the model directory" (every weight
    rounding of a graph past 256 MB failed so), and a writer here replaces files, never
    writes into one (onnx's own writer refuses a linked file)."""
    from studio.core.fsutil import link_or_copy

    folder = work / "input"
    folder.mkdir(parents=True, exist_ok=True)
    for f in src.parent.iterdir():
        if f.is_file() and not (folder / f.name).exists():
            link_or_copy(f.resolve(), folder / f.name)
    return folder / src.name


def _quantize_graph(
    src: Path, dst: Path, recipe: dict, feeds: list[dict], progress: Progress,
    shared: dict[str, list[dict[str, Any]]] | None = None,
    rounded: dict[str, Any] | None = None,
    store: WeightStore | None = None,
) -> dict[str, Any]:
    """Quantize one graph. ``rounded``: weight -> :class:`studio.engine.rounding.Rounded`,
    the integer weights and per-channel scales chosen for the weights the recipe quantizes per
    channel (:func:`studio.engine.rounding.rounding_targets`); the quantizer stores exactly
    those. ``store``: the shared weight file of ``dst``'s folder, where a graph past
    :data:`studio.engine.weightstore.SHARE_ABOVE` bytes keeps its weights (the prefill and
    decode graphs of a part then hold one copy)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantType
    from onnxruntime.quantization.execution_providers.qnn import (
        get_qnn_qdq_config,
        qnn_preprocess_model,
    )

    act = QuantType.QUInt16 if activation_bits(recipe["scheme"]) == 16 else QuantType.QUInt8
    work = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.stem}-quant."))
    handler = _LogToProgress(progress)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        pre = work / "preprocessed.onnx"
        # A graph past the 2 GB protobuf limit (its weights in external data) must be written
        # back the same way; the graph is read without its weights (the overrides and the
        # config only need its structure, and an in-memory model past 2 GB cannot be
        # serialized for shape inference or ByteSize).
        external = _uses_external_data(src)
        ext = ({"save_as_external_data": True, "all_tensors_to_one_file": True,
                "external_data_location": pre.name + ".data"} if external else {})
        model_path = (pre if _preprocess_fuses(src) and qnn_preprocess_model(
            str(src), str(pre), **ext) else private_input(src, work))
        model = onnx.load(str(model_path), load_external_data=False)
        resolved = resolve_overrides(model, recipe)
        progress.check()
        applied: set[str] = set()
        if rounded:
            model_path, applied = _apply_rounding(model, model_path, work, external,
                                                  resolved["init_overrides"], rounded)
        by_channel = (_channels_where_blocks_do_not_fit(
            model, model_path, recipe["block_size"], resolved["init_overrides"])
            if recipe["weight_granularity"] == "per_block" else {})
        for w, why in by_channel.items():
            progress.log(f"{w}: 4-bit per channel, not in blocks: {why}")
        config = get_qnn_qdq_config(
            model,
            _reader(feeds, progress),
            calibrate_method=CalibrationMethod[recipe["calibration_method"]],
            activation_type=act,
            weight_type=QuantType.QUInt8,
            per_channel=False,
            init_overrides=resolved["init_overrides"] or None,
            nodes_to_exclude=resolved["nodes_to_exclude"] or None,
        )
        if shared:
            # activations another graph already quantized keep that graph's scales (the
            # verify graph reuses the decode graph's, so both compute the same logits)
            tqo = config.extra_options.setdefault("TensorQuantOverrides", {})
            for name, enc in shared.items():
                if name not in tqo:
                    tqo[name] = enc
        if recipe["weight_granularity"] == "per_block":
            # block-wise weights as an opset-21 DequantizeLinear with block_size (LPBQ)
            config.extra_options["BlockSize"] = recipe["block_size"]
            config.extra_options["UseQDQContribOps"] = False
        if external and config.extra_options.get("UseQDQContribOps"):
            # 16-bit types need opset 21, and ORT's own upgrade serializes the whole model
            # (past 2 GB it cannot): upgrade the weight-free graph here; the quantizer then
            # sees opset 21 and does the rest as for a small graph.
            model_path = _upgrade_opset(model_path, work, 21)
        del model
        # Not CalibMaxIntermediateOutputs: in ORT 1.32 MinMaxCalibrater drops the collected
        # batches when it reaches that count without computing their ranges. MinMax keeps
        # only ReduceMin/ReduceMax outputs per feed, so memory stays small anyway.
        out = work / dst.name
        try:
            _quantize_streamed(model_path, out, config,
                               _mapped_ranges(model_path, config, feeds, progress), progress)
        except ValueError as exc:
            raise StudioError(
                f"quantization of {src.name} failed: {str(exc).splitlines()[0]}"
            ) from None
        progress.check()
        onnx.checker.check_model(str(out))  # by path: works past the 2 GB protobuf limit
        qmodel = onnx.load(str(out))
        mm = matmul_precisions(qmodel)
        bad = [k for k in mm if k.startswith("16x16w")]
        if bad:
            raise StudioError(
                f"{mm[bad[0]]} MatMul(s) of {src.name} ended up with 16-bit weights under 16-bit "
                "activations, which the HTP does not run; keep those weights INT8"
            )
        from studio.engine import weightstore
        from studio.engine.llm_export import _weight_bytes, save_onnx_atomic

        if store is not None and _weight_bytes(qmodel) > weightstore.SHARE_ABOVE:
            weightstore.save_shared(qmodel, dst, store)
        else:
            save_onnx_atomic(qmodel, dst)
        overrides = config.extra_options.get("TensorQuantOverrides", {})
        return {
            "file": dst.name,
            "opset": next(o.version for o in qmodel.opset_import if o.domain in ("", "ai.onnx")),
            "calibration_feeds": len(feeds),
            "matmul_precisions": mm,
            "per_channel_weights": resolved["per_channel_weights"],
            "nodes_excluded": resolved["nodes_to_exclude"],
            "patterns": resolved["patterns"],
            "layers": resolved["layers"],
            "tensors_overridden": {
                name: (_jsonable(v[0]) | {"scale": f"per channel ({len(v)}), chosen by "
                                                   f"{recipe.get('weight_rounding')}"}
                       if name in applied else _jsonable(v))
                for name, v in sorted(overrides.items())},
            **({"weights_rounded": len(applied)} if rounded else {}),
            **({"per_channel_not_blocks": by_channel} if by_channel else {}),
            "qdq_nodes": sum(
                n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in qmodel.graph.node
            ),
        }
    finally:
        root.removeHandler(handler)
        shutil.rmtree(work, ignore_errors=True)


#: why a weight whose input dimension is not a whole number of blocks is not block-quantized
BLOCKS_DO_NOT_FIT = ("its input dimension {k} is not a multiple of the block size {b}: the HTP "
                     "computes such a MatMul wrong (one MatMul measured on the simulator: "
                     "output cosine to the host QDQ graph -0.19 at 688 / 32, 0.9999 at 256 / 32)")


def _channels_where_blocks_do_not_fit(model, model_path: Path, block: int,
                                      init_overrides: dict[str, list[dict]]) -> dict[str, str]:
    """The block-wise 4-bit weights whose input dimension is not a whole number of blocks,
    given explicit per-channel scales instead (the quantizer's block size applies to every
    weight it computes scales for; one with its scales given keeps them): weight -> why."""
    import numpy as np
    from onnx import numpy_helper
    from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType

    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, str] = {}
    for w, rules in init_overrides.items():
        rule = rules[0] if rules else {}
        t = inits.get(w)
        if (t is None or len(t.dims) != 2 or rule.get("axis") != 0 or "scale" in rule
                or t.dims[0] % block == 0):
            continue
        values = numpy_helper.to_array(t, base_dir=str(Path(model_path).parent))
        qtype = rule["quant_type"]
        qmin, qmax = get_qmin_qmax_for_qType(qtype.tensor_type, symmetric=True)
        lo, hi = values.min(axis=0), values.max(axis=0)
        per: list[dict] = []
        for n in range(values.shape[1]):  # as the quantizer's own symmetric per channel
            _, sc = compute_scale_zp(lo[n:n + 1], hi[n:n + 1], qmin, qmax, symmetric=True)
            per.append({"scale": np.float32(np.asarray(sc).reshape(())), "zero_point": 0})
        per[0].update(quant_type=qtype, axis=1)
        init_overrides[w] = per
        out[w] = BLOCKS_DO_NOT_FIT.format(k=t.dims[0], b=block)
    return out


def _apply_rounding(model, model_path: Path, work: Path, external: bool,
                    init_overrides: dict[str, list[dict]], rounded: dict[str, Any]
                    ) -> tuple[Path, set[str]]:
    """Put the rounding's choices where the quantizer reproduces them: each rounded weight's
    FP32 values replaced by its dequantized integers and its per-channel override given the
    explicit scales (``round(q * s / s) = q``). Only weights this graph quantizes per channel
    with the same integer type (per-layer overrides win). Returns the graph to quantize and
    the weights applied."""
    import onnx
    from onnx import numpy_helper

    from studio.engine.rounding import rounding_targets

    targets = rounding_targets(model, init_overrides)
    apply = {w: r for w, r in rounded.items()
             if w in targets and targets[w].quant_type == r.quant_type}
    if not apply:
        return model_path, set()
    full = onnx.load(str(model_path))
    for init in full.graph.initializer:
        if init.name in apply:
            init.CopyFrom(numpy_helper.from_array(apply[init.name].dequantized(), init.name))
    for w, r in apply.items():
        init_overrides[w] = r.overrides()
    out = work / "rounded.onnx"
    if external:
        onnx.save_model(full, str(out), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=out.name + ".data")
    else:
        onnx.save_model(full, str(out))
    return out, set(apply)


def quantize_graph(src: Path, dst: Path, recipe: dict, feeds: list[dict],
                   progress: Progress = NullProgress()) -> dict[str, Any]:
    """Quantize any FP32 ONNX graph with static shapes (a CNN, an encoder, ...) into the QDQ
    graph ``dst`` for the HTP: the recipe's scheme, granularity and overrides, calibrated on
    ``feeds`` (at least one). Returns what was quantized."""
    if not feeds:
        raise StudioError("quantization needs calibration samples: give at least one")
    recipe = normalize_recipe(recipe)
    if is_float_scheme(recipe["scheme"]):
        raise StudioError(f"{recipe['scheme']} is not a quantization: run the float graph with "
                          "fp16 instead")
    rounded = None
    if recipe["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING:
        from studio.engine.rounding import Source, round_for_recipe

        work = Path(tempfile.mkdtemp(dir=Path(dst).parent, prefix=f".{Path(dst).stem}-round."))
        try:
            rounded, summary, _ = round_for_recipe(
                [Source(Path(src), feeds, [None] * len(feeds))], recipe, work,
                SubProgress(progress, 0.0, 0.5))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        progress = SubProgress(progress, 0.5, 1.0)
    info = _quantize_graph(Path(src), Path(dst), recipe, feeds, progress, rounded=rounded)
    info.pop("layers", None)
    if rounded is not None:
        info["rounding"] = summary
    return info


def quantize_like(src: Path, dst: Path, like: Path, recipe: dict, feeds: list[dict],
                  progress: Progress = NullProgress()) -> dict[str, Any]:
    """Quantize the FP32 graph ``src`` into ``dst`` with the recipe, its activations taking the
    scales of the quantized graph ``like`` wherever the tensor names match (an AR-N graph
    next to the decode graph: both then compute the same rows alike); ``feeds`` calibrate
    whatever ``like`` lacks; with a weight rounding other than nearest, the weights take the
    integers and scales ``like`` stores. Returns what was quantized and how many tensors were
    shared."""
    shared = activation_encodings(Path(like))
    recipe = normalize_recipe(recipe)
    rounded = None
    if recipe["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING:
        # the same integer weights as ``like`` (chosen there from its calibration inputs)
        from studio.engine.rounding import rounded_from_qdq

        rounded = rounded_from_qdq(Path(like))
    info = _quantize_graph(Path(src), Path(dst), recipe, feeds, progress,
                           shared=shared, rounded=rounded)
    info.pop("layers", None)
    info["shared_activations"] = sum(1 for t in info["tensors_overridden"] if t in shared)
    return info


def _uses_external_data(path: Path) -> bool:
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    return any(uses_external_data(t) for t in model.graph.initializer)


def _upgrade_opset(path: Path, work: Path, opset: int) -> Path:
    """``path`` (weights in external data) converted to ``opset`` without loading its
    weights: the converted graph is written into ``work`` beside links to its data files
    (:mod:`studio.engine.onnxlinks` lets onnx read linked external data; a copy of GBs was
    what this did before)."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    from studio.core.fsutil import link_or_copy

    model = onnx.load(str(path), load_external_data=False)
    if next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= opset:
        return path
    converted = onnx.version_converter.convert_version(model, opset)
    locations = {
        e.value
        for t in converted.graph.initializer if uses_external_data(t)
        for e in t.external_data if e.key == "location"
    }
    for loc in sorted(locations):
        src, dst = path.parent / loc, work / loc
        if not dst.exists():
            link_or_copy(src.resolve(), dst)
    out = work / f"opset{opset}.onnx"
    onnx.save_model(converted, str(out))
    return out


def weight_type_name(recipe: dict) -> str:
    """How a (normalized) recipe stores its weights, in words."""
    return {
        ("INT8", "per_tensor"): "QUInt8",
        ("INT8", "per_channel"): "QInt8 per channel (symmetric)",
        ("INT4", "per_channel"): "QInt4 per channel (symmetric)",
        ("INT4", "per_block"): f"QInt4 block-wise, {recipe['block_size']} per block "
                               "(LPBQ, symmetric)",
    }.get((weight_precision(recipe["scheme"]), recipe["weight_granularity"]),
          recipe["weight_granularity"])


def _jsonable(value):
    import numpy as np

    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return getattr(value, "name", str(value))


def _logit_cosine(ref, other) -> float:
    import numpy as np

    a = np.asarray(ref, dtype=np.float64).reshape(-1, ref.shape[-1])
    b = np.asarray(other, dtype=np.float64).reshape(-1, other.shape[-1])
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)
    return float(cos.mean())


def _self_check(graphs_dir: Path, out_dir: Path, pre_feed: dict, dec_feed: dict | None) -> dict:
    """Cosine of the quantized logits vs FP32 on one calibration feed of each graph (CPU)."""
    from studio.engine.llm_runtime import make_cpu_session

    res = {}
    for graph, feed in (("prefill", pre_feed), ("decode", dec_feed)):
        if feed is None:
            continue
        ref = make_cpu_session(graphs_dir / f"{graph}.onnx").run(["logits"], feed)[0]
        got = make_cpu_session(out_dir / f"{graph}.onnx").run(["logits"], feed)[0]
        if graph == "prefill":
            n = int(
                (feed["attention_mask"][0, 0, -1] == 0).sum()
            )  # the last real row sees n tokens
            ref, got = ref[:, :n], got[:, :n]
        res[f"{graph}_logits_cosine"] = _logit_cosine(ref, got)
    return res


def quantize_llm(
    graphs_dir: Path,
    out_dir: Path,
    recipe: dict,
    calibration_text: str,
    tokenizer_dir: Path,
    progress: Progress = NullProgress(),
    with_verify: bool = False,
    images: list[Any] | None = None,
) -> dict:
    """Quantize the FP32 graphs of ``graphs_dir`` into ``out_dir``; returns quant.json's
    content. ``with_verify``: the verify graph (speculative decoding) too, calibrated on the
    true next tokens of the calibration windows. A vision-language model's prefill and
    decode graphs are calibrated on image prompts too (``images``, [3, S, S] arrays; None:
    ``samples`` images generated here), and its vision encoder on those images
    (:func:`studio.engine.vision.quantize_vision`)."""
    from studio.engine import vision
    from studio.engine.calibration import build_calibration_feeds, calibration_windows
    from studio.engine.llm_export import load_spec

    graphs_dir, out_dir = Path(graphs_dir), Path(out_dir)
    recipe = normalize_recipe(recipe)
    spec = load_spec(graphs_dir)
    for g in GRAPHS:
        if not (graphs_dir / f"{g}.onnx").is_file():
            raise StudioError(f"{graphs_dir} has no {g}.onnx; re-run the export")
    if spec.get("dtype", "float32") != "float32" or "quantization" in spec:
        raise StudioError(
            f"{graphs_dir} holds already-quantized graphs; quantize the FP32 export instead"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    if out_dir.resolve() == graphs_dir.resolve():
        raise StudioError(
            "the quantized graphs need their own folder; choose an output folder other than the export"
        )
    info: dict[str, Any] = {
        "scheme": recipe["scheme"],
        "weight_granularity": recipe["weight_granularity"],
        "samples": recipe["samples"],
        "overrides": dict(recipe["given"]),
        "weight_rounding": recipe["weight_rounding"],
        **({"rounding_samples": recipe["rounding_samples"]}
           if recipe["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING else {}),
    }
    run_facts: dict[str, float] = {}
    vs = vision.vision_spec(spec)
    images = list(images or [])
    held_images: list[Any] = []
    if vs is not None:
        images = images or vision.calibration_images(
            int(recipe["samples"]), vs.image_size, seed=0)
        if not images:
            raise StudioError("a vision-language model is calibrated on images: give at least "
                              "one (quantization.calibration_images)")
        held_images = vision.calibration_images(2, vs.image_size, seed=1000)

    # Everything is written into a staging folder and moved into place at the end, so a
    # cancelled or failed run leaves no half-quantized graphs.
    stage = Path(tempfile.mkdtemp(dir=out_dir, prefix=".quantize."))
    try:
        if is_float_scheme(recipe["scheme"]):
            progress.update(0.1, f"{recipe['scheme']}: copying the float graphs")
            for f in sorted(graphs_dir.iterdir()):
                wanted = ("prefill.onnx", "decode.onnx", *(("verify.onnx",) if with_verify else ()),
                          WEIGHTS_FILE)
                if f.name.startswith(wanted) and f.is_file():
                    progress.check()
                    shutil.copyfile(f, stage / f.name)  # the stage is private: moved at the end
            if recipe["overrides"]:
                progress.log("FP16 scheme: overrides are ignored (every op runs in FP16)")
            if recipe["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING:
                progress.log(f"{recipe['scheme']} scheme: weight_rounding "
                             f"{recipe['weight_rounding']} is ignored (float weights)")
                info["weight_rounding"] = f"ignored ({recipe['scheme']} keeps float weights)"
            info.update(
                activation_type="float16 (on the HTP)",
                weight_type="float16 (on the HTP)",
                note="float graphs; run them on the HTP with enable_htp_fp16_precision=1",
                overrides_ignored=bool(recipe["overrides"]),
                graphs={g: {"file": f"{g}.onnx"} for g in GRAPHS},
            )
            if vs is not None:
                info["graphs"]["vision"] = vision.quantize_vision(
                    graphs_dir, stage, recipe, images, held_images)
        else:
            check_overrides(graphs_dir, recipe)  # before the slow part
            progress.update(0.0, "tokenizing the calibration text")
            P, C = int(spec["prompt_length"]), int(spec["context_length"])
            windows = calibration_windows(
                calibration_text,
                tokenizer_dir,
                length=C,
                count=recipe["samples"],
                min_length=min(C, P + 1),
            )
            progress.check()
            ver_feeds: list[dict] | None = [] if with_verify else None
            pre_feeds, dec_feeds = build_calibration_feeds(
                graphs_dir,
                spec,
                windows,
                SubProgress(progress, 0.02, 0.2),
                decode_per_window=recipe["decode_per_window"],
                verify_feeds=ver_feeds,
            )
            if vs is not None:  # image prompts: the image rows' ranges and the image's positions
                progress.update(0.18, f"calibration: {len(images)} image prompts through the "
                                      "FP32 encoder and graphs")
                img_pre, img_dec = vision.image_prompt_feeds(graphs_dir, spec, windows, images)
                pre_feeds += img_pre
                dec_feeds += img_dec
            progress.log(
                f"calibration: {len(windows)} windows of {len(windows[0])} tokens -> "
                f"{len(pre_feeds)} prefill and {len(dec_feeds)} decode feeds"
                + (f" ({len(images)} of them image prompts)" if vs is not None else "")
            )
            if not dec_feeds:
                raise StudioError(
                    "the calibration text gave no decode samples; give a longer calibration text"
                )
            rounded, a0 = None, 0.2
            if recipe["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING:
                from studio.engine.rounding import Source, prefill_rows, round_for_recipe

                progress.update(0.2, f"rounding the weights ({recipe['weight_rounding']})")
                # the layers' inputs: prompts of rounding_samples windows (prefill rows) and
                # the calibration's decode feeds (later positions)
                r_pre, _ = build_calibration_feeds(
                    graphs_dir, spec, calibration_windows(
                        calibration_text, tokenizer_dir, length=C,
                        count=recipe["rounding_samples"], min_length=min(C, P + 1)),
                    SubProgress(progress, 0.2, 0.22), decode_per_window=0)
                rounded, info["rounding"], seconds = round_for_recipe(
                    [Source(graphs_dir / "prefill.onnx", r_pre,
                            [prefill_rows(f) for f in r_pre]),
                     Source(graphs_dir / "decode.onnx", dec_feeds, [None] * len(dec_feeds))],
                    recipe, stage / ".rounding", SubProgress(progress, 0.22, 0.5))
                shutil.rmtree(stage / ".rounding", ignore_errors=True)
                run_facts["rounding_seconds"] = seconds
                a0 = 0.5
            info.update(
                activation_type=(
                    "QUInt16" if activation_bits(recipe["scheme"]) == 16 else "QUInt8"
                ),
                weight_type=weight_type_name(recipe),
                calibration={
                    "method": recipe["calibration_method"],
                    "windows": len(windows),
                    "window_tokens": len(windows[0]),
                    "prefill_feeds": len(pre_feeds),
                    "decode_feeds": len(dec_feeds),
                    "decode_positions": sorted(
                        int(f["position_ids"].reshape(-1)[0]) for f in dec_feeds
                    ),
                    **({"image_prompts": len(images)} if vs is not None else {}),
                },
                graphs={},
            )
            n_graphs = 3 if ver_feeds else 2
            cuts = [a0 + (0.9 - a0) * i / n_graphs for i in range(n_graphs + 1)]
            steps = [(g, f, cuts[i], cuts[i + 1]) for i, (g, f) in enumerate(
                (("prefill", pre_feeds), ("decode", dec_feeds),
                 *((("verify", ver_feeds),) if ver_feeds else ())))]
            with shared_store(stage) as store:
                for graph, feeds, a, b in steps:
                    progress.check()
                    progress.update(a, f"quantizing {graph}.onnx ({recipe['scheme']})")
                    info["graphs"][graph] = _quantize_graph(
                        graphs_dir / f"{graph}.onnx",
                        stage / f"{graph}.onnx",
                        recipe,
                        feeds,
                        SubProgress(progress, a, b),
                        shared=activation_encodings(stage / "decode.onnx")
                        if graph == "verify" else None,
                        rounded=rounded,
                        store=store,
                    )
                    progress.log(f"quantized {graph}.onnx: MatMuls "
                                 f"{info['graphs'][graph]['matmul_precisions']}")
            if vs is not None:
                progress.update(0.9, f"quantizing the vision encoder on {len(images)} images")
                info["graphs"]["vision"] = vision.quantize_vision(
                    graphs_dir, stage, recipe, images, held_images)
                progress.log("quantized vision.onnx: image rows vs FP32 cosine "
                             f"{info['graphs']['vision']['check']['encoder_cosine_min']:.4f} "
                             "(lowest of 2 held-out images)")
            progress.update(0.92, "checking the quantized graphs against FP32 (CPU)")
            info["check"] = _self_check(graphs_dir, stage, pre_feeds[0], dec_feeds[-1])
            progress.log(
                "quantized vs FP32 logits cosine on a calibration sample: "
                + ", ".join(f"{k} {v:.4f}" for k, v in info["check"].items())
            )

        for f in sorted(stage.iterdir()):
            os.replace(f, out_dir / f.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if "decode" in info.get("graphs", {}) and "layers" in info["graphs"]["decode"]:
        # what each weighted layer got, as applied (the decode graph has every layer)
        info["layers"] = info["graphs"]["decode"]["layers"]
        for g in info["graphs"].values():
            g.pop("layers", None)
    qspec = dict(spec)
    qspec["quantization"] = {
        k: info[k] for k in ("scheme", "weight_granularity", "activation_type", "weight_type")
    }
    atomic_write_json(out_dir / "graph.json", qspec)
    atomic_write_json(out_dir / "quant.json", info)
    progress.update(1.0, f"{recipe['scheme']} graphs written")
    out = json.loads(json.dumps(info))
    if run_facts:  # not in quant.json: timings are run facts
        out["run_facts"] = run_facts
    return out
