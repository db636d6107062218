"""The device memory plan of a project, per target (:mod:`studio.core.deviceplan`): computed
here once for ``studio info``, ``studio doctor``, the report, the Model page and the bundle
stage's refusal.

The plan is of the bundle the project would ship, the compile stage's binaries: its part
count (the export's parts: the bundle splits nothing), weight sharing, the scheme, the context
length, the AR-N prefill graph (``bundle.prefill_length``, else the prompt length) and the
KV cache as the compiled graphs take it (``htp.graph_io``, ``quantization.kv_cache``).
Read from the checkpoint's weight headers and config: nothing is loaded. With a draft model,
the host side beside it: whether the draft reads the target's token table, and the bytes
that saves (:mod:`studio.core.drafttable`; the two tables compared byte for byte).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from studio.core.artifacts import ArtifactStore
from studio.core.catalog import get_chip
from studio.core.deviceplan import DevicePlan, Dims, Inputs, bundle_inputs, device_plan
from studio.core.drafttable import TableShare
from studio.core.errors import StudioError
from studio.core.jobs import JobStore
from studio.core.parts import Layout
from studio.core.recipe import is_float_scheme
from studio.core.units import format_bytes
from studio.engine import hf_import
from studio.engine.deploy import read
from studio.engine.llm_parts import auto_device_count, checkpoint_layout, export_plan
from studio.engine.shared_table import checkpoint_share
from studio.services.history import latest_job

if TYPE_CHECKING:
    from studio.core.project import Project

def plan_inputs(project: Project, exported_parts: int, layout: Layout) -> Inputs:
    """The project's settings as the inputs of its bundle's plan."""
    return bundle_inputs(
        layout, scheme=project.quantization["scheme"], exported_parts=exported_parts,
        weight_sharing=str(project.bundle.get("weight_sharing", "auto")),
        prompt_length=int(project.export["prompt_length"]),
        context_length=int(project.export["context_length"]),
        prefill_length=int(project.bundle["prefill_length"]), graph_io=project.htp["graph_io"],
        kv_cache=project.quantization["kv_cache"],
        embedding=project.quantization.get("embedding", "auto"))


def _model(project: Project) -> tuple[Any, Layout, int]:
    """(ModelInfo, layout, the export's part count) of a causal-LM project."""
    source = project.input_path(project.model["source"])
    info = hf_import.open_checkpoint(source)
    layout = checkpoint_layout(source)
    parts = project.export["parts"]
    device = (auto_device_count(info, layout, project.targets, project.export["prompt_length"],
                                project.export["context_length"]) if parts == "auto" else None)
    return info, layout, len(export_plan(source, parts, project.export["max_part_mb"], layout,
                                         device))


def project_plans(project: Project) -> list[DevicePlan] | None:
    """The plan of each of the project's targets; None for a project that is not a causal
    LM (its graph is one binary: nothing to split). Raises the export's own refusal when the
    settings cannot split the model."""
    if project.model["kind"] != "causal-lm":
        return None
    info, layout, exported = _model(project)

    if is_float_scheme(project.quantization["scheme"]):
        return None  # a bundle is made from a quantized graph; FP16 has no bundle to plan
    inputs = plan_inputs(project, exported, layout)
    dims = Dims.of(info)
    return [device_plan(layout, dims, get_chip(t), inputs,
                        measured_binaries(project, t, inputs.weight_sharing, inputs.parts))
            for t in project.targets]


def measured_binaries(project: Project, target: str, shared: bool,
                      parts: int) -> dict[str, int] | None:
    """The context binaries' file sizes of the project's newest compile for ``target`` (its
    ``deploy.json``), under the plan's binary names — where that compile holds the binaries
    the plan is of (the same part count and weight sharing); None otherwise."""
    db = project.folder / "runs.sqlite"
    if not db.is_file():
        return None
    jobs = JobStore(db)
    try:
        job = latest_job(jobs, "compile", get_chip(target).key)
    finally:
        jobs.close()
    if job is None or not job.artifact_key:
        return None
    art = ArtifactStore(project.folder / "artifacts").get(job.artifact_key)
    try:
        rec = read(art.path) if art is not None else None
    except StudioError:
        return None
    if rec is None or int(rec["parts"]) != parts or bool(rec.get("shared")) != shared:
        return None
    names = rec.get("part_names") or ["whole"]
    if shared:
        return {names[r["part"] - 1]: int(r["bytes"]) for r in rec["shared"]}
    return {f"{names[r['part'] - 1]}/{r['kind']}": int(r["bytes"]) for r in rec["graphs"]}


def target_plan(project: Project, chip: str) -> DevicePlan | None:
    """The plan of one target (None: not a causal LM, or an FP16 recipe)."""
    for plan in project_plans(project) or []:
        if plan.chip == get_chip(chip).key:
            return plan
    return None


def draft_table_share(project: Project, draft_ref: str | None = None) -> TableShare | None:
    """Whether the project's draft model (``draft_ref``, default ``model.draft``) reads its
    target's token table on the host CPU, why, and the bytes saved
    (:mod:`studio.core.drafttable`); None without a draft."""
    ref = draft_ref or project.model.get("draft")
    if not ref or project.model["kind"] != "causal-lm":
        return None

    return checkpoint_share(project.input_path(project.model["source"]),
                            project.input_path(ref), project.model.get("draft_embedding", "auto"))


def _draft_table(project: Project) -> dict[str, Any] | None:
    try:
        share = draft_table_share(project)
    except StudioError as exc:
        return {"shareable": False, "why": exc.message, "saved_bytes": 0,
                "source": "estimated", "line": f"draft's token table: {exc.message}"}
    return share.to_dict() if share is not None else None


def plans_dict(project: Project) -> dict[str, Any]:
    """The plans as JSON-ready data: ``{"plans": [...]}``, or ``{"plans": None, "why": ...}``
    when there is none (the why in one line); with a draft model, ``draft_table``: whether
    it reads the target's token table on the host CPU and the bytes that saves."""
    draft = {"draft_table": _draft_table(project)} if project.model.get("draft") else {}
    try:
        plans = project_plans(project)
    except StudioError as exc:
        return {"plans": None, "why": exc.message, **draft}
    if plans is None:
        return {"plans": None, "why": "the device plan is for causal LMs with a quantized "
                                      "scheme (a bundle's parts)", **draft}
    return {"plans": [p.to_dict() for p in plans], **draft}


def plan_lines(project: Project, data: dict[str, Any] | None = None) -> list[str]:
    """The plans as text (``data``: :func:`plans_dict` already computed): a summary per
    target, then its rows."""
    data = data if data is not None else plans_dict(project)
    draft = [data["draft_table"]["line"]] if data.get("draft_table") else []
    if data["plans"] is None:
        return [f"device plan: {data['why']}", *draft]
    out = []
    for p in data["plans"]:
        out.append(p["summary"])
        for r in p["rows"]:
            size = "unknown" if r["bytes"] is None else format_bytes(r["bytes"])
            out.append(f"    {r['what']:<34} {size:>11}  {r['source']:<9}  {r['detail']}")
        out.append(f"    limits: address space {_limit(p['npu_va_bytes'])} "
                   f"({p['npu_va_source'] or 'no source'}); context binary "
                   f"{_limit(p['npu_context_bytes'])} ({p['npu_context_source'] or 'no source'})")
    return out + draft


def _limit(n: int | None) -> str:
    return "unknown" if n is None else format_bytes(n)

