"""One planned stage job, run: what the pipeline, the sweeps and any other scheduler hand a
job to.

A scheduler decides which jobs run and when (the pipeline one after another in its warm
worker, a sweep as many at once as its executor has slots); :class:`JobRunner` runs one, the
same way for all of them:

1. the key: the job's key, or for a measuring stage (``measures``) the newest measurement
   under it, or (``remeasure``) a new key of its own, so the earlier one stays comparable;
2. the store: a stored artifact under that key whose files still verify is the result
   (``cached: inputs and settings unchanged``);
3. the key's lock: another run or sweep computing the same key is waited for and its
   artifact taken (``cached: computed meanwhile by another run``);
4. the worker: the job spec goes to the scheduler's ``execute`` (its warm
   :class:`~studio.services.workers.WorkerProcess`, a :class:`~studio.services.workers.LocalPool`,
   Ray), the progress, log and partial messages to the job's :class:`JobSink`;
5. the commit: the work folder becomes the artifact under the key (:func:`artifact_meta`),
   the result's figures and the run facts go to the sink; a new measurement becomes the
   newest of its base key (``measurements.json`` in the store);
6. the end: a cancelled job records itself cancelled; a stage's refusal or crash becomes one
   :class:`StudioError` (:func:`job_failure`), raised for the scheduler to record.

:func:`job_gates` judges a result by the project's gates when its stage is ``gated``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from studio.core.artifacts import Artifact, ArtifactStore
from studio.core.errors import StageCrashed, StudioError
from studio.core.fsutil import atomic_write_json, sha256_json
from studio.core.gates import evaluate_gates
from studio.core.metrics import Metric
from studio.core.stagegraph import STAGES, StageConfig, StageDecl, job_key
from studio.services.workers import OnMessage, died_message

#: how a scheduler runs a job spec: ``(spec, on_message) -> outcome`` (the worker's
#: ``result`` / ``error`` line, or ``{"type": "died", ...}``)
Execute = Callable[[dict[str, Any], OnMessage], Awaitable[dict[str, Any]]]

CACHED = "cached: inputs and settings unchanged"
CACHED_MEANWHILE = "cached: computed meanwhile by another run"
SHARED = "cached: from the machine's shared store"


def not_run(label: str) -> str:
    """The message of a job whose input did not succeed."""
    return f"not run: {label} did not succeed"


# ---- a worker's outcome ---------------------------------------------------------------------
def artifact_meta(stage: str, target: str, config: StageConfig, input_keys: Mapping[str, str],
                  versions: Mapping[str, str], result: dict[str, Any]) -> dict[str, Any]:
    """What an artifact records of the job that made it (``ArtifactStore.commit``)."""
    return {"stage": stage, "target": target, "config": dict(config.hashed),
            "inputs": dict(input_keys), "versions": dict(versions),
            "tool": result.get("tool", {})}


def job_failure(label: str, outcome: dict[str, Any]) -> StudioError:
    """The one-line error of a job that did not give a result: the stage's own refusal (a
    StudioError), or a crash (a stage's bug, or its worker process died)."""
    if outcome.get("type") == "error" and outcome.get("kind") == "user":
        return StudioError(f"{label}: {outcome['message']}")
    detail = outcome.get("message") or died_message(outcome.get("returncode"))
    if outcome.get("traceback"):
        return StageCrashed(f"{label} crashed: {detail} (the job log has the traceback)")
    return StageCrashed(f"{label} crashed: {detail}")


def job_gates(decl: StageDecl, gates: Mapping[str, float], target: str,
              result: dict[str, Any]) -> list[dict[str, Any]]:
    """The gate rows a job's result gives, each with the job's target: none unless its stage
    is ``gated`` (its result holds the accuracy figures the gates judge)."""
    if not decl.gated:
        return []
    rows = evaluate_gates(dict(gates), result)
    for r in rows:
        r["target"] = target
        r["stage"] = decl.name  # which binaries: validate's (compiled) or the bundle's
    return rows


# ---- measurements: the newest one under each base key ------------------------------------------
def _measurements_file(store: ArtifactStore) -> Path:
    return store.root / "measurements.json"


def newest_measurement(store: ArtifactStore, base_key: str) -> str:
    """The key of the newest measurement for ``base_key`` (itself when never remeasured or
    when that artifact is gone)."""
    try:
        newest = json.loads(_measurements_file(store).read_text()).get(base_key)
    except (OSError, ValueError, AttributeError):
        return base_key
    if isinstance(newest, str) and store.get(newest) is not None:
        return newest
    return base_key


def set_newest_measurement(store: ArtifactStore, base_key: str, key: str) -> None:
    try:
        table = json.loads(_measurements_file(store).read_text())
        if not isinstance(table, dict):
            table = {}
    except (OSError, ValueError):
        table = {}
    table[base_key] = key
    atomic_write_json(_measurements_file(store), table)


# ---- the job and where its events go -----------------------------------------------------------
@dataclass
class StageJob:
    """One planned job, ready to run: its frozen config, its inputs by artifact key (input
    label -> key), the tool versions, and what a stage that reads the run history gets."""

    job_id: int
    config: StageConfig
    input_keys: Mapping[str, str]
    versions: Mapping[str, str]
    history: Mapping[str, Any] = field(default_factory=dict)
    key: str = field(init=False)  # the job's artifact key (a measurement's base key)

    def __post_init__(self) -> None:
        self.key = job_key(self.config, self.input_keys, self.versions)

    @property
    def stage(self) -> str:
        return self.config.stage

    @property
    def target(self) -> str:
        return self.config.item

    @property
    def decl(self) -> StageDecl:
        return STAGES[self.stage]

    @property
    def label(self) -> str:
        return f"{self.stage}[{self.target}]" if self.target else self.stage


class JobSink(Protocol):
    """Where one job's events go: the run history and the listeners (the pipeline), or the
    sweep's table of distinct jobs."""

    def update(self, **fields: Any) -> None:
        """The job's record changed: any of state, started, finished, progress, message,
        cached (1: served from the store), artifact_key, result."""

    def log(self, line: str) -> None:
        """A line the stage logged."""

    def partial(self, data: Any) -> None:
        """A partial result the stage streamed (tokens so far, ...)."""

    def metrics(self, metrics: list[Metric], facts: list[Metric]) -> None:
        """The figures of the job's result, and the run facts of this computation (how long
        it took, ...; none when the result came from the store)."""

    def traceback(self, text: str) -> None:
        """The traceback of a crashed stage, for the job's log."""


def _result(art: Artifact) -> dict[str, Any]:
    return json.loads((art.path / "result.json").read_text())


# ---- the runner ----------------------------------------------------------------------------------
class JobRunner:
    """Runs one planned job at a time per call (calls may overlap: each holds its key's
    lock); ``execute`` says how a job spec runs."""

    def __init__(self, store: ArtifactStore, execute: Execute,
                 shared: ArtifactStore | None = None):
        self.store = store
        self.execute = execute
        #: the machine's shared store (:mod:`studio.services.sharedstore`), or None
        self.shared = shared

    def measurement_key(self, job: StageJob, remeasure: bool, now: float) -> str:
        """The key the job's artifact has: its own, or for a measuring stage the newest
        measurement (``remeasure``: a new key of its own, so the earlier one stays in the
        history and can be compared with)."""
        if not job.decl.measures:
            return job.key
        if remeasure:
            return sha256_json([job.key, "measurement", job.job_id, now])
        return newest_measurement(self.store, job.key)

    async def run(self, job: StageJob, sink: JobSink, *, remeasure: bool = False,
                  cancelled: Callable[[], bool] = lambda: False) -> Artifact | None:
        """Run ``job``: its artifact (computed, or served from the store), or None when it
        was cancelled; a job that gave no result raises its StudioError."""
        now = time.time()
        key = self.measurement_key(job, remeasure, now)
        reuse = job.decl.cache and not (job.decl.measures and remeasure)
        cached = self.store.get(key) if reuse else None
        if cached is not None and await asyncio.to_thread(self.store.verify, cached):
            self._served(cached, sink, key, now, now, CACHED)
            return cached
        # another run or a sweep may compute the same key now: wait for it, then take it
        lock = self.store.key_lock(key)
        while not lock.try_acquire():
            await asyncio.sleep(0.5)
        try:
            if cached is None and reuse:
                done = self.store.get(key)
                if done is not None and await asyncio.to_thread(self.store.verify, done):
                    self._served(done, sink, key, now, time.time(), CACHED_MEANWHILE)
                    return done
            if self.shared is None or not reuse or job.decl.measures:
                return await self._compute(job, sink, key, now, cancelled)
            return await self._through_shared(job, sink, key, now, cancelled)
        finally:
            lock.release()

    async def _through_shared(self, job: StageJob, sink: JobSink, key: str, now: float,
                              cancelled: Callable[[], bool]) -> Artifact | None:
        """The key from the machine's shared store, or computed here and put there; one
        process computes a key at a time (the shared store's key lock), the others wait and
        take it."""
        assert self.shared is not None
        lock = self.shared.key_lock(key)
        while not lock.try_acquire():
            await asyncio.sleep(0.5)
        try:
            found = self.shared.get(key)
            if found is not None and await asyncio.to_thread(self.shared.verify, found):
                taken = await asyncio.to_thread(self.store.adopt, found)
                self._served(taken, sink, key, now, time.time(), SHARED)
                return taken
            art = await self._compute(job, sink, key, now, cancelled)
            if art is not None:
                try:
                    await asyncio.to_thread(self.shared.adopt, art)
                except OSError as exc:  # a full or read-only shared store: the job stands
                    sink.log(f"not put in the shared store {self.shared.root}: {exc}")
            return art
        finally:
            lock.release()

    def _served(self, art: Artifact, sink: JobSink, key: str, started: float, finished: float,
                message: str) -> None:
        result = _result(art)
        sink.metrics([Metric.from_dict(m) for m in result.get("metrics", [])], [])
        sink.update(state="succeeded", started=started, finished=finished, progress=1.0,
                    cached=1, artifact_key=key, result=result, message=message)

    def _inputs(self, job: StageJob) -> dict[str, str]:
        out = {}
        for label, key in job.input_keys.items():
            art = self.store.get(key)
            if art is None:
                raise StudioError(f"{job.label}: its input {label} is missing from the store")
            out[label] = str(art.path)
        return out

    async def _compute(self, job: StageJob, sink: JobSink, key: str, now: float,
                       cancelled: Callable[[], bool]) -> Artifact | None:
        inputs = self._inputs(job)
        # a part-by-part stage gets its key's kept folder: the parts a killed run finished
        # there are kept, and stay on cancel or failure for the next run of the key
        workdir = self.store.new_workdir(key if job.decl.resumes else None)
        spec: dict[str, Any] = {
            "job_id": job.job_id, "config": job.config.to_dict(), "inputs": inputs,
            "input_keys": dict(job.input_keys), "workdir": str(workdir),
            "history": dict(job.history),
        }
        if job.decl.resumes:  # its finished parts are kept by part key for other settings
            spec["part_cache"] = {"root": str(self.store.parts),
                                  "salt": sha256_json(dict(job.versions))}
        sink.update(state="running", started=now, progress=0.0, message="starting")

        def on_message(msg: dict[str, Any]) -> None:
            kind = msg.get("type")
            if kind == "progress":
                sink.update(progress=msg["fraction"], message=msg.get("message", ""))
            elif kind == "log":
                sink.log(msg["line"])
            elif kind == "partial":
                sink.partial(msg.get("data"))

        try:
            outcome = await self.execute(spec, on_message)
        except BaseException:
            # interrupted (Ctrl-C, a cancelled run): the work folder goes with the worker that
            # wrote it (a kept folder of finished parts stays for the next run of its key)
            self.store.drop_workdir(workdir)
            raise
        if cancelled():
            self.store.drop_workdir(workdir)
            sink.update(state="cancelled", finished=time.time(), message="cancelled")
            return None
        if outcome.get("type") == "result":
            result = outcome["result"]
            # Run facts (how long the stage took, ...) go to the run history only: they are
            # not part of the artifact, whose content must not depend on the clock.
            sink.metrics([Metric.from_dict(m) for m in result.get("metrics", [])],
                         [Metric.from_dict(m) for m in outcome.get("facts", [])])
            art = await asyncio.to_thread(
                self.store.commit, key, workdir,
                artifact_meta(job.stage, job.target, job.config, job.input_keys, job.versions,
                              result))
            if key != job.key:
                set_newest_measurement(self.store, job.key, key)
            sink.update(state="succeeded", finished=time.time(), progress=1.0,
                        artifact_key=key, result=result, message=result.get("summary", "done"))
            return art
        self.store.drop_workdir(workdir)
        if outcome.get("traceback"):
            sink.traceback(outcome["traceback"])
        raise job_failure(job.label, outcome)
