"""The pipeline: a DAG of stage jobs, cached by artifact key, each run in a worker subprocess.

``plan`` is pure: it turns a project (and an optional choice of stages / targets) into the
list of jobs that ``studio --batch`` and the GUI's "Run pipeline" both queue. ``Pipeline``
schedules a plan: its jobs one after another on the executor the project's
``pipeline.executor`` names — one warm worker process on this machine (``local``), or Ray
tasks (``ray``, :mod:`studio.services.executors`; with no cluster reachable, a local one is
started for the run) — each run by the job runner (:mod:`studio.services.jobrunner`: key,
store, lock, worker, commit, failure), everything recorded in the run history and streamed
to listeners.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.core.artifacts import Artifact, ArtifactStore
from studio.core.errors import StudioError
from studio.core.fsutil import RunLock, atomic_write_bytes
from studio.core.jobs import Job, JobStore, run_outcome
from studio.core.metrics import Metric
from studio.core.project import Project, file_record
from studio.core.scheduler import Scheduler, WorkItem
from studio.core.stagegraph import PlannedJob, plan, stage_config
from studio.services import joblog
from studio.services.deviceplan import plans_dict
from studio.services.executors import executor_name, make_executor, model_bytes, parts_spec
from studio.services.jobrunner import (
    JobRunner,
    StageJob,
    artifact_meta,
    job_failure,
    job_gates,
    not_run,
)
from studio.services.preflight import preflight
from studio.services.reports import sweep_fronts
from studio.services.sharedstore import shared_store
from studio.services.versions import tool_versions
from studio.services.workers import WorkerProcess

MAX_LOG_LINES = 4000

# plan, preflight, tool_versions, artifact_meta and job_failure live in their own modules;
# they stay importable from here
__all__ = ["PlannedJob", "Pipeline", "RunSummary", "artifact_meta", "job_failure", "plan",
           "preflight", "tool_versions"]


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
        self._remote: Any = None  # the Ray executor (pipeline.executor = "ray"), once made
        self._current_job: int | None = None
        self._log_count = 0
        self._cancelled: set[int] = set()
        self._cancel_all = False
        self._remeasure = False
        self._run_id: int | None = None
        self._runner = JobRunner(store, self._execute, shared_store())
        self._scheduler: Scheduler | None = None
        self._items: dict[int, WorkItem] = {}  # job id -> its work item
        self._by_item: dict[int, int] = {}  # work item id -> job id

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
        if self._scheduler is not None:  # a waiting job ends now
            self._scheduler.cancel(None if job_id is None else self._items[job_id].id,
                                   running=False)
        for jid in ids:
            self._terminate(jid)

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

    async def _stop_worker(self) -> None:
        """The warm worker killed and reaped (:meth:`WorkerProcess.stop`), the Ray tasks
        cancelled."""
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.stop()
        remote, self._remote = self._remote, None
        if remote is not None:
            await remote.stop()

    async def _close_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.close()
        remote, self._remote = self._remote, None
        if remote is not None:
            await remote.close()

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
        # The run records the settings it ran with (comparisons and staleness read them) and
        # the project file they came from, with whether they are the file's.
        run_id = self.jobs.create_run({"stages": stages, "targets": targets,
                                       "retry": list(retry) if retry else None,
                                       "settings": self.project.to_dict(),
                                       "file": file_record(self.project)})
        self._run_id = run_id
        ids = [self.jobs.add_job(run_id, j.stage, j.target) for j in planned]
        for jid, pj in zip(ids, planned, strict=True):
            if pj.deps:
                self.jobs.set_depends_on(jid, [ids[d] for d in pj.deps])
            self._emit({"kind": "job", "job": self.jobs.job(jid)})
        self._emit({"kind": "run", "run_id": run_id, "state": "running"})
        out = _Outcome()
        try:
            await self._schedule(ids, planned, out)
        except BaseException:
            # Ctrl-C, or the caller cancelled the coroutine: record the unfinished jobs as
            # cancelled (not left "running" for the next open to find), and stop the worker
            # and wait for it to be gone before the event loop closes (a worker left to the
            # garbage collector prints "Event loop is closed" after the run)
            now = time.time()
            for jid in ids:
                if self.jobs.job(jid).state in ("queued", "running"):
                    self.jobs.update_job(jid, state="cancelled", finished=now,
                                         message="cancelled: the run was interrupted")
            self.jobs.finish_run(run_id, "cancelled")
            await self._stop_worker()
            raise
        await self._close_worker()
        state = run_outcome([self.jobs.job(i).state for i in ids])
        self.jobs.finish_run(run_id, state)
        self._emit({"kind": "run", "run_id": run_id, "state": state})
        return RunSummary(run_id, state, [self.jobs.job(i) for i in ids], out.gates,
                          out.report, time.time() - t0, out.error, out.exit_code,
                          self.jobs.metrics(run_id=run_id))

    async def _schedule(self, ids: list[int], planned: list[PlannedJob], out: _Outcome
                        ) -> None:
        """The plan's jobs as work items of the scheduler: one at a time, in the plan's
        order, each after the jobs that make its inputs; a job whose input did not finish
        is not run, saying which."""
        sched = Scheduler(slots=1, ok=lambda art: art is not None,
                          on_end=lambda item: self._item_ended(item, out))
        self._items = {}
        for jid, pj in zip(ids, planned, strict=True):
            item = sched.add(self.jobs.job(jid).label, self._job_work(jid, pj, ids, out),
                             deps=[self._items[ids[d]].id for d in pj.deps],
                             stop=lambda jid=jid: self._terminate(jid))
            self._items[jid] = item
        self._by_item = {item.id: jid for jid, item in self._items.items()}
        self._scheduler = sched
        for jid in ids:  # cancelled while the run set itself up
            if self._cancel_all or jid in self._cancelled:
                sched.cancel(self._items[jid].id, running=False)
        try:
            await sched.run()
        finally:
            self._scheduler = None
        if out.crash is not None:  # a bug in a job: the run stops as it did
            raise out.crash

    def _job_work(self, jid: int, pj: PlannedJob, ids: list[int], out: _Outcome):
        async def run() -> Artifact | None:
            try:
                art = await self._run_job(jid, pj, {ids[d]: out.artifacts[ids[d]]
                                                    for d in pj.deps})
            except StudioError as exc:
                out.error = out.error or exc.message
                out.exit_code = max(out.exit_code, exc.exit_code)
                self._update(jid, state="failed", finished=time.time(), error=exc.message,
                             message=exc.message)
                return None
            if art is None:
                return None
            out.artifacts[jid] = art
            if pj.decl.gated:
                result = json.loads((art.path / "result.json").read_text())
                out.gates.extend(job_gates(pj.decl, self.project.gates, pj.target, result))
            if pj.decl.role == "report":
                out.report = self._publish_report(art)
            return art
        return run

    def _item_ended(self, item: WorkItem, out: _Outcome) -> None:
        """A job's item ended: one that never ran is recorded cancelled, saying why; a bug
        in a job stops the others (:meth:`_run_locked` records them interrupted)."""
        if item.error is not None and out.crash is None:
            out.crash = item.error
            if self._scheduler is not None:
                self._scheduler.cancel(running=False)
            return
        jid = self._by_item[item.id]
        if out.crash is not None or self.jobs.job(jid).state != "queued":
            return
        message = not_run(item.blocked_by.name) if item.blocked_by is not None else "cancelled"
        self._update(jid, state="cancelled", finished=time.time(), message=message)

    def _terminate(self, jid: int) -> None:
        worker = self._procs.get(jid)
        if worker is not None:
            worker.terminate()
        elif self._remote is not None:  # its Ray task, if it runs one
            self._remote.cancel(jid)

    def _report_sweeps(self) -> list[dict[str, Any]] | None:
        """The project's recorded sweeps for the report (None: they could not be read)."""
        try:
            return sweep_fronts(self.project, self.jobs)
        except (StudioError, OSError, ValueError, KeyError):
            return None

    def _report_device_plan(self) -> dict[str, Any] | None:
        """The device memory plan per target, for the report (None: it could not be made)."""
        try:
            return plans_dict(self.project)
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

    # ---- one job: planned here, run by the job runner ----------------------------------------
    async def _run_job(self, jid: int, pj: PlannedJob,
                       inputs: dict[int, Artifact]) -> Artifact | None:
        config = await asyncio.to_thread(stage_config, self.project, pj)
        input_keys = {self.jobs.job(i).label: a.key for i, a in inputs.items()}
        versions = await asyncio.to_thread(tool_versions)
        history: dict[str, Any] = {"db": str(self.jobs.path), "run_id": self._run_id}
        if pj.decl.reads_history:  # the report shows the project's sweeps too
            history["sweeps"] = await asyncio.to_thread(self._report_sweeps)
            history["device_plan"] = await asyncio.to_thread(self._report_device_plan)
        job = StageJob(jid, config, input_keys, versions, history)
        return await self._runner.run(
            job, _HistorySink(self, jid), remeasure=self._remeasure,
            cancelled=lambda: jid in self._cancelled or self._cancel_all)

    async def _execute(self, spec: dict[str, Any], on_message: Callable[[dict[str, Any]], None]
                       ) -> dict[str, Any]:
        """A job spec in the warm worker; its stderr is the job's log meanwhile (on Ray: a
        Ray task, its log lines sent back as it ends)."""
        if executor_name(self.project) == "ray":
            return await self._execute_remote(spec, on_message)
        jid = spec["job_id"]
        worker = self._get_worker()
        await worker.start()
        self._current_job = jid
        self._log_count = 0
        self._procs[jid] = worker
        assert worker.proc is not None
        self.jobs.update_job(jid, pid=worker.proc.pid)
        try:  # its parts, if it has some, run as the project's executor says
            return await worker.run({**spec, "parts": parts_spec(self.project)}, on_message)
        finally:
            self._procs.pop(jid, None)
            self._current_job = None

    async def _execute_remote(self, spec: dict[str, Any],
                              on_message: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """A job spec as a task of the Ray executor, made (a local cluster started when none
        is reachable) for the run's first job; its parts go to Ray as tasks of their own."""
        if self._remote is None:
            self._remote, _ = await asyncio.to_thread(
                make_executor, self.project, self.store, "ray", None,
                model_bytes=model_bytes(self.project))
        out = await self._remote.run(spec, on_message)
        if out.get("node"):
            on_message({"type": "log", "line": f"ran as a Ray task on {out['node']}"})
        return out


@dataclass
class _Outcome:
    """What a run's jobs leave as they end."""

    artifacts: dict[int, Artifact] = field(default_factory=dict)
    gates: list[dict[str, Any]] = field(default_factory=list)
    report: Path | None = None
    error: str | None = None
    exit_code: int = 0
    crash: BaseException | None = None


class _HistorySink:
    """A pipeline job's events: recorded in the run history, then sent to the listeners."""

    def __init__(self, pipeline: Pipeline, job_id: int):
        self.pipeline, self.job_id = pipeline, job_id
        self._started: float | None = None
        self._said = ""
        self._progress_lines = 0

    def update(self, **fields: Any) -> None:
        if fields.get("state") == "running" and fields.get("started"):
            self._started = float(fields["started"])
        message = fields.get("message") or ""
        if (self._started is not None and message and message != self._said
                and "state" not in fields and self._progress_lines < joblog.MAX_PROGRESS_LINES):
            # each progress message once in the log, timed from the job's start
            self._said = message
            self._progress_lines += 1
            self.log(joblog.progress_line(time.time() - self._started,
                                          fields.get("progress"), message))
        self.pipeline._update(self.job_id, **fields)

    def log(self, line: str) -> None:
        self.pipeline.jobs.append_log(self.job_id, line)
        self.pipeline._emit({"kind": "log", "job_id": self.job_id, "line": line})

    def partial(self, data: Any) -> None:
        self.pipeline._emit({"kind": "partial", "job_id": self.job_id, "data": data})

    def metrics(self, metrics: list[Metric], facts: list[Metric]) -> None:
        self.pipeline.jobs.add_metrics(self.job_id, metrics + facts)

    def traceback(self, text: str) -> None:
        self.pipeline.jobs.append_log(self.job_id, text)
