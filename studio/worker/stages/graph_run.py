"""The run stage of graph projects: the latency per inference on one device."""

from __future__ import annotations

import time
from typing import Any

from studio.core.progress import Progress
from studio.core.stages.graph_run import GraphRunSettings
from studio.engine import graphpipe
from studio.worker.context import StageContext, device_metric
from studio.worker.stages._graph import device_session, held_samples, input_specs


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    imp, qdir = ctx.input("import"), ctx.input("graph-quantize")
    dev = ctx.device
    feed = held_samples(qdir, input_specs(imp))[0]
    s = GraphRunSettings.of(ctx.config)
    repeats = s.repeats
    t0 = time.perf_counter()
    session = device_session(ctx)
    load_s = time.perf_counter() - t0
    what = ctx.backend.describe(s.scheme)
    progress.update(0.1, f"timing {repeats} inferences: {what}")
    t = graphpipe.latency(session, feed, repeats)
    note = dev.timing_note
    return {
        "summary": f"{t['median_ms']:.2f} ms per inference, {t['per_s']:.1f}/s ({dev.source}, "
                   f"{what}); first {t['first_ms']:.3g} ms, load {load_s:.2f} s",
        "device": dev.kind, "device_id": dev.id, "target": dev.chip, "source": dev.source,
        "latency": t, "load_s": load_s,
        "metrics": [
            device_metric(dev, "latency_ms", t["median_ms"], "ms",
                          f"median of {repeats}; {note}"),
            device_metric(dev, "inferences_per_s", t["per_s"], "1/s", note),
            device_metric(dev, "first_inference_ms", t["first_ms"], "ms",
                          f"the first inference, before the timed ones; {note}"),
            device_metric(dev, "load_ms", load_s * 1e3, "ms",
                          f"opening the graph (a context binary's load) before the first "
                          f"inference; {note}"),
        ],
    }
