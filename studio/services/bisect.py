"""``studio bisect``: the seed's three-step accuracy method in one command, on the prefill or
the decode graph of a project's target — the layer diff stage run with the HTP in FP16 beside
it (the backend without quantization), read into one verdict that names the layer.

The project file is not changed: the bisection's settings (``layerdiff.graph``,
``layerdiff.fp16_step``) are set on the loaded project only, so its artifact is the layer
diff of those settings, cached like any other stage result. Nothing here imports Qt.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError


def bisect_project(path: Path, target: str | None = None, graph: str = "prefill"):
    """The project at ``path`` with the bisection's settings (not saved)."""
    from studio.core import project as projectfile
    from studio.core.catalog import get_chip

    p = projectfile.load(Path(path))
    if p.model["kind"] != "causal-lm":
        raise StudioError("studio bisect runs on language-model projects; for an ONNX graph "
                          "the graph-validate stage compares every output")
    target = target or p.targets[0]
    if target not in p.targets:
        raise StudioError(f"target {target!r} is not one of the project's targets "
                          f"({', '.join(p.targets)})")
    if p.export["parts"] not in (1, "1"):
        raise StudioError("studio bisect runs on a model exported whole so far "
                          "(export.parts = 1): a model in parts is bisected part by part in "
                          "a later version")
    d = p.to_dict()
    d["layerdiff"] = {**d.get("layerdiff", {}), "graph": graph,
                      "fp16_step": bool(get_chip(target).fp16)}
    q = projectfile.from_dict(d)
    q.path = p.path
    return q, target


def bisect(path: Path, target: str | None = None, graph: str = "prefill",
           on_event: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run (or reuse) the bisection's layer diff and read it: ``{"target", "graph", "steps",
    "verdict", "layer", "result"}``."""
    import asyncio

    from studio.core.layerdiff import bisect_verdict
    from studio.services.layerdiff import layerdiff_result
    from studio.services.pipeline import plan, preflight
    from studio.services.session import Studio

    project, target = bisect_project(path, target, graph)
    preflight(project, plan(project, ["layerdiff"], [target]))
    studio = Studio(project)
    if on_event is not None:
        studio.pipeline.listeners.append(on_event)
    try:
        summary = asyncio.run(studio.run_pipeline(["layerdiff"], [target]))
    finally:
        studio.close()
    if summary.state != "succeeded":
        failed = [j for j in summary.jobs if j.state == "failed"]
        raise StudioError(summary.error or (failed[0].message if failed else summary.state))
    got = layerdiff_result(project, target)
    read = bisect_verdict(got["result"], got["rows"])
    return {"target": target, "graph": graph, **read, "result": got["result"]}
