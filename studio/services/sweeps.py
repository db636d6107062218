"""Recipe sweeps: every point of a sweep run through the declared stage graph at once.

Each point is the project with its settings applied (:func:`studio.core.project.apply_point`).
The sweep plans every point's jobs and their artifact keys, then runs each *distinct* key
once: points that share a prefix (one export for every quantization point) share its job,
and a key already in the store is not run at all. The jobs go to an executor — the local
process pool (default) or Ray (``studio.services.ray_executor``) — as soon as their inputs
exist, as many at once as it has slots.

Each finished point is recorded as a run of the history (its settings, its jobs with their
artifact keys, metrics and gates), so ``studio compare`` and the GUI open it like any run,
and as a row of the sweep (state, reason, figures). A point that fails (a gate, a refused
op, a stage error) keeps its reason and does not stop the others. A killed sweep resumes:
points whose keys have not changed keep their recorded result, and the jobs of the others
that finished are served by the store. A key is computed under its store lock, so two
sweeps (or a sweep and a run) never write the same artifact twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from studio.core import archs, perfmodel
from studio.core import figures as catalogue
from studio.core.artifacts import ArtifactStore
from studio.core.errors import StudioError
from studio.core.fsutil import RunLock, sha256_json
from studio.core.jobs import JobStore
from studio.core.metrics import Metric
from studio.core.project import Project, apply_point
from studio.core.scheduler import CANCELLED, Scheduler, WorkItem
from studio.core.stagegraph import (
    MODEL_KINDS,
    STAGES,
    PlannedJob,
    job_key,
    plan,
    stage_config,
    stage_for_role,
)
from studio.core.sweep import (
    Point,
    PointResult,
    SweepSpec,
    best_point,
    pareto_front,
    parse_axis_arg,
    parse_spec,
)
from studio.engine import hf_import
from studio.engine.deploy import read as read_deploy
from studio.services.edits import project_edits
from studio.services.executors import executor_name, make_executor, model_bytes
from studio.services.jobrunner import JobRunner, StageJob, job_gates, not_run
from studio.services.partplan import part_plan
from studio.services.precision import scheme_diff
from studio.services.preflight import preflight
from studio.services.sharedstore import shared_store
from studio.services.versions import tool_versions
from studio.services.workers import OnMessage

# what a sweep runs when it names no stages: up to the check against FP32 on each target
SWEEP_ROLES = ("export", "quantize", "compile", "validate")
SWEEP_STAGES = {k: tuple(stage_for_role(r, k) for r in SWEEP_ROLES) for k in MODEL_KINDS}
# the accuracy a point is compared by (higher is better), per model kind
ACCURACY = {kind: (name, catalogue.title(name)) for kind, name in (
    ("causal-lm", "logits_cosine_mean"), ("encoder", "output_cosine_min"),
    ("onnx-graph", "output_cosine_min"))}
FINISHED = ("succeeded", "failed", "invalid")

Listener = Callable[[dict[str, Any]], None]


#: the name a precision ladder (``studio sweep FILE --ladder N``) is recorded under
LADDER = "ladder"


def find_spec(project: Project, name: str | None = None, axes: list[str] | None = None,
              best: str | None = None, stages: list[str] | None = None,
              points: list[dict[str, Any]] | None = None) -> SweepSpec:
    """The sweep to run: one of the project's ``[[sweeps]]`` by name (the only one when
    there is one), a grid from ``--axis`` arguments (named ``name`` or "cli"), or a list of
    ``points`` (named ``name`` or "ladder": a precision ladder's rungs)."""
    if points:
        table: dict[str, Any] = {"name": name or LADDER, "points": points}
    elif axes:
        table = {"name": name or "cli", "axes": dict(parse_axis_arg(a) for a in axes)}
    else:
        declared = {t["name"]: t for t in project.sweeps}
        if not declared:
            raise StudioError("the project declares no sweeps: add a [[sweeps]] table, or give "
                              "--axis KEY=V1,V2 (e.g. quantization.scheme=W8A16,W8A8)")
        if name is None:
            if len(declared) > 1:
                raise StudioError(f"the project declares {len(declared)} sweeps "
                                  f"({', '.join(declared)}): choose one with --name")
            name = next(iter(declared))
        if name not in declared:
            raise StudioError(f"no sweep named {name!r}; the project declares "
                              f"{', '.join(declared)}")
        table = dict(declared[name])
    if best:
        table["best"] = best
    if stages:
        table["stages"] = stages
    return parse_spec(table, project)


def sweep_stages(spec: SweepSpec, kind: str) -> list[str]:
    # the report is the run's, not a point's; the sweep writes its own
    return [s for s in (spec.stages or SWEEP_STAGES[kind]) if not STAGES[s].needs_all]


# ---- the jobs -----------------------------------------------------------------------------
@dataclass
class SweepJob:
    """One distinct stage job of the sweep (one artifact key), shared by its points."""

    key: str
    stage: str
    target: str
    config: Any  # StageConfig
    input_keys: dict[str, str]  # input label -> key
    deps: list[str]
    points: list[str] = field(default_factory=list)
    state: str = "pending"  # pending | running | succeeded | failed | cancelled
    cached: bool = False
    computed_by: str = ""  # the point that first recorded it (others reuse it)
    result: dict[str, Any] | None = None
    facts: list[Metric] = field(default_factory=list)  # run facts of its computation
    artifact_key: str = ""  # its artifact's key (for a measurement: the newest one)
    message: str = ""
    started: float | None = None
    finished: float | None = None
    progress: float = 0.0
    log: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.stage}[{self.target}]" if self.target else self.stage

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "stage": self.stage, "target": self.target,
                "state": self.state, "cached": self.cached, "points": list(self.points),
                "seconds": round((self.finished or 0) - (self.started or 0), 2)
                if self.started and self.finished else None, "message": self.message}


@dataclass
class PointRun:
    point: Point
    variant: Project | None = None
    planned: list[PlannedJob] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    state: str = "pending"
    reason: str = ""
    run_id: int | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    kept: bool = False  # finished in an earlier (interrupted) run of the sweep

    @property
    def keys_digest(self) -> str:
        return sha256_json(self.keys) if self.keys else ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.point.id, "label": self.point.label, "index": self.point.index,
                "settings": dict(self.point.settings), "state": self.state,
                "reason": self.reason, "run_id": self.run_id, "kept": self.kept,
                "metrics": self.figures.get("metrics", []),
                **{k: v for k, v in self.figures.items() if k != "metrics"}}


@dataclass
class SweepSummary:
    name: str
    state: str
    executor: str
    points: list[PointRun]
    jobs: list[SweepJob]
    seconds: float
    front: list[int]
    best: int | None
    best_rule: str
    accuracy_metric: str
    workers: int

    @property
    def computed(self) -> list[SweepJob]:
        return [j for j in self.jobs if j.state == "succeeded" and not j.cached]

    def to_dict(self) -> dict[str, Any]:
        done = [p for p in self.points if p.state in FINISHED and not p.kept]
        return {
            "sweep": self.name, "state": self.state, "executor": self.executor,
            "workers": self.workers, "seconds": round(self.seconds, 2),
            "points_per_minute": round(len(done) / (self.seconds / 60), 3)
            if self.seconds > 0 and done else None,
            "accuracy_metric": self.accuracy_metric, "best_rule": self.best_rule,
            "points": [p.to_dict() for p in self.points],
            "pareto_front": [self.points[i].point.label for i in self.front],
            "best": self.points[self.best].point.label if self.best is not None else None,
            "jobs": {"distinct": len(self.jobs),
                     "computed": len(self.computed),
                     "cached": sum(1 for j in self.jobs if j.cached),
                     "by_stage": _count_by_stage(self.computed)},
        }


def _count_by_stage(jobs: list[SweepJob]) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in jobs:
        out[j.stage] = out.get(j.stage, 0) + 1
    return out


# ---- figures of a finished point ---------------------------------------------------------------
def _metric(metrics: list[dict[str, Any]], name: str, chip: str = "") -> dict[str, Any] | None:
    """The first recorded metric ``name`` (on ``chip`` when given), with its source."""
    for m in metrics:
        if m["name"] == name and (not chip or m.get("target") == chip
                                  or chip in str(m.get("device", ""))):
            return m
    return None


def point_figures(variant: Project, results: dict[str, dict[str, Any]],
                  store: ArtifactStore, compile_keys: dict[str, str]) -> dict[str, Any]:
    """What the sweep compares a point by, each with its source: the accuracy metric (on the
    first target), perplexity where the LLM validation ran, weight bytes (estimated from the
    recipe: parameters × bytes per parameter), the compiled context binaries' bytes on the
    first target (measured: file sizes; the ``size`` the Pareto front uses), estimated
    decode tok/s per target chip (performance model)."""
    kind = variant.model["kind"]
    metrics = [m for r in results.values() for m in r.get("metrics", [])]
    chip = variant.targets[0]
    acc_name, acc_title = ACCURACY[kind]
    out: dict[str, Any] = {"metrics": metrics, "accuracy_metric": acc_name,
                           "accuracy_title": acc_title}
    acc = _metric(metrics, acc_name, chip)
    if acc is not None:
        out["accuracy"] = {"value": float(acc["value"]), "source": acc["source"],
                           "target": chip}
    ppl_q, ppl_f = _metric(metrics, "perplexity_quantized", chip), _metric(
        metrics, "perplexity_fp32")
    if ppl_q is not None and ppl_f is not None and ppl_f["value"]:
        out["perplexity_increase"] = {"value": ppl_q["value"] / ppl_f["value"] - 1.0,
                                      "source": ppl_q["source"], "target": chip}
    if kind == "causal-lm":
        try:
            out["weight_bytes"] = {"value": _recipe_weight_bytes(variant),
                                   "source": "estimated",
                                   "detail": "parameters × bytes per parameter of the recipe"}
        except StudioError:
            pass
        out["tokens_per_s"] = _estimated_speed(variant)
    # the HTP compiler's own figures of a decode step (a sweep whose stages include profile):
    # deterministic, so an optimization level or a VTCM budget compares exactly
    for key, name in (("compiler_dram_bytes", "compiler_dram_bytes_per_step"),
                      ("compiler_vtcm_bytes", "compiler_vtcm_bytes_per_step")):
        m = _metric(metrics, name, chip)
        if m is not None:
            out[key] = {"value": float(m["value"]), "source": m["source"], "target": chip,
                        "detail": m.get("detail", "")}
    ctx = compile_keys.get(chip)
    art = store.get(ctx) if ctx else None
    if art is not None:
        deployed = read_deploy(art.path)
        size = (int(deployed["binary_bytes"]) if deployed else
                sum(f.stat().st_size for f in art.path.glob("*_ctx.onnx")))
        if size:
            out["context_bytes"] = {"value": size, "source": "measured", "target": chip,
                                    "detail": "compiled context binaries, file sizes"}
    # what a point is compared by for size: the compiled context binaries the target loads
    # (weights, activation encodings, the graph), else the recipe's weight bytes
    if "context_bytes" in out:
        out["size"] = {**out["context_bytes"], "title": catalogue.title("deployable_binary_bytes")}
    elif "weight_bytes" in out:
        out["size"] = {**out["weight_bytes"], "title": catalogue.title("matmul_weight_bytes")}
    return out


def _recipe_weight_bytes(variant: Project) -> float:
    info = hf_import.open_checkpoint(variant.input_path(variant.model["source"]))
    return float(scheme_diff(variant, info)["weight_bytes"]["recipe"])


def _estimated_speed(variant: Project) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    try:
        arch = archs.load_arch(variant.input_path(variant.model["source"]))
    except (StudioError, OSError, ValueError, KeyError):
        return out
    for chip in variant.targets:
        try:
            float_io = variant.htp["graph_io"] == "float" and \
                variant.quantization["scheme"] != "FP16"
            est = perfmodel.estimate(arch, chip, variant.quantization["scheme"],
                                     variant.export["context_length"], float_io=float_io)
        except (StudioError, ValueError, KeyError):
            continue
        out[chip] = {"value": est.decode_tokens_per_s, "source": "estimated",
                     "model_version": perfmodel.MODEL_VERSION,
                     "detail": f"decode tok/s, {variant.quantization['scheme']}, context "
                               f"{variant.export['context_length']}, graph I/O "
                               f"{variant.htp['graph_io']} (performance model; "
                               "per-layer overrides are not modelled)"}
    return out


def size_figure(figures: dict[str, Any]) -> dict[str, Any] | None:
    """The size a point is compared by (see :func:`point_figures`)."""
    if figures.get("size"):
        return figures["size"]
    if figures.get("context_bytes"):
        return {**figures["context_bytes"], "title": catalogue.title("deployable_binary_bytes")}
    if figures.get("weight_bytes"):
        return {**figures["weight_bytes"], "title": catalogue.title("matmul_weight_bytes")}
    return None


def point_result(p: PointRun) -> PointResult:
    f = p.figures
    speed = f.get("tokens_per_s") or {}
    first = next(iter(speed.values()), None)
    size = (size_figure(f) or {}).get("value")
    if size is not None:  # a few bytes of metadata do not make a recipe smaller
        size = round(size / 1024) * 1024
    return PointResult(
        p.point, p.state,
        accuracy=(f.get("accuracy") or {}).get("value"),
        size_bytes=size,
        tokens_per_s=first["value"] if first else None,
        gates_passed=f.get("gates_passed"), reason=p.reason)


# ---- the runner ---------------------------------------------------------------------------------
class SweepRunner:
    """Runs one sweep of a project; ``listeners`` get ``{"kind": "point" | "job" | "sweep"}``
    events as states change (the GUI's Sweeps page draws them live)."""

    def __init__(self, project: Project, jobs: JobStore, store: ArtifactStore, spec: SweepSpec,
                 executor: str | None = None, workers: int | None = None,
                 ray_address: str | None = None, transfer: str = "auto"):
        self.project, self.jobs, self.store, self.spec = project, jobs, store, spec
        # where the jobs run: the command's choice, else the project's pipeline.executor
        self.executor_name = executor_name(project, executor)
        self.workers_asked = workers
        self.ray_address, self.transfer = ray_address, transfer
        self.listeners: list[Listener] = []
        self.points: list[PointRun] = []
        self.unique: dict[str, SweepJob] = {}
        self._cancelled = False
        self._executor: Any = None
        self._scheduler: Scheduler | None = None
        self._by_item: dict[int, SweepJob] = {}
        self._runner = JobRunner(store, self._execute_spec, shared_store())
        self._next_id = 0
        self.note = ""

    def _emit(self, event: dict[str, Any]) -> None:
        for cb in list(self.listeners):
            cb(event)

    def cancel(self) -> None:
        """Stop the sweep: running jobs are stopped, finished points stay recorded."""
        self._cancelled = True
        if self._scheduler is not None:  # the waiting jobs end; the executor stops the others
            self._scheduler.cancel(running=False)
        if self._executor is not None:
            self._executor.cancel()

    # -- planning --
    def _plan_points(self, versions: dict[str, str]) -> None:
        kind = self.project.model["kind"]
        stages = sweep_stages(self.spec, kind)
        earlier = {r["point_id"]: r for r in self.jobs.points(self.spec.name)}
        for point in self.spec.expand():
            pr = PointRun(point)
            self.points.append(pr)
            try:
                pr.variant = apply_point(self.project, point.settings)
                pr.planned = plan(pr.variant, stages)
                preflight(pr.variant, pr.planned)
            except StudioError as exc:
                pr.state, pr.reason = "invalid", exc.message
            if pr.variant is not None and pr.state != "invalid":
                cfgs = [stage_config(pr.variant, j) for j in pr.planned]
                for j, cfg in zip(pr.planned, cfgs, strict=True):
                    inputs = {pr.planned[d].label: pr.keys[d] for d in j.deps}
                    pr.keys.append(job_key(cfg, inputs, versions))
                    key = pr.keys[-1]
                    uj = self.unique.get(key)
                    if uj is None:
                        uj = self.unique[key] = SweepJob(
                            key, j.stage, j.target, cfg, inputs,
                            [pr.keys[d] for d in j.deps])
                    uj.points.append(point.id)
            old = earlier.get(point.id)
            if old and old["state"] in FINISHED and old["keys"] == pr.keys_digest:
                pr.state, pr.reason, pr.run_id = old["state"], old["reason"], old["run_id"]
                pr.figures, pr.kept = old["figures"], True
            if pr.kept or pr.state == "invalid":
                for key in pr.keys:
                    self.unique[key].points.remove(point.id)
            else:
                pr.state = "pending"
            self._record(pr)
        # jobs only finished points needed are not run again
        self.unique = {k: j for k, j in self.unique.items() if j.points}

    def _record(self, pr: PointRun) -> None:
        self.jobs.set_point(self.spec.name, pr.point.id, pr.point.index,
                            dict(pr.point.settings), pr.state, pr.reason, pr.run_id,
                            pr.keys_digest, pr.figures)
        self._emit({"kind": "point", "point": pr})

    # -- running --
    async def run(self) -> SweepSummary:
        t0 = time.time()
        lock = RunLock(self.project.folder / "sweeps" / self.spec.name)
        try:
            lock.acquire()
        except StudioError:
            raise StudioError(f"the sweep {self.spec.name!r} is already running in another "
                              "process: wait for it or cancel it") from None
        try:
            return await self._run(t0)
        finally:
            lock.release()

    async def _run(self, t0: float) -> SweepSummary:
        versions = await asyncio.to_thread(tool_versions)
        self.jobs.start_sweep(self.spec.name, self.spec.to_dict(), self.executor_name)
        await asyncio.to_thread(self._plan_points, versions)
        self._emit({"kind": "sweep", "state": "running", "points": len(self.points)})
        state = "succeeded"
        todo = [j for j in self.unique.values()]
        try:
            if todo:
                self._executor = await asyncio.to_thread(self._make_executor)
                await self._execute(versions)
        except BaseException:
            await self._stop_executor()
            for pr in self.points:
                if pr.state in ("pending", "running"):
                    pr.state, pr.reason = "cancelled", "the sweep was interrupted"
                    self._record(pr)
            self.jobs.finish_sweep(self.spec.name, "cancelled")
            raise
        if self._executor is not None:
            await self._executor.close()
        for pr in self.points:
            if pr.state in ("pending", "running"):
                await asyncio.to_thread(self._finish_point, pr)
        if self._cancelled:
            state = "cancelled"
        elif any(p.state in ("failed", "invalid") for p in self.points):
            state = "finished with failures"
        self.jobs.finish_sweep(self.spec.name, state)
        results = [point_result(p) for p in self.points]
        front = pareto_front(results)
        best = best_point(results, self.spec.best)
        kind = self.project.model["kind"]
        summary = SweepSummary(self.spec.name, state, self._describe(), self.points,
                               list(self.unique.values()), time.time() - t0, front, best,
                               self.spec.best, ACCURACY[kind][0], self._slots())
        self._emit({"kind": "sweep", "state": state, "summary": summary})
        return summary

    def _slots(self) -> int:
        return getattr(self._executor, "size", 0) if self._executor is not None else 0

    def _describe(self) -> str:
        if self._executor is None:
            return f"{self.executor_name} (nothing to run: every point was finished or cached)"
        return self._executor.describe() + (f"; {self.note}" if self.note else "")

    def _make_executor(self) -> Any:
        executor, self.note = make_executor(self.project, self.store, self.executor_name,
                                            self.workers_asked, self.ray_address,
                                            self.transfer, model_bytes(self.project))
        return executor

    async def _stop_executor(self) -> None:
        if self._executor is not None:
            await self._executor.stop()

    async def _execute(self, versions: dict[str, str]) -> None:
        """Every distinct job as a work item of the scheduler, waiting for the jobs that make
        its inputs, as many at once as the executor has slots; a failed or cancelled input
        ends the jobs after it."""
        sched = Scheduler(slots=self._executor.size, on_end=self._item_ended)
        items: dict[str, WorkItem] = {}
        peaks = self._stage_peaks()
        for key, j in self.unique.items():
            items[key] = sched.add(j.label, self._job_work(j, versions), deps=[
                items[d].id for d in j.deps if d in items], memory=peaks.get(j.stage) or None)
            self._by_item[items[key].id] = j
        self._scheduler = sched
        if self._cancelled:
            sched.cancel()
        await sched.run()

    def _stage_peaks(self) -> dict[str, int]:
        """Each stage's predicted memory peak (estimated) from the project's part plan: two
        jobs run at once only where both fit in the free memory; {} without a prediction."""
        if self.executor_name == "ray":  # Ray places its tasks by the nodes' memory
            return {}
        try:
            plan = part_plan(self.project)
        except StudioError:  # the export stage refuses such settings in its own words
            return {}
        return dict(plan.peaks) if plan is not None else {}

    def _job_work(self, j: SweepJob, versions: dict[str, str]):
        async def run() -> None:
            await self._run_job(j, versions)
            if j.state != "succeeded":  # recorded by its sink: its dependants do not run
                raise StudioError(j.message or j.state)
        return run

    def _item_ended(self, item: WorkItem) -> None:
        """A job's item ended: a job its runner did not record is recorded, saying why."""
        j = self._by_item[item.id]
        if j.state not in ("succeeded", "failed", "cancelled"):
            if item.blocked_by is not None:
                j.state, j.message = "cancelled", not_run(item.blocked_by.name)
            elif item.state == CANCELLED:
                j.state, j.message = "cancelled", "cancelled"
            else:  # it raised outside the job runner
                j.state, j.message = "failed", item.why
            j.finished = time.time()
        self._job_done(j)

    def _job_done(self, j: SweepJob) -> None:
        self._emit({"kind": "job", "job": j})
        for pr in self.points:
            if pr.state not in ("pending", "running") or pr.point.id not in j.points:
                continue
            states = [self.unique[k].state for k in pr.keys]
            if all(s in ("succeeded", "failed", "cancelled") for s in states):
                self._finish_point(pr)
            elif pr.state == "pending":
                pr.state = "running"
                self._record(pr)

    async def _run_job(self, j: SweepJob, versions: dict[str, str]) -> None:
        self._next_id += 1
        job = StageJob(self._next_id, j.config, j.input_keys, versions)
        try:
            await self._runner.run(job, _SweepSink(self, j), cancelled=lambda: self._cancelled)
        except StudioError as exc:
            j.state, j.message, j.finished = "failed", exc.message, time.time()

    async def _execute_spec(self, spec: dict[str, Any], on_message: OnMessage
                            ) -> dict[str, Any]:
        return await self._executor.run(spec, on_message)

    # -- a point is done: its run in the history -------------------------------------------
    def _finish_point(self, pr: PointRun) -> None:
        assert pr.variant is not None
        variant = pr.variant
        run_id = self.jobs.create_run({
            "stages": [j.stage for j in pr.planned], "targets": None, "retry": None,
            "settings": variant.to_dict(),
            "sweep": {"name": self.spec.name, "point": pr.point.id, "label": pr.point.label,
                      "settings": dict(pr.point.settings)}})
        ids = [self.jobs.add_job(run_id, j.stage, j.target) for j in pr.planned]
        gates: list[dict[str, Any]] = []
        results: dict[str, dict[str, Any]] = {}
        compile_keys: dict[str, str] = {}
        for jid, pj, key in zip(ids, pr.planned, pr.keys, strict=True):
            if pj.deps:
                self.jobs.set_depends_on(jid, [ids[d] for d in pj.deps])
            uj = self.unique[key]
            reused = uj.state == "succeeded" and (uj.cached or (
                uj.computed_by and uj.computed_by != pr.point.id))
            if uj.state == "succeeded" and not uj.computed_by:
                uj.computed_by = pr.point.id
            fields: dict[str, Any] = {
                "state": uj.state, "started": uj.started, "finished": uj.finished,
                "progress": 1.0 if uj.state == "succeeded" else uj.progress,
                "artifact_key": (uj.artifact_key or key) if uj.state == "succeeded" else None,
                "cached": 1 if reused else 0, "result": uj.result,
                "message": (f"shared with {self._label_of(uj.computed_by)} in this sweep"
                            if reused and not uj.cached else uj.message)}
            if uj.state == "failed":
                fields["error"] = uj.message
            self.jobs.update_job(jid, **fields)
            for line in uj.log[-200:] if not reused else []:
                self.jobs.append_log(jid, line)
            if uj.result is not None:
                metrics = [Metric.from_dict(m) for m in uj.result.get("metrics", [])]
                if not reused:
                    metrics += uj.facts
                self.jobs.add_metrics(jid, metrics)
                results[pj.label] = uj.result
                gates.extend(job_gates(pj.decl, variant.gates, pj.target, uj.result))
                if pj.decl.role == "compile":
                    compile_keys[pj.target] = uj.artifact_key or key
        states = [self.unique[k].state for k in pr.keys]
        run_state = ("succeeded" if all(s == "succeeded" for s in states)
                     else "failed" if "failed" in states else "cancelled")
        self.jobs.finish_run(run_id, run_state)
        pr.run_id = run_id
        pr.figures = point_figures(variant, results, self.store, compile_keys)
        pr.figures["gates"] = gates
        pr.figures["gates_passed"] = bool(gates) and all(g["passed"] for g in gates)
        failed_gates = [g for g in gates if not g["passed"]]
        if run_state == "succeeded" and failed_gates:
            g = failed_gates[0]
            pr.state = "failed"
            pr.reason = (f"gate {g['gate']} [{g['target']}]: {g['value']:.4f} against "
                         f"{g['threshold']}")
        elif run_state == "succeeded":
            pr.state, pr.reason = "succeeded", ""
        elif run_state == "failed":
            first = next(self.unique[k] for k in pr.keys if self.unique[k].state == "failed")
            pr.state, pr.reason = "failed", first.message
        else:
            pr.state, pr.reason = "cancelled", "cancelled before it finished"
        self._record(pr)

    def _label_of(self, point_id: str) -> str:
        return next((p.point.label for p in self.points if p.point.id == point_id), point_id)


class _SweepSink:
    """A sweep job's events, kept on its :class:`SweepJob` (each point's run records them
    when the point finishes); its start and progress go to the listeners, its end when the
    scheduler has seen it (``SweepRunner._job_done``)."""

    FIELDS = ("state", "started", "finished", "progress", "message", "result", "artifact_key")

    def __init__(self, runner: SweepRunner, job: SweepJob):
        self.runner, self.job = runner, job

    def update(self, **fields: Any) -> None:
        for name in self.FIELDS:
            if name in fields:
                setattr(self.job, name, fields[name])
        if "cached" in fields:
            self.job.cached = bool(fields["cached"])
        if self.job.state not in ("succeeded", "failed", "cancelled"):
            self.runner._emit({"kind": "job", "job": self.job})

    def log(self, line: str) -> None:
        if len(self.job.log) < 2000:
            self.job.log.append(line)

    def partial(self, data: Any) -> None:
        return None  # a sweep shows no live output

    def metrics(self, metrics: list[Metric], facts: list[Metric]) -> None:
        self.job.facts = facts  # the result's own figures are recorded from job.result

    def traceback(self, text: str) -> None:
        self.job.log.append(text)


# ---- reading a recorded sweep -------------------------------------------------------------------
def recorded(project: Project, jobs: JobStore, name: str) -> dict[str, Any] | None:
    """A sweep as the history holds it: its spec, state, points (with figures), the Pareto
    front and the best point (what the Sweeps page and ``studio sweep --show`` read)."""
    row = jobs.sweep(name)
    if row is None:
        return None
    try:
        spec = parse_spec(row["spec"], project)
    except StudioError:
        spec = None
    points = jobs.points(name)
    prs = []
    for r in points:
        pr = PointRun(Point(r["idx"], r["settings"]), state=r["state"], reason=r["reason"],
                      run_id=r["run_id"], figures=r["figures"])
        prs.append(pr)
    results = [point_result(p) for p in prs]
    rule = spec.best if spec else "smallest"
    front = pareto_front(results)
    best = best_point(results, rule)
    kind = project.model["kind"]
    return {"name": name, "state": row["state"], "executor": row["executor"],
            "spec": row["spec"], "updated": row["updated"],
            "points": [p.to_dict() for p in prs], "pareto_front": front, "best": best,
            "best_rule": rule, "accuracy_metric": ACCURACY[kind][0],
            "accuracy_title": ACCURACY[kind][1]}


def apply_point_edits(project: Project, settings: dict[str, Any]) -> list:
    """The SetValue commands that give the project a point's settings (one undoable step
    in the GUI: ``ProjectController.apply_as_one``)."""
    return project_edits(project, apply_point(project, settings))


def apply_point_label(point: dict[str, Any]) -> str:
    """The Undo action's words for applying a recorded point."""
    return f"Apply sweep point {point['label']} ({Point(point['index'], point['settings']).describe()})"


def sweep_names(project: Project, jobs: JobStore) -> list[str]:
    """Declared sweeps first, then recorded ones the file no longer declares."""
    names = [t["name"] for t in project.sweeps]
    return names + [s["name"] for s in jobs.sweeps() if s["name"] not in names]



# ---- search beyond grids ------------------------------------------------------------------------
async def search(project: Project, jobs: JobStore, store: ArtifactStore, spec: SweepSpec,
                 trials: int, minutes: float | None = None, executor: str | None = None,
                 workers: int | None = None, ray_address: str | None = None,
                 transfer: str = "auto", listeners: list[Listener] | None = None,
                 seed: int = 0) -> SweepSummary:
    """A multi-objective search (optuna, NSGA-II) over the axes of ``spec``: accuracy up,
    size down. Trials are asked in batches of the executor's slots and run as points of the
    sweep ``<name>-search`` through the same runner (a point the search proposes twice, or
    one an earlier search ran, is served by the history and the store). Stops after
    ``trials`` points or ``minutes``, whichever comes first."""
    try:  # optional: the search extra (pip install 'qstudio[search]')
        import optuna
    except ImportError:
        raise StudioError("--search needs the optuna package: pip install 'qstudio[search]'"
                          ) from None
    if not spec.axes:
        raise StudioError(f"sweep {spec.name!r} lists points: a search needs axes to choose "
                          "from")
    if trials < 1:
        raise StudioError("--search needs at least 1 trial")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "minimize"],
                                sampler=optuna.samplers.NSGAIISampler(seed=seed))
    t0 = time.time()
    asked: list[dict[str, Any]] = []
    summary: SweepSummary | None = None
    batch_size = workers or 2
    while len(asked) < trials and (minutes is None or time.time() - t0 < minutes * 60):
        batch = []
        for _ in range(min(batch_size, trials - len(asked))):
            trial = study.ask()
            settings = {key: vals[trial.suggest_categorical(key, list(range(len(vals))))]
                        for key, vals in spec.axes}
            batch.append((trial, settings))
            asked.append(settings)
        unique: list[dict[str, Any]] = []
        for s in asked:
            if s not in unique:
                unique.append(s)
        sub = SweepSpec(f"{spec.name}-search", points=tuple(unique), stages=spec.stages,
                        best=spec.best, description=f"optuna NSGA-II search over {spec.name}")
        runner = SweepRunner(project, jobs, store, sub, executor, workers, ray_address,
                             transfer)
        runner.listeners.extend(listeners or [])
        summary = await runner.run()
        batch_size = max(1, summary.workers or batch_size)
        by_id = {p.point.id: point_result(p) for p in summary.points}
        for trial, settings in batch:
            r = by_id[Point(0, settings).id]
            if r.accuracy is None or r.size_bytes is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, [r.accuracy, r.size_bytes])
    assert summary is not None
    summary.seconds = time.time() - t0
    return summary
