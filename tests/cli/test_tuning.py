"""studio prune on the small project: the ablation's ranked table, a pruned checkpoint with a
project file that runs through the pipeline, and bad input."""

import json

import pytest

from tests.cli.conftest import studio

pytestmark = pytest.mark.slow


def test_prune_writes_a_checkpoint_the_pipeline_runs(batch_run, small_project, tmp_path):
    r = studio("prune", small_project, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    table = json.loads(r.stdout)["ablation"]
    assert table["num_blocks"] == 4 and len(table["blocks"]) == 4
    deltas = [b["delta"] for b in table["blocks"]]
    assert deltas == sorted(deltas) and deltas[0] > 0  # every block matters, ranked
    assert table["dropped"] == [table["blocks"][0]["block"]]
    assert table["pruned_ppl"] == pytest.approx(table["blocks"][0]["ppl"], rel=1e-6)

    out = tmp_path / "pruned"
    r = studio("prune", small_project, "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "dropped block" in r.stdout and str(out) in r.stdout
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3
    proj = out.with_suffix(".qstudio")
    r = studio("--batch", proj, "--stages", "export")
    assert r.returncode == 0, r.stderr[-2000:]

    r = studio("prune", small_project, "--out", out)  # not over a non-empty folder
    assert r.returncode == 2 and "not empty" in r.stderr
    r = studio("prune", small_project, "--drop", "4")
    assert r.returncode == 2 and "at least one must stay (at most 3)" in r.stderr
