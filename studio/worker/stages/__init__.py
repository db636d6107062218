"""The pipeline's stages: one module per stage, named by its declaration
(``StageDecl.module`` in :mod:`studio.core.stagegraph`: ``export.py``, ``graph_quantize.py``,
``compile.py`` …), each a thin adapter over the engine with one function
``run(ctx, progress) -> result``. Modules whose names start with ``_`` hold what several
stages share.

The worker subprocess calls :func:`run_stage` with the job spec from the service layer;
benchmarks and tests call :func:`run_in_process` or a stage's function directly
(:func:`stage_function`). A stage writes its files into ``ctx.out`` (a fresh folder that
becomes the content-addressed artifact) and returns a JSON-able result whose ``metrics`` each
carry their source. A new stage is its declaration plus its module here: nothing else lists
stage names.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core.compare import compare_with_previous
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.jobs import FINAL, JobStore, run_outcome
from studio.core.partcache import PartCache
from studio.core.progress import Progress
from studio.core.stagegraph import STAGES, StageConfig, StageDecl, stage_config
from studio.worker.context import StageContext
from studio.worker.parts import PartsConfig

StageFunction = Callable[[StageContext, Progress], dict[str, Any]]


def stage_function(stage: StageDecl | str) -> StageFunction:
    """A stage's function, found from its declaration: ``run`` of
    ``studio.worker.stages.<decl.module>``."""
    decl = STAGES[stage] if isinstance(stage, str) else stage
    return importlib.import_module(f"{__name__}.{decl.module}").run


def _history(spec: dict[str, Any]) -> dict[str, Any]:
    """The run history facts a stage may read: this run's settings and the comparison with
    the previous run (read-only)."""
    h = spec.get("history") or {}
    if not h.get("db") or not Path(h["db"]).exists() or h.get("run_id") is None:
        return {}

    store = JobStore(Path(h["db"]))
    try:
        run = store.run(int(h["run_id"]))
        out: dict[str, Any] = {"settings": (run or {}).get("config", {}).get("settings"),
                               "sweeps": h.get("sweeps")}
        if run is not None:
            out["run"] = {"id": run["id"], "state": _state_when_written(store, run, spec),
                          "created": run["created"], "finished": run.get("finished"),
                          "settings_recorded": bool((run.get("config") or {}).get("settings"))}
        try:
            out["comparison"] = compare_with_previous(store, int(h["run_id"]))
        except ImportError:
            pass
        return out
    finally:
        store.close()


def _state_when_written(store, run: dict[str, Any], spec: dict[str, Any]) -> str:
    """The state of the run a stage reads: a run is recorded as running until its last job
    ends, and the stage reading it (the report, which waits for every other job) is that
    job. When every other job of the run has ended, the run ends as they did (the reading
    job succeeds with what it writes): the report of a finished run never calls it
    running."""
    if run["state"] != "running":
        return str(run["state"])
    others = [j.state for j in store.jobs(run_id=run["id"]) if j.id != spec.get("job_id")]
    if not all(s in FINAL for s in others):
        return "running"
    return run_outcome(others)


def refuse_parts(decl: StageDecl, inputs: dict[str, Path]) -> None:
    """A one-line error when a stage not built for a model in parts gets one (its export's
    graph.json lists more than one part)."""
    if decl.takes_parts:
        return
    for folder in inputs.values():
        try:
            spec = json.loads((Path(folder) / "graph.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        count = len(spec.get("parts") or []) if isinstance(spec, dict) else 0
        if count > 1:
            raise StudioError(f"the {decl.title.lower()} stage does not take a model exported "
                              f"in parts yet (this one has {count}): run it on a project "
                              "with export.parts = 1")


def run_in_process(project, job, inputs: dict[str, Path], out: Path,
                   progress: Progress) -> dict[str, Any]:
    """Run one planned job here, without a worker (benchmarks, experiments): the stage sees
    the same frozen config the pipeline would hand it."""
    ctx = StageContext(stage_config(project, job), dict(inputs), Path(out),
                       parts_config=PartsConfig.local(project))
    refuse_parts(job.decl, ctx.inputs)
    result = stage_function(job.decl)(ctx, progress)
    atomic_write_json(ctx.out / "result.json", result)
    return result


def run_stage(spec: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Entry point of the worker: build the context from the job spec and run the stage.

    Returns ``{"result": ..., "facts": [...]}``: the result is written into the artifact;
    the facts (timings of this run) go to the run history only."""
    config = StageConfig.from_dict(spec["config"])
    decl = STAGES[config.stage]
    ctx = StageContext(config, {k: Path(v) for k, v in spec.get("inputs", {}).items()},
                       Path(spec["workdir"]), _history(spec) if decl.reads_history else {})
    if spec.get("part_cache"):
        ctx.parts = PartCache(Path(spec["part_cache"]["root"]))
        ctx.part_salt = str(spec["part_cache"]["salt"])
    ctx.parts_config = PartsConfig.from_spec(spec.get("parts"))
    refuse_parts(decl, ctx.inputs)
    result = stage_function(decl)(ctx, progress)
    atomic_write_json(ctx.out / "result.json", result)
    return {"result": result, "facts": ctx.facts}


__all__ = ["StageContext", "StageFunction", "run_in_process", "run_stage", "stage_function"]
