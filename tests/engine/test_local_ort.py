"""The ``local-ort`` device kind (ONNX Runtime's CPU provider on the quantize stage's QDQ
graphs), added as one backend module (``studio/engine/devices/local_ort.py``) and one
registration line: as a project's ``run.devices`` entry the plan gives its run job the
quantized graphs, and its run stage and ``studio generate --device local-ort`` give the
tokens of the existing host QDQ path (the validate stage's ``host_qdq``: the same graphs on
the same runtime) on the shipped sample, labelled measured on local-ort."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import share_store, studio
from tests.conftest import run_batch, small_sample_project


def test_the_kind_is_declared_once_and_read_everywhere():
    from studio.core import devices
    from studio.core import project as pf
    from studio.core.catalog import default_chip_key
    from studio.core.stagegraph import STAGES, plan
    from studio.services.devices import device_rows, run_choices

    dev = devices.resolve("local-ort", [])
    assert (dev.kind, dev.id, dev.source, dev.runs, dev.chip) == (
        "local-ort", "local-ort", "measured", "quantize", "")
    assert "local-ort" in STAGES["run"].device_kinds
    assert "local-ort" not in STAGES["profile"].device_kinds  # no NPU to profile
    assert devices.default_devices() == ["cpu", "htp-sim"]  # a new project's devices stay
    p = pf.new_project("x", "sample:tiny-coder", [default_chip_key()],
                       run={"devices": ["local-ort"]})
    jobs = plan(p, ["run"])
    assert [j.label for j in jobs] == ["export", "quantize", "run[local-ort]"]
    assert jobs[2].deps == [0, 1]  # the device runs the quantized graphs: quantize is a need
    row = next(r for r in device_rows(probe=False) if r["kind"] == "local-ort")
    assert row["source"] == "measured" and row["status"].startswith("ok")
    assert run_choices([row], []) == [(dev.name, "local-ort")]


def _stored(project: Path, stage: str) -> Path:
    """The stored artifact of ``stage`` (a job label) for the project's current settings."""
    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.services.history import current_keys

    p = pf.load(project)
    key = current_keys(p, [stage.split("[")[0]])[stage]
    art = ArtifactStore(p.folder / "artifacts").get(key)
    assert art is not None, stage
    return art.path


def _host_qdq_tokens(project: Path, prompt: str, n: int) -> list[int]:
    """The existing host QDQ path (the validate stage's ``host_qdq`` runner) on the stored
    quantized graphs: greedy tokens after ``prompt``."""
    from studio.engine.llm_runtime import cpu_generator, load_graph_spec, load_tokenizer

    export, qdir = _stored(project, "export"), _stored(project, "quantize")
    spec = load_graph_spec(export)
    ids = load_tokenizer(export)(prompt).input_ids
    return cpu_generator(qdir, spec).greedy(ids, n, eos_id=spec.get("eos_token_id"))["tokens"]


@pytest.fixture(scope="module")
def local_ort_project(sample_export, tmp_path_factory) -> tuple[Path, dict]:
    """The small sample project with ``run.devices = ["cpu", "local-ort"]`` after
    ``--stages run`` (the session's export; quantize and the runs computed here)."""
    folder = tmp_path_factory.mktemp("local-ort")
    path = small_sample_project(folder, "localort", run={"devices": ["cpu", "local-ort"],
                                                         "max_new_tokens": 8})
    share_store(sample_export, path, stages={"export"})
    summary, _seconds = run_batch(path, "--stages", "run")
    return path, summary


@pytest.mark.slow
def test_the_run_stage_on_local_ort_gives_the_host_qdq_tokens(local_ort_project):
    path, summary = local_ort_project
    assert {(j["stage"], j["target"]) for j in summary["jobs"]} >= {
        ("quantize", ""), ("run", "cpu"), ("run", "local-ort")}
    assert {j["state"] for j in summary["jobs"]} == {"succeeded"}
    res = json.loads((_stored(path, "run[local-ort]") / "result.json").read_text())
    from studio.core import project as pf

    prompt = pf.load(path).run["prompt"]
    assert res["tokens"] == _host_qdq_tokens(path, prompt, 8)
    assert len(res["tokens"]) == 8 and res["text"].strip()
    assert res["device"] == "local-ort" and res["source"] == "measured"
    assert "QDQ graphs on ONNX Runtime's CPU provider" in res["summary"]
    assert {m["source"] for m in res["metrics"]} == {"measured"}
    assert {m["device"] for m in res["metrics"]} == {"local-ort"}


@pytest.mark.slow
def test_generate_on_local_ort_gives_the_host_qdq_tokens(local_ort_project):
    path, _summary = local_ort_project
    prompt = "def __init__(self"
    r = studio("generate", path, "--prompt", prompt, "--max-new-tokens", "6", "--device",
               "local-ort", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["tokens"] == _host_qdq_tokens(path, prompt, 6) and got["text"].strip()
    assert got["source"] == "measured" and got["device"] == "local-ort"
    assert got["decode_tokens_per_s"] > 0 and got["time_to_first_token_ms"] > 0
