"""The quantization recipe: one vocabulary, one set of defaults, one override rule.

Every reader calls this module: the project file's validation, the quantize stage, the
Precision page, ``studio info`` and the report. Nothing else defines a scheme, a precision,
a default or the rule that decides which layers a pattern covers.

Layers are named by their module path, as Hugging Face names them
(``model.layers.3.mlp.down_proj``); an ONNX node ``/model/layers.3/mlp/down_proj/MatMul``
belongs to that layer (:func:`module_of_node`).

**The override rule.** A pattern is a case-sensitive glob (``fnmatch``). It *covers* a layer
when it matches the layer's module path, or a module above it (``model.layers.3`` covers
every layer of block 3), and it may leave out leading parts of the path (``layers.3``,
``mlp.down_proj``, ``*.down_proj``). A pattern ending in ``.weight`` is *weight-only*: it
sets the precision of the weights of the layers it covers and leaves their activations
alone. Otherwise a pattern sets what the layer computes: ``INT8`` / ``INT16`` its output
activations, ``INT4`` its weights, ``FP16`` / ``FP32`` leaves the layer unquantized.
When several patterns cover a layer, the one written last in the project file wins: a float
pattern takes the whole layer out of quantization, and a quantized pattern written after it
puts the layer back (scheme defaults, then that pattern).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from studio.core.errors import StudioError

SCHEMES: tuple[str, ...] = ("W8A16", "W8A8", "W4A16", "FP16")
# per_block: block-wise (LPBQ) INT4 weights, blocks of ``block_size`` along the input axis
GRANULARITIES: tuple[str, ...] = ("per_tensor", "per_channel", "per_block")
CALIBRATION_METHODS: tuple[str, ...] = ("MinMax", "Entropy", "Percentile")
# how the integer weights of per-channel layers are chosen: round to nearest on MinMax scales
# (what the quantizer does by itself), or from calibration data (studio.engine.rounding)
WEIGHT_ROUNDINGS: tuple[str, ...] = ("nearest", "seqmse", "adaround", "gptq", "seqmse_gptq")
DEFAULT_WEIGHT_ROUNDING = "nearest"
# the calibration windows the rounding collects its layer inputs on (more than the activation
# ranges need: a layer's output error is fitted on them)
DEFAULT_ROUNDING_SAMPLES = 32
WEIGHT_ROUNDING_HELP = {
    "nearest": "round to nearest on MinMax scales (the quantizer's own)",
    "seqmse": "per output channel, the clipping range that minimises the layer's output error "
              "on calibration inputs (AIMET's SeqMSE)",
    "adaround": "each weight rounded up or down as learned to minimise the layer's output "
                "error on calibration inputs (AdaRound, Nagel et al. 2020)",
    "gptq": "weights quantized one input row at a time, the rounding error of each pushed onto "
            "the rows not yet quantized through the inverse input Gram matrix (GPTQ, Frantar "
            "et al. 2022), on MinMax scales",
    "seqmse_gptq": "SeqMSE's clipping ranges, then GPTQ's rounding on them (measured best on "
                   "tiny-coder W4A16)",
}
# the KV cache as graph I/O: "float" (quantized at the graph edge every step on the HTP) or
# "int8" (uint8 I/O with per-head scales: a quarter of FP32, half of a 16-bit cache)
KV_CACHE_KINDS: tuple[str, ...] = ("float", "int8")
#: activations: one static scale per tensor (what the HTP runs), or one per token (dynamic)
ACTIVATION_GRANULARITIES: tuple[str, ...] = ("per_tensor", "per_token")
#: why per-token activations are refused (found on the QNN EP here: see the README)
PER_TOKEN_REFUSAL = (
    "quantization.activation_granularity per_token cannot run on the HTP: its activation "
    "scales are fixed when the graph is compiled, and the QNN EP refuses the dynamic "
    "DynamicQuantizeLinear / MatMulInteger that per-token scales need; 16-bit activations "
    "(scheme W8A16 or W4A16, per_tensor) come closest")
BLOCK_SIZES: tuple[int, ...] = (16, 32, 64, 128)
#: the smallest block the HTP's block-quant optimization computes right (measured on the
#: simulator, one MatMul): smaller blocks compile without it (right, slower)
LPBQ_OPTIMIZED_FROM = 32
PRECISIONS: tuple[str, ...] = ("INT4", "INT8", "INT16", "FP16", "FP32")
# the way past nodes the HTP refuses (ONNX graphs and encoders): fail naming them, let the
# CPU take them, or apply the catalogue of equivalent rewrites first
PLACEMENTS: tuple[str, ...] = ("strict", "partition", "rewrite")
PLACEMENT_HELP = {
    "strict": "every node on the NPU, or the run fails listing the refused nodes and why",
    "partition": "the CPU takes the refused nodes; NPU↔CPU transitions and their bytes shown",
    "rewrite": "known equivalent rewrites (e.g. Erf-GELU → Gelu), each checked numerically",
}
FLOAT_PRECISIONS: tuple[str, ...] = ("FP16", "FP32")

SCHEME_HELP = {
    "W8A16": "8-bit weights, 16-bit activations: the usual start for LLMs on the HTP",
    "W8A8": "8-bit weights and activations: smallest and fastest, most accuracy loss",
    "W4A16": "4-bit weights (per channel, or block-wise LPBQ), 16-bit activations: the "
             "usual LLM deployment on Snapdragon; validate accuracy",
    "FP16": "16-bit float weights and activations (on chips with FP16 support)",
}
GRANULARITY_HELP = {
    "per_tensor": "one scale per weight tensor (4-bit per tensor loses a lot: avoid with W4A16)",
    "per_channel": "one scale per output channel",
    "per_block": "block-wise (LPBQ): one scale per block of input channels; 4-bit weights only. "
                 "A weight whose inputs are not a whole number of blocks stays per channel "
                 "(the HTP computes it wrong otherwise); on tiny-coder it beats per channel "
                 "on the HTP simulator (top-1 86.5 vs 84.4 %)",
}
# scheme -> (weight precision, activation precision)
SCHEME_PRECISIONS: dict[str, tuple[str, str]] = {
    "W8A16": ("INT8", "INT16"),
    "W8A8": ("INT8", "INT8"),
    "W4A16": ("INT4", "INT16"),
    "FP16": ("FP16", "FP16"),
}

#: bits per value of each precision
PRECISION_BITS: dict[str, int] = {"INT4": 4, "INT8": 8, "INT16": 16, "FP16": 16, "FP32": 32}


def is_float_precision(precision: str) -> bool:
    """FP16 / FP32: a layer kept in float (no quantization)."""
    return precision in FLOAT_PRECISIONS


def weight_precision(scheme: str) -> str:
    """The precision a scheme gives every layer's weights (``W4A16`` -> ``INT4``)."""
    return SCHEME_PRECISIONS[scheme][0]


def activation_precision(scheme: str) -> str:
    """The precision a scheme gives every layer's activations (``W8A8`` -> ``INT8``)."""
    return SCHEME_PRECISIONS[scheme][1]


def is_float_scheme(scheme: str) -> bool:
    """Whether a scheme keeps the model in float (FP16): no quantization, no calibration, no
    per-layer overrides, a float KV cache, and a target whose HTP runs float."""
    return scheme in SCHEME_PRECISIONS and is_float_precision(activation_precision(scheme))


def weight_bits(scheme: str) -> int:
    """Bits per weight under a scheme (4 for W4A16: the scheme block-wise LPBQ weights need)."""
    return PRECISION_BITS[weight_precision(scheme)]


def activation_bits(scheme: str) -> int:
    """Bits per activation under a scheme (16 for W8A16 / W4A16: 16-bit quantized graphs)."""
    return PRECISION_BITS[activation_precision(scheme)]


def table_bits(scheme: str, embedding: str = "auto") -> int:
    """Bits per entry of the token embedding table (a Gather's data, not a MatMul weight):
    ``auto`` stores it as the quantizer does, at the activations' width (measured: the 8 B
    shape's table is UINT16 under W4A16, beside INT4 MatMul weights); ``INT8`` (the setting
    ``quantization.embedding``) at 8 bits. A float scheme keeps it at its float width."""
    if embedding == "INT8" and not is_float_scheme(scheme):
        return 8
    return PRECISION_BITS[activation_precision(scheme)]


#: ``quantization.embedding``: the token embedding table's precision
EMBEDDING_PRECISIONS: tuple[str, ...] = ("auto", "INT8")

#: the schemes that quantize (every scheme but the float one)
QUANTIZED_SCHEMES: tuple[str, ...] = tuple(s for s in SCHEMES if not is_float_scheme(s))

DEFAULT_SCHEME = "W8A16"
DEFAULT_GRANULARITY = "per_channel"
DEFAULT_CALIBRATION_SAMPLES = 8
DEFAULT_CALIBRATION_METHOD = "MinMax"
DEFAULT_BLOCK_SIZE = 32

# The accuracy gates every new project starts with (validate fails the batch below them).
DEFAULT_GATES: dict[str, float] = {
    "min_logits_cosine": 0.99,
    "max_perplexity_increase": 0.05,
    "min_top1_agreement": 0.9,
    # graphs other than causal LMs: the worst output cosine against FP32 over the validation
    # samples, and for encoders the retrieval queries whose top document stays the same
    "min_output_cosine": 0.95,
    "min_ranking_top1": 0.75,
}
GATE_HELP = {
    "min_logits_cosine": "mean cosine of the logits against FP32 (0 to 1)",
    "max_perplexity_increase": "largest allowed relative perplexity increase (0.05 = +5 %)",
    "min_top1_agreement": "teacher-forced top-1 token agreement with FP32 (0 to 1)",
    "min_output_cosine": "graphs: the worst output cosine against FP32 on the validation samples",
    "min_ranking_top1": "encoders: retrieval queries whose top document matches FP32 (0 to 1)",
}


def module_of_node(node_name: str) -> str:
    """``/model/layers.0/mlp/up_proj/MatMul`` -> ``model.layers.0.mlp.up_proj``."""
    parts = [p for p in node_name.split("/") if p]
    return ".".join(parts[:-1])


#: Key activations that are not modules of their own, named as pseudo-layers without weights
#: under the module that computes them (``model.layers.3.self_attn.scores``): patterns reach
#: them by these names (``*.self_attn.scores`` = INT16) and the layer grid shows them.
ACTIVATION_POINTS: dict[str, str] = {
    "self_attn.scores": "attention scores (Q·Kᵀ, the input of the softmax chain)",
    "self_attn.softmax": "attention probabilities (the softmax output)",
    "residual": "the residual stream (the block's residual adds)",
}
_BLOCK = re.compile(r"(?P<block>.*\.layers\.\d+)(?P<attn>\.self_attn)?")


def activation_point(node_name: str) -> str | None:
    """The pseudo-layer of an ONNX node that computes a key activation, else None:
    ``/model/layers.0/self_attn/MatMul`` (Q·Kᵀ) -> ``model.layers.0.self_attn.scores``,
    ``…/self_attn/Softmax`` -> ``….self_attn.softmax``, ``/model/layers.0/Add_1`` ->
    ``model.layers.0.residual``."""
    module = module_of_node(node_name)
    op = node_name.rstrip("/").rsplit("/", 1)[-1]
    m = _BLOCK.fullmatch(module)
    if m is None:
        return None
    if m.group("attn"):
        if op == "MatMul":  # the first MatMul of the attention module (not a projection's)
            return module + ".scores"
        if re.fullmatch(r"Softmax(_\d+)?", op):
            return module + ".softmax"
        return None
    if re.fullmatch(r"Add(_\d+)?", op):
        return module + ".residual"
    return None


def activation_points(block_prefix: str) -> list[str]:
    """The pseudo-layers of one transformer block (``model.layers.3``)."""
    return [f"{block_prefix}.{p}" for p in ACTIVATION_POINTS]


def block_prefix(layer: str) -> str | None:
    """``model.layers.3.mlp.up_proj`` -> ``model.layers.3``; None outside the blocks."""
    m = re.match(r"(.*?\.layers\.\d+)(\.|$)", layer)
    return m.group(1) if m else None


def is_weight_only(pattern: str) -> bool:
    return pattern.endswith(".weight")


def covers(pattern: str, layer: str) -> bool:
    """Whether ``pattern`` covers the layer (or weight) ``layer``: see the module docstring."""
    if not pattern or not layer:
        return False
    if is_weight_only(pattern):
        layer = layer if layer.endswith(".weight") else layer + ".weight"
        return fnmatch.fnmatchcase(layer, pattern) or fnmatch.fnmatchcase(layer, "*." + pattern)
    return any(
        fnmatch.fnmatchcase(layer, p)
        for p in (pattern, pattern + ".*", "*." + pattern, "*." + pattern + ".*")
    )


@dataclass(frozen=True)
class LayerPrecision:
    """What one layer ends up with, and why."""

    layer: str
    weight: str  # INT4 / INT8 / INT16 / FP16 / FP32, or "" for a layer without weights
    activation: str
    weight_rule: str  # "scheme W8A16 (per_channel)" or "override 'pattern'"
    activation_rule: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def effective_precision(layer: str, scheme: str, granularity: str,
                        overrides: dict[str, str], has_weight: bool = True) -> LayerPrecision:
    """The weight and activation precision of one layer under a recipe, with the rule that
    set each. Later overrides win over earlier ones; a weight-only pattern sets weights."""
    w, a = SCHEME_PRECISIONS[scheme]
    base = f"scheme {scheme}" + (f" ({granularity})" if not is_float_scheme(scheme) else "")
    w_rule = a_rule = base
    if not is_float_scheme(scheme):
        for pattern, prec in overrides.items():
            if not covers(pattern, layer):
                continue
            rule = f"override {pattern!r}"
            if is_float_precision(w) and not is_float_precision(prec):
                # a quantized pattern after a float one: the layer is quantized again
                (w, a), w_rule, a_rule = SCHEME_PRECISIONS[scheme], base, base
            if is_weight_only(pattern):
                w, w_rule = prec, rule
            elif is_float_precision(prec):
                w, a, w_rule, a_rule = prec, prec, rule, rule
            elif prec == "INT4":
                w, w_rule = prec, rule
            else:
                a, a_rule = prec, rule
    if not has_weight:
        w, w_rule = "", ""
    return LayerPrecision(layer, w, a, w_rule, a_rule)


def effective_precisions(layers: list[str], quantization: Mapping[str, Any],
                         weighted: set[str] | None = None) -> list[LayerPrecision]:
    """:func:`effective_precision` for every layer, from a project's ``[quantization]``."""
    return [
        effective_precision(
            name, quantization["scheme"], quantization["weight_granularity"],
            quantization.get("overrides") or {},
            has_weight=weighted is None or name in weighted,
        )
        for name in layers
    ]


def unmatched_patterns(layers: list[str], overrides: dict[str, str]) -> list[str]:
    """Override patterns that cover none of ``layers``."""
    return [p for p in overrides if not any(covers(p, name) for name in layers)]


def check_recipe(quantization: Mapping[str, Any]) -> None:
    """One-line errors for the combinations a ``[quantization]`` table cannot hold and for
    its override rules (its vocabulary, each setting's choices, is declared in
    :mod:`studio.core.settings`, which calls this)."""
    q = quantization
    scheme, granularity = q["scheme"], q["weight_granularity"]
    if q.get("activation_granularity", "per_tensor") == "per_token":
        raise StudioError(PER_TOKEN_REFUSAL)
    if q["kv_cache"] == "int8" and is_float_scheme(scheme):
        raise StudioError(f"quantization.kv_cache int8 needs an integer scheme "
                          f"({', '.join(QUANTIZED_SCHEMES)}): {scheme} graphs keep a float cache")
    if weight_bits(scheme) == 4 and granularity == "per_tensor":
        raise StudioError(
            f"{scheme} with per_tensor weights loses too much accuracy (one 4-bit scale per "
            "tensor); choose weight_granularity per_channel or per_block"
        )
    rounding = q.get("weight_rounding", DEFAULT_WEIGHT_ROUNDING)
    if rounding != DEFAULT_WEIGHT_ROUNDING and not is_float_scheme(scheme) \
            and granularity != "per_channel":
        raise StudioError(
            f"quantization.weight_rounding {rounding} works on per-channel weights: set "
            f"weight_granularity per_channel (it is {granularity}), or weight_rounding nearest"
        )
    if granularity == "per_block" and weight_bits(scheme) != 4:
        four = ", ".join(s for s in SCHEMES if weight_bits(s) == 4)
        raise StudioError(
            "quantization.weight_granularity per_block (LPBQ) is for 4-bit weights: use it "
            f"with scheme {four}, or choose per_channel"
        )
    vision = q.get("vision_scheme") or ""
    if vision and is_float_scheme(vision) != is_float_scheme(scheme):
        raise StudioError(
            f"quantization.vision_scheme {vision} with scheme {scheme}: the vision encoder runs "
            "float (FP16) exactly when the language model does; leave vision_scheme empty or "
            "choose " + ", ".join(x for x in SCHEMES
                                  if is_float_scheme(x) == is_float_scheme(scheme)))
    for key in ("overrides", "vision_overrides"):
        for pattern, prec in (q.get(key) or {}).items():
            if not str(pattern).strip():
                raise StudioError(
                    f"quantization.{key} has an empty pattern: name layers (globs allowed)"
                )
            if prec not in PRECISIONS:
                raise StudioError(
                    f"quantization.{key}[{pattern!r}] = {prec!r} is not one of "
                    f"{', '.join(PRECISIONS)}"
                )
            if is_weight_only(pattern) and is_float_precision(prec):
                *ints, last = (x for x in PRECISIONS if not is_float_precision(x))
                raise StudioError(
                    f"quantization.{key}[{pattern!r}] = {prec!r}: a weight-only pattern "
                    f"takes {', '.join(ints)} or {last}"
                )


def covers_node(pattern: str, node_name: str) -> bool:
    """Whether ``pattern`` covers an ONNX node: by the node's own name
    (``/lm_head/MatMul``) or by the layer (module) it belongs to."""
    if is_weight_only(pattern):
        return False
    if fnmatch.fnmatchcase(node_name, pattern) or covers(pattern, module_of_node(node_name)):
        return True
    point = activation_point(node_name)
    return point is not None and covers(pattern, point)


# ---- what the target HTP can run ----------------------------------------------------------------
#: What an edit of one layer sets: its weights, the activations it computes, or both (the
#: whole layer; FP16 / FP32 keep a layer in float, which is always the whole layer).
PARTS: tuple[str, ...] = ("weights", "activations", "layer")
PART_TITLES = {"weights": "weights", "activations": "activations", "layer": "whole layer"}


def _float_chips(chips) -> list:
    return [c for c in chips if not getattr(c, "fp16", True)]


def refusal(part: str, precision: str, *, has_weight: bool = True, chips=(),
            scheme: str | None = None, layer: str = "", act_bits: int | None = None
            ) -> str | None:
    """Why the HTP of the project's targets cannot run ``precision`` for ``part`` of a layer
    (one readable sentence), or None when it can. ``chips`` are the targets' catalog entries
    (:class:`studio.core.catalog.Chip`); ``has_weight`` whether the layer stores weights.

    The rules: INT4 is for weights only (HTP activations are 8- or 16-bit, or float); weights
    alone cannot be float (a float layer is float throughout); a layer without weights has no
    weight precision; FP16 / FP32 need a target whose HTP runs float (the catalog's ``fp16``);
    the FP16 scheme keeps every layer in float and ignores per-layer overrides; the HTP's
    MatMul takes no 16-bit weights under 16-bit activations (``act_bits``: the bits of the
    layers' input activations, the scheme's when not given)."""
    what = f"{layer}: " if layer else ""
    if act_bits is None and scheme is not None and not is_float_scheme(scheme):
        act_bits = activation_bits(scheme)
    if part not in PARTS:
        return f"{what}unknown part {part!r}: choose one of {', '.join(PARTS)}"
    if precision not in PRECISIONS:
        return f"{what}{precision!r} is not one of {', '.join(PRECISIONS)}"
    if scheme is not None and is_float_scheme(scheme):
        return (f"the {scheme} scheme keeps every layer in float and ignores per-layer "
                f"overrides: choose a quantized scheme ({', '.join(QUANTIZED_SCHEMES)}) first")
    if precision == "INT4" and part != "weights":
        return (f"{what}INT4 is for weights only on the HTP: activations are INT8 or INT16 "
                "(or FP16 on chips with float support); set INT4 on the weights")
    if part == "weights" and is_float_precision(precision):
        return (f"{what}weights alone cannot be float: {precision} keeps the whole layer in "
                "float (choose 'whole layer'), or give the weights INT4, INT8 or INT16")
    if part == "weights" and not has_weight:
        return (f"{what}this layer has no weights (an activation, a norm or the embedding "
                "lookup): set its activations instead")
    if (part in ("weights", "layer") and precision == "INT16" and has_weight
            and act_bits == 16):
        return (f"{what}the HTP's MatMul does not run 16-bit weights under 16-bit activations "
                "(the scheme's): give the weights INT8 or INT4"
                + (", and the activations INT16 alone" if part == "layer" else ""))
    if is_float_precision(precision):
        no_float = _float_chips(chips)
        if no_float:
            names = ", ".join(f"{c.name} ({c.key})" for c in no_float)
            return (f"{what}{precision} needs float support on the HTP, and the target {names} "
                    "has none (its catalog entry says fp16 = false): keep the layer quantized "
                    "(INT16 is the most precise), or drop that target")
    return None


def scheme_refusal(scheme: str, chips=()) -> str | None:
    """Why the targets cannot run ``scheme`` (the FP16 scheme needs float on the HTP)."""
    if not is_float_scheme(scheme):
        return None
    no_float = _float_chips(chips)
    if not no_float:
        return None
    names = ", ".join(f"{c.name} ({c.key})" for c in no_float)
    return (f"the {scheme} scheme needs float support on the HTP, and the target {names} has "
            "none (its catalog entry says fp16 = false): choose a quantized scheme (W8A16 is "
            "the usual start), or drop that target")


def htp_refusals(htp, chip) -> list[str]:
    """Why ``chip`` cannot take the recipe's ``[htp]`` options (``htp``: the section): a VTCM
    budget over the chip's, FP16 relaxation on an HTP without FP16. The compile refuses
    them; ``studio doctor`` names them before anything runs."""
    out = []
    if htp["vtcm_mb"] > chip.vtcm_mb:
        out.append(f"htp.vtcm_mb = {htp['vtcm_mb']} is more than the {chip.vtcm_mb} MB of "
                   f"VTCM {chip.name} has: use 1..{chip.vtcm_mb} (0: all of it)")
    if htp["fp16_relaxation"] and not chip.fp16:
        out.append(f"htp.fp16_relaxation: the HTP of {chip.name} runs no FP16; set it to "
                   "false for this target")
    return out


def override_part(pattern: str, precision: str) -> str:
    """What an override rule sets (see the module docstring): ``weights`` for a weight-only
    pattern or INT4, ``layer`` for FP16 / FP32, else ``activations``."""
    if is_weight_only(pattern) or precision == "INT4":
        return "weights"
    return "layer" if is_float_precision(precision) else "activations"


def override_refusal(pattern: str, precision: str, weighted: dict[str, bool], chips=(),
                     act_bits: int | None = None) -> str | None:
    """Why an override rule cannot run on the targets, or None. ``weighted`` maps every layer
    the recipe can set (and key activation) to whether it stores weights; a rule that covers
    none of them is not refused here (:func:`unmatched_patterns` names it)."""
    if not str(pattern).strip():
        return "the pattern is empty: name layers (globs allowed), e.g. *.down_proj"
    part = override_part(pattern, precision)
    covered = [name for name in weighted if covers(pattern, name)]
    has_weight = not covered or any(weighted[name] for name in covered)
    why = refusal(part, precision, has_weight=has_weight, chips=chips, act_bits=act_bits)
    if why and part == "weights" and not has_weight:
        return (f"{pattern!r} = {precision} sets weights, and the {len(covered)} layer(s) it "
                f"covers have none ({covered[0]}{', …' if len(covered) > 1 else ''}): give them "
                "INT8 / INT16 activations instead")
    return f"{pattern!r} = {precision}: {why}" if why else None
