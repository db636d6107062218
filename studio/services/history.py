"""The run history, read by run: runs and their state, a run's jobs and figures, run
comparison, and which results are stale against the project as it is now.

The CLI (``studio info``, ``studio compare``), the GUI (Overview, Validation) and the
report all call these; nothing here imports Qt.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core import compare as _compare
from studio.core.artifacts import ArtifactStore, artifact_key
from studio.core.errors import StudioError
from studio.core.fsutil import RunLock
from studio.core.jobs import Job, JobStore
from studio.core.metrics import Metric
from studio.core.profile import Profile
from studio.core.project import Project
from studio.core.stagegraph import STAGES, plan, plan_keys
from studio.services.versions import tool_versions


@dataclass(frozen=True)
class RunInfo:
    id: int
    state: str  # running | succeeded | failed | cancelled | interrupted
    created: float
    finished: float | None
    settings: dict[str, Any] | None  # the project settings the run ran with (None: not recorded)
    stages: list[str] | None  # what it asked for (None: the project's stages)
    # a sweep's point: {"name", "point", "label", "settings"} (None: the project's own run)
    sweep: dict[str, Any] | None = None
    # the project file it ran: {"path", "sha256", "matches"} (None: not recorded)
    file: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state, "created": self.created,
                "finished": self.finished, "stages": self.stages,
                "settings_recorded": self.settings is not None,
                "file_sha256": (self.file or {}).get("sha256"),
                "ran_the_file": (self.file or {}).get("matches")}


def _run_info(r: dict[str, Any], going: bool) -> RunInfo:
    """A run of the history (``JobStore.run``) as a RunInfo; ``going``: whether a process
    holds the project's run lock (else a run recorded as running was interrupted)."""
    config = r.get("config")
    cfg: dict[str, Any] = config if isinstance(config, dict) else {}
    state = r["state"]
    if state == "running" and not going:
        state = "interrupted"
    file = cfg.get("file")
    return RunInfo(r["id"], state, r["created"], r["finished"], cfg.get("settings"),
                   cfg.get("stages"), cfg.get("sweep"), file if isinstance(file, dict) else None)


def plays_role(job: Job, role: str) -> bool:
    """Whether a recorded job's stage plays ``role`` ("validate" for validate and
    graph-validate, ...; a stage no longer declared plays none)."""
    decl = STAGES.get(job.stage)
    return decl is not None and decl.role == role


def runs(project: Project, jobs: JobStore, limit: int = 50) -> list[RunInfo]:
    """Runs newest first. A run recorded as running while no process holds the project's
    run lock was killed: it is shown as interrupted (the next open records it so)."""
    going = RunLock(project.folder).held()
    return [_run_info(jobs.run(r["id"]) or r, going) for r in jobs.runs(limit)]


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


def current_keys(project: Project, stages: list[str] | None = None) -> dict[str, str]:
    """The artifact key every job of the project's full plan (or of the plan for ``stages``,
    e.g. an optional stage) would have now (job label -> key), computed without running
    anything. Hashes the input files: call it off the UI thread."""
    jobs = plan(project, stages)
    keys = plan_keys(project, jobs, tool_versions())
    return {j.label: k for j, k in zip(jobs, keys, strict=True)}


def stale(job: Job, keys: dict[str, str]) -> bool:
    """Whether a finished job's result no longer matches the project as it is now (its
    settings, inputs or the studio's stage code changed since)."""
    want = keys.get(job.label)
    return want is not None and job.artifact_key is not None and job.artifact_key != want


def stale_reason(project: Project, jobs: JobStore, job: Job, keys: dict[str, str]) -> str:
    """Why a job's figures no longer match the project ("" when they do): its run's recorded
    settings differ from the project's now, or — the same settings — an input file or the
    studio's stage code changed (a new version of the studio keys its stages anew)."""
    if not stale(job, keys):
        return ""
    info = run_info(project, jobs, job.run_id)
    if info is not None and info.settings is not None and info.settings == project.to_dict():
        return f"inputs or the studio's code changed since run {job.run_id}"
    return f"settings changed since run {job.run_id}"


def measured_base_key(store: ArtifactStore | None, key: str | None) -> str | None:
    """The plan key a measurement was taken under: a measuring stage (run, profile) measured
    again stores its artifact under a key of its own, whose metadata still holds the stage,
    settings, inputs and versions the plan key hashes (None: not stored)."""
    if store is None or not key:
        return None
    art = store.get(key)
    if art is None:
        return None
    m = art.meta
    try:
        return artifact_key(m["stage"], dict(m["config"]), dict(sorted(m["inputs"].items())),
                            dict(m["versions"]))
    except (KeyError, TypeError, AttributeError):
        return None


def stale_reasons(project: Project, jobs: JobStore, shown: list[Job],
                  keys: dict[str, str] | None = None, store: ArtifactStore | None = None
                  ) -> dict[int, str]:
    """Why each shown job's figures no longer match the project file as it is now (job id ->
    :func:`stale_reason`; a job that matches is left out): the one rule every page, report
    and CLI output marks stale figures by. ``keys``: :func:`current_keys` of the stages shown
    (computed here when None: it hashes the input files, call it off the UI thread);
    ``store``: the artifact store, so a measurement taken again (a key of its own) counts as
    current when it was taken under the current plan key."""
    if keys is None:
        keys = current_keys(project, sorted({j.stage for j in shown if j.stage in STAGES}))
    out: dict[int, str] = {}
    for job in shown:
        why = stale_reason(project, jobs, job, keys)
        decl = STAGES.get(job.stage)
        if why and decl is not None and decl.measures \
                and measured_base_key(store, job.artifact_key) == keys.get(job.label):
            why = ""
        if why:
            out[job.id] = why
    return out


def validation_table(jobs: JobStore, run_id: int
                     ) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per target: FP32, host QDQ and HTP figures of one run's validation, side by side:
    ``{target: {"fp32": {...}, "host_qdq": {...}, "htp": {...}}}``."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for job in jobs.jobs(run_id=run_id):
        if not plays_role(job, "validate") or job.state != "succeeded" or not job.result:
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


# ---- validation by run, for the Validation page (read-only helpers) ---------------------------
#: the columns of ``validation_table``: FP32 on the host, the quantized model on the host
#: (QDQ in ONNX Runtime) and on the HTP (the simulator today)
VALIDATION_COLUMNS: tuple[str, ...] = ("fp32", "host_qdq", "htp")
#: the figures of ``validation_table``, in the order a page lists them
VALIDATION_FIGURES: tuple[str, ...] = (
    "perplexity", "logits_cosine_mean", "logits_cosine_min", "logits_max_abs_error",
    "top1_agreement", "greedy_agreement", "greedy_prefix_agreement",
)
#: figures of ``validation_table`` where a smaller value is better
VALIDATION_LOWER_IS_BETTER = frozenset({"perplexity", "logits_max_abs_error"})
# the metric that says where each column's figures come from
_COLUMN_METRIC = {"fp32": "perplexity_fp32", "host_qdq": "perplexity_host_qdq",
                  "htp": "perplexity_quantized"}


def run_info(project: Project, jobs: JobStore, run_id: int) -> RunInfo | None:
    """One run as ``runs`` describes it (None: not in the history)."""
    r = jobs.run(run_id)
    if r is None:
        return None
    return _run_info(r, r["state"] != "running" or RunLock(project.folder).held())


def validation_runs(project: Project, jobs: JobStore, limit: int = 100) -> list[RunInfo]:
    """Runs with at least one succeeded validate job (cached ones count), newest first; the
    project's own runs before the points of sweeps (variants, also listed)."""
    ids = sorted({j.run_id for j in jobs.jobs(limit=50 * limit)
                  if plays_role(j, "validate") and j.state == "succeeded" and j.result},
                 reverse=True)[:limit]
    points = jobs.sweep_run_ids()
    ids = [i for i in ids if i not in points] + [i for i in ids if i in points]
    return [info for i in ids if (info := run_info(project, jobs, i)) is not None]


def validation_sources(jobs: JobStore, run_id: int) -> dict[str, dict[str, dict[str, str]]]:
    """Per target, where each column of ``validation_table`` comes from:
    ``{target: {"fp32": {"source": "measured", "device": "host-cpu"}, ...}}``. FP32 and host
    QDQ run on the host CPU; HTP on the device the validate job ran on."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for job in jobs.jobs(run_id=run_id):
        if not plays_role(job, "validate") or job.state != "succeeded" or not job.result:
            continue
        ms = jobs.metrics(job_id=job.id)
        cols = {"fp32": {"source": "measured", "device": "host-cpu"},
                "host_qdq": {"source": "measured", "device": "host-cpu"},
                "htp": {"source": "simulated", "device": "htp-sim"}}
        off_host = next((m for m in ms if m.device != "host-cpu"), None)
        if off_host is not None:
            cols["htp"] = {"source": off_host.source, "device": off_host.device}
        for col, name in _COLUMN_METRIC.items():
            m = next((m for m in ms if m.name == name), None)
            if m is not None:
                cols[col] = {"source": m.source, "device": m.device}
        out[job.target] = cols
    return out


def validation_compare(jobs: JobStore, run_id: int, against: int | None
                       ) -> dict[str, Any]:
    """Run ``run_id``'s validation figures next to run ``against``'s (None: no comparison):
    per target, one row per figure and column with both values, the delta and whether it
    improved; plus the settings that differ between the two runs (``compare``).

    ``{"run": id, "against": id | None, "settings_recorded": bool, "settings": [...],
    "targets": {target: [{"figure", "column", "value", "previous", "delta", "relative",
    "better"}]}}``"""
    now = validation_table(jobs, run_id)
    before = validation_table(jobs, against) if against is not None else {}
    diff: dict[str, Any] = {"settings_recorded": False, "settings": []}
    if against is not None:
        c = compare(jobs, against, run_id)
        diff = {"settings_recorded": c["settings_recorded"], "settings": c["settings"]}
    targets: dict[str, list[dict[str, Any]]] = {}
    for target in sorted(set(now) | set(before)):
        rows = []
        for fig in VALIDATION_FIGURES:
            for col in VALIDATION_COLUMNS:
                b = now.get(target, {}).get(col, {}).get(fig)
                a = before.get(target, {}).get(col, {}).get(fig)
                if a is None and b is None:
                    continue
                delta = rel = better = None
                if a is not None and b is not None:
                    delta = b - a
                    rel = delta / abs(a) if a else None
                    if delta:
                        better = (delta < 0) == (fig in VALIDATION_LOWER_IS_BETTER)
                rows.append({"figure": fig, "column": col, "value": b, "previous": a,
                             "delta": delta, "relative": rel, "better": better})
        targets[target] = rows
    return {"run": run_id, "against": against, **diff, "targets": targets}


def newest_run_with_results(project: Project, jobs: JobStore) -> RunInfo | None:
    """The newest run that recorded a figure (the run the Overview's cards come from)."""
    ids = runs_with_results(jobs)
    return run_info(project, jobs, ids[0]) if ids else None


#: the stages that measure (run again, a measurement keeps a key of its own)
_MEASURING = frozenset({"run", "profile", "graph-run", "graph-profile"})


def _is_current(job: Job, want: str | None, store: ArtifactStore | None) -> bool:
    """Whether ``job``'s result is the one the project gives its label now (``want``): its
    artifact key, or a measurement taken again under that plan key."""
    return want is not None and job.artifact_key is not None and (
        want == job.artifact_key or (job.stage in _MEASURING
                                     and measured_base_key(store, job.artifact_key) == want))


def current_results(jobs: JobStore, keys: dict[str, str] | None = None,
                    store: ArtifactStore | None = None) -> list[tuple[Job, list[Metric]]]:
    """The project's current state as figures: for each job label (stage and target) that
    recorded any, the newest job's figures — with ``keys`` (:func:`current_keys`), the newest
    job whose artifact key is the current one when there is such a job (its figures match the
    project as it is now), else the newest (stale: :func:`stale` says so) — none when the
    current result exists but recorded no figures (taken from the cache). A one-stage run (a
    bundle, a precision re-run) then leaves the other stages' figures in place. Of the
    project's own runs (a sweep's points are variants); in pipeline order, then by target.

    A job served from the cache carries its artifact's figures but not the run facts of the
    computation (the export's time, ...): those stay those of the job that computed the
    artifact, as a row of their own (that job, from its run), each figure's detail saying
    "from run N (cached: run M reused it)" — a run that reuses the cached export keeps the
    export-time figure.

    With ``store``, a measurement taken again under the current plan key (its own key) is
    current too (:func:`measured_base_key`): the newest measurement is shown, as the stage
    pages show it."""
    points = jobs.sweep_run_ids()
    newest: dict[str, tuple[Job, list[Metric]]] = {}
    current: dict[str, tuple[Job, list[Metric]]] = {}
    matched: set[str] = set()  # labels with a job of the current key (with figures or not)
    done = [j for j in jobs.jobs(limit=5000)  # newest first
            if j.run_id not in points and j.state == "succeeded"]
    for job in done:
        if job.label in current or (keys is None and job.label in newest):
            continue
        is_current = keys is not None and _is_current(job, keys.get(job.label), store)
        matched.update([job.label] if is_current else [])
        figures = jobs.metrics(job_id=job.id)
        if not figures:
            continue
        newest.setdefault(job.label, (job, figures))
        if is_current:
            current[job.label] = (job, figures)
    # a label whose current result came from the cache with no figures of its own (its
    # times were another project's) shows none rather than another setting's as stale: a
    # run again would take it from the cache and still give none
    chosen = {label: current.get(label, row) for label, row in newest.items()
              if label in current or label not in matched}
    rows = list(chosen.values())
    for job, figures in list(rows):
        kept = _computed_figures(jobs, done, job, figures)
        if kept is not None:
            rows.append(kept)
    order = {name: i for i, name in enumerate(STAGES)}
    return sorted(rows, key=lambda row: (order.get(row[0].stage, len(order)),
                                         row[0].target or "", row[0].label, row[0].run_id))


def _computed_figures(jobs: JobStore, done: list[Job], job: Job, figures: list[Metric]
                      ) -> tuple[Job, list[Metric]] | None:
    """For a job served from the cache: the figures of the job that computed its artifact
    (the newest one not cached, same label and key) that the cached job does not carry —
    the run facts of the computation — each saying where it comes from; None when there
    are none."""
    if not job.cached or not job.artifact_key:
        return None
    have = {m.name for m in figures}
    for older in done:
        if (older.label != job.label or older.cached or older.id == job.id
                or older.artifact_key != job.artifact_key):
            continue
        extra = [m for m in jobs.metrics(job_id=older.id) if m.name not in have]
        if not extra:
            return None
        note = (f"from run {older.run_id} (cached: run {job.run_id} reused its "
                f"{job.stage} from the artifact store)")
        return older, [dataclasses.replace(m, detail=f"{note}; {m.detail}" if m.detail
                                           else note) for m in extra]
    return None


# ---- the newest results of each stage (across runs) -------------------------------------
def latest_jobs(jobs: JobStore, stage: str, state: str = "succeeded") -> list[Job]:
    """The newest job of ``stage`` in ``state`` per target, newest first (of the project's
    own runs: a sweep's points are variants, shown on the Sweeps page)."""
    seen: dict[str, Job] = {}
    points = jobs.sweep_run_ids()
    for job in jobs.jobs(limit=2000):  # newest first
        if job.run_id in points:
            continue
        if job.stage == stage and job.state == state and job.target not in seen:
            seen[job.target] = job
    return list(seen.values())


def current_jobs(jobs: JobStore, stage: str, keys: dict[str, str],
                 store: ArtifactStore | None = None) -> list[Job]:
    """The job of ``stage`` per target that a page shows: the newest whose result is the one
    the project gives its label now (the Overview's choice, :func:`current_results`), else
    the newest (stale: its page marks it). One fact, one job, on every page."""
    points = jobs.sweep_run_ids()
    done = [j for j in jobs.jobs(limit=2000)
            if j.run_id not in points and j.stage == stage and j.state == "succeeded"]
    out = []
    for job in latest_jobs(jobs, stage):
        want = keys.get(job.label)
        pick = job
        if not _is_current(job, want, store):
            pick = next((j for j in done if j.target == job.target
                         and _is_current(j, want, store)), job)
        out.append(pick)
    return out


def latest_job(jobs: JobStore, stage: str, target: str | None = None) -> Job | None:
    for job in latest_jobs(jobs, stage):
        if target is None or job.target == target:
            return job
    return None


def artifact_dir(studio, job: Job | None) -> Path | None:
    """The artifact folder a succeeded job produced, when it is still stored."""
    if job is None or not job.artifact_key:
        return None
    art = studio.store.get(job.artifact_key)
    return art.path if art is not None else None


def export_graphs(studio) -> dict[str, Path]:
    """The ONNX graphs of the newest export (``{"prefill": path, "decode": path}``, and a
    vision-language model's ``"vision"``: its encoder)."""
    folder = artifact_dir(studio, latest_job(studio.jobs, "export"))
    if folder is None:
        return {}
    return {
        g: folder / f"{g}.onnx" for g in ("prefill", "decode", "vision")
        if (folder / f"{g}.onnx").exists()
    }


@dataclass
class GraphFile:
    """An ONNX graph of the project's newest artifacts, for the Model page."""

    path: Path
    stage: str  # "export" | "quantize"
    graph: str  # "prefill", "decode", "vision"
    #: the newest compile's placement of this graph ({"chip", "cpu_nodes", ...}) when the
    #: graph is a quantized one that was compiled
    placement: dict[str, Any] | None = None


def graph_files(studio) -> dict[str, GraphFile]:
    """The project's ONNX graphs by a label: the newest export's FP32 graphs and the newest
    quantization's, each quantized graph with the newest compile's placement of it (where each
    node runs on the NPU of that compile's chip)."""
    out = {g: GraphFile(p, "export", g) for g, p in export_graphs(studio).items()}
    qfolder = artifact_dir(studio, latest_job(studio.jobs, "quantize"))
    if qfolder is None:
        return out
    compiled = latest_job(studio.jobs, "compile")
    cfolder = artifact_dir(studio, compiled)
    placement: dict[str, Any] = {}
    if cfolder is not None and (cfolder / "placement.json").exists():
        try:
            placement = json.loads((cfolder / "placement.json").read_text())
        except (OSError, ValueError):
            placement = {}
    for g in ("prefill", "decode", "vision"):
        path = qfolder / f"{g}.onnx"
        if not path.exists():
            continue
        place = placement.get(g) if isinstance(placement.get(g), dict) else None
        chip = (place or {}).get("chip") or (compiled.target if compiled else "")
        label = f"{g} · quantized, compiled for {chip}" if place is not None \
            else f"{g} · quantized"
        out[label] = GraphFile(path, "quantize", g, place)
    return out


def profile_totals(studio, job: Job) -> tuple[dict[str, float], str, str]:
    """(op-type totals, unit, source) of a profile job: the full profile when stored."""
    folder = artifact_dir(studio, job)
    if folder is not None and (folder / "profile.json").exists():
        prof = Profile.from_dict(json.loads((folder / "profile.json").read_text()))
        return prof.totals_by_op_type(), prof.unit, prof.source
    res = job.result or {}
    return (
        dict(res.get("by_op_type", {})),
        str(res.get("unit", "")),
        str(res.get("source", "simulated")),
    )
