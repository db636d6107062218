"""The export stage: the checkpoint's prefill and decode graphs (static KV cache), checked
against transformers, with its tokenizer and model facts."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.families import family_of
from studio.core.fsutil import atomic_write_json
from studio.core.hostmem import check_fits
from studio.core.progress import Progress, SubProgress
from studio.core.stages.export import ExportSettings
from studio.engine import chat_template, hf_import, partresume
from studio.engine.llm_export import export_llm
from studio.engine.llm_parts import auto_device_count, checkpoint_layout, export_parts, export_plan
from studio.engine.weightstore import graph_bytes
from studio.worker.context import StageContext, host_metric
from studio.worker.stages._llm import GRAPHS


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    s = ExportSettings.of(ctx.config)
    ckpt = s.path(s.source)
    info = hf_import.open_checkpoint(ckpt)
    P, C = s.prompt_length, s.context_length
    budget = int(s.max_part_mb) * 1_000_000
    layout = checkpoint_layout(ckpt)
    # "auto": the tighter of the host compiler's limit and the target NPUs' (the key hashes
    # the targets' context-binary limits, not their names: stagegraph.KEY_IDENTITIES)
    device_count = (auto_device_count(info, layout, s.targets, P, C)
                    if s.parts == "auto" else None)
    plan = export_plan(ckpt, s.parts, s.max_part_mb, layout, device_count)

    family = family_of(info.family)
    if len(plan) > 1 and family is not None and family.vision:
        raise StudioError(f"{info.architecture} is a vision-language model, which exports in "
                          "one part: set export.parts = 1 (its parts' graphs do not take "
                          "the image yet)")
    check_fits("export", [p.parameters for p in plan], head_parameters=layout.head_in_graph(),
               last_block_parameters=layout.blocks[-1] if layout.blocks else 0)
    t0 = time.perf_counter()
    if len(plan) == 1:
        partresume.clear(ctx.out)  # a kept work folder: nothing of a killed run is reused
        progress.update(0.02, f"exporting {info.architecture} ({info.num_layers} layers)")
        spec = export_llm(ckpt, ctx.out, P, C, progress=SubProgress(progress, 0.02, 0.95),
                          image_size=s.image_size)
    else:
        progress.update(0.02, f"exporting {info.architecture} ({info.num_layers} layers) in "
                              f"{len(plan)} parts, one in memory at a time")
        spec = export_parts(ckpt, ctx.out, P, C, parts=len(plan), max_part_bytes=budget,
                            progress=SubProgress(progress, 0.02, 0.95), resume=True)
    ctx.fact("export_seconds", time.perf_counter() - t0, "s")

    copy_tokenizer(ckpt, ctx.out / "tokenizer")
    atomic_write_json(ctx.out / "modelinfo.json", info.to_dict())
    # each graph with the weights it refers to (a part's graphs share one weights.data)
    sizes = {g: sum(graph_bytes(f) for f in ctx.out.rglob(f"{g}.onnx")) for g in GRAPHS}
    chk = spec.get("export_check") or {}
    vchk = (spec.get("vision") or {}).get("export_check") or {}
    metrics = check_metrics(spec)
    return {
        "summary": f"prefill [1,{P}] + decode with KV cache {C} ({info.parameters:,} parameters"
                   + (f", {len(plan)} parts)" if len(plan) > 1 else ")")
                   + (f"; matches transformers over {chk['positions']} positions "
                      f"(max |Δlogit| {chk['max_abs_logit_diff']:.2g})" if chk else "")
                   + (f"; vision encoder {spec['vision']['image_size']} px -> "
                      f"{spec['vision']['image_tokens']} image tokens, an image prompt "
                      f"matches too (encoder cosine {vchk['encoder_cosine']:.6f})"
                      if vchk else ""),
        "spec": spec, "sizes": sizes, "metrics": metrics,
    }


def copy_tokenizer(ckpt: Path, tok_dir: Path) -> None:
    """The tokenizer with its chat template (the runtimes read it from here) and a VL model's
    image processor, copied from the checkpoint into ``tok_dir``."""
    tok_dir.mkdir()
    for f in ckpt.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges",
                              "preprocessor_config")) or f.name in chat_template.FILES:
            shutil.copy2(f, tok_dir / f.name)


def check_metrics(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The export check's metrics: the graphs against transformers (and a vision-language
    model's image prompt)."""
    chk = spec.get("export_check") or {}
    metrics = []
    if chk:
        # the graphs against transformers over the whole exported context (deterministic)
        detail = (f"ONNX Runtime CPU FP32 vs transformers, teacher-forced over "
                  f"{chk['positions']} positions ({chk['prefill_positions']} prefill + "
                  f"{chk['positions'] - chk['prefill_positions']} decode), "
                  f"tolerance {chk['tolerance']:.3g}")
        metrics = [
            host_metric("export_max_abs_logit_diff", chk["max_abs_logit_diff"], "", detail),
            host_metric("export_top1_agreement", chk["top1_agreement"], "fraction", detail),
            host_metric("export_positions_checked", chk["positions"], "positions"),
        ]
    vchk = (spec.get("vision") or {}).get("export_check") or {}
    if vchk:
        # a vision-language model: an image prompt through vision.onnx and the graphs
        vdetail = (f"ONNX Runtime CPU FP32 vs transformers: a generated "
                   f"{spec['vision']['image_size']} px image through the vision encoder, "
                   f"then the image prompt teacher-forced over {vchk['positions']} positions")
        metrics += [
            host_metric("export_encoder_cosine", vchk["encoder_cosine"], "", vdetail),
            host_metric("export_image_max_abs_logit_diff", vchk["max_abs_logit_diff"], "",
                        vdetail),
            host_metric("export_image_top1_agreement", vchk["top1_agreement"], "fraction",
                        vdetail),
        ]
    return metrics
