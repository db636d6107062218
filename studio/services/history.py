"""The run history, read by run: runs and their state, a run's jobs and figures, run
comparison, and which results are stale against the project as it is now.

The CLI (``studio info``, ``studio compare``), the GUI (Overview, Validation) and the
report all call these; nothing here imports Qt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from studio.core import compare as _compare
from studio.core.errors import StudioError
from studio.core.fsutil import RunLock
from studio.core.jobs import Job, JobStore
from studio.core.metrics import Metric
from studio.core.project import Project
from studio.core.stagegraph import plan, plan_keys


@dataclass(frozen=True)
class RunInfo:
    id: int
    state: str  # running | succeeded | failed | cancelled | interrupted
    created: float
    finished: float | None
    settings: dict[str, Any] | None  # the project settings the run ran with (None: not recorded)
    stages: list[str] | None  # what it asked for (None: the project's stages)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state, "created": self.created,
                "finished": self.finished, "stages": self.stages,
                "settings_recorded": self.settings is not None}


def runs(project: Project, jobs: JobStore, limit: int = 50) -> list[RunInfo]:
    """Runs newest first. A run recorded as running while no process holds the project's
    run lock was killed: it is shown as interrupted (the next open records it so)."""
    going = RunLock(project.folder).held()
    out = []
    for r in jobs.runs(limit):
        full = jobs.run(r["id"]) or r
        raw = full.get("config")
        cfg: dict[str, Any] = raw if isinstance(raw, dict) else {}
        state = r["state"]
        if state == "running" and not going:
            state = "interrupted"
        out.append(RunInfo(r["id"], state, r["created"], r["finished"], cfg.get("settings"),
                           cfg.get("stages")))
    return out


def run_jobs(jobs: JobStore, run_id: int) -> list[Job]:
    return jobs.jobs(run_id=run_id)


def run_metrics(jobs: JobStore, run_id: int) -> list[tuple[Job, Metric]]:
    """Every figure of one run, with the job that produced it, in pipeline order."""
    by_job = {j.id: j for j in jobs.jobs(run_id=run_id)}
    out: list[tuple[Job, Metric]] = []
    for jid, job in by_job.items():
        out.extend((job, m) for m in jobs.metrics(job_id=jid))
    return out


def default_pair(jobs: JobStore) -> tuple[int, int]:
    """The two newest runs with results (older, newer)."""
    ids = _compare.runs_with_results(jobs)
    if len(ids) < 2:
        raise StudioError(
            f"the project has {len(ids)} run(s) with results; compare needs two: run the "
            "pipeline again (e.g. after changing the recipe)"
        )
    return ids[1], ids[0]


def compare(jobs: JobStore, run_a: int | None = None, run_b: int | None = None
            ) -> dict[str, Any]:
    """Run ``run_b`` against ``run_a``: the settings that differ and each metric's delta.
    With no runs given, the last two runs with results; with one, that run against the
    newest."""
    if run_a is None and run_b is None:
        run_a, run_b = default_pair(jobs)
    elif run_b is None:
        newest = _compare.runs_with_results(jobs)
        if not newest:
            raise StudioError("the project has no run with results yet: run the pipeline")
        run_b = newest[0]
    assert run_a is not None and run_b is not None
    return _compare.compare_runs(jobs, run_a, run_b)


def previous_run(jobs: JobStore, run_id: int) -> int | None:
    return _compare.previous_run(jobs, run_id)


def runs_with_results(jobs: JobStore) -> list[int]:
    return _compare.runs_with_results(jobs)


def current_keys(project: Project) -> dict[str, str]:
    """The artifact key every job of the project's full plan would have now (job label ->
    key), computed without running anything. Hashes the input files: call it off the UI
    thread."""
    from studio.services.pipeline import tool_versions

    jobs = plan(project, None)
    keys = plan_keys(project, jobs, tool_versions())
    return {j.label: k for j, k in zip(jobs, keys, strict=True)}


def stale(job: Job, keys: dict[str, str]) -> bool:
    """Whether a finished job's result no longer matches the project as it is now (its
    settings, inputs or the studio's stage code changed since)."""
    want = keys.get(job.label)
    return want is not None and job.artifact_key is not None and job.artifact_key != want


def validation_table(jobs: JobStore, run_id: int
                     ) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per target: FP32, host QDQ and HTP figures of one run's validation, side by side:
    ``{target: {"fp32": {...}, "host_qdq": {...}, "htp": {...}}}``."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for job in jobs.jobs(run_id=run_id):
        if job.stage != "validate" or job.state != "succeeded" or not job.result:
            continue
        r = job.result
        cols: dict[str, dict[str, float | None]] = {
            "fp32": {"perplexity": r.get("perplexity_fp32")},
            "host_qdq": dict(r.get("host_qdq", {})),
            "htp": dict(r.get("htp", {})),
        }
        cols["htp"]["greedy_agreement"] = r.get("greedy_agreement")
        cols["htp"]["greedy_prefix_agreement"] = r.get("greedy_prefix_agreement")
        out[job.target] = cols
    return out
