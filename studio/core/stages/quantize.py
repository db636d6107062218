"""The quantize stage: calibrate and quantize the exported graphs with the project's recipe.

Owns the recipe's ``[quantization]`` keys; the mixins :class:`Scheme`, :class:`Weights` and
:class:`Recipe` are the groups of them other stages read."""

from __future__ import annotations

from typing import Any

from studio.core.keys import MAX_TOKENS, StageSettings, setting
from studio.core.recipe import (
    BLOCK_SIZES,
    CALIBRATION_METHODS,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CALIBRATION_METHOD,
    DEFAULT_CALIBRATION_SAMPLES,
    DEFAULT_GRANULARITY,
    DEFAULT_ROUNDING_SAMPLES,
    DEFAULT_SCHEME,
    DEFAULT_WEIGHT_ROUNDING,
    EMBEDDING_PRECISIONS,
    GRANULARITIES,
    KV_CACHE_KINDS,
    SCHEMES,
    WEIGHT_ROUNDINGS,
    is_float_scheme,
)
from studio.core.stagedecl import GIB, Need, StageDecl, StageMemory


class Scheme(StageSettings):
    """The recipe's scheme: every stage whose figures depend on the precisions."""

    scheme: str = setting("quantization.scheme", DEFAULT_SCHEME, "the weight and activation "
                          "precisions of every layer", choices=SCHEMES)

    @property
    def fp16(self) -> bool:
        """The scheme runs in FP16 (no quantization)."""
        return is_float_scheme(self.scheme)


class Weights(Scheme):
    """How the weights are scaled: what a compile's QNN options depend on."""

    weight_granularity: str = setting("quantization.weight_granularity", DEFAULT_GRANULARITY,
                                      "one weight scale per tensor, per output channel, or "
                                      "per block (LPBQ)", choices=GRANULARITIES)
    block_size: int = setting("quantization.block_size", DEFAULT_BLOCK_SIZE, "input channels "
                              "per block (per_block weights)", choices=BLOCK_SIZES)


class Calibration(StageSettings):
    """The calibration text and how much of it."""

    calibration_text: str = setting("quantization.calibration_text", "sample:calibration",
                                    "the text the activation ranges are calibrated on",
                                    ref="text")
    calibration_samples: int = setting("quantization.calibration_samples",
                                       DEFAULT_CALIBRATION_SAMPLES, "calibration windows (or "
                                       "samples)", min=1, cap=MAX_TOKENS)


class Recipe(Weights, Calibration):
    """The whole quantization recipe of a language model (what the quantize stage applies)."""

    weight_rounding: str = setting("quantization.weight_rounding", DEFAULT_WEIGHT_ROUNDING,
                                   "how per-channel integer weights are chosen: nearest "
                                   "(MinMax), or from calibration inputs: seqmse (clipping "
                                   "search), adaround (learned rounding), gptq (error "
                                   "feedback), seqmse_gptq (both); float schemes ignore it",
                                   choices=WEIGHT_ROUNDINGS)
    rounding_samples: int = setting("quantization.rounding_samples", DEFAULT_ROUNDING_SAMPLES,
                                    "calibration windows the weight rounding fits each layer "
                                    "on (seqmse, adaround)", min=1, cap=MAX_TOKENS)
    calibration_method: str = setting("quantization.calibration_method",
                                      DEFAULT_CALIBRATION_METHOD, "how a range is taken from "
                                      "the calibration statistics",
                                      choices=CALIBRATION_METHODS)
    overrides: dict[str, str] = setting("quantization.overrides", {}, "per-layer precisions: "
                                        "pattern -> precision, the last matching pattern wins")
    embedding: str = setting("quantization.embedding", "auto", "the token embedding table's "
                             "precision: auto (the activations' width, as the quantizer stores "
                             "a Gather table: 16-bit under W4A16 / W8A16) or INT8 (half the "
                             "bytes: what lets an 8 B model's first part fit one context "
                             "binary)", choices=EMBEDDING_PRECISIONS)

    def recipe(self) -> dict[str, Any]:
        """The recipe as the engine takes it."""
        return {"scheme": self.scheme, "weight_granularity": self.weight_granularity,
                "samples": self.calibration_samples, "overrides": self.overrides,
                "calibration_method": self.calibration_method, "block_size": self.block_size,
                "weight_rounding": self.weight_rounding,
                "rounding_samples": self.rounding_samples, "embedding": self.embedding}


class KvCache(StageSettings):
    kv_cache: str = setting("quantization.kv_cache", "float", "the KV cache as graph I/O: "
                            "float, or int8 with per-head scales", choices=KV_CACHE_KINDS)


class QuantizeSettings(Recipe, KvCache):
    vision_scheme: str = setting("quantization.vision_scheme", "", "a vision-language model's "
                                 "vision encoder: its own scheme (\"\": the recipe's scheme)",
                                 choices=("", *SCHEMES))
    vision_overrides: dict[str, str] = setting("quantization.vision_overrides", {}, "a "
                                               "vision-language model's vision encoder: "
                                               "per-layer precisions on its layers "
                                               "(visual.blocks.N.attn.qkv, visual.merger.mlp.0, "
                                               "...), the last matching pattern wins")
    calibration_images: str = setting("quantization.calibration_images", "", "a "
                                      "vision-language model: a folder of images the vision "
                                      "encoder and the image prompts are calibrated on (\"\": "
                                      "images generated here); text models ignore it",
                                      ref="images")


#: Quantize, since the calibration holds no copy of the weights (ONNX Runtime's calibrater
#: over the graph's structure, run without prepacking) and the large weights are quantized a
#: slice at a time beside the quantizer (studio.engine.qdq_weights): the export's four
#: shapes (studio.core.stages.export), 2.42, 3.75, 3.33 and 5.99 GiB (before the slices:
#: 2.66, 4.33, 5.25 and 8.98; before the calibration's change: 3.32, not run, 6.05 and
#: 10.71). What remains is the calibration's two float sessions, which now read the part's
#: weights through one shared mapping of its file (``llm_runtime.make_cpu_session``; each
#: used to map it itself, the same pages counted once per mapping): the same four, 1.63,
#: 2.43, 2.06 and 3.36 GiB, 1.47 GiB + 0.70 x the part, errors +24 %, +1 %, +21 %, +1 %
#: (before the shared mapping: 1.0 GiB + 2.0 x). The head needs no term of its own any more.
MEMORY = StageMemory(base=int(1.47 * GIB), per_weight_byte=0.70, per_head_byte=0.0)
#: When the recipe rounds its weights (``weight_rounding`` other than nearest): the rounding
#: holds every rounded layer's inputs and candidates beside the part. One measured run so
#: far: the Qwen2-0.5B shape in one part (2.35 GiB with its tied head's copy), SeqMSE on 8
#: windows, 12.42 GiB against 7.40 for nearest rounding: 4.5 x the part.
ROUNDING_MEMORY = StageMemory(base=int(1.05 * GIB), per_weight_byte=4.5, per_head_byte=1.85)

DECL = StageDecl("quantize", "Quantize", (Need("export"),), settings_class=QuantizeSettings,
                 role="quantize", takes_parts=True, resumes=True, preflight=("overrides",),
                 memory=MEMORY, rounding_memory=ROUNDING_MEMORY,
                 disk_per_parameter=2.5,  # the Qwen2.5-3B shape's parts, W8A16: 1.1 GB / 444 M
                 help="calibrate and quantize the graphs with the project's recipe")
