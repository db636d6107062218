"""Memory plans of a project's stage outputs: the export stage really run (sample model,
prompt 16, context 64) and stored under the key the plan gives it now."""

from __future__ import annotations

import json

import pytest

from studio.core import project as pf
from studio.core.artifacts import ArtifactStore
from studio.core.errors import StudioError
from studio.core.progress import RecordingProgress
from studio.core.stagegraph import plan
from studio.services import memory
from studio.services.history import current_keys
from studio.worker.stages import run_in_process
from tests.conftest import small_sample_project


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> pf.Project:
    from tests.engine.conftest import SAMPLE_MODEL

    if not (SAMPLE_MODEL / "model.safetensors").is_file():
        pytest.skip("the sample model resources/models/tiny-coder is not built")
    return pf.load(small_sample_project(tmp_path_factory.mktemp("memory"), "memory"))


def test_no_result_says_what_to_run(project):
    with pytest.raises(StudioError, match="--stages export"):
        memory.project_memory(project)
    assert memory.stage_graphs(project, "quantize") is None
    with pytest.raises(StudioError, match="export and quantize"):
        memory.stage_graphs(project, "compile")


@pytest.mark.slow
def test_plans_the_current_export(project):
    store = ArtifactStore(project.folder / "artifacts").open()
    job = plan(project, ["export"])[-1]
    work = store.new_workdir()
    run_in_process(project, job, {}, work, RecordingProgress())
    store.commit(current_keys(project, ["export"])["export"], work, {"stage": "export"})

    out = memory.project_memory(project)
    assert out["missing"] == ["quantize"] and set(out["stages"]) == {"export"}
    graphs = out["stages"]["export"]
    assert set(graphs) == {"prefill", "decode"}
    json.dumps(out)  # JSON-able as it is
    dec = graphs["decode"]
    assert dec["kv_cache_bytes"] == 4 * 2 * 2 * 64 * 64 * 4  # 4 layers, K+V, 2 heads, C 64, D 64
    assert dec["plan"]["arena_bytes"] < dec["plan"]["naive_bytes"]
    assert memory.memory_plan(memory.stage_graphs(project, "export")["decode"]) == dec
    line = memory.summary(dec)
    assert line.startswith("decode: activations") and "[estimated]" in line and "\n" not in line
