"""studio profile show / export / import on the small project's real batch run."""

import json

import pytest

from tests.cli.conftest import studio

pytestmark = pytest.mark.slow


def test_show_the_seed_table_and_export_it(batch_run, small_project, tmp_path):
    r = studio("profile", "show", small_project, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["source"] == "simulated" and d["stats"]["runs"] == 5
    assert {"QKV projection", "attention: softmax", "gate/up", "RMSNorm", "RoPE"} <= set(
        d["by_block"])
    assert sum(v["share"] for v in d["by_block"].values()) == pytest.approx(1.0)
    text = studio("profile", "show", small_project, "--by", "layer-block").stdout
    rows = [ln for ln in text.splitlines() if not ln.startswith("warning:")]  # a busy host warns
    assert rows[2].startswith("layer") and "layer 3" in text

    out = tmp_path / "trace.json"
    r = studio("profile", "export", small_project, "--format", "chrome", out)
    assert r.returncode == 0, r.stderr
    trace = json.loads(out.read_text())
    assert "back to back" in trace["otherData"]["time_axis"]
    assert trace["otherData"]["source"] == "simulated"
    csv_out = tmp_path / "ops.csv"
    assert studio("profile", "export", small_project, "--format", "csv", csv_out).returncode == 0
    assert csv_out.read_text().startswith("source,op,op_type")

    back = studio("profile", "import", out, "--json")
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout)["source"] == "imported"


def test_bad_profile_commands_exit_2(batch_run, small_project, tmp_path):
    r = studio("profile", "show", small_project, "--run", "999")
    assert r.returncode == 2 and "has no profile" in r.stderr
    junk = tmp_path / "junk.txt"
    junk.write_text("not a profile\n")
    r = studio("profile", "import", junk)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    r = studio("profile", "export", small_project, "--format", "pdf", tmp_path / "x")
    assert r.returncode == 2
