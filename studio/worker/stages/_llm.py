"""What the language-model stages share: the graph names, the recipe of the project's
settings and the QNN options it needs."""

from __future__ import annotations

from typing import Any

from studio.core.errors import StudioError
from studio.worker.context import StageContext

GRAPHS = ("prefill", "decode")
# Quantized graphs at least this large get their context binary beside the ONNX model
# (measured: a Qwen2-0.5B-shaped W8A16 graph is 771 MB and embeds; 2 GB would not).
EMBED_LIMIT = 1 << 30


def recipe(ctx: StageContext) -> dict[str, Any]:
    """The quantization recipe of the project's settings (what the quantize stage applies)."""
    return {"scheme": ctx.get("quantization.scheme"),
            "weight_granularity": ctx.get("quantization.weight_granularity"),
            "samples": ctx.get("quantization.calibration_samples"),
            "overrides": ctx.get("quantization.overrides"),
            "calibration_method": ctx.get("quantization.calibration_method"),
            "block_size": ctx.get("quantization.block_size"),
            "weight_rounding": ctx.get("quantization.weight_rounding"),
            "rounding_samples": ctx.get("quantization.rounding_samples"),
            "embedding": ctx.get("quantization.embedding")}


def htp_options(ctx: StageContext) -> dict[str, str]:
    """Extra QNN EP options a compile of the recipe's graphs takes: the recipe's ``[htp]``
    options (:func:`htp_settings_options`), and block-wise (LPBQ) weights need the HTP's
    block-quant optimization (~5x slower without), which computes blocks under 32 wrong
    (one MatMul on the simulator: output cosine 0.56 at 16 per block, 0.05 at 8; 0.9999
    without it): those run without it."""
    from studio.core.recipe import LPBQ_OPTIMIZED_FROM

    opts = htp_settings_options(ctx)
    if ctx.get("quantization.weight_granularity") != "per_block" or \
            int(ctx.get("quantization.block_size")) < LPBQ_OPTIMIZED_FROM:
        return opts
    return {**opts, "enable_block_quant_weight_optimization": "1"}


def htp_settings_options(ctx: StageContext) -> dict[str, str]:
    """The QNN EP options of the project's ``[htp]`` compile settings for the stage's chip
    (nothing for a setting left at its default: the EP's own choice stays)."""
    from studio.core.recipe import htp_refusals
    from studio.core.stagegraph import HTP_COMPILE_SETTINGS

    s = {k.split(".", 1)[1]: ctx.get(k) for k in HTP_COMPILE_SETTINGS}
    refused = htp_refusals(s, ctx.chip)
    if refused:
        raise StudioError(refused[0])
    opts: dict[str, str] = {}
    if s["optimization_level"]:
        opts["htp_graph_finalization_optimization_mode"] = str(s["optimization_level"])
    if s["vtcm_mb"]:
        opts["vtcm_mb"] = str(s["vtcm_mb"])
    if s["fp16_relaxation"]:
        opts["enable_htp_fp16_precision"] = "1"
    return opts


def partial(progress: Any, data: dict[str, Any]) -> None:
    """Hand a partial result to whoever watches the job (the GUI draws it live)."""
    send = getattr(progress, "partial", None)
    if send is not None:
        send(data)


def check_fits_target(ctx: StageContext, spec: dict[str, Any]) -> None:
    """Refuse, in one line naming what would fit, a bundle the target's NPU cannot map
    (:mod:`studio.core.deviceplan`; a float recipe is refused below anyway)."""
    from studio.core.deviceplan import Dims, bundle_inputs, check_bundle_fits, device_plan
    from studio.core.recipe import is_float_scheme
    from studio.engine import hf_import
    from studio.engine.llm_parts import checkpoint_layout

    scheme = ctx.get("quantization.scheme")
    if is_float_scheme(scheme):
        return
    ckpt = ctx.path("model.source")
    layout = checkpoint_layout(ckpt)
    inputs = bundle_inputs(
        layout, scheme=scheme, exported_parts=len(spec.get("parts") or []) or 1,
        weight_sharing=ctx.get("bundle.weight_sharing"),
        prompt_length=int(spec["prompt_length"]), context_length=int(spec["context_length"]),
        prefill_length=int(ctx.get("bundle.prefill_length")), graph_io=ctx.get("htp.graph_io"),
        kv_cache=ctx.get("quantization.kv_cache"), embedding=ctx.get("quantization.embedding"))
    check_bundle_fits(device_plan(layout, Dims.of(hf_import.open_checkpoint(ckpt)), ctx.chip,
                                  inputs))
