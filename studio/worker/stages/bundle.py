"""The bundle stage: a Genie bundle for the target chip, built and checked by
:func:`studio.engine.bundle.build_bundle`; its figures labelled from the device the check
ran on (the target's HTP simulator)."""

from __future__ import annotations

from typing import Any

from studio.core.errors import StudioError
from studio.core.progress import Progress
from studio.core.stages.bundle import BundleSettings
from studio.engine.bundle import BundleSettings as BuildSettings
from studio.engine.bundle import build_bundle
from studio.engine.llm_runtime import load_graph_spec
from studio.worker.context import StageContext, device_metric, read_text
from studio.worker.stages._llm import check_fits_target, htp_options


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    s = BundleSettings.of(ctx.config)

    export_dir, qdir = ctx.input("export"), ctx.input("quantize")
    cdir = ctx.input("compile", ctx.config.chip)
    spec = load_graph_spec(export_dir)
    check_fits_target(s, ctx.chip, spec)  # before any work: a bundle its NPU cannot map is refused
    if s.fp16:
        raise StudioError("a Genie bundle is made from a quantized graph: use a W8A16, W8A8 or "
                          "W4A16 scheme, not FP16")
    settings = BuildSettings(
        checkpoint=s.path(s.source), recipe=s.recipe(),
        calibration_text=read_text(s.path(s.calibration_text), "calibration text"),
        heldout_text=read_text(s.path(s.heldout_text), "held-out text"),
        prefill_length=int(s.prefill_length), parts=int(s.parts),
        prompts=int(s.prompts), new_tokens=int(s.new_tokens),
        score_tokens=int(s.score_tokens), dlc=s.dlc,
        greedy_prompt=s.prompt,
        greedy_tokens=int(s.greedy_tokens),
        htp_options=htp_options(s, ctx.chip), graph_io=s.graph_io,
        chat_template=s.chat_template,
        draft=(s.path(s.draft) if s.draft and s.draft_in_bundle != "off" else None),
        draft_ref=str(s.draft), draft_embedding=s.draft_embedding)
    dev = ctx.device
    result = build_bundle(export_dir, qdir, cdir, ctx.chip, spec, ctx.out, settings,
                          dev.source, progress)
    result["metrics"] = [
        device_metric(dev, name, value, unit,
                      f"{detail}; {dev.timing_note}" if timed and dev.timing_note else detail)
        for name, value, unit, detail, timed in result.pop("figures")]
    return result
