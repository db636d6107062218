"""The profile stage of graph projects: one inference profiled, repeated."""

from __future__ import annotations

from typing import Any

from studio.core.fsutil import atomic_write_json
from studio.core.progress import Progress
from studio.core.stages.graph_profile import GraphProfileSettings
from studio.engine import qnn_profile
from studio.worker.context import StageContext, metric
from studio.worker.stages._graph import held_samples, input_specs


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """One inference of the compiled graph profiled ``profile.repeats`` times with QNN's
    detailed profiling, on a validation sample: the median per op, by op type and by layer,
    with the spread and the host load of each repeat (on the simulator: relative cost), run by
    the device's backend."""
    imp, qdir = ctx.input("import"), ctx.input("graph-quantize")
    cdir = ctx.input("graph-compile", ctx.config.chip)
    chip, dev = ctx.chip, ctx.device
    feed = held_samples(qdir, input_specs(imp))[0]
    s = GraphProfileSettings.of(ctx.config)
    repeats = int(s.repeats or 5)
    strict = s.placement != "partition"
    runs, loads = [], []
    for info, load in ctx.backend.profile_inferences(cdir / "graph_ctx.onnx", feed,
                                                     ctx.out / "repeats", repeats, strict,
                                                     progress):
        runs.append(qnn_profile.parse_profile_run(info, onnx_path=qdir / "quantized.onnx",
                                                  chip=chip))
        loads.append(load)
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
        "metrics": [metric("inference_total", stats["median"], prof.unit, prof.source,
                            dev.kind, chip.key, note)],
    }
