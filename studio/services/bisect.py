"""``studio bisect``: the seed's three-step accuracy method in one command, on the prefill or
the decode graph of a project's target — the layer diff stage run with the HTP in FP16 beside
it (the backend without quantization), read into one verdict that names the layer.

The project file is not changed: the bisection's settings (``layerdiff.graph``,
``layerdiff.fp16_step``) are set on the loaded project only, so its artifact is the layer
diff of those settings, cached like any other stage result. Nothing here imports Qt.
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core import project as projectfile
from studio.core.artifacts import ArtifactStore
from studio.core.catalog import get_chip
from studio.core.devices import device
from studio.core.errors import StudioError
from studio.core.layerdiff import KL_OK, PAIR_TITLES, bisect_verdict, device_vs_simulator, summarize
from studio.engine.devices import backend
from studio.engine.layerdiff import layer_diff, windows_of
from studio.engine.llm_runtime import load_graph_spec, load_tokenizer
from studio.services.history import current_keys
from studio.services.layerdiff import layerdiff_result
from studio.services.pipeline import plan, preflight
from studio.services.session import Studio
from studio.worker.context import read_text


def bisect_project(path: Path, target: str | None = None, graph: str = "prefill",
                   part: int = 0):
    """The project at ``path`` with the bisection's settings (not saved); ``part``: the part
    of a model exported in parts whose layers are compared (0: a model exported whole)."""
    p = projectfile.load(Path(path))
    if p.model["kind"] != "causal-lm":
        raise StudioError("studio bisect runs on language-model projects; for an ONNX graph "
                          "the graph-validate stage compares every output")
    target = target or p.targets[0]
    if target not in p.targets:
        raise StudioError(f"target {target!r} is not one of the project's targets "
                          f"({', '.join(p.targets)})")
    d = p.to_dict()
    d["layerdiff"] = {**d.get("layerdiff", {}), "graph": graph, "part": int(part),
                      "fp16_step": bool(get_chip(target).fp16)}
    q = projectfile.from_dict(d)
    q.path = p.path
    return q, target


def run_stage(project, stage: str, target: str,
              on_event: Callable[[dict[str, Any]], None] | None) -> None:
    """Run ``stage`` for ``target`` and what it needs (cached where the store has it), as
    ``studio --batch FILE --stages STAGE`` would; one line when it does not succeed."""
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


def exported_parts(project, target: str,
                   on_event: Callable[[dict[str, Any]], None] | None = None) -> int:
    """How many parts the project's export has (exported first when the store lacks it)."""
    if project.export["parts"] in (1, "1"):
        return 1
    run_stage(project, "export", target, on_event)
    art = ArtifactStore(project.folder / "artifacts").get(
        current_keys(project, ["export"])["export"])
    if art is None:
        raise StudioError(f"the export is missing: run studio --batch {project.path} "
                          "--stages export")
    return max(1, len(load_graph_spec(art.path).get("parts") or []))


def bisect_on_device(project, target: str, graph: str, device_id: str,
                     on_event: Callable[[dict[str, Any]], None] | None = None,
                     log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The bisection with the HTP runs on a device through its agent (``agent:NAME@htp:CHIP``
    on a Snapdragon machine, ``@htp-sim:CHIP`` on a simulator): the stored export, quantize
    and compile of the project's current settings (run first when missing), the held-out
    windows, then the layer diff with the device's outputs. A device's figures are a
    measurement, not an artifact: nothing is stored."""
    dev = device(device_id, list(project.targets))

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
                          part=int(project.layerdiff["part"]),
                          htp={"chip": chip, "fp16": False, "fp16_step": chip.fp16,
                               "runner": functools.partial(runner, work=Path(work)),
                               "where": dev.name})
    s = summarize(data)
    return {**data, **{k: v for k, v in s.items() if k != "line"}, "target": target,
            "device": dev.name, "device_id": dev.id, "source": dev.source,
            "pair_titles": {p: PAIR_TITLES[p] for p in data["pairs"]}}


def _bisect_part(path: Path, target: str | None, graph: str, part: int,
                 on_event: Callable[[dict[str, Any]], None] | None, device: str | None,
                 log: Callable[[str], None] | None) -> dict[str, Any]:
    """One bisection: the whole model (``part`` 0) or one part of a model in parts."""
    project, target = bisect_project(path, target, graph, part)
    run_stage(project, "layerdiff", target, on_event)  # this machine's HTP simulator
    got = layerdiff_result(project, target)
    if device:  # the device's reading, beside the simulator's on the same graphs and windows
        result = bisect_on_device(project, target, graph, device, on_event, log)
        read = device_vs_simulator(bisect_verdict(result, result["rows"]), result["rows"],
                                   got["rows"], result["device"], got["result"]["device"])
        return {"target": target, "graph": graph, "device": result["device"], **read,
                "result": {k: v for k, v in result.items() if k != "rows"}}
    read = bisect_verdict(got["result"], got["rows"])
    return {"target": target, "graph": graph, **read, "result": got["result"]}


def _output_kl(got: dict[str, Any]) -> float:
    """A bisection's final-logits KL to FP32: the HTP's, else host QDQ's."""
    lg = got["result"].get("logits", {})
    return float((lg.get("htp") or lg.get("qdq") or {}).get("kl_divergence", 0.0))


def _output_kl_source(got: dict[str, Any]) -> str:
    """Where :func:`_output_kl` comes from, with its source label."""
    r = got["result"]
    if "htp" in r.get("logits", {}):
        return f"the HTP, {r.get('source', 'simulated')} on {r.get('device', 'the device')}"
    return "host QDQ, measured on host-cpu"


def bisect(path: Path, target: str | None = None, graph: str = "prefill",
           on_event: Callable[[dict[str, Any]], None] | None = None,
           device: str | None = None,
           log: Callable[[str], None] | None = None, part: int | None = None) -> dict[str, Any]:
    """Run (or reuse) the bisection's layer diff and read it: ``{"target", "graph", "steps",
    "verdict", "layer", "result"}``. ``device``: the HTP runs on that agent's device.

    A model exported in parts is bisected part by part (``part``: only that one, 1-based):
    each part fed what the FP32 parts before it hand on, its output run on to the logits by
    the FP32 parts after it, so each part's own error is measured at the output; ``parts``
    then lists each part's reading, and the verdict is the reading of the part whose own
    error reaches the logits most."""
    project, target = bisect_project(path, target, graph)
    n = exported_parts(project, target, on_event)
    if n == 1:
        if part not in (None, 0, 1):
            raise StudioError(f"--part {part}: this model is exported whole (one part)")
        return {**_bisect_part(path, target, graph, 0, on_event, device, log), "parts": None}
    if part is not None and not 1 <= part <= n:
        raise StudioError(f"--part {part}: this model is exported in {n} parts (1..{n})")
    reads = []
    for k in [part] if part else range(1, n + 1):
        if log is not None:
            log(f"part {k}/{n}:")
        got = _bisect_part(path, target, graph, k, on_event, device, log)
        info = got["result"]["part"]
        got["verdict"] = (f"part {k}/{n} (blocks {info['blocks'][0]}–{info['blocks'][1] - 1}): "
                          + got["verdict"])
        reads.append(got)
    pick = max(reads, key=_output_kl)
    rows = [{"part": r["result"]["part"]["index"], "blocks": r["result"]["part"]["blocks"],
             "output_kl": _output_kl(r), "output_kl_of": _output_kl_source(r),
             "verdict": r["verdict"], "layer": r["layer"],
             "tensor": r["tensor"]} for r in reads]
    verdict = pick["verdict"]
    if len(reads) > 1 and all(r["output_kl"] < KL_OK for r in rows):
        verdict = ("no part's own error reaches the output (final-logits KL with the other "
                   "parts in FP32: " + ", ".join(f"part {r['part']} {r['output_kl']:.3g}"
                                                 for r in rows)
                   + " nats) — nothing to fix; the largest: " + pick["verdict"])
    elif len(reads) > 1:
        verdict = (f"the most error at the output comes from part "
                   f"{pick['result']['part']['index']} of {n} (final-logits KL "
                   f"{_output_kl(pick):.3g} nats with the other parts in FP32) — "
                   + pick["verdict"])
    return {**pick, "verdict": verdict, "parts": rows}
