"""The pipeline: a DAG of stage jobs, cached by artifact key, each run in a worker subprocess.

``plan`` is pure: it turns a project (and an optional choice of stages / targets) into the
list of jobs that ``studio --batch`` and the GUI's "Run pipeline" both queue. ``Pipeline``
executes a plan, records everything in the run history and streams events to listeners.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.core.artifacts import Artifact, ArtifactStore
from studio.core.errors import StageCrashed, StudioError
from studio.core.fsutil import RunLock, atomic_write_bytes, atomic_write_json, sha256_json
from studio.core.gates import evaluate_gates
from studio.core.jobs import Job, JobStore
from studio.core.metrics import Metric
from studio.core.project import Project
from studio.core.stagegraph import (
    REFS,
    STAGES,
    PlannedJob,
    StageConfig,
    job_key,
    plan,
    project_value,
    ref_identity,
    stage_config,
)
from studio.services.workers import WorkerProcess, died_message

MAX_LOG_LINES = 4000

__all__ = ["PlannedJob", "Pipeline", "RunSummary", "plan", "preflight", "tool_versions"]


# ---- preflight: the declared file references, checked by kind ------------------------------
# Content keys of checkpoints verified by this process (a pure function of content and
# code version, so remembering it is safe).
_VERIFIED: set[str] = set()


def _cached_check(project: Project, refs: list[str], what: str,
                  check: Callable[[], Any]) -> None:
    """Run a checkpoint check once per content: the verdict is kept in the project folder,
    keyed by the files' content and the checks' version, so a warm re-run pays nothing."""
    from studio.core.fsutil import atomic_write_json, sha256_json
    from studio.engine.checkpoint_check import CHECKS_VERSION

    key = sha256_json({"what": what, "v": CHECKS_VERSION,
                       "content": [ref_identity(project, r) for r in refs]})
    cache = project.folder / "checks.json"
    try:
        done = json.loads(cache.read_text()) if cache.exists() else {}
    except (OSError, ValueError):
        done = {}
    if key in done:
        return
    if key not in _VERIFIED:  # checked earlier in this process, before the folder existed
        check()
        _VERIFIED.add(key)
    done[key] = {"what": what, "refs": refs, "checked": time.time()}
    if project.folder.is_dir():
        atomic_write_json(cache, done)


def _check_checkpoint(project: Project, ref: str) -> Path:
    path = project.input_path(ref)
    if path.is_file() and path.suffix == ".onnx":
        from studio.engine.onnx_import import open_onnx

        open_onnx(path)  # a corrupt file gets a clear error
        raise StudioError(
            f"{path.name} is an ONNX model: the LLM pipeline starts from a Hugging Face "
            "checkpoint folder (export makes its prefill and decode graphs)"
        )
    from studio.engine import checkpoint_check, hf_import

    hf_import.open_checkpoint(path)  # cheap: the family, config and headers, every time
    _cached_check(project, [ref], "checkpoint",
                  lambda: checkpoint_check.check_checkpoint(path))
    return path


def _check_graph_source(project: Project, ref: str) -> None:
    """An encoder's folder or an ONNX file, checked in seconds before any stage runs."""
    path = project.input_path(ref)
    if project.model["kind"] == "onnx-graph":
        from studio.engine.onnx_import import open_onnx

        open_onnx(path)  # a corrupt file gets a clear error
    elif not (path / "config.json").is_file():
        raise StudioError(f"{path} is not a sentence-encoder folder: expected config.json, "
                          "tokenizer files and model weights (or use sample:minilm)")


def _check_samples(path: Path, key: str) -> None:
    if not path.is_file() or path.suffix.lower() not in (".npz", ".npy"):
        raise StudioError(f"{key}: {path} is not a .npz or .npy file of sample inputs")


def _check_text(path: Path, what: str) -> None:
    if path.is_dir() or path.stat().st_size == 0 or not path.read_bytes().strip():
        raise StudioError(f"the {what} {path} is empty: give a text file with some content")


def _check_lengths(project: Project, model: Path, stages: set[str]) -> None:
    """The prompt, tokenized as the runtime will, against the exported lengths."""
    from studio.engine.checkpoint_check import prompt_length

    P, C = project.export["prompt_length"], project.export["context_length"]
    n = prompt_length(model, project.run["prompt"])
    if n >= C:  # longer than P is fine: the rest is prefilled in chunks
        raise StudioError(
            f"run.prompt is {n} tokens but the KV cache holds {C} (export.context_length; "
            f"the prefill graph takes {P} at once, the rest in chunks): shorten the prompt or "
            "raise export.context_length"
        )
    for stage, key in (("run", "run.max_new_tokens"), ("validate", "validation.greedy_tokens")):
        want = project_value(project, key)
        if stage in stages and n + want > C:
            raise StudioError(
                f"{key} = {want} does not fit: the {n}-token prompt leaves {C - n} positions "
                f"of the {C}-token context (export.context_length); lower {key.split('.')[1]} "
                "or raise export.context_length"
            )


def _check_overrides(project: Project, model: Path) -> None:
    from studio.engine import hf_import
    from studio.services.precision import unmatched

    # patterns that name ONNX nodes ("/lm_head/MatMul") are checked by quantize itself
    bad = [p for p in unmatched(project, hf_import.open_checkpoint(model)) if not p.startswith("/")]
    if bad:
        raise StudioError(
            f"quantization.overrides: {', '.join(repr(b) for b in bad)} match(es) no layer of the "
            "model; use names like model.layers.0, *.mlp.down_proj or lm_head (see studio info)"
        )


def preflight(project: Project, jobs: list[PlannedJob]) -> None:
    """Check the input files the planned stages declare, and the settings that depend on
    them, before anything runs: fail in seconds, not after minutes of stage work."""
    stages = {j.stage for j in jobs}
    if "draft" in stages and not project.model.get("draft"):
        raise StudioError("the project has no draft model: set model.draft (for example "
                          "\"sample:tiny-coder-draft\") to export one")
    checked: set[str] = set()
    model: Path | None = None
    for job in jobs:
        for key in STAGES[job.stage].settings:
            kind = REFS.get(key)
            if kind is None or key in checked:
                continue
            checked.add(key)
            ref = project_value(project, key)
            if key == "model.source" and project.model["kind"] != "causal-lm":
                _check_graph_source(project, ref)
            elif kind == "samples":
                if ref:
                    _check_samples(project.input_path(ref), key)
            elif kind == "checkpoint":
                checked_model = _check_checkpoint(project, ref)
                if key == "model.source":
                    model = checked_model
            else:
                _check_text(project.input_path(ref), key.split(".", 1)[1].replace("_", " "))
    if project.model.get("draft"):
        draft_ref = project.model["draft"]
        target = model or project.input_path(project.model["source"])
        draft = project.input_path(draft_ref)
        from studio.engine.checkpoint_check import check_draft

        _cached_check(project, [project.model["source"], draft_ref], "draft",
                      lambda: check_draft(target, draft))
    if ("graph-quantize" in stages and project.model["kind"] == "onnx-graph"
            and not project.graph["calibration"]):
        raise StudioError("graph.calibration is empty: an ONNX graph is calibrated on sample "
                          "inputs; give a .npz file with one array per graph input (studio new "
                          "--onnx MODEL --calibration DATA.npz)")
    if model is None and (stages & {"run", "validate", "quantize"}):
        model = project.input_path(project.model["source"])
    if model is not None and model.is_dir():
        if stages & {"run", "validate"}:
            _check_lengths(project, model, stages)
        if "quantize" in stages and project.quantization["overrides"]:
            _check_overrides(project, model)
    _check_targets_run_the_recipe(project, jobs)
    from studio.core.fsutil import check_writable_dir

    check_writable_dir(project.folder)


def _check_targets_run_the_recipe(project: Project, jobs: list[PlannedJob]) -> None:
    """The recipe's float parts (the FP16 scheme, FP16 / FP32 override rules) need a target
    whose HTP runs float: refused before any stage runs, with the Precision page's reason."""
    from studio.core.catalog import get_chip
    from studio.core.recipe import scheme_refusal
    from studio.services.precision import override_refusals

    keys = sorted({j.chip for j in jobs if j.chip})
    if not keys:
        return
    chips = [get_chip(k) for k in keys]
    why = scheme_refusal(project.quantization["scheme"], chips)
    if why is None and project.quantization["scheme"] != "FP16":
        found = override_refusals(project, None, chips=chips)
        why = found[0] if found else None
    if why:
        raise StudioError(why)


def _code_digest() -> str:
    """The studio's own stage code is an input too: editing it re-runs the stages."""
    import hashlib

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for folder in ("engine", "worker"):
        for f in sorted((root / folder).rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def tool_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"qstudio-code": _code_digest()}
    for pkg in ("qstudio", "torch", "transformers", "onnx", "onnxruntime", "onnxruntime-qnn"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "missing"
    return out


# ---- a worker's outcome ---------------------------------------------------------------------
def artifact_meta(stage: str, target: str, config: StageConfig, input_keys: dict[str, str],
                  versions: dict[str, str], result: dict[str, Any]) -> dict[str, Any]:
    """What an artifact records of the job that made it (``ArtifactStore.commit``)."""
    return {"stage": stage, "target": target, "config": dict(config.hashed),
            "inputs": input_keys, "versions": versions, "tool": result.get("tool", {})}


def job_failure(label: str, outcome: dict[str, Any]) -> StudioError:
    """The one-line error of a job that did not give a result: the stage's own refusal (a
    StudioError), or a crash (a stage's bug, or its worker process died)."""
    if outcome.get("type") == "error" and outcome.get("kind") == "user":
        return StudioError(f"{label}: {outcome['message']}")
    detail = outcome.get("message") or died_message(outcome.get("returncode"))
    if outcome.get("traceback"):
        return StageCrashed(f"{label} crashed: {detail} (the job log has the traceback)")
    return StageCrashed(f"{label} crashed: {detail}")


# ---- execution --------------------------------------------------------------------------
@dataclass
class RunSummary:
    run_id: int
    state: str
    jobs: list[Job]
    gates: list[dict[str, Any]]
    report: Path | None
    seconds: float
    error: str | None = None
    exit_code: int = 0
    metrics: list[Metric] = field(default_factory=list)

    @property
    def gates_passed(self) -> bool:
        return all(g["passed"] for g in self.gates)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "state": self.state, "seconds": round(self.seconds, 2),
            "error": self.error, "report": str(self.report) if self.report else None,
            "gates": self.gates, "gates_passed": self.gates_passed,
            "jobs": [{"id": j.id, "stage": j.stage, "target": j.target, "state": j.state,
                      "cached": j.cached, "seconds": round(j.elapsed or 0.0, 2),
                      "message": j.message, "summary": (j.result or {}).get("summary", "")}
                     for j in self.jobs],
            "metrics": [m.to_dict() for m in self.metrics],
        }


Listener = Callable[[dict[str, Any]], None]


class Pipeline:
    """Runs plans for one project; one job at a time (the HTP simulator is CPU-bound)."""

    def __init__(self, project: Project, jobs: JobStore, store: ArtifactStore):
        self.project = project
        self.jobs = jobs
        self.store = store
        self.listeners: list[Listener] = []
        self._procs: dict[int, WorkerProcess] = {}
        self._worker: WorkerProcess | None = None
        self._current_job: int | None = None
        self._log_count = 0
        self._cancelled: set[int] = set()
        self._cancel_all = False
        self._run_id: int | None = None

    def _emit(self, event: dict[str, Any]) -> None:
        for cb in list(self.listeners):
            cb(event)

    def _update(self, job_id: int, **fields: Any) -> None:
        self.jobs.update_job(job_id, **fields)
        self._emit({"kind": "job", "job": self.jobs.job(job_id)})

    # -- control --
    def cancel(self, job_id: int | None = None) -> None:
        """Cancel one job (or, with no id, the whole run): a running worker is terminated."""
        if job_id is None:
            self._cancel_all = True
            ids = list(self._procs)
        else:
            self._cancelled.add(job_id)
            ids = [job_id] if job_id in self._procs else []
        for jid in ids:
            worker = self._procs.get(jid)
            if worker is not None:
                worker.terminate()

    # -- the worker process --
    def _get_worker(self) -> WorkerProcess:
        """The warm worker: one subprocess runs this run's jobs one after another, so the
        heavy imports are paid once; a crash or a cancel ends it and the next job starts a
        new one. Its temporary files go under the project's own tmp folder, which the next
        open cleans after a killed run; its stderr is the current job's log."""
        if self._worker is None:
            self._worker = WorkerProcess(self.store.tmp)
            self._worker.on_stderr = self._stderr_line
        return self._worker

    def _stderr_line(self, line: str) -> None:
        jid = self._current_job
        if jid is None or self._log_count >= MAX_LOG_LINES:
            return
        self._log_count += 1
        self.jobs.append_log(jid, line)
        self._emit({"kind": "log", "job_id": jid, "line": line})

    def _kill_worker(self) -> None:
        if self._worker is not None:
            self._worker.kill()

    async def _close_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.close()

    # -- running --
    async def run(self, stages: list[str] | None = None,
                  targets: list[str] | None = None,
                  retry: tuple[str, str] | None = None,
                  remeasure: bool = False) -> RunSummary:
        """Run a plan: the requested stages (default: the project's), or with ``retry``
        a finished job again together with every job downstream of it. ``remeasure``: the
        measuring stages (run, profile) time again instead of reusing a cached measurement
        (e.g. a profile taken while the host was busy); later runs reuse the newest one."""
        t0 = time.time()
        self._cancel_all = False
        self._remeasure = remeasure
        planned = plan(self.project, stages, targets, retry=retry)
        # hashing checkpoints and reading files can take seconds: keep it off the event loop
        await asyncio.to_thread(preflight, self.project, planned)
        lock = RunLock(self.project.folder)
        lock.acquire()
        try:
            return await self._run_locked(planned, stages, targets, t0, retry)
        finally:
            lock.release()

    async def _run_locked(self, planned: list[PlannedJob], stages: list[str] | None,
                          targets: list[str] | None, t0: float,
                          retry: tuple[str, str] | None = None) -> RunSummary:
        # The run records the settings it ran with: comparisons and staleness read them.
        run_id = self.jobs.create_run({"stages": stages, "targets": targets,
                                       "retry": list(retry) if retry else None,
                                       "settings": self.project.to_dict()})
        self._run_id = run_id
        ids = [self.jobs.add_job(run_id, j.stage, j.target) for j in planned]
        for jid, pj in zip(ids, planned, strict=True):
            if pj.deps:
                self.jobs.set_depends_on(jid, [ids[d] for d in pj.deps])
            self._emit({"kind": "job", "job": self.jobs.job(jid)})
        self._emit({"kind": "run", "run_id": run_id, "state": "running"})
        artifacts: dict[int, Artifact] = {}
        gates: list[dict[str, Any]] = []
        report: Path | None = None
        error: str | None = None
        exit_code = 0
        try:
            for jid, pj in zip(ids, planned, strict=True):
                failed_dep = next((ids[d] for d in pj.deps if ids[d] not in artifacts), None)
                if self._cancel_all or jid in self._cancelled:
                    self._update(jid, state="cancelled", finished=time.time(), message="cancelled")
                    continue
                if failed_dep is not None:
                    dep = self.jobs.job(failed_dep)
                    self._update(jid, state="cancelled", finished=time.time(),
                                 message=f"not run: {dep.label} did not succeed")
                    continue
                try:
                    art = await self._run_job(jid, pj, {ids[d]: artifacts[ids[d]] for d in pj.deps})
                except StudioError as exc:
                    error = error or exc.message
                    exit_code = max(exit_code, exc.exit_code)
                    self._update(jid, state="failed", finished=time.time(), error=exc.message,
                                 message=exc.message)
                    continue
                if art is None:
                    continue
                artifacts[jid] = art
                result = json.loads((art.path / "result.json").read_text())
                if pj.stage in ("validate", "graph-validate"):
                    rows = evaluate_gates(self.project.gates, result)
                    for r in rows:
                        r["target"] = pj.target
                    gates.extend(rows)
                if pj.stage == "report":
                    report = self._publish_report(art)
        except BaseException:
            # Ctrl-C, or the caller cancelled the coroutine: stop the worker and record the
            # unfinished jobs as cancelled (not left "running" for the next open to find).
            self._kill_worker()
            now = time.time()
            for jid in ids:
                if self.jobs.job(jid).state in ("queued", "running"):
                    self.jobs.update_job(jid, state="cancelled", finished=now,
                                         message="cancelled: the run was interrupted")
            self.jobs.finish_run(run_id, "cancelled")
            raise
        await self._close_worker()
        states = [self.jobs.job(i).state for i in ids]
        if all(s == "succeeded" for s in states):
            state = "succeeded"
        elif any(s == "failed" for s in states):
            state = "failed"
        else:
            state = "cancelled"
        self.jobs.finish_run(run_id, state)
        self._emit({"kind": "run", "run_id": run_id, "state": state})
        return RunSummary(run_id, state, [self.jobs.job(i) for i in ids], gates, report,
                          time.time() - t0, error, exit_code, self.jobs.metrics(run_id=run_id))

    # ---- measurements ---------------------------------------------------------------------
    def _measurements_file(self) -> Path:
        return self.store.root / "measurements.json"

    def _newest_measurement(self, base_key: str) -> str:
        """The key of the newest measurement for ``base_key`` (itself when never remeasured
        or when that artifact is gone)."""
        try:
            newest = json.loads(self._measurements_file().read_text()).get(base_key)
        except (OSError, ValueError, AttributeError):
            return base_key
        if isinstance(newest, str) and self.store.get(newest) is not None:
            return newest
        return base_key

    def _set_newest_measurement(self, base_key: str, key: str) -> None:
        try:
            table = json.loads(self._measurements_file().read_text())
            if not isinstance(table, dict):
                table = {}
        except (OSError, ValueError):
            table = {}
        table[base_key] = key
        atomic_write_json(self._measurements_file(), table)

    def _report_sweeps(self) -> list[dict[str, Any]] | None:
        """The project's recorded sweeps for the report (None: they could not be read)."""
        from studio.services.reports import sweep_fronts

        try:
            return sweep_fronts(self.project, self.jobs)
        except (StudioError, OSError, ValueError, KeyError):
            return None

    def _publish_report(self, art: Artifact) -> Path:
        reports = self.project.folder / "reports"
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = reports / f"report-{stamp}.html"
        for name, dest in (("report.html", out), ("report.json", out.with_suffix(".json")),
                           ("report.html", reports / "latest.html"),
                           ("report.json", reports / "latest.json")):
            atomic_write_bytes(dest, (art.path / name).read_bytes())
        return out

    async def _run_job(self, jid: int, pj: PlannedJob,
                       inputs: dict[int, Artifact]) -> Artifact | None:
        config: StageConfig = await asyncio.to_thread(stage_config, self.project, pj)
        input_keys = {self.jobs.job(i).label: a.key for i, a in inputs.items()}
        versions = await asyncio.to_thread(tool_versions)
        key = job_key(config, input_keys, versions)
        now = time.time()
        base_key = key
        if pj.decl.measures:
            if getattr(self, "_remeasure", False):
                # a new measurement gets a key of its own, so the earlier one stays in the
                # history (and can be compared with)
                key = sha256_json([base_key, "measurement", jid, now])
            else:
                key = self._newest_measurement(base_key)
        cached = (self.store.get(key) if pj.decl.cache
                  and not (pj.decl.measures and getattr(self, "_remeasure", False)) else None)
        if cached is not None and await asyncio.to_thread(self.store.verify, cached):
            result = json.loads((cached.path / "result.json").read_text())
            self.jobs.add_metrics(jid, [Metric.from_dict(m) for m in result.get("metrics", [])])
            self._update(jid, state="succeeded", started=now, finished=now, progress=1.0,
                         cached=1, artifact_key=key, result=result,
                         message="cached: inputs and settings unchanged")
            return cached
        # another run or a sweep may compute the same key now: wait for it, then take it
        lock = self.store.key_lock(key)
        while not lock.try_acquire():
            await asyncio.sleep(0.5)
        try:
            if cached is None and pj.decl.cache and not (
                    pj.decl.measures and getattr(self, "_remeasure", False)):
                done = self.store.get(key)
                if done is not None and await asyncio.to_thread(self.store.verify, done):
                    result = json.loads((done.path / "result.json").read_text())
                    self.jobs.add_metrics(
                        jid, [Metric.from_dict(m) for m in result.get("metrics", [])])
                    self._update(jid, state="succeeded", started=now, finished=time.time(),
                                 progress=1.0, cached=1, artifact_key=key, result=result,
                                 message="cached: computed meanwhile by another run")
                    return done
            return await self._compute(jid, pj, key, base_key, config, input_keys, versions,
                                       inputs, now)
        finally:
            lock.release()

    async def _compute(self, jid: int, pj: PlannedJob, key: str, base_key: str,
                       config: StageConfig, input_keys: dict[str, str],
                       versions: dict[str, str], inputs: dict[int, Artifact],
                       now: float) -> Artifact | None:
        workdir = self.store.new_workdir()
        spec: dict[str, Any] = {
            "job_id": jid, "config": config.to_dict(),
            "inputs": {self.jobs.job(i).label: str(a.path) for i, a in inputs.items()},
            "workdir": str(workdir),
            "history": {"db": str(self.jobs.path), "run_id": self._run_id},
        }
        if pj.stage == "report":  # the report shows the project's sweeps too
            spec["history"]["sweeps"] = await asyncio.to_thread(self._report_sweeps)
        self._update(jid, state="running", started=now, progress=0.0, message="starting")
        worker = self._get_worker()
        await worker.start()
        self._current_job = jid
        self._log_count = 0
        self._procs[jid] = worker
        assert worker.proc is not None
        self.jobs.update_job(jid, pid=worker.proc.pid)

        def on_message(msg: dict[str, Any]) -> None:
            kind = msg.get("type")
            if kind == "progress":
                self._update(jid, progress=msg["fraction"], message=msg.get("message", ""))
            elif kind == "log":
                self.jobs.append_log(jid, msg["line"])
                self._emit({"kind": "log", "job_id": jid, "line": msg["line"]})
            elif kind == "partial":
                self._emit({"kind": "partial", "job_id": jid, "data": msg.get("data")})

        try:
            outcome = await worker.run(spec, on_message)
        finally:
            self._procs.pop(jid, None)
            self._current_job = None
        if jid in self._cancelled or self._cancel_all:
            shutil.rmtree(workdir, ignore_errors=True)
            self._update(jid, state="cancelled", finished=time.time(), message="cancelled")
            return None
        if outcome.get("type") == "result":
            result = outcome["result"]
            # Run facts (how long the stage took, ...) go to the run history only: they are
            # not part of the artifact, whose content must not depend on the clock.
            facts = [Metric.from_dict(m) for m in outcome.get("facts", [])]
            self.jobs.add_metrics(
                jid, [Metric.from_dict(m) for m in result.get("metrics", [])] + facts)
            art = await asyncio.to_thread(
                self.store.commit, key, workdir,
                artifact_meta(pj.stage, pj.target, config, input_keys, versions, result))
            if key != base_key:
                self._set_newest_measurement(base_key, key)
            self._update(jid, state="succeeded", finished=time.time(), progress=1.0,
                         artifact_key=key, result=result, message=result.get("summary", "done"))
            return art
        shutil.rmtree(workdir, ignore_errors=True)
        if outcome.get("traceback"):
            self.jobs.append_log(jid, outcome["traceback"])
        raise job_failure(pj.label, outcome)
