"""Memory planning for the CLI and the GUI: the activation peak of a graph with naive
allocation and with buffer reuse by tensor lifetime, the largest tensors alive at the peak,
the weight and KV cache bytes beside it (see :mod:`studio.core.memplan`).

Figures are computed from the graph's shapes and dtypes: source ``estimated``. Nothing here
imports Qt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studio.core.artifacts import ArtifactStore
from studio.core.errors import StudioError
from studio.core.memplan import DEFAULT_ALIGNMENT, GraphMemory
from studio.core.project import Project
from studio.core.units import format_bytes
from studio.engine.memplan import graph_memory as _graph_memory
from studio.services.history import current_keys

GRAPHS = ("prefill", "decode")
STAGES = ("export", "quantize")


def graph_memory(onnx_path: Path | str, dims: dict[str, int] | None = None,
                 alignment: int = DEFAULT_ALIGNMENT) -> GraphMemory:
    """The memory of one ONNX graph (a dataclass; ``.to_dict()`` for JSON)."""
    return _graph_memory(Path(onnx_path), dims=dims, alignment=alignment)


def memory_plan(onnx_path: Path | str, dims: dict[str, int] | None = None,
                alignment: int = DEFAULT_ALIGNMENT) -> dict[str, Any]:
    """The memory of one ONNX graph as a JSON-able dict (:meth:`GraphMemory.to_dict`)."""
    return graph_memory(onnx_path, dims, alignment).to_dict()


def stage_graphs(project: Project, stage: str) -> dict[str, Path] | None:
    """The prefill / decode ONNX files of ``stage`` (export or quantize) for the project's
    current settings, or None when that stage has no result for them."""
    if stage not in STAGES:
        raise StudioError(f"memory plans are made for the {' and '.join(STAGES)} stages, "
                          f"not {stage!r}")
    if project.path is None:
        raise StudioError("save the project to a file first: its results live in its folder")
    key = current_keys(project, [stage]).get(stage)
    art = ArtifactStore(project.folder / "artifacts").get(key) if key else None
    if art is None:
        return None
    files = {g: art.path / f"{g}.onnx" for g in GRAPHS}
    return {g: f for g, f in files.items() if f.is_file()} or None


def project_memory(project: Project, stages: tuple[str, ...] = STAGES,
                   alignment: int = DEFAULT_ALIGNMENT) -> dict[str, Any]:
    """Plans of every graph the export and quantize stages wrote for the project's current
    settings: ``{"stages": {stage: {graph: GraphMemory dict}}, "missing": [stage, ...]}``.
    StudioError (saying what to run) when none of ``stages`` has a result. Hashes the
    project's inputs and reads the graphs: call it off the UI thread."""
    out: dict[str, Any] = {"stages": {}, "missing": []}
    for stage in stages:
        files = stage_graphs(project, stage)
        if files is None:
            out["missing"].append(stage)
            continue
        out["stages"][stage] = {g: memory_plan(f, alignment=alignment) for g, f in files.items()}
    if not out["stages"]:
        raise StudioError(f"no {' or '.join(stages)} result for the current settings: run "
                          f"studio --batch {project.path} --stages {stages[0]}")
    return out


def graphs_memory(graphs: dict[str, dict[str, Path]],
                  alignment: int = DEFAULT_ALIGNMENT) -> dict[str, Any]:
    """Plans of given graphs (``{stage: {graph: path}}``, e.g. the graphs a profile job
    profiled), in the shape of :func:`project_memory`."""
    out: dict[str, Any] = {"stages": {}, "missing": []}
    for stage in STAGES:
        files = graphs.get(stage)
        if not files:
            out["missing"].append(stage)
            continue
        out["stages"][stage] = {g: memory_plan(f, alignment=alignment) for g, f in files.items()}
    if not out["stages"]:
        raise StudioError("the graphs of this profile are no longer stored; run the profile "
                          "stage again")
    return out


def summary(mem: dict[str, Any]) -> str:
    """One line per graph plan dict: naive vs reuse peak, the peak op, weights, KV cache."""
    p = mem["plan"]
    saving = p["reuse_saving"] * 100
    return (f"{mem['graph']}: activations {format_bytes(p['naive_bytes'])} naive, "
            f"{format_bytes(p['arena_bytes'])} with reuse (−{saving:.1f} %, lower bound "
            f"{format_bytes(p['lower_bound_bytes'])}) at {p['peak_op_type']} {p['peak_node']}; "
            f"weights {format_bytes(mem['weight_bytes'])} "
            f"(FP32 {format_bytes(mem['weight_bytes_fp32'])}), "
            f"KV cache {format_bytes(mem['kv_cache_bytes'])} [{mem['source']}]")
