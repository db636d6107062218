"""``studio info FILE [--json]``: describe a project file: its settings, its recent runs, the
newest run's figures and (with ``--json``, or when the recipe has overrides) the precision of
each layer.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import open_history, when
from studio.core import figures
from studio.core import project as projectfile
from studio.core.artifacts import ArtifactStore
from studio.core.errors import StudioError
from studio.core.modelinfo import ModelInfo
from studio.core.recipe import DEFAULT_WEIGHT_ROUNDING, is_float_scheme
from studio.services import deviceplan, history, precision
from studio.services.projects import describe_model
from studio.services.prompts import project_lines, template_line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("--json", dest="info_json", action="store_true")


def _rounding(q: dict[str, Any]) -> str:
    """How the recipe rounds its weights, when it is not the quantizer's own nearest."""
    r = q.get("weight_rounding", DEFAULT_WEIGHT_ROUNDING)
    if r == DEFAULT_WEIGHT_ROUNDING:
        return ""
    return f" ({r} rounding{', ignored: float weights' if is_float_scheme(q['scheme']) else ''})"


def _layers(p) -> tuple[list[dict[str, Any]] | None, list[str] | None, str | None]:
    """(layer table, unmatched override patterns, why there is no table)."""
    try:
        info = describe_model(p)
    except StudioError as exc:
        return None, None, exc.message
    if not isinstance(info, ModelInfo):
        return None, None, ("the model is an ONNX file: per-layer precision needs a checkpoint "
                            "or a sample model")
    return precision.layer_precisions(p, info), precision.unmatched(p, info), None


def _stale(p, store, shown) -> tuple[dict[int, str], str]:
    """Which shown jobs' figures no longer match the file (job id -> why), and a line when
    that cannot be told."""
    try:
        return history.stale_reasons(p, store, shown, store=ArtifactStore(
            p.folder / "artifacts")), ""
    except StudioError as exc:
        return {}, f"cannot tell whether they match the file now: {exc.message}"


def run(args: argparse.Namespace, ctx: Context) -> int:
    p = projectfile.load(Path(args.file))
    data = p.to_dict()
    data["file"] = str(p.path)
    runs, latest, metrics, stale_note = _history(p)
    data["recent_runs"] = [r.to_dict() for r in runs]
    data["latest_run"] = latest
    data["latest_metrics"] = metrics
    if stale_note:
        data["latest_metrics_note"] = stale_note
    layers = unmatched = why = None
    if args.info_json or p.quantization["overrides"]:
        layers, unmatched, why = _layers(p)

    device = deviceplan.plans_dict(p)

    if args.info_json:
        data["prompt_format"] = template_line(p) or None
        data["model_notes"] = project_lines(p)
        data["device_plan"] = device
        data["layers"] = layers
        data["unmatched_overrides"] = unmatched
        if why:
            data["layers_error"] = why
        print(json.dumps(data, indent=1))
        return 0
    _print_settings(p, unmatched, device)
    _print_history(runs, latest, metrics, stale_note)
    return 0


def _history(p) -> tuple[list[Any], int | None, list[dict[str, Any]], str]:
    """The project's recent runs, the newest run with results and its figures (each marked
    stale where it no longer matches the file), and a line when that cannot be told."""
    runs: list[history.RunInfo] = []
    latest: int | None = None
    metrics: list[dict[str, Any]] = []
    stale_note = ""
    store = open_history(p)
    if store is not None:
        try:
            runs = history.runs(p, store, 5)
            with_results = history.runs_with_results(store)
            if with_results:
                latest = with_results[0]
                rows = history.run_metrics(store, latest)
                stale, stale_note = _stale(p, store, [job for job, _ in rows])
                metrics = [dict(m.to_dict(), run=latest, stage=job.stage,
                                title=figures.title(m.name),
                                text=figures.fmt(m.name, m.value, m.unit),
                                stale=stale.get(job.id, ""))
                           for job, m in rows]
        finally:
            store.close()
    return runs, latest, metrics, stale_note


def _print_settings(p, unmatched: list[str] | None, device) -> None:
    """The model, its export or graph, the recipe, the targets, the stages and (for an
    LLM) the device plan."""
    print(f"{p.name}  ({p.path})")
    print(f"  model     {p.model['source']}  ({p.model['kind']})"
          + (f"  draft {p.model['draft']}" if p.model["draft"] else ""))
    q = p.quantization
    if p.model["kind"] == "causal-lm":
        print(f"  export    prompt {p.export['prompt_length']}, context "
              f"{p.export['context_length']}")
        for line in project_lines(p):  # the chat template; a VL model's image and lengths
            print(f"  {line}")
        print(f"  recipe    {q['scheme']} {q['weight_granularity']}{_rounding(q)}, "
              f"{q['calibration_samples']} calibration windows, {len(q['overrides'])} "
              "override(s)")
    else:
        g = p.graph
        shapes = ", ".join(f"{k}={v}" for k, v in g["shapes"].items())
        print("  graph     " + (f"sequence length {g['seq_len']}" if p.model["kind"] == "encoder"
                                else f"shapes {shapes or 'as the file declares them'}"))
        calib = g["calibration"] or q["calibration_text"]
        print(f"  recipe    {q['scheme']} {q['weight_granularity']}{_rounding(q)}, up to "
              f"{q['calibration_samples']} calibration samples from {calib}; placement "
              f"{q['placement']}")
    for pattern in unmatched or []:
        print(f"            override {pattern!r} covers no layer of the model")
    print(f"  targets   {', '.join(p.targets)}")
    print(f"  stages    {', '.join(p.pipeline['stages'])}")
    if p.model["kind"] == "causal-lm":
        print("  device plan (what the NPU maps, per target):")
        for line in deviceplan.plan_lines(p, device):
            print(f"    {line}")


def _print_history(runs: list[Any], latest: int | None, metrics: list[dict[str, Any]],
                   stale_note: str) -> None:
    """The recent runs and the newest run's figures."""
    for r in runs:
        print(f"  run {r.id}: {r.state}  (started {when(r.created)})")
    if metrics:
        print(f"  latest figures (run {latest}):")
        width = max(len(m["title"]) for m in metrics)
        for m in metrics:
            print(f"    {m['title']:<{width}}  {m['text']:>17}  {m['source']:<10} "
                  f"{figures.where(m['device'], m['target'])}"
                  + (f"  (stale: {m['stale']})" if m["stale"] else ""))
        if any(m["stale"] for m in metrics):
            print("    stale: made with other settings or inputs than the file holds now; "
                  "run the pipeline again to update them")
        if stale_note:
            print(f"    {stale_note}")


COMMAND = registered("info", add_arguments, run)
