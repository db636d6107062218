"""The stages of the kinds other than causal LMs (``model.kind`` encoder or onnx-graph):
import → quantize → compile (per chip) → validate (per chip) → run (per device), declared in
:mod:`studio.core.stagegraph` as ``import``, ``graph-quantize``, ``graph-compile``,
``graph-validate`` and ``graph-run``. The steps are :mod:`studio.engine.graphpipe`'s, the
ones ``studio graph`` runs in one go."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.progress import Progress, SubProgress
from studio.worker.context import (
    StageContext,
    _device_metric,
    _host_metric,
    _metric,
    _read_text,
)


def _inputs(import_dir: Path):
    from studio.engine.graphpipe import inputs_from_json

    return inputs_from_json(json.loads((import_dir / "inputs.json").read_text()))


def _held(qdir: Path, inputs) -> list[dict[str, Any]]:
    from studio.engine.graphdata import load_samples

    return load_samples(qdir / "validation.npz", inputs, "validation samples")


def import_(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    import onnx

    from studio.engine import graphpipe

    kind = ctx.get("model.kind")
    source = ctx.path("model.source")
    info = graphpipe.static_graph(kind, source, ctx.out, ctx.get("graph.shapes"),
                                  ctx.get("graph.seq_len"), progress)
    atomic_write_json(ctx.out / "inputs.json", info["inputs"])
    model = onnx.load(str(ctx.out / "static.onnx"), load_external_data=False)
    ops: dict[str, int] = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    shapes = ", ".join(f"{i['name']} {i['shape']}" for i in info["inputs"])
    check = info["export_check"]
    metrics = []
    if check:
        metrics.append(_host_metric("export_cosine_min", check["min_cosine"], "",
                                    f"ONNX Runtime FP32 vs torch, {len(check['cosines'])} texts"))
    how = (f"exported from PyTorch at [1, {info['seq_len']}]" if kind == "encoder"
           else f"imported {source.name}")
    return {"summary": f"{how}: {len(model.graph.node)} nodes, inputs {shapes}",
            "kind": kind, "inputs": info["inputs"], "export_check": check, "op_types": ops,
            "nodes": len(model.graph.node), "metrics": metrics}


def graph_quantize(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    import numpy as np

    from studio.engine import graphpipe

    imp = ctx.input("import")
    inputs = _inputs(imp)
    kind = ctx.get("model.kind")
    scheme, gran = ctx.get("quantization.scheme"), ctx.get("quantization.weight_granularity")
    placement = ctx.get("quantization.placement")
    calibration, validation = ctx.get("graph.calibration"), ctx.get("graph.validation")
    progress.update(0.02, "reading the calibration samples")
    if kind == "encoder" and not calibration:
        text = _read_text(ctx.path("quantization.calibration_text"), "calibration text")
        feeds, held, held_from = graphpipe.sample_feeds(
            inputs, None, None, ctx.get("quantization.calibration_samples"), imp / "tokenizer",
            text)
    else:
        feeds, held, held_from = graphpipe.sample_feeds(
            inputs, ctx.path("graph.calibration") if calibration else None,
            ctx.path("graph.validation") if validation else None,
            ctx.get("quantization.calibration_samples"))
    arrays: dict[str, Any] = {i.name: np.stack([f[i.name] for f in held]) for i in inputs}
    np.savez(str(ctx.out / "validation.npz"), **arrays)
    method = ctx.get("quantization.calibration_method")
    q = graphpipe.rewrite_and_quantize(imp / "static.onnx", ctx.out, placement, feeds, held,
                                       scheme, gran, SubProgress(progress, 0.05, 0.98),
                                       method, ctx.get("quantization.overrides"))
    check = q["rewrite_check"]
    metrics = []
    if check:
        metrics += [_host_metric("rewrite_cosine_min", check["worst_cosine"], "",
                                 f"rewritten vs original graph, FP32, {check['samples']} samples"),
                    _host_metric("rewrite_max_abs_error", check["max_abs_error"])]
    names = ", ".join(r["rewrite"] for r in q["rewrites"]) or "none"
    return {"summary": f"{scheme} {gran}, {len(feeds)} calibration samples ({method}); "
                       f"rewrites: {names}",
            **q, "placement": placement, "validation_from": held_from,
            "validation_samples": len(held), "calibration_samples": len(feeds),
            "metrics": metrics}


def graph_compile(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    from studio.engine import graphpipe, qnn

    qdir = ctx.input("graph-quantize")
    chip = ctx.chip
    placement = ctx.get("quantization.placement")
    progress.update(0.05, f"placing the graph on {chip.name}")
    report = graphpipe.place(qdir / "quantized.onnx", chip, placement)
    graphpipe.check_placement(report, chip)
    atomic_write_json(ctx.out / "placement.json", report)
    progress.check()
    progress.update(0.4, f"compiling the context binary for {chip.name}")
    info = qnn.compile_context(qdir / "quantized.onnx", ctx.out / "graph_ctx.onnx", chip,
                               embed=True, strict=placement != "partition")
    where = ("all nodes on the NPU" if report["all_on_npu"] else
             f"{len(report['cpu_nodes'])} node(s) on the CPU, {report['transitions']} NPU↔CPU transitions")
    ctx.fact("compile_seconds", info.get("seconds", 0.0), "s")
    return {"summary": f"context binary for {chip.name} (QNN SDK {info.get('sdk_version', '')});"
                       f" {where}",
            "placement": {k: v for k, v in report.items() if k not in ("crossings",)},
            "sdk_version": info.get("sdk_version", ""),
            "tool": {"qnn_sdk": info.get("sdk_version", "")},
            "size_bytes": info.get("size_bytes"), "metrics": []}


def _session(ctx: StageContext, cdir: Path):
    from studio.engine import qnn

    return qnn.make_session(cdir / "graph_ctx.onnx", ctx.chip,
                            strict=ctx.get("quantization.placement") != "partition")


def graph_validate(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    from studio.engine import graphpipe
    from studio.engine.graphdata import compare_outputs

    imp, qdir = ctx.input("import"), ctx.input("graph-quantize")
    cdir = ctx.input("graph-compile", ctx.config.chip)
    dev = ctx.device
    inputs = _inputs(imp)
    held = _held(qdir, inputs)
    quant = json.loads((qdir / "result.json").read_text())
    progress.update(0.1, f"FP32 on the CPU vs the quantized graph on the {dev.name}: "
                         f"{len(held)} samples")
    ref = graphpipe.cpu_session(imp / "static.onnx")
    htp = _session(ctx, cdir)
    host = graphpipe.cpu_session(qdir / "quantized.onnx")
    check = compare_outputs(ref, htp, held)
    host_check = compare_outputs(ref, host, held)
    progress.check()
    res: dict[str, Any] = {
        "target": ctx.chip.key, "device": dev.name, "device_id": dev.id, "source": dev.source,
        "outputs": check["outputs"], "samples": check["samples"],
        "output_cosine_min": check["worst_cosine"], "output_max_abs_error": check["max_abs_error"],
        "host_qdq": {"output_cosine_min": host_check["worst_cosine"],
                     "output_max_abs_error": host_check["max_abs_error"]},
        "on": quant.get("validation_from", ""),
    }
    metrics = [
        _device_metric(dev, "output_cosine_min", check["worst_cosine"], "",
                       f"worst output cosine vs FP32 over {check['samples']} samples"),
        _device_metric(dev, "output_max_abs_error", check["max_abs_error"], ""),
        _host_metric("output_cosine_min_host_qdq", host_check["worst_cosine"], "",
                     "the quantized graph on the host CPU (ONNX Runtime QDQ)"),
    ]
    summary = f"worst output cosine {check['worst_cosine']:.4f} on {dev.name} ({dev.source})"
    if ctx.get("model.kind") == "encoder":
        progress.update(0.5, "the retrieval set: FP32 vs deployed rankings")
        seq_len = int(inputs[0].shape[1])
        rank = graphpipe.encoder_ranking(imp / "tokenizer", seq_len, ref, htp)
        host_rank = graphpipe.encoder_ranking(imp / "tokenizer", seq_len, ref, host)
        res["ranking"] = rank
        res["host_qdq"]["ranking"] = {k: host_rank[k] for k in (
            "top1_agreement", "mean_kendall_tau", "embedding_cosine_mean")}
        res.update(embedding_cosine_mean=rank["embedding_cosine_mean"],
                   ranking_top1=rank["top1_agreement"])
        n = rank["queries"]
        metrics += [
            _device_metric(dev, "embedding_cosine_mean", rank["embedding_cosine_mean"], "",
                           f"the retrieval set's {rank['texts']} texts vs FP32"),
            _device_metric(dev, "ranking_top1", rank["top1_agreement"], "fraction",
                           f"{n} queries whose top document matches FP32's"),
            _device_metric(dev, "ranking_kendall_tau", rank["mean_kendall_tau"], "",
                           f"mean over {n} queries"),
            _device_metric(dev, "recall_at_1", rank["recall_at_1_deployed"], "fraction",
                           f"FP32: {rank['recall_at_1_reference']:.0%}"),
        ]
        summary = (f"embedding cosine {rank['embedding_cosine_mean']:.4f}, top-1 "
                   f"{rank['top1_agreement']:.0%} of {n} queries, Kendall "
                   f"{rank['mean_kendall_tau']:.3f} on {dev.name} ({dev.source})")
    res["metrics"] = metrics
    res["summary"] = summary
    return res


def graph_run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    from studio.engine import graphpipe

    imp, qdir = ctx.input("import"), ctx.input("graph-quantize")
    dev = ctx.device
    feed = _held(qdir, _inputs(imp))[0]
    repeats = ctx.get("graph.repeats")
    if dev.kind == "host-cpu":
        session = graphpipe.cpu_session(imp / "static.onnx")
        what = "FP32 on the host CPU (ONNX Runtime)"
    elif dev.kind == "htp-sim":
        session = _session(ctx, ctx.input("graph-compile", dev.chip))
        what = f"{ctx.get('quantization.scheme')} on the {dev.name}"
    else:  # the stage graph declares host-cpu and htp-sim only
        raise StudioError(f"graph projects run on the host CPU and the HTP simulator, not on "
                          f"{dev.name}")
    progress.update(0.1, f"timing {repeats} inferences: {what}")
    t = graphpipe.latency(session, feed, repeats)
    note = dev.timing_note
    return {
        "summary": f"{t['median_ms']:.2f} ms per inference, {t['per_s']:.1f}/s ({dev.source}, "
                   f"{what})",
        "device": dev.kind, "device_id": dev.id, "target": dev.chip, "source": dev.source,
        "latency": t,
        "metrics": [
            _device_metric(dev, "latency_ms", t["median_ms"], "ms",
                           f"median of {repeats}; {note}"),
            _device_metric(dev, "inferences_per_s", t["per_s"], "1/s", note),
        ],
    }


def graph_profile(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """One inference of the compiled graph profiled ``profile.repeats`` times with QNN's
    detailed profiling, on a validation sample: the median per op, by op type and by layer,
    with the spread and the host load of each repeat (simulated figures: relative cost)."""
    from studio.engine import qnn, qnn_profile
    from studio.engine.hostload import HostLoadMeter

    imp, qdir = ctx.input("import"), ctx.input("graph-quantize")
    cdir = ctx.input("graph-compile", ctx.config.chip)
    chip, dev = ctx.chip, ctx.device
    feed = _held(qdir, _inputs(imp))[0]
    repeats = int(ctx.get("profile.repeats") or 5)
    strict = ctx.get("quantization.placement") != "partition"
    runs, loads = [], []
    for i in range(repeats):
        progress.check()
        progress.update(0.05 + 0.9 * i / repeats,
                        f"profiling inference {i + 1}/{repeats} on {chip.name}")
        with HostLoadMeter() as meter:
            info = qnn.profile_run(cdir / "graph_ctx.onnx", chip, feed,
                                   ctx.out / "repeats" / f"qnn_profile_{i + 1}.csv",
                                   strict=strict, op_trace=True)
        runs.append(qnn_profile.parse_profile_run(info, onnx_path=qdir / "quantized.onnx",
                                                  chip=chip))
        loads.append(meter.sample.other_load if meter.sample else 0.0)
    prof = qnn_profile.merge_repeats(runs, loads)
    prof.device = dev.id
    atomic_write_json(ctx.out / "profile.json", prof.to_dict())
    stats = prof.stats
    by_type = prof.totals_by_op_type()
    by_layer = {("outside layers" if k is None else f"layer {k}"): v
                for k, v in prof.totals_by_layer().items()}
    note = (f"simulator {prof.unit} follow the host CPU: the relative cost of ops, not device "
            f"latency; median of {stats['runs']} runs, ±{stats.get('spread', 0):.0%}"
            if prof.source == "simulated" else "")
    warn = "" if stats.get("reliable") else " · UNRELIABLE: " + "; ".join(stats["warnings"])
    top = sorted(by_type.items(), key=lambda kv: -kv[1])[:10]
    return {
        "summary": (f"{len(prof.ops)} HTP ops in one inference, median of {stats['runs']} runs "
                    f"({prof.source}, {chip.name}){warn}"),
        "by_op_type": dict(top), "by_layer": by_layer, "unit": prof.unit,
        "source": prof.source, "ops": len(prof.ops), "stats": stats, "target": chip.key,
        "metrics": [_metric("inference_total", stats["median"], prof.unit, prof.source,
                            dev.kind, chip.key, note)],
    }


STAGE_FUNCTIONS: dict[str, Callable[[StageContext, Progress], dict[str, Any]]] = {
    "import": import_, "graph-quantize": graph_quantize, "graph-compile": graph_compile,
    "graph-validate": graph_validate, "graph-run": graph_run, "graph-profile": graph_profile,
}
