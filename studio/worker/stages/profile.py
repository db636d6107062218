"""The profile stage: one decode step profiled on an NPU device, repeated, with the host load
of each repeat; the compiler's traffic and a host CPU timeline beside it."""

from __future__ import annotations

import shutil
from pathlib import Path
from statistics import median
from typing import Any

from studio.core import figures
from studio.core.devices import HOST_CPU
from studio.core.errors import StudioError
from studio.core.events import EventTable
from studio.core.fsutil import atomic_write_json
from studio.core.profile import layer_label
from studio.core.progress import Progress, SubProgress
from studio.core.stages.profile import ProfileSettings
from studio.engine import profiling, qnn_profile, vision_input
from studio.engine.chain import part_dirs
from studio.engine.deployed import decode_context
from studio.engine.graphio import quantize_io
from studio.engine.llm_runtime import load_graph_spec
from studio.engine.opblocks import node_blocks
from studio.engine.profile_import import (
    compiler_totals,
    copy_traffic,
    import_profile,
    merge_bandwidth,
    read_schematic,
)
from studio.engine.weightstore import graph_bytes
from studio.worker.context import StageContext, metric
from studio.worker.stages._llm import GRAPHS, htp_options, partial


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """One decode step profiled ``profile.repeats`` times on the job's device (its backend runs
    them), each run with the host load it ran under; the median per op, the spread, and the seed's op table."""
    cdir, qdir = ctx.input("compile", ctx.config.chip), ctx.input("quantize")
    chip = ctx.chip
    dev = ctx.device
    spec = load_graph_spec(cdir)
    s = ProfileSettings.of(ctx.config)
    repeats = int(s.repeats or 5)
    qdirs, cdirs = part_dirs(spec, qdir), part_dirs(spec, cdir)
    blocks: dict[str, str] = {}
    costs: dict[str, Any] = {}
    for q in qdirs:
        blocks.update(node_blocks(q / "decode.onnx"))
        costs.update(qnn_profile.node_costs(q / "decode.onnx"))
    # a model in parts: every part's decode step, in turn, each repeat one pass over all parts
    per_part = [list(ctx.backend.profile_decode_steps(
        c, spec, ctx.out / "repeats" / (c.name if len(cdirs) > 1 else ""), repeats, s.fp16,
        SubProgress(progress, k / len(cdirs), (k + 1) / len(cdirs))))
        for k, c in enumerate(cdirs)]
    runs, loads = [], []
    for i in range(min(len(steps) for steps in per_part)):
        parsed = [qnn_profile.parse_profile_run(steps[i][0], onnx_path=q / "decode.onnx",
                                                chip=chip)
                  for steps, q in zip(per_part, qdirs, strict=True)]
        runs.append(qnn_profile.join_parts(parsed, [q.name for q in qdirs])
                    if len(parsed) > 1 else parsed[0])
        loads.append(sum(steps[i][1] for steps in per_part) / len(per_part))
        merged = qnn_profile.merge_repeats(runs, loads)
        table = qnn_profile.event_table(merged, blocks)
        partial(progress, {"by_block": table.group_sum("block", "cycles"),
                           "unit": merged.unit, "stats": merged.stats,
                           "repeat": i + 1, "repeats": repeats})
    if len(runs) != repeats:
        raise StudioError(f"{dev.name} returned {len(runs)} profiled runs, not {repeats}")
    progress.update(0.86, "reading the compiler's DDR traffic (optrace)")
    prof = qnn_profile.merge_repeats(runs, loads)
    prof.device = dev.id
    table = qnn_profile.event_table(prof, blocks, costs=costs)
    table, bytes_source, compiler = _compiler_traffic(ctx, table, spec, progress)
    prof.stats["bytes_source"] = bytes_source
    table.save(ctx.out / "events.npz")
    progress.update(0.93, "timing the step on the host CPU (ONNX Runtime profiler)")
    host = _host_timeline(ctx, [q / "decode.onnx" for q in qdirs], spec)
    atomic_write_json(ctx.out / "profile.json", prof.to_dict())
    by_type = prof.totals_by_op_type()
    by_layer = {layer_label(k): v for k, v in prof.totals_by_layer().items()}
    measure = "cycles" if prof.unit == "cycles" else "dur"
    by_block = table.group_sum("block", measure)
    top = sorted(by_type.items(), key=lambda kv: -kv[1])[:10]
    stats = prof.stats
    note = ("simulator cycles follow the host CPU: relative cost of ops, not device latency; "
            f"median of {stats['runs']} runs, ±{stats.get('spread', 0):.0%} (median deviation)"
            if prof.source == "simulated" else "")
    warn = "" if stats.get("reliable") else " · UNRELIABLE: " + "; ".join(stats["warnings"])
    encoder = _profile_encoder(ctx, spec, cdir, qdir, repeats, progress) \
        if spec.get("vision") else None
    enc_metrics = [] if not encoder else [metric(
        "encoder_inference_total", encoder["stats"]["median"], encoder["unit"],
        encoder["source"], dev.kind, chip.key,
        f"the vision encoder on one {spec['vision']['image_size']} px image; " + note)]
    return {
        "summary": (f"{len(prof.ops)} {figures.title('profiled_ops')}, median of {stats['runs']} "
                    f"runs ({prof.source}, {chip.name}){warn}"
                    + (f"; vision encoder: {encoder['ops']} HTP ops, "
                       f"{encoder['stats']['median']:.3g} {encoder['unit']} per image"
                       if encoder else "")),
        "encoder": encoder,
        "by_op_type": dict(top), "by_layer": by_layer, "by_block": by_block,
        "counts_by_block": table.group_count("block"), "unit": prof.unit,
        "bytes_source": bytes_source, "host_timeline": host,
        "source": prof.source, "ops": len(prof.ops), "stats": stats,
        "compiler": compiler,
        "metrics": [metric("decode_step_total", stats["median"], prof.unit, prof.source,
                            dev.kind, chip.key, note), *_compiler_metrics(compiler, chip.key),
                    *enc_metrics],
    }


def _profile_encoder(ctx: StageContext, spec: dict[str, Any], cdir: Path, qdir: Path,
                     repeats: int, progress: Progress) -> dict[str, Any] | None:
    """A vision-language model's vision encoder profiled on the job's device, one generated
    image per inference, ``repeats`` times: its op table (median per op) beside the decode
    step's. None, with a log line, where the device profiles no single graph."""
    vs = vision_input.vision_spec(spec)
    assert vs is not None
    feed, _ = vision_input.encoder_feeds(vision_input.image_patches(
        vision_input.calibration_images(1, vs.image_size, seed=7)[0], vs), vs)
    try:
        runs, loads = [], []
        for info, load in ctx.backend.profile_inferences(
                cdir / "vision_ctx.onnx", feed, ctx.out / "encoder-repeats", repeats, True,
                SubProgress(progress, 0.95, 0.99)):
            runs.append(qnn_profile.parse_profile_run(info, onnx_path=qdir / "vision.onnx",
                                                      chip=ctx.chip))
            loads.append(load)
    except StudioError as exc:
        progress.log(f"the vision encoder is not profiled on {ctx.device.name}: {exc.message}")
        return None
    prof = qnn_profile.merge_repeats(runs, loads)
    prof.device = ctx.device.id
    qnn_profile.event_table(prof, node_blocks(qdir / "vision.onnx")).save(
        ctx.out / "encoder_events.npz")
    atomic_write_json(ctx.out / "encoder_profile.json", prof.to_dict())
    top = sorted(prof.totals_by_op_type().items(), key=lambda kv: -kv[1])[:10]
    return {"ops": len(prof.ops), "unit": prof.unit, "source": prof.source,
            "stats": prof.stats, "by_op_type": dict(top),
            "image_size": vs.image_size, "image_tokens": vs.tokens}


#: the compiler's figures of one decode step, as metrics: (key, name, unit, what)
COMPILER_FIGURES = (
    ("dram_bytes", "compiler_dram_bytes_per_step", "B", "DRAM read + written"),
    ("vtcm_bytes", "compiler_vtcm_bytes_per_step", "B", "VTCM read + written"),
    ("dma_ops", "compiler_dma_ops_per_step", "", "ops the compiler made DMA transfers"),
    ("vtcm_peak_bytes", "compiler_vtcm_peak_bytes", "B", "VTCM the compiler placed tensors in"),
    ("spill_fill_ops", "compiler_spill_fill_ops", "", "ops spilling tensors out of VTCM or "
                                                      "filling them back"),
    ("htp_ops", "compiler_htp_ops", "", "HTP ops after the compiler's optimization"),
    ("binary_bytes", "compiler_binary_bytes", "B", "the compiled decode graph's size (to a few "
     "bytes: the graph's name comes from a hash of the model file's path)"),
)


def _compiler_metrics(compiler: dict[str, Any] | None, chip: str) -> list[dict[str, Any]]:
    """The HTP compiler's own figures of the decode graph (optrace), deterministic for a
    binary — unlike the simulator's cycles they do not follow the host's load, so two
    compiles (an optimization level, a VTCM budget) compare exactly."""
    if not compiler:
        return []
    opts = ", ".join(f"{k}={v}" for k, v in compiler["options"].items()) or "default options"
    where = (f"from the HTP compiler's optrace schematic of the decode graph ({opts}); "
             "deterministic for a binary, not a device timing")
    return [metric(name, compiler[key], unit, "measured", "htp-compiler", chip,
                   f"{what} in one decode step, {where}")
            for key, name, unit, what in COMPILER_FIGURES if compiler[key] is not None]


# Quantized graphs at least this large are not recompiled for an optrace profile (minutes
# and GBs for a 0.5B model): their bytes moved stay analytic.
OPTRACE_LIMIT = 256 << 20


def _compiler_traffic(ctx: StageContext, table, spec, progress: Progress):
    """Replace the analytic bytes moved by the compiler's own per-op DRAM / VTCM traffic
    and DMA flags: one optrace profile of the quantized graph (the context binary keeps no
    schematic). Returns (table, "compiler (optrace)" | "analytic", the compiler's totals of
    the step — DRAM and VTCM bytes, DMA ops, HTP ops, the binary's size, the options — or
    None)."""
    qdir = ctx.input("quantize")
    graph = qdir / "decode.onnx"
    if len(spec.get("parts") or []) > 1:
        progress.log("bytes moved stay analytic: the model is in parts (the optrace profile "
                     "reads one graph)")
        return table, "analytic", None
    size = graph_bytes(graph)
    if size >= OPTRACE_LIMIT:
        progress.log(f"bytes moved stay analytic: {graph.name} is {size >> 20} MiB, too large "
                     "to recompile for an optrace profile here")
        return table, "analytic", None
    try:
        s = ProfileSettings.of(ctx.config)
        extra = htp_options(s, ctx.chip)
        if s.graph_io == "quantized":  # the graph as the compile stage built it

            quantize_io(qdir, ctx.out / "optrace-io", GRAPHS)
            graph = ctx.out / "optrace-io" / "decode.onnx"
        info = profiling.profile_decode_step(graph, ctx.chip, spec, ctx.out / "optrace" / "ops.csv",
                                       fp16=s.fp16, level="optrace", extra_options=extra)
        if not info["schematic"]:
            raise StudioError("the optrace profile wrote no schematic")
        oprof = qnn_profile.parse_profile_run(info, onnx_path=graph, chip=ctx.chip)
        sch = read_schematic(info["schematic"][0])  # read once: the ops' traffic, the totals
        traffic = merge_bandwidth(qnn_profile.event_table(oprof), oprof.ops, sch)
    except StudioError as exc:
        progress.log(f"bytes moved stay analytic: {exc.message}")
        return table, "analytic", None
    finally:
        shutil.rmtree(ctx.out / "optrace-io", ignore_errors=True)
    merged, matched = copy_traffic(table, traffic)

    compiler = compiler_totals(sch, extra,
                               decode_context(ctx.input("compile", ctx.config.chip)))
    if matched < len(table) // 2:
        progress.log(f"bytes moved stay analytic: only {matched} of {len(table)} ops matched "
                     "the optrace profile")
        return table, "analytic", compiler
    return merged, "compiler (optrace)", compiler


def _host_timeline(ctx: StageContext, graphs: list[Path], spec) -> dict[str, Any]:
    """The quantized decode step on the host CPU under ONNX Runtime's profiler: a measured
    timeline (per node, per thread) saved as host_events.npz. A model in parts: each part's
    decode graph in turn, its step the sum of theirs, its threads on tracks named for the part
    (each part's times count from its own session's start: on one track they overlapped)."""
    rows: list[dict[str, Any]] = []
    step_ms, runs = 0.0, 0
    for graph in graphs:
        name = graph.parent.name if len(graphs) > 1 else ""
        info = profiling.profile_host_cpu(graph, ctx.out / "host" / name / "ort_profile.json",
                                    position=int((spec or {}).get("prompt_length", 0)), runs=3)
        prof = import_profile(info["json"], source=HOST_CPU.source, fmt="ort-json")
        blocks = node_blocks(graph)
        assert prof.table is not None  # an ONNX Runtime profile always has its events
        for r in prof.table.rows():
            r["block"] = blocks.get(r["onnx_node"], r["block"])
            if name:  # each part's session on tracks of its own (its times from its start)
                r["track"] = f"{name} · {r.get('track') or 'host'}"
            rows.append(r)
        step_ms += 1e3 * median(info["wall_s"])
        runs = info["runs"]
    EventTable.from_rows(rows, time_unit="us").save(ctx.out / "host_events.npz")
    return {"source": HOST_CPU.source, "device": HOST_CPU.kind, "runs": runs,
            "events": len(rows), "step_ms_median": step_ms,
            **({"parts": len(graphs)} if len(graphs) > 1 else {})}
