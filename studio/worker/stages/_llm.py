"""What the language-model stages share: the graph names and the QNN options a compile of
the recipe takes (from the stage's typed settings)."""

from __future__ import annotations

from typing import Any

from studio.core.catalog import Chip
from studio.core.deviceplan import Dims, bundle_inputs, check_bundle_fits, device_plan
from studio.core.errors import StudioError
from studio.core.recipe import LPBQ_OPTIMIZED_FROM, htp_refusals
from studio.core.stages.bundle import BundleSettings
from studio.core.stages.compile import CompiledWeights, HtpCompile
from studio.engine import hf_import
from studio.engine.llm_parts import checkpoint_layout

GRAPHS = ("prefill", "decode")
# Quantized graphs at least this large get their context binary beside the ONNX model
# (measured: a Qwen2-0.5B-shaped W8A16 graph is 771 MB and embeds; 2 GB would not).
EMBED_LIMIT = 1 << 30


def htp_options(s: CompiledWeights, chip: Chip) -> dict[str, str]:
    """Extra QNN EP options a compile of the recipe's graphs takes: the recipe's ``[htp]``
    options (:func:`htp_settings_options`), and block-wise (LPBQ) weights need the HTP's
    block-quant optimization (~5x slower without), which computes blocks under 32 wrong
    (one MatMul on the simulator: output cosine 0.56 at 16 per block, 0.05 at 8; 0.9999
    without it): those run without it."""
    opts = htp_settings_options(s, chip)
    if s.weight_granularity != "per_block" or int(s.block_size) < LPBQ_OPTIMIZED_FROM:
        return opts
    return {**opts, "enable_block_quant_weight_optimization": "1"}


def htp_settings_options(htp: HtpCompile, chip: Chip) -> dict[str, str]:
    """The QNN EP options of the project's ``[htp]`` compile settings for ``chip`` (nothing
    for a setting left at its default: the EP's own choice stays)."""
    s = htp.htp_settings()
    refused = htp_refusals(s, chip)
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


def check_fits_target(s: BundleSettings, chip: Chip, spec: dict[str, Any]) -> None:
    """Refuse, in one line naming what would fit, a bundle the target's NPU cannot map
    (:mod:`studio.core.deviceplan`; a float recipe is refused below anyway)."""
    if s.fp16:
        return
    ckpt = s.path(s.source)
    layout = checkpoint_layout(ckpt)
    inputs = bundle_inputs(
        layout, scheme=s.scheme, exported_parts=len(spec.get("parts") or []) or 1,
        weight_sharing=s.weight_sharing,
        prompt_length=int(spec["prompt_length"]), context_length=int(spec["context_length"]),
        prefill_length=int(s.prefill_length), graph_io=s.graph_io,
        kv_cache=s.kv_cache, embedding=s.embedding)
    check_bundle_fits(device_plan(layout, Dims.of(hf_import.open_checkpoint(ckpt)), chip,
                                  inputs))
