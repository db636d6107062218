"""The quantization recipe and what it names in a graph (:mod:`studio.engine.quantize` runs it).

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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
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

onnx = lazy_module("onnx")
ortq = lazy_module("onnxruntime.quantization")

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
DTYPE_BITS = {"uint8": 8, "int8": 8, "uint16": 16, "int16": 16, "uint4": 4, "int4": 4}


# ---------------------------------------------------------------------------- the recipe


def normalize_recipe(recipe: dict) -> dict:
    """Check a recipe and fill in defaults; StudioError on anything unusable."""
    if not isinstance(recipe, dict):
        raise StudioError("the quantization recipe must be a table with at least a scheme")
    unknown = set(recipe) - RECIPE_KEYS
    if unknown:
        raise StudioError(
            f"unknown quantization setting(s) {', '.join(sorted(unknown))}; "
            "use scheme, weight_granularity, samples, overrides"
        )
    scheme, gran, samples, per_window = _scheme_and_samples(recipe)
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
    rounding, r_samples = _rounding(recipe, scheme, gran)
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


#: the settings a recipe may hold
RECIPE_KEYS = frozenset({
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
})


def _scheme_and_samples(recipe: dict) -> tuple[str, str, int, int]:
    """The recipe's scheme, weight granularity, calibration samples and decode feeds per
    window, checked."""
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
    return scheme, gran, samples, per_window


def _rounding(recipe: dict, scheme: str, gran: str) -> tuple[str, int]:
    """The recipe's weight rounding and its samples, checked."""
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
    return rounding, r_samples


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


def float_tensors(model) -> set[str]:
    typed = onnx.shape_inference.infer_shapes(model)
    out = set()
    for v in (*typed.graph.value_info, *typed.graph.output, *typed.graph.input):
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            out.add(v.name)
    return out


def matmul_weights(model) -> dict[str, str]:
    """MatMul weight initializer -> the MatMul node's name (weights as input 1)."""
    inits = {t.name: t for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in inits:
            if len(inits[node.input[1]].dims) == 2:
                out[node.input[1]] = node.name
    return out


@dataclass(frozen=True)
class GraphFacts:
    """What resolving a recipe reads of a graph, whatever the recipe: its MatMul weights, its
    float tensors (a whole shape inference) and its attention-score chains. Computed once
    for a graph resolved against many recipes (the sensitivity analysis resolves one per
    variant: about a hundred on the sample); read only."""

    weights: dict[str, str]
    floats: set[str]
    chains: dict[str, list]

    @classmethod
    def of(cls, model) -> GraphFacts:
        return cls(matmul_weights(model), float_tensors(model), _score_chains(model))


def resolve_overrides(model, recipe: dict, facts: GraphFacts | None = None) -> dict:
    """Map the recipe to the ORT quantizer's tensor overrides for one graph (``facts``: the
    graph's :class:`GraphFacts`, when the caller resolves several recipes on it).

    Returns ``{"init_overrides", "nodes_to_exclude", "patterns", "per_channel_weights"}``
    where ``patterns`` says what each pattern covered in this graph.
    """
    act16 = activation_bits(recipe["scheme"]) == 16
    facts = facts or GraphFacts.of(model)
    weights = facts.weights
    rules = _Rules(model, facts)
    for pattern, prec in recipe["overrides"].items():
        rules.apply(pattern, prec)
    _check_htp_matmuls(model, weights, rules, "INT16" if act16 else "INT8")
    init_overrides, per_channel = _init_overrides(model, recipe, weights, rules, act16)
    exclude = rules.exclude
    for name in [n for n in rules.weight_prec if rules.weight_prec[n] == "FLOAT"]:
        for node in model.graph.node:
            if name in node.input:
                exclude.setdefault(node.name, rules.weight_rule[name])
    return {
        "init_overrides": init_overrides,
        "nodes_to_exclude": sorted(exclude),
        "patterns": rules.report,
        "per_channel_weights": per_channel,
        "layers": _applied_layers(model, recipe, weights, rules.weight_prec, rules.weight_rule,
                                  rules.act_prec, rules.act_rule, exclude),
    }


class _Rules:
    """The recipe's override patterns applied in order to one graph: each weight's and
    activation's precision and the pattern that set it, the nodes left float, and what
    each pattern covered (``report``)."""

    def __init__(self, model, facts: GraphFacts) -> None:
        self.model, self.weights = model, facts.weights
        self.inits = {t.name for t in model.graph.initializer}
        self.floats = facts.floats
        self.chains = facts.chains
        self.weight_prec: dict[str, str] = {}
        self.act_prec: dict[str, str] = {}
        self.weight_rule: dict[str, str] = {}  # tensor / node -> the pattern that set it
        self.act_rule: dict[str, str] = {}
        self.exclude: dict[str, str] = {}  # node -> pattern
        self.report: dict[str, dict] = {}

    def apply(self, pattern: str, prec: str) -> None:
        """One pattern: the nodes it covers (with their score chains), else the weights it
        names."""
        nodes = [] if is_weight_only(pattern) else [
            n for n in self.model.graph.node
            if n.op_type != "Constant" and covers_node(pattern, n.name)
        ]
        named = {n.name for n in nodes}
        nodes += [c for n in list(nodes) for c in self.chains.get(n.name, [])
                  if c.name not in named]
        named_inits = sorted(i for i in self.inits if covers(pattern, i))
        entry: dict[str, Any] = {"precision": prec, "nodes": len(nodes), "tensors": []}
        if nodes:
            for n in nodes:
                self.on_node(n, pattern, prec, entry)
        elif named_inits:
            for w in named_inits:
                self.weight_prec[w] = prec
                self.weight_rule[w] = pattern
                entry["tensors"].append(w)
                if prec != "FLOAT" and self.weights.get(w) in self.exclude:
                    self.exclude.pop(self.weights[w])  # its MatMul is quantized again
        self.report[pattern] = entry

    def on_node(self, n, pattern: str, prec: str, entry: dict[str, Any]) -> None:
        """A covered node: left float (superseding earlier patterns), its MatMul weight at
        INT4, or its float outputs at ``prec``."""
        weights = self.weights
        if prec == "FLOAT":
            # float supersedes what earlier patterns set on this node
            self.exclude[n.name] = pattern
            for t in n.output:
                self.act_prec.pop(t, None)
                self.act_rule.pop(t, None)
            if n.op_type == "MatMul" and n.input[1] in weights:
                self.weight_prec.pop(n.input[1], None)
                self.weight_rule.pop(n.input[1], None)
            entry["tensors"].extend(o for o in n.output if o in self.floats)
            return
        self.exclude.pop(n.name, None)  # a later quantized pattern re-quantizes the node
        if prec == "INT4":
            if n.op_type == "MatMul" and n.input[1] in weights:
                self.weight_prec[n.input[1]] = "INT4"
                self.weight_rule[n.input[1]] = pattern
                entry["tensors"].append(n.input[1])
        else:
            for o in n.output:
                if o in self.floats and o not in self.inits:
                    self.act_prec[o] = prec
                    self.act_rule[o] = pattern
                    entry["tensors"].append(o)


def _check_htp_matmuls(model, weights: dict[str, str], rules: _Rules, act_default: str
                       ) -> None:
    """HTP MatMul: no 16-bit weight under a 16-bit activation."""
    for w, prec in rules.weight_prec.items():
        if prec != "INT16" or w not in weights:
            continue
        node = next(n for n in model.graph.node if n.name == weights[w])
        a = node.input[0]
        a_prec = rules.act_prec.get(a, act_default)
        if a_prec == "INT16":
            raise StudioError(
                f"override makes weight {w} 16-bit under 16-bit activations, which the HTP MatMul "
                "does not run; keep MatMul weights INT8 (or make the activations INT8)"
            )


def _init_overrides(model, recipe: dict, weights: dict[str, str], rules: _Rules,
                    act16: bool) -> tuple[dict[str, list[dict]], int]:
    """The quantizer's tensor overrides: activations off the scheme's type, each MatMul
    weight's type and axis (per channel or in blocks), other named weights, the token
    table at 8 bits where the recipe says; and the count of per-channel weights."""
    qtype = {
        "INT8": ortq.QuantType.QUInt8,
        "INT16": ortq.QuantType.QUInt16,
    }
    init_overrides: dict[str, list[dict]] = {}
    default_act = ortq.QuantType.QUInt16 if act16 else ortq.QuantType.QUInt8
    for name, prec in rules.act_prec.items():
        if qtype[prec] != default_act:
            init_overrides[name] = [{"quant_type": qtype[prec]}]
    per_channel = 0
    w_default = weight_precision(recipe["scheme"])
    blocked = recipe["weight_granularity"] == "per_block"
    for w in weights:
        prec = rules.weight_prec.get(w) or w_default
        if prec == "FLOAT" or weights[w] in rules.exclude:
            continue
        if prec == "INT4":
            # per channel (axis 1 of the [in, out] MatMul weight), or block-wise along the
            # input axis (LPBQ; the block size is the quantizer's BlockSize option)
            init_overrides[w] = [{"quant_type": ortq.QuantType.QInt4, "axis": 0 if blocked else 1,
                                  "symmetric": True}]
            per_channel += 1
        elif prec == "INT16":
            init_overrides[w] = [{"quant_type": ortq.QuantType.QUInt16}]
        elif recipe["weight_granularity"] in ("per_channel", "per_block"):
            init_overrides[w] = [{"quant_type": ortq.QuantType.QInt8, "axis": 1, "symmetric": True}]
            per_channel += 1
    for name, prec in rules.weight_prec.items():
        if name not in weights and prec in ("INT8", "INT16"):
            init_overrides[name] = [{"quant_type": qtype[prec]}]
    table = embedding_table(model) if recipe.get("embedding", "auto") == "INT8" else None
    if table is not None:  # quantization.embedding = "INT8": the token table at 8 bits
        init_overrides[table] = [{"quant_type": ortq.QuantType.QUInt8}]
    return init_overrides, per_channel


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
        return str(DTYPE_BITS.get(dt, "?")), const

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
