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


def run_stage(project, stage: str, target: str,
              on_event: Callable[[dict[str, Any]], None] | None) -> None:
    """Run ``stage`` for ``target`` and what it needs (cached where the store has it), as
    ``studio --batch FILE --stages STAGE`` would; one line when it does not succeed."""
    import asyncio

    from studio.services.pipeline import plan, preflight
    from studio.services.session import Studio

    preflight(project, plan(project, [stage], [target]))
    studio = Studio(project)
    if on_event is not None:
        studio.pipeline.listeners.append(on_event)
    try:
        summary = asyncio.run(studio.run_pipeline([stage], [target]))
    finally:
        studio.close()
    if summary.state != "succeeded":
        failed = [j for j in summary.jobs if j.state == "failed"]
        raise StudioError(summary.error or (failed[0].message if failed else summary.state))


def bisect_on_device(project, target: str, graph: str, device_id: str,
                     on_event: Callable[[dict[str, Any]], None] | None = None,
                     log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The bisection with the HTP runs on a device through its agent (``agent:NAME@htp:CHIP``
    on a Snapdragon machine, ``@htp-sim:CHIP`` on a simulator): the stored export, quantize
    and compile of the project's current settings (run first when missing), the held-out
    windows, then the layer diff with the device's outputs. A device's figures are a
    measurement, not an artifact: nothing is stored."""
    import functools
    import tempfile

    from studio.core.artifacts import ArtifactStore
    from studio.core.devices import device
    from studio.core.layerdiff import PAIR_TITLES, summarize
    from studio.engine.layerdiff import layer_diff, windows_of
    from studio.engine.llm_runtime import load_graph_spec, load_tokenizer
    from studio.services.history import current_keys
    from studio.worker.context import read_text

    dev = device(device_id, list(project.targets))
    from studio.core.catalog import get_chip
    from studio.engine.devices import backend

    runner = backend(dev).tensor_runner()  # refuses, in one line, a device that has none
    chip = get_chip(dev.chip)
    run_stage(project, "compile", target, on_event)
    keys = current_keys(project, ["compile"])
    store = ArtifactStore(project.folder / "artifacts")
    arts = {label.split("[")[0]: store.get(key) for label, key in keys.items()
            if label in ("export", "quantize", f"compile[{target}]")}
    if any(a is None for a in arts.values()):
        raise StudioError("the export, quantize or compile artifact is missing: run studio "
                          f"--batch {project.path} --stages compile")
    export_art, quant_art = arts["export"], arts["quantize"]
    assert export_art is not None and quant_art is not None
    export_dir, qdir = export_art.path, quant_art.path
    spec = load_graph_spec(export_dir)
    P = int(spec["prompt_length"])
    ids = load_tokenizer(export_dir)(read_text(project.input_path(
        project.validation["heldout_text"]), "held-out text")).input_ids
    windows = windows_of(ids, P, graph, int(project.layerdiff["windows"]))
    if not windows:
        raise StudioError("the held-out text is shorter than one window: use a longer text")

    class _Log:
        def update(self, fraction: float, message: str = "") -> None:
            if log is not None and message:
                log(f"  {int(fraction * 100):3d}%  {message}")

        def log(self, message: str) -> None:
            if log is not None:
                log(message)

        def check(self) -> None:
            return None

    with tempfile.TemporaryDirectory(prefix=".bisect.", dir=project.folder) as work:
        data = layer_diff(export_dir, qdir, windows, mode=project.layerdiff["tensors"],
                          graph=graph, progress=_Log(), work_parent=Path(work),
                          htp={"chip": chip, "fp16": False, "fp16_step": chip.fp16,
                               "runner": functools.partial(runner, work=Path(work)),
                               "where": dev.name})
    s = summarize(data)
    return {**data, **{k: v for k, v in s.items() if k != "line"}, "target": target,
            "device": dev.name, "device_id": dev.id, "source": dev.source,
            "pair_titles": {p: PAIR_TITLES[p] for p in data["pairs"]}}


def bisect(path: Path, target: str | None = None, graph: str = "prefill",
           on_event: Callable[[dict[str, Any]], None] | None = None,
           device: str | None = None,
           log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or reuse) the bisection's layer diff and read it: ``{"target", "graph", "steps",
    "verdict", "layer", "result"}``. ``device``: the HTP runs on that agent's device."""

    from studio.core.layerdiff import bisect_verdict
    from studio.services.layerdiff import layerdiff_result

    project, target = bisect_project(path, target, graph)
    if device:
        from studio.core.layerdiff import bisect_verdict

        result = bisect_on_device(project, target, graph, device, on_event, log)
        read = bisect_verdict(result, result["rows"])
        return {"target": target, "graph": graph, "device": result["device"], **read,
                "result": {k: v for k, v in result.items() if k != "rows"}}
    run_stage(project, "layerdiff", target, on_event)
    got = layerdiff_result(project, target)
    read = bisect_verdict(got["result"], got["rows"])
    return {"target": target, "graph": graph, **read, "result": got["result"]}
