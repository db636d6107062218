"""Any ONNX network onto the NPU of a target chip, headless: static shapes, the way past ops
the HTP refuses (strict, partition or rewrite), quantization on the user's calibration
samples, the placement report, validation per output against FP32 and the latency per
inference on each side — with every file it made left in one folder to take away."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from studio.core.catalog import get_chip
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json, check_destination
from studio.core.progress import NullProgress, Progress
from studio.core.recipe import PLACEMENTS as PLACEMENTS
from studio.engine import graphpipe, qnn
from studio.engine.graphdata import compare_outputs, load_samples, make_static
from studio.engine.onnx_import import open_onnx
from studio.engine.rewrites import CATALOGUE
from studio.services.generate import stored_artifact


def deploy_graph(onnx_path: Path, out_dir: Path, calibration: Path, target: str,
                 shapes: dict[str, list[int]] | None = None, placement: str = "strict",
                 scheme: str = "W8A16", weight_granularity: str = "per_channel",
                 validation: Path | None = None, repeats: int = 5,
                 progress: Progress | None = None) -> dict[str, Any]:
    """``onnx_path`` through static shapes → (rewrites) → quantization → the HTP of
    ``target``; the files go into ``out_dir`` (``static.onnx``, ``rewritten.onnx`` when a
    rewrite applied, ``quantized.onnx``, ``placement.json``, ``result.json``). Strict
    placement with refused nodes is a :class:`StudioError` naming each with the EP's
    reason. The pipeline's graph stages run the same steps (:mod:`studio.engine.graphpipe`)."""
    progress = progress or NullProgress()
    if placement not in PLACEMENTS:
        raise StudioError(f"placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}")
    chip = get_chip(target)
    out = check_destination(Path(out_dir), folder=True)

    open_onnx(Path(onnx_path))  # a corrupt model: one line, before the folder is made
    for what, given in (("calibration data", calibration), ("validation data", validation)):
        if given is not None and not Path(given).is_file():
            raise StudioError(f"{what} {given} does not exist: give a .npz with one array per "
                              "model input")
    out.mkdir(parents=True, exist_ok=True)
    static = graphpipe.static_graph("onnx-graph", Path(onnx_path), out, shapes, 0, progress)
    inputs = graphpipe.inputs_from_json(static["inputs"])
    feeds, held, held_from = graphpipe.sample_feeds(inputs, Path(calibration),
                                                    Path(validation) if validation else None,
                                                    1 << 30)
    progress.check()
    q = graphpipe.rewrite_and_quantize(out / "static.onnx", out, placement, feeds, held, scheme,
                                       weight_granularity, progress)
    if q["rewrites"]:
        (out / "graph.onnx").replace(out / "rewritten.onnx")
    else:
        (out / "graph.onnx").unlink()
    progress.check()
    progress.update(0.6, f"placing the graph on {chip.name}")
    report = graphpipe.place(out / "quantized.onnx", chip, placement)
    atomic_write_json(out / "placement.json", report)  # kept when the placement refuses
    graphpipe.check_placement(report, chip, "--placement")
    progress.update(0.7, "validating against FP32 and timing")
    cpu = graphpipe.cpu_session(out / "static.onnx")
    htp = qnn.make_session(out / "quantized.onnx", chip, strict=placement != "partition")
    check = compare_outputs(cpu, htp, held)
    result = {
        "model": str(onnx_path), "target": chip.key, "placement": placement,
        "inputs": static["inputs"], "rewrites": q["rewrites"],
        "rewrite_check": q["rewrite_check"], "quantization": q["quantization"],
        "on_npu": {k: report[k] for k in ("all_on_npu", "total_nodes", "qnn_nodes",
                                          "qnn_subgraphs", "transitions", "bytes_crossing")},
        "cpu_nodes": report["cpu_nodes"],
        "validation": {**check, "on": held_from},
        "latency_ms": {
            "htp": {"value": graphpipe.latency(htp, held[0], repeats)["median_ms"],
                    "source": "simulated",
                    "note": "the HTP simulator on this host's CPU: not device latency"
                            + ("; the CPU part of the partition included"
                               if not report["all_on_npu"] else "")},
            "cpu_fp32": {"value": graphpipe.latency(cpu, held[0], repeats)["median_ms"],
                         "source": "measured", "note": "ONNX Runtime, this host's CPU, FP32"},
        },
        "files": sorted(p.name for p in out.iterdir() if p.is_file()),
    }
    atomic_write_json(out / "result.json", result)
    progress.update(1.0, "done")
    return result


def placement_view(project, chip: str) -> dict[str, Any] | None:
    """What the Placement page shows for ``chip`` under the project's current settings: the
    compile stage's stored placement report, or — when the chip's compile has not run or
    refused — the report of the stored quantized graph placed now (seconds; the QNN EP's
    reasons for each refused node), with the refusal the compile stage gives. Also the
    rewrites quantization applied and their check. None when the graph is not quantized
    under these settings yet."""
    if project.model["kind"] == "causal-lm":
        return None
    quant = stored_artifact(project, "graph-quantize", "the quantized graph", run=False)
    if quant is None:
        return None
    q = json.loads((quant / "result.json").read_text())
    comp = stored_artifact(project, f"graph-compile[{chip}]", "the compiled graph", run=False)
    placement = project.quantization["placement"]
    refusal = ""
    if comp is not None:
        report = json.loads((comp / "placement.json").read_text())
        state = "compiled"
    else:
        c = get_chip(chip)
        report = graphpipe.place(quant / "quantized.onnx", c, placement)
        state = "placed"
        try:
            graphpipe.check_placement(report, c)
        except StudioError as exc:
            refusal, state = exc.message, "refused"
    files = {"graph": quant / "graph.onnx", "quantized": quant / "quantized.onnx"}
    if comp is not None:
        files |= {"placement": comp / "placement.json", "context": comp / "graph_ctx.onnx"}

    measured: dict[str, Any] = {}  # what this placement costs: accuracy and time
    for key, label in (("validate", f"graph-validate[{chip}]"),
                       ("htp", f"graph-run[htp-sim:{chip}]"), ("cpu", "graph-run[cpu]")):
        art = stored_artifact(project, label, label, run=False) if comp is not None else None
        if art is not None:
            measured[key] = json.loads((art / "result.json").read_text())
    return {"measured": measured,"state": state, "placement": placement, "report": report, "refusal": refusal,
            "catalogue": {r.refused: f"{r.name}: {r.description}" for r in CATALOGUE},
            "rewrites": q.get("rewrites", []), "rewrite_check": q.get("rewrite_check"),
            "files": {k: str(v) for k, v in files.items() if v.is_file()}}


def save_placement_files(view: dict[str, Any], dest: Path) -> list[Path]:
    """Copy what a user takes away — the float graph after the rewrites, the quantized graph
    (the partition is its placement), the placement report, the compiled context — into
    ``dest``; the placement report is written even when the compile refused."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    names = {"graph": "rewritten.onnx", "quantized": "quantized.onnx",
             "context": "graph_ctx.onnx"}
    for key, name in names.items():
        if key in view["files"]:
            tmp = dest / f".{name}.tmp"
            shutil.copyfile(view["files"][key], tmp)
            tmp.replace(dest / name)
            out.append(dest / name)
    atomic_write_json(dest / "placement.json", view["report"])
    out.append(dest / "placement.json")
    return out


def graph_inputs(onnx_path: Path) -> list[dict[str, Any]]:
    """An ONNX file's inputs (name, dtype, shape with symbolic dimensions as names) — what
    the new-project wizard asks fixed shapes for."""
    open_onnx(Path(onnx_path))  # a corrupt file: one line
    return graphpipe.inputs_to_json(graphpipe.inputs_of(Path(onnx_path)))


def check_graph_samples(onnx_path: Path, shapes: dict[str, list[int]],
                        calibration: Path, validation: Path | None = None) -> int:
    """The shapes fix every dynamic input and the sample files fit the graph (names, dtypes,
    shapes): a one-line :class:`StudioError` otherwise. Returns the calibration samples.
    Seconds for small graphs: the graph is made static in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="qstudio-check-") as tmp:
        inputs = make_static(Path(onnx_path), Path(tmp) / "static.onnx", shapes)
    n = len(load_samples(Path(calibration), inputs))
    if validation is not None:
        load_samples(Path(validation), inputs, "validation data")
    return n
