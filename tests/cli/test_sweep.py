"""``studio sweep``: a 4-point grid of the seed's axes on the sample, on the local pool (killed half-way
and resumed) and on a local Ray cluster the test starts, with identical metrics; the
Pareto front and the best point applied to the project; bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.conftest import SMALL, default_target, share_store, studio
from tests.conftest import copy_store

GRID = """
[[sweeps]]
name = "seed-grid"
[sweeps.axes]
"quantization.scheme" = ["W8A16", "W8A8"]
"quantization.overrides" = [{}, {"lm_head" = "INT16", "*.self_attn.scores" = "INT16"}]
"""


def _project(folder: Path) -> Path:
    text = SMALL.format(target=default_target()).replace(
        "heldout_tokens = 96", "heldout_tokens = 32").replace("greedy_tokens = 8",
                                                               "greedy_tokens = 2")
    f = folder / "grid.qstudio"
    f.write_text(text + GRID)
    return f


def _points(f: Path) -> list[dict]:
    from studio.core.jobs import JobStore

    db = f.with_suffix(".studio") / "runs.sqlite"
    if not db.exists():
        return []
    store = JobStore(db)
    try:
        return store.points("seed-grid")
    finally:
        store.close()


def _export_artifacts(f: Path) -> int:
    objects = f.with_suffix(".studio") / "artifacts" / "objects"
    return sum(1 for m in objects.glob("*/*/artifact.json")
               if json.loads(m.read_text())["stage"] == "export")


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, sample_export, batch_run, small_project):
    """The grid on 2 local workers, killed (SIGKILL to the whole process group) once 2
    points finished, then run again to the end. The project starts from the session's export
    and, for its per-channel W8A16 point, the session's quantized graph and compile (the
    small project's settings, the same keys): every other point is computed here."""
    f = _project(tmp_path_factory.mktemp("sweep"))
    share_store(sample_export, f, stages={"export"})
    share_store(small_project, f, stages={"quantize", "compile"})
    proc = subprocess.Popen([sys.executable, "-m", "studio.cli", "sweep", str(f), "--workers",
                             "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, text=True)
    deadline = time.time() + 900
    before: dict[str, int] = {}
    while time.time() < deadline and proc.poll() is None:
        done = [p for p in _points(f) if p["state"] in ("succeeded", "failed")]
        if len(done) >= 2:
            before = {p["point_id"]: p["run_id"] for p in done}
            break
        time.sleep(1)
    assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 2 <= len(before) < 4
    r = studio("sweep", f, "--workers", "2", "--json")
    out = json.loads(r.stdout)
    failed = any(p["state"] == "failed" for p in out["points"])
    assert r.returncode == (1 if failed else 0), r.stderr[-3000:]  # a failed point: not 0
    return f, before, out, r.stderr


def test_a_killed_sweep_resumes_without_recomputing_finished_points(resumed):
    f, before, out, err = resumed
    points = {p["id"]: p for p in out["run"]["points"]}
    assert len(points) == 4
    for pid, run_id in before.items():  # recorded before the kill: kept as they were
        assert points[pid]["kept"] and points[pid]["run_id"] == run_id
    assert all(p["state"] in ("succeeded", "failed") for p in points.values())
    computed = out["run"]["jobs"]["by_stage"]
    assert "export" not in computed  # the store served it
    assert computed.get("quantize", 0) <= 4 - len(before)
    assert "recorded earlier" in err
    assert _export_artifacts(f) == 1


def test_seed_grid_points_fronts_and_best(resumed):
    f, _, out, _ = resumed
    assert out["state"] in ("succeeded", "finished with failures")
    rows = out["points"]
    for p in rows:
        assert p["accuracy"]["source"] == "simulated" and 0.99 < p["accuracy"]["value"] <= 1
        assert p["weight_bytes"]["source"] == "estimated" and p["weight_bytes"]["value"] > 0
        assert p["tokens_per_s"][default_target()]["source"] == "estimated"
        assert p["context_bytes"]["source"] == "measured"
        assert p["run_id"]
        if p["state"] == "failed":
            assert p["reason"].startswith("gate ")
            assert p["settings"]["quantization.scheme"] == "W8A8"
        # each point is a run of the history with its own settings
        assert p["gates"]
    assert out["pareto_front"]
    best = rows[out["best"]]
    assert best["state"] == "succeeded" and best["gates_passed"]
    # every point is a run: compare two of them like any runs
    a, b = rows[0]["run_id"], rows[-1]["run_id"]
    r = studio("compare", f, a, b, "--json")
    assert r.returncode == 0, r.stderr
    changed = {c["key"] for c in json.loads(r.stdout)["settings"]}
    assert {"quantization.scheme", "quantization.overrides"} <= changed
    report = Path(out["report"])
    html = report.read_text()
    assert "<svg" in html and "Pareto" in html and report.with_suffix(".json").is_file()


def test_the_best_point_applied_to_the_project(resumed, tmp_path):
    f, _, out, _ = resumed
    g = tmp_path / "grid.qstudio"  # a copy: the other tests keep the original
    shutil.copy(f, g)
    copy_store(f.with_suffix(".studio"), g.with_suffix(".studio"))
    r = studio("sweep", g, "--show", "--apply", "best", "--json")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    best = shown["points"][shown["best"]]
    assert shown["applied"] == best["label"]
    from studio.core import project as projectfile

    p = projectfile.load(g)
    assert p.quantization["scheme"] == best["settings"]["quantization.scheme"]
    assert p.quantization["weight_granularity"] == "per_channel"  # not an axis: unchanged
    assert p.quantization["overrides"] == best["settings"]["quantization.overrides"]
    assert [s["name"] for s in p.sweeps] == ["seed-grid"]  # the sweep stays declared
    r = studio("sweep", g, "--show", "--apply", "p9")
    assert r.returncode == 2 and "give best or a point label p1 .. p4" in r.stderr


ROBUST = """
[[sweeps]]
name = "robust"
points = [
  {"quantization.weight_granularity" = "per_channel"},
  {"quantization.scheme" = "W4A16", "quantization.weight_granularity" = "per_tensor"},
  {"quantization.scheme" = "W8A8", "quantization.overrides" = {"model.layers.0.mlp" = "INT16", "model.layers.0.mlp.down_proj.weight" = "INT16"}},
]
"""
# the third point passes the checks before a run (16-bit weights under the W8A8 scheme's 8-bit
# activations run on the HTP) and fails in quantize: its MLP's activations at 16 bits put
# down_proj's 16-bit weights under a 16-bit input, which the HTP's MatMul does not take


def test_failing_points_keep_their_reason_and_the_others_finish(resumed, tmp_path):
    f, _, _, _ = resumed
    g = tmp_path / "grid.qstudio"
    g.write_text(f.read_text() + ROBUST)
    copy_store(f.with_suffix(".studio"), g.with_suffix(".studio"))
    r = studio("sweep", g, "--name", "robust", "--json")
    assert r.returncode == 1, r.stderr[-3000:]  # a point failed: the sweep is not a success
    out = json.loads(r.stdout)
    ok, invalid, refused = out["points"]
    assert ok["state"] == "succeeded" and ok["accuracy"]  # the grid's first point, from the store
    assert invalid["state"] == "invalid" and "W4A16 with per_tensor" in invalid["reason"]
    assert invalid["run_id"] is None
    assert refused["state"] == "failed" and refused["reason"].startswith("quantize: ")
    assert "16-bit" in refused["reason"] and refused["run_id"]
    assert out["state"] == "finished with failures"
    assert out["best"] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_grid_on_a_local_ray_cluster_gives_identical_metrics(resumed, tmp_path):
    """Two of the grid's validate jobs again, as Ray tasks on a cluster the test starts,
    their inputs and outputs moved through Ray's object store (``--transfer copy``, the path
    a node without the project's file system takes); the other two points come from the
    store: the same figures for every point."""
    pytest.importorskip("ray")
    f, _, local, _ = resumed
    g = tmp_path / "grid.qstudio"
    g.write_text(f.read_text())
    objects = g.with_suffix(".studio") / "artifacts" / "objects"
    shutil.copytree(f.with_suffix(".studio") / "artifacts" / "objects", objects)
    validations = sorted(m for m in objects.glob("*/*/artifact.json")
                         if json.loads(m.read_text())["stage"] == "validate")
    assert len(validations) == 4
    for meta in validations[:2]:  # these two validations run again, on Ray
        shutil.rmtree(meta.parent)
    port = _free_port()
    ray_bin = Path(sys.executable).with_name("ray")
    if not ray_bin.exists():  # a venv over the system's packages: ray's script is the system's
        ray_bin = Path(shutil.which("ray") or ray_bin)
    # no token authentication: another test's Ray (tests/cli/test_parts_cli.py) may start on
    # this machine meanwhile and write its own token where this cluster's client reads one
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    start = subprocess.run([str(ray_bin), "start", "--head", f"--port={port}",
                            "--num-cpus=2", "--include-dashboard=false",
                            "--node-ip-address=127.0.0.1", "--disable-usage-stats"],
                           capture_output=True, text=True, timeout=180, env=env)
    assert start.returncode == 0, start.stderr[-2000:]
    try:
        r = studio("sweep", g, "--executor", "ray", "--ray-address", f"127.0.0.1:{port}",
                   "--transfer", "copy", "--json", env=env)
    finally:
        subprocess.run([str(ray_bin), "stop", "--force"], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["run"]["executor"].startswith("Ray (127.0.0.1:")
    assert out["run"]["jobs"]["by_stage"] == {"validate": 2}

    def figures(rows):
        return {p["id"]: (p["state"], p["accuracy"]["value"],
                          sorted((m["name"], m["device"], m["value"]) for m in p["metrics"]))
                for p in rows}

    assert figures(out["points"]) == figures(local["points"])


def test_bad_sweep_input_gets_one_line(tmp_path):
    f = _project(tmp_path)
    for args, words in (
        (["--axis", "quantization.nope=1,2"], "is not a project setting"),
        (["--name", "other"], "no sweep named 'other'"),
        (["--executor", "dask"], "invalid choice: 'dask' (choose from 'local', 'ray')"),
        (["--axis", "quantization.scheme"], "KEY=VALUE1,VALUE2"),
        (["--show"], "has not run yet"),
    ):
        r = studio("sweep", f, *args)
        assert r.returncode == 2, (args, r.stderr)
        lines = [x for x in r.stderr.splitlines() if x.startswith("error")]
        assert len(lines) == 1 and words in lines[0], (args, r.stderr)
    assert not (f.with_suffix(".studio") / "artifacts" / "objects").exists() or not any(
        (f.with_suffix(".studio") / "artifacts" / "objects").iterdir())


def test_a_search_over_the_grid_axes_reuses_what_the_grid_ran(resumed):
    pytest.importorskip("optuna")
    f, _, local, _ = resumed
    r = studio("sweep", f, "--search", "3", "--workers", "2", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["name"] == "seed-grid-search"
    assert 1 <= len(out["points"]) <= 3
    grid = {p["id"]: p for p in local["points"]}
    for p in out["points"]:  # every proposal is a grid point, served from the store
        assert p["id"] in grid and p["accuracy"] == grid[p["id"]]["accuracy"]
    assert out["run"]["jobs"]["computed"] == 0


TWO = """
[[sweeps]]
name = "a"
stages = ["export"]
points = [{"quantization.scheme" = "W8A16"}]

[[sweeps]]
name = "b"
stages = ["export"]
points = [{"quantization.scheme" = "W8A8"}]
"""


@pytest.mark.slow
def test_two_sweeps_at_once_compute_a_shared_artifact_once(tmp_path):
    """Two processes sweep at once; both need the same export: one computes it under the
    store's lock for its key, the other waits and takes it from the store."""
    f = _project(tmp_path)
    f.write_text(f.read_text().split("[[sweeps]]")[0] + TWO)
    procs = [subprocess.Popen([sys.executable, "-m", "studio.cli", "sweep", str(f), "--name",
                               name, "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout)["run"]["jobs"])
    assert sorted(o["computed"] for o in outs) == [0, 1]
    assert sorted(o["cached"] for o in outs) == [0, 1]
    assert _export_artifacts(f) == 1


def test_sweep_points_do_not_stand_in_for_the_projects_own_runs(resumed):
    """Variants do not overwrite the project's results: the pages' newest jobs per stage, the
    Overview's newest run and compare's default pair leave the points out."""
    from studio.core import compare
    from studio.core.jobs import JobStore
    from studio.services import history

    f, _, out, _ = resumed
    store = JobStore(f.with_suffix(".studio") / "runs.sqlite")
    try:
        points = store.sweep_run_ids()
        assert {p["run_id"] for p in out["points"]} <= points
        assert history.latest_jobs(store, "validate") == []
        assert compare.runs_with_results(store) == []
        assert set(compare.runs_with_results(store, sweeps=True)) >= {
            p["run_id"] for p in out["points"]}
    finally:
        store.close()
    r = studio("compare", f)
    assert r.returncode == 2 and "compare needs two" in r.stderr
