"""The bundle stage: a Genie bundle for the target chip, built and checked by
:func:`studio.engine.bundle.build_bundle`; its figures labelled from the device the check
ran on (the target's HTP simulator)."""

from __future__ import annotations

from typing import Any

from studio.core.errors import StudioError
from studio.core.progress import Progress
from studio.engine.llm_runtime import load_graph_spec
from studio.worker.context import StageContext, device_metric, read_text
from studio.worker.stages._llm import check_fits_target, htp_options, recipe


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    from studio.engine.bundle import BundleSettings, build_bundle

    export_dir, qdir = ctx.input("export"), ctx.input("quantize")
    cdir = ctx.input("compile", ctx.config.chip)
    spec = load_graph_spec(export_dir)
    check_fits_target(ctx, spec)  # before any work: a bundle its NPU cannot map is refused
    if ctx.fp16:
        raise StudioError("a Genie bundle is made from a quantized graph: use a W8A16, W8A8 or "
                          "W4A16 scheme, not FP16")
    settings = BundleSettings(
        checkpoint=ctx.path("model.source"), recipe=recipe(ctx),
        calibration_text=read_text(ctx.path("quantization.calibration_text"),
                                   "calibration text"),
        heldout_text=read_text(ctx.path("validation.heldout_text"), "held-out text"),
        prefill_length=int(ctx.get("bundle.prefill_length")), parts=int(ctx.get("bundle.parts")),
        prompts=int(ctx.get("bundle.prompts")), new_tokens=int(ctx.get("bundle.new_tokens")),
        score_tokens=int(ctx.get("bundle.score_tokens")), dlc=ctx.get("bundle.dlc"),
        greedy_prompt=ctx.get("run.prompt"),
        greedy_tokens=int(ctx.get("validation.greedy_tokens")),
        htp_options=htp_options(ctx), graph_io=ctx.get("htp.graph_io"),
        chat_template=ctx.get("model.chat_template"),
        draft=(ctx.path("model.draft") if ctx.get("model.draft")
               and ctx.get("bundle.draft") != "off" else None),
        draft_ref=ctx.get("model.draft"), draft_embedding=ctx.get("model.draft_embedding"))
    dev = ctx.device
    result = build_bundle(export_dir, qdir, cdir, ctx.chip, spec, ctx.out, settings,
                          dev.source, progress)
    result["metrics"] = [
        device_metric(dev, name, value, unit,
                      f"{detail}; {dev.timing_note}" if timed and dev.timing_note else detail)
        for name, value, unit, detail, timed in result.pop("figures")]
    return result
