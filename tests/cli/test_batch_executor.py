"""``studio --batch`` runs its jobs where the project's ``pipeline.executor`` says: with
``ray``, as Ray tasks on a local cluster the run starts for itself (and stops after)."""

from __future__ import annotations

import json
import os

import pytest

from studio.core.jobs import JobStore
from tests.cli.conftest import ROOT, SMALL, default_target, share_store, studio


def test_a_batch_run_with_the_ray_executor_runs_its_jobs_as_ray_tasks(sample_export,
                                                                      tmp_path):
    pytest.importorskip("ray")
    f = tmp_path / "onray.qstudio"
    f.write_text(SMALL.format(target=default_target()).replace('name = "small"',
                                                               'name = "onray"')
                 + '\n[pipeline]\nexecutor = "ray"\n')
    share_store(sample_export, f, {"export"})  # the export from the store: quantize runs
    # no token authentication: another test's Ray cluster may run on this machine meanwhile
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                          if p))
    r = studio("--batch", f, "--stages", "quantize", "--json", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = {j["stage"]: j for j in json.loads(r.stdout)["jobs"]}
    assert jobs["export"]["cached"] and jobs["quantize"]["state"] == "succeeded"
    assert not jobs["quantize"]["cached"]
    store = JobStore(f.with_suffix(".studio") / "runs.sqlite")
    try:
        log = store.log(jobs["quantize"]["id"])
    finally:
        store.close()
    assert any(line.startswith("ran as a Ray task on ") for line in log), log[-20:]
