"""Reproducible keys, end to end: two fresh copies of a project, in different folders, give
the same artifact key for every stage; a run stores exactly the keys the plan predicts."""

from __future__ import annotations

import json
import sqlite3

from studio.core import project as pf
from studio.services.history import current_keys
from tests.cli.conftest import SMALL, default_target, studio


def _stored_keys(project_file) -> dict[str, str]:
    con = sqlite3.connect(project_file.with_suffix(".studio") / "runs.sqlite")
    rows = con.execute("SELECT stage, target, artifact_key FROM jobs WHERE state='succeeded' "
                       "ORDER BY id").fetchall()
    con.close()
    return {f"{s}[{t}]" if t else s: k for s, t, k in rows}


def test_two_fresh_copies_give_identical_keys_for_every_stage(batch_run, small_project,
                                                              tmp_path):
    copy = tmp_path / "elsewhere" / "copy.qstudio"
    copy.parent.mkdir()
    copy.write_text(SMALL.format(target=default_target()).replace('name = "small"',
                                                                   'name = "copy"'))
    r = studio("--batch", copy, "--stages", "quantize", "--json")
    assert r.returncode == 0, r.stderr
    assert all(not j["cached"] for j in json.loads(r.stdout)["jobs"])  # computed afresh
    ran = _stored_keys(copy)
    # the small project's own plan (its history also holds variants other tests ran in its
    # folder, e.g. an INT8 KV quantize for studio generate --kv int8)
    original = current_keys(pf.load(small_project))
    assert ran["export"] == original["export"]
    assert ran["quantize"] == original["quantize"]
    # the run stored exactly the keys the plan predicts
    predicted = current_keys(pf.load(copy))
    assert ran == {k: predicted[k] for k in ran}
    # every stage: a third copy elsewhere, differing only in its name, which only the report
    # reads
    third = tmp_path / "third" / "small.qstudio"
    third.parent.mkdir()
    third.write_text(SMALL.format(target=default_target()))
    a, b = current_keys(pf.load(third)), predicted
    assert set(a) == set(b) and len(a) == 8
    assert {k for k in a if a[k] != b[k]} == {"report"}
