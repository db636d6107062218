"""Profiles in and out: import a file another tool wrote, find a run's profile, export it as
chrome-trace / Perfetto JSON or CSV — for the CLI (``studio profile ...``) and the GUI."""

from __future__ import annotations

import json
from pathlib import Path

from studio.core.artifacts import ArtifactStore
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_text, check_destination
from studio.core.jobs import Job, JobStore
from studio.core.profile import Profile
from studio.core.profile_export import to_chrome_trace, to_csv
from studio.core.stagegraph import stage_for_role
from studio.engine.profile_import import import_profile
from studio.services import history
from studio.services import profile_view as pv

EXPORT_FORMATS = ("chrome", "csv")


def import_profile_file(path: str | Path, source: str | None = None,
                        onnx_path: str | Path | None = None) -> pv.ProfileData:
    """A profile file (QNN CSV, optrace schematic, ORT JSON, chrome trace, AI Hub JSON)."""
    prof = import_profile(path, source=source, onnx_path=onnx_path)
    return pv.from_profile(prof, prof.table, None, f"{Path(path).name} ({prof.level})")


def run_profile_job(project, run: int | None = None, target: str | None = None) -> Job:
    """The succeeded profile job of ``run`` (default: the newest run that has one)."""
    stage = stage_for_role("profile", project.model["kind"]) or "profile"
    db = project.folder / "runs.sqlite" if project.path else None
    if db is None or not db.exists():
        raise StudioError(f"{project.name} has no runs yet: run studio --batch "
                          f"{project.path} --stages {stage}")
    store = JobStore(db)
    try:
        jobs = [j for j in store.jobs(limit=100_000) if history.plays_role(j, "profile")
                and j.state == "succeeded" and (run is None or j.run_id == run)
                and (target is None or target in j.target)]
    finally:
        store.close()
    if not jobs:
        where = f"run {run}" if run is not None else "any run"
        raise StudioError(f"{where} of {project.name} has no profile: run studio --batch "
                          f"{project.path} --stages {stage}")
    return max(jobs, key=lambda j: j.id)


def load_run_profile(project, run: int | None = None, target: str | None = None,
                     graph: str = "decode") -> pv.ProfileData:
    """A run's profile of ``graph``: the decode step, or a vision-language model's vision
    encoder (``vision``)."""
    job = run_profile_job(project, run, target)
    art = ArtifactStore(project.folder / "artifacts").get(job.artifact_key or "")
    if art is None:
        if graph != "decode":
            raise StudioError(f"the profile's files are gone from the store: profile again "
                              f"to see its {graph} graph")
        return pv.from_result(job)
    return pv.load_folder(art.path, job, graph)


def export(data: pv.ProfileData, fmt: str, out: str | Path) -> Path:
    """Write ``data`` as ``fmt`` (chrome | csv) to ``out`` atomically."""
    if fmt not in EXPORT_FORMATS:
        raise StudioError(f"unknown export format '{fmt}'; use {' or '.join(EXPORT_FORMATS)}")
    prof: Profile = data.profile
    prof.table = data.table
    text = (json.dumps(to_chrome_trace(prof), separators=(",", ":")) if fmt == "chrome"
            else to_csv(prof))
    out = check_destination(Path(out))
    atomic_write_text(out, text)
    return out


def summary(data: pv.ProfileData) -> dict:
    """What ``studio profile import/show --json`` print."""
    t = data.table
    metric = data.metric
    return {
        "title": data.title, "source": data.source, "unit": data.unit,
        "format": data.profile.level, "ops": len(data.profile.ops), "events": len(t),
        "tracks": [x for x in t.vocab["track"] if x], "has_times": t.has("start"),
        "stats": data.stats,
        "by_block": {r.name: {"value": r.value, "share": r.share, "ops": r.count,
                              "min": r.low, "max": r.high}
                     for r in pv.breakdown(data, "block")},
        "by_op_type": dict(list(t.group_sum("op_type", metric).items())[:20]),
        "by_layer": {r.name: r.value for r in pv.breakdown(data, "layer")},
    }
