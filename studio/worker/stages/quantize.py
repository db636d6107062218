"""The quantize stage: the recipe applied to the exported graphs (and, with an INT8 KV cache,
the cache's scales)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.hostmem import check_fits
from studio.core.progress import Progress
from studio.core.recipe import DEFAULT_WEIGHT_ROUNDING, WEIGHT_ROUNDINGS
from studio.core.stages.quantize import QuantizeSettings
from studio.engine import partresume
from studio.engine.kvquant import calibrate_kv_scales, kv_bytes, write_int8_kv_graphs
from studio.engine.llm_parts import exported_part_sizes
from studio.engine.llm_runtime import cpu_generator, load_graph_spec, load_tokenizer
from studio.engine.quantize import quantize_llm
from studio.engine.quantize_parts import quantize_parts
from studio.engine.vision import images_for
from studio.engine.vision_input import vision_spec
from studio.worker.context import StageContext, read_text


def _int8_kv(export_dir: Path, out_dir: Path, calibration_text: str) -> dict[str, Any]:
    """Make the graphs in ``out_dir`` INT8-KV, with scales calibrated on the FP32 export."""
    spec = load_graph_spec(export_dir)
    ids = load_tokenizer(export_dir)(calibration_text).input_ids
    scales = calibrate_kv_scales(cpu_generator(export_dir, spec), ids)
    # per layer and tensor: the QNN EP refuses per-axis Q/DQ that stand alone at the edge
    graphs = write_int8_kv_graphs(out_dir, out_dir, scales, per_head=False)
    return {"graphs": graphs, "bits": 8, "bytes": kv_bytes(spec, 8), "granularity": "per_tensor",
            "calibration_tokens": min(len(ids), int(spec["context_length"]))}


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    s = QuantizeSettings.of(ctx.config)
    rec = s.recipe()
    # a vision-language model's encoder: its own scheme and per-layer precisions
    rec.update(vision_scheme=s.vision_scheme, vision_overrides=s.vision_overrides)
    scheme, gran, samples = rec["scheme"], rec["weight_granularity"], rec["samples"]
    overrides, method = rec["overrides"], rec["calibration_method"]
    text = read_text(s.path(s.calibration_text), "calibration text")
    export_dir = ctx.input("export")
    t0 = time.perf_counter()
    kv = s.kv_cache or "float"

    spec = load_graph_spec(export_dir)
    parts = spec.get("parts") or []
    check_fits("quantize", exported_part_sizes(export_dir, spec),
               head_parameters=int(spec["vocab_size"]) * int(spec["hidden_size"]),
               rounding=s.weight_rounding != DEFAULT_WEIGHT_ROUNDING)
    if len(parts) > 1:
        if kv == "int8":
            raise StudioError("an INT8 KV cache is not built for a model exported in parts: "
                              "set quantization.kv_cache = \"float\" or export.parts = 1")
        info = quantize_parts(export_dir, ctx.out, rec, text, export_dir / "tokenizer",
                              progress, resume=True, cache=ctx.parts, salt=ctx.part_salt)
    else:
        partresume.clear(ctx.out)  # a kept work folder: nothing of a killed run is reused
        info = quantize_llm(export_dir, ctx.out, rec, text, export_dir / "tokenizer", progress,
                            images=_calibration_images(s, spec, int(samples)))
    if kv == "int8":
        progress.update(0.97, "INT8 KV cache: per-head scales from the FP32 cache, uint8 I/O")
        info["kv_cache"] = _int8_kv(export_dir, ctx.out, text)
    ctx.fact("quantize_seconds", time.perf_counter() - t0, "s")
    facts = info.pop("run_facts", {})
    if "rounding_seconds" in facts:
        ctx.fact("rounding_seconds", facts["rounding_seconds"], "s",
                 f"weight rounding {rec['weight_rounding']}")
    rounding = info.get("weight_rounding", "nearest")
    return {
        "summary": f"{scheme} {gran}, {samples} calibration windows ({method})"
                   + (f", weights rounded by {rounding}"
                      if rounding in WEIGHT_ROUNDINGS and rounding != DEFAULT_WEIGHT_ROUNDING
                      else "")
                   + (", INT8 KV cache" if kv == "int8" else "")
                   + (f", overrides {', '.join(f'{k}={v}' for k, v in overrides.items())}"
                      if overrides else "")
                   + _reused(info, len(parts)),
        "quant": info, "layers": info.get("layers", []), "metrics": [],
    }


def _calibration_images(s: QuantizeSettings, spec: dict[str, Any], count: int
                        ) -> list | None:
    """A vision-language model's calibration images: the project's folder's, or None (the
    quantizer generates them)."""
    vs = vision_spec(spec)
    if vs is None or not s.calibration_images:
        return None
    return images_for(s.path(s.calibration_images), count, vs, 0)


def _reused(info: dict[str, Any], count: int) -> str:
    """The summary's note on the parts taken from an earlier quantization, if any."""
    reused = info.get("parts_reused") or []
    if not reused:
        return ""
    return (f"; part{'s' if len(reused) > 1 else ''} {', '.join(map(str, reused))} of {count} "
            "as quantized before (same graphs, calibration inputs and precisions)")
