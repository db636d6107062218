"""`studio info`: runs as the run history says they are (a killed run is interrupted, not
running), the latest figures with the run they come from, and the per-layer precision table."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from studio.core import project as projectfile
from studio.core.jobs import JobStore
from studio.core.metrics import Metric
from tests.cli.conftest import ROOT, SMALL, default_target, record_run, studio


@pytest.fixture
def project_file(tmp_path) -> Path:
    f = tmp_path / "p.qstudio"
    f.write_text(SMALL.format(target=default_target()))
    return f


def _leave_a_running_run(folder: Path) -> int:
    """A run left "running" by a process that died without finishing it (and without the
    project's run lock, which dies with its process)."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from studio.core.jobs import JobStore\n"
        "s = JobStore(Path(sys.argv[1]) / 'runs.sqlite')\n"
        "r = s.create_run({'stages': ['export']})\n"
        "j = s.add_job(r, 'export')\n"
        "s.update_job(j, state='running', pid=0)\n"
        "print(r)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(folder)], cwd=ROOT, capture_output=True,
                       text=True, check=True)
    return int(r.stdout)


def _stored_state(folder: Path, run_id: int) -> str:
    con = sqlite3.connect(folder / "runs.sqlite")
    try:
        return con.execute("SELECT state FROM runs WHERE id=?", (run_id,)).fetchone()[0]
    finally:
        con.close()


def test_a_killed_run_shows_as_interrupted(project_file):
    folder = project_file.with_suffix(".studio")
    run_id = _leave_a_running_run(folder)
    assert _stored_state(folder, run_id) == "running"

    r = studio("info", project_file)
    assert r.returncode == 0, r.stderr
    assert f"run {run_id}: interrupted" in r.stdout and "running" not in r.stdout
    r = studio("info", project_file, "--json")
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)["recent_runs"]
    assert [(x["id"], x["state"]) for x in runs] == [(run_id, "interrupted")]
    # info only reads: the history still says running until a session opens the project
    assert _stored_state(folder, run_id) == "running"


def test_a_run_whose_process_holds_the_run_lock_is_running(project_file):
    folder = project_file.with_suffix(".studio")
    run_id = _leave_a_running_run(folder)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from studio.core.fsutil import RunLock\n"
         f"RunLock({str(folder)!r}).acquire()\n"
         "print('locked', flush=True)\n"
         "time.sleep(60)\n"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = studio("info", project_file)
        assert r.returncode == 0, r.stderr
        assert f"run {run_id}: running" in r.stdout
    finally:
        holder.kill()
        holder.wait()
    assert f"run {run_id}: interrupted" in studio("info", project_file).stdout


def test_latest_figures_name_their_run(project_file):
    folder = project_file.with_suffix(".studio")
    settings = projectfile.load(project_file).to_dict()
    store = JobStore(folder / "runs.sqlite")
    t = default_target()
    record_run(store, settings, [Metric("top1_agreement", 0.875, "fraction", "simulated",
                                        "htp-sim", t)])
    second = record_run(store, settings, [
        Metric("top1_agreement", 0.9375, "fraction", "simulated", "htp-sim", t),
        Metric("perplexity_fp32", 67.1, "", "measured", "host-cpu"),
    ])
    store.close()
    newest = _leave_a_running_run(folder)  # newer, but no figures

    r = studio("info", project_file)
    assert r.returncode == 0, r.stderr
    assert f"latest figures (run {second}):" in r.stdout
    # the catalogue's title and way of writing the figure, as every page writes it
    line = next(ln for ln in r.stdout.splitlines() if "top-1 agreement with FP32" in ln)
    assert "93.8%" in line and "simulated" in line and f"HTP simulator · {t}" in line
    data = json.loads(studio("info", project_file, "--json").stdout)
    assert data["latest_run"] == second
    assert {(m["name"], m["run"]) for m in data["latest_metrics"]} == {
        ("top1_agreement", second), ("perplexity_fp32", second)}
    assert [x["id"] for x in data["recent_runs"]] == [newest, second, second - 1]


def test_json_lists_every_layer_with_its_precision_and_rule(project_file):
    p = projectfile.load(project_file)
    p.quantization["scheme"] = "W8A8"
    p.quantization["overrides"] = {"layers.3": "INT16", "*.down_proj.weight": "INT4",
                                   "model.layers.9.*": "INT8"}
    projectfile.save(p)
    r = studio("info", project_file, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    layers = {row["layer"]: row for row in data["layers"]}
    assert len(layers) == 39 + 4 * 3  # and each block's key activations  # embedding, 4 blocks of 9, final norm, head
    assert list(layers)[0] == "model.embed_tokens" and list(layers)[-1] == "lm_head"
    down3 = layers["model.layers.3.mlp.down_proj"]
    assert (down3["weight"], down3["activation"]) == ("INT4", "INT16")
    assert down3["weight_rule"] == "override '*.down_proj.weight'"
    assert down3["activation_rule"] == "override 'layers.3'"
    assert down3["block"] == 3 and down3["kind"] == "mlp"
    q0 = layers["model.layers.0.self_attn.q_proj"]
    assert (q0["weight"], q0["activation"]) == ("INT8", "INT8")
    assert q0["weight_rule"] == q0["activation_rule"] == "scheme W8A8 (per_channel)"
    norm = layers["model.layers.3.input_layernorm"]
    assert (norm["weight"], norm["activation"]) == ("", "INT16")
    assert layers["lm_head"]["tied_to"] == "model.embed_tokens"
    assert data["unmatched_overrides"] == ["model.layers.9.*"]
    text = studio("info", project_file).stdout
    assert "override 'model.layers.9.*' covers no layer" in text


def test_json_without_a_model_says_why_there_is_no_layer_table(project_file):
    project_file.write_text(project_file.read_text().replace('"sample:tiny-coder"',
                                                             '"./no-such-model"'))
    r = studio("info", project_file, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["layers"] is None and "not found" in data["layers_error"]


def test_info_shows_the_device_memory_plan(project_file):
    r = studio("info", project_file, "--json")
    assert r.returncode == 0, r.stderr
    (plan,) = json.loads(r.stdout)["device_plan"]["plans"]
    assert plan["chip"] == default_target() and plan["parts"] == 1 and plan["fits"] is True
    kinds = {row["kind"] for row in plan["rows"]}
    assert kinds == {"weights", "activations", "kv", "io"}
    assert {row["source"] for row in plan["rows"]} == {"estimated"}
    assert plan["kv_dtype"] == "uint16" and plan["npu_va_source"].startswith("[VA]")
    text = studio("info", project_file).stdout
    assert "device plan (what the NPU maps, per target):" in text and "; fits" in text
