"""``--remeasure``: the measuring stages time again; the earlier measurement stays in the
history, and later runs reuse the newest one."""

import json
import shutil

import pytest

from tests.cli.conftest import studio
from tests.conftest import copy_store

pytestmark = pytest.mark.slow


def _profile_job(out: str) -> dict:
    return next(j for j in json.loads(out)["jobs"] if j["stage"] == "profile")


def test_remeasure_profiles_again_and_later_runs_reuse_the_newest(batch_run, small_project,
                                                                  tmp_path):
    dest = tmp_path / small_project.name
    shutil.copy2(small_project, dest)
    copy_store(small_project.with_suffix(".studio"), dest.with_suffix(".studio"))

    plain = studio("--batch", dest, "--stages", "profile", "--json")
    assert plain.returncode == 0, plain.stderr[-2000:]
    first = _profile_job(plain.stdout)
    assert first["cached"]  # the batch run profiled already

    again = studio("--batch", dest, "--stages", "profile", "--remeasure", "--json")
    assert again.returncode == 0, again.stderr[-2000:]
    fresh = _profile_job(again.stdout)
    assert not fresh["cached"] and "median of 5 runs" in fresh["summary"]

    later = studio("--batch", dest, "--stages", "profile", "--json")
    reused = _profile_job(later.stdout)
    assert reused["cached"]

    from studio.core.project import load
    from studio.services.session import Studio

    s = Studio(load(dest))
    try:
        keys = {j: s.jobs.job(j).artifact_key for j in (first["id"], fresh["id"], reused["id"])}
    finally:
        s.close()
    assert keys[fresh["id"]] != keys[first["id"]]  # both measurements are kept
    assert keys[reused["id"]] == keys[fresh["id"]]  # a plain run reuses the newest
