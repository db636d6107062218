"""The job runner on a real artifact store, with an executor that runs a job spec in this
process (as the Ray executor's task body does): computed then served from the store, two
runs of one key computing it once, new and newest measurements, a stage's refusal and a
crash, cancellation, and the gates of gated stages."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from studio.core.artifacts import ArtifactStore
from studio.core.errors import StageCrashed, StudioError
from studio.core.metrics import Metric
from studio.core.stagegraph import STAGES, StageConfig
from studio.services.jobrunner import (
    CACHED,
    CACHED_MEANWHILE,
    JobRunner,
    StageJob,
    job_gates,
    newest_measurement,
)

VERSIONS = {"qstudio-code": "test"}


def config(stage: str, item: str = "", **settings: Any) -> StageConfig:
    return StageConfig(stage, item, MappingProxyType(settings), MappingProxyType({}),
                       MappingProxyType({**settings, "@item": item}))


class Recorder:
    """A job sink that keeps what it is told."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self.partials: list[Any] = []
        self.figures: list[Metric] = []
        self.facts: list[Metric] = []
        self.tracebacks: list[str] = []

    def update(self, **fields: Any) -> None:
        self.updates.append(fields)

    def log(self, line: str) -> None:
        self.lines.append(line)

    def partial(self, data: Any) -> None:
        self.partials.append(data)

    def metrics(self, metrics: list[Metric], facts: list[Metric]) -> None:
        self.figures, self.facts = metrics, facts

    def traceback(self, text: str) -> None:
        self.tracebacks.append(text)

    @property
    def last(self) -> dict[str, Any]:
        return self.updates[-1]


class InProcess:
    """Runs a spec here: writes ``out.txt`` and a result, after the messages a stage sends;
    ``outcome`` replaces the result (an error, a died worker)."""

    def __init__(self, outcome: dict[str, Any] | None = None, delay: float = 0.0):
        self.outcome, self.delay = outcome, delay
        self.specs: list[dict[str, Any]] = []

    async def __call__(self, spec: dict[str, Any], on_message) -> dict[str, Any]:
        self.specs.append(spec)
        on_message({"type": "progress", "fraction": 0.5, "message": "halfway"})
        on_message({"type": "log", "line": "a line"})
        on_message({"type": "partial", "data": {"tokens": 3}})
        await asyncio.sleep(self.delay)
        if self.outcome is not None:
            return {"job_id": spec["job_id"], **self.outcome}
        out = Path(spec["workdir"])
        (out / "out.txt").write_text(f"computed {len(self.specs)}")
        metric = Metric("answer", 42.0, "", "measured", "host-cpu").to_dict()
        result = {"summary": "made it", "metrics": [metric], "logits_cosine_mean": 0.5}
        (out / "result.json").write_text(json.dumps(result))
        fact = Metric("stage_seconds", 1.0, "s", "measured", "host-cpu").to_dict()
        return {"type": "result", "job_id": spec["job_id"], "result": result, "facts": [fact]}


@pytest.fixture()
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "artifacts").open()


def test_a_job_is_computed_once_then_served_from_the_store(store):
    execute = InProcess()
    runner = JobRunner(store, execute)
    job = StageJob(1, config("export", **{"export.prompt_length": 16}), {}, VERSIONS)
    first = Recorder()
    art = asyncio.run(runner.run(job, first))
    assert art is not None and art.key == job.key and (art.path / "out.txt").is_file()
    assert first.updates[0] == {"state": "running", "started": first.updates[0]["started"],
                                "progress": 0.0, "message": "starting"}
    assert {"progress": 0.5, "message": "halfway"} in first.updates
    assert first.lines == ["a line"] and first.partials == [{"tokens": 3}]
    assert [m.name for m in first.figures] == ["answer"]
    assert [m.name for m in first.facts] == ["stage_seconds"]
    assert first.last["state"] == "succeeded" and first.last["message"] == "made it"
    assert art.meta["stage"] == "export" and art.meta["versions"] == VERSIONS
    spec = execute.specs[0]
    assert spec["config"]["stage"] == "export" and spec["history"] == {}

    again = Recorder()
    served = asyncio.run(runner.run(StageJob(2, job.config, {}, VERSIONS), again))
    assert served is not None and served.key == art.key and len(execute.specs) == 1
    assert again.last["cached"] == 1 and again.last["message"] == CACHED
    assert [m.name for m in again.figures] == ["answer"] and again.facts == []


def test_two_runs_of_one_key_compute_it_once(store):
    execute = InProcess(delay=1.0)
    runner = JobRunner(store, execute)
    cfg = config("export", **{"export.prompt_length": 32})
    a, b = Recorder(), Recorder()

    async def both():
        return await asyncio.gather(runner.run(StageJob(1, cfg, {}, VERSIONS), a),
                                    runner.run(StageJob(2, cfg, {}, VERSIONS), b))

    arts = asyncio.run(both())
    assert arts[0].key == arts[1].key and len(execute.specs) == 1
    assert sorted(r.last["message"] for r in (a, b)) == sorted(["made it", CACHED_MEANWHILE])


def test_inputs_go_by_key_and_a_missing_input_is_refused(store):
    runner = JobRunner(store, InProcess())
    up = asyncio.run(runner.run(StageJob(1, config("export"), {}, VERSIONS), Recorder()))
    assert up is not None
    execute = InProcess()
    runner = JobRunner(store, execute)
    down = StageJob(2, config("quantize"), {"export": up.key}, VERSIONS)
    asyncio.run(runner.run(down, Recorder()))
    assert execute.specs[0]["inputs"] == {"export": str(up.path)}
    assert execute.specs[0]["input_keys"] == {"export": up.key}
    gone = StageJob(3, config("quantize", x=1), {"export": "0" * 64}, VERSIONS)
    with pytest.raises(StudioError, match="its input export is missing from the store"):
        asyncio.run(runner.run(gone, Recorder()))


def test_a_remeasurement_gets_its_own_key_and_later_runs_take_the_newest(store):
    execute = InProcess()
    runner = JobRunner(store, execute)
    cfg = config("profile", "htp-sim:sm8650")
    assert STAGES["profile"].measures
    base = asyncio.run(runner.run(StageJob(1, cfg, {}, VERSIONS), Recorder()))
    assert base is not None and base.key == StageJob(1, cfg, {}, VERSIONS).key
    again = asyncio.run(runner.run(StageJob(2, cfg, {}, VERSIONS), Recorder(),
                                   remeasure=True))
    assert again is not None and again.key != base.key and len(execute.specs) == 2
    assert newest_measurement(store, base.key) == again.key
    later = Recorder()
    newest = asyncio.run(runner.run(StageJob(3, cfg, {}, VERSIONS), later))
    assert newest is not None and newest.key == again.key and len(execute.specs) == 2
    assert later.last["message"] == CACHED


def test_a_refusal_and_a_crash_become_one_line_errors(store):
    refused = JobRunner(store, InProcess({"type": "error", "kind": "user",
                                          "message": "the prompt is too long"}))
    rec = Recorder()
    with pytest.raises(StudioError, match=r"^export: the prompt is too long$"):
        asyncio.run(refused.run(StageJob(1, config("export"), {}, VERSIONS), rec))
    # the scheduler records the failure (the run's error and exit code come from it)
    assert [u["state"] for u in rec.updates if "state" in u] == ["running"]
    assert rec.tracebacks == []
    assert list(store.tmp.iterdir()) == []  # its work folder is gone

    crashed = JobRunner(store, InProcess({"type": "error", "kind": "bug", "message": "boom",
                                          "traceback": "Traceback ..."}))
    rec = Recorder()
    with pytest.raises(StageCrashed, match="crashed: boom .the job log has the traceback"):
        asyncio.run(crashed.run(StageJob(1, config("export", y=2), {}, VERSIONS), rec))
    assert rec.tracebacks == ["Traceback ..."]

    died = JobRunner(store, InProcess({"type": "died", "returncode": -9}))
    with pytest.raises(StageCrashed, match="killed by SIGKILL"):
        asyncio.run(died.run(StageJob(1, config("export", y=3), {}, VERSIONS), Recorder()))


def test_a_cancelled_job_keeps_nothing(store):
    runner = JobRunner(store, InProcess({"type": "died", "returncode": -15}))
    rec = Recorder()
    job = StageJob(1, config("export", z=1), {}, VERSIONS)
    assert asyncio.run(runner.run(job, rec, cancelled=lambda: True)) is None
    assert rec.last == {"state": "cancelled", "finished": rec.last["finished"],
                        "message": "cancelled"}
    assert store.get(job.key) is None and list(store.tmp.iterdir()) == []


def test_only_gated_stages_are_judged_by_the_gates():
    gates = {"min_logits_cosine": 0.9}
    result = {"logits_cosine_mean": 0.5}
    rows = job_gates(STAGES["validate"], gates, "sm8650", result)
    assert rows and rows[0]["gate"] == "min_logits_cosine" and not rows[0]["passed"]
    assert rows[0]["target"] == "sm8650"
    assert job_gates(STAGES["graph-validate"], gates, "sm8650", result)
    assert job_gates(STAGES["compile"], gates, "sm8650", result) == []
