"""``export.parts = 2`` through the pipeline: the sample in two parts gives the one-part
run's tokens on the host CPU and on the HTP simulator, and the one-part validation figures;
a stage not built for parts says so in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cli.conftest import SMALL, default_target, studio


def _runs(project: Path, max_new_tokens: int = 8) -> dict[str, list[int]]:
    """The run stage's tokens per device, from the project's artifact store: the runs of
    ``max_new_tokens`` (the session's small project also holds the runs other tests made
    with other lengths)."""
    out = {}
    for meta in (project.with_suffix(".studio") / "artifacts" / "objects").glob("*/*/artifact.json"):
        info = json.loads(meta.read_text())
        if info["stage"] == "run" and info["config"].get("run.max_new_tokens") == max_new_tokens:
            out[info["target"]] = json.loads((meta.parent / "result.json").read_text())["tokens"]
    return out


def _validation(project: Path) -> dict:
    """The validate stage's result for the default target, from the project's store."""
    for meta in (project.with_suffix(".studio") / "artifacts" / "objects").glob("*/*/artifact.json"):
        info = json.loads(meta.read_text())
        if info["stage"] == "validate" and info["target"] == default_target():
            return json.loads((meta.parent / "result.json").read_text())
    raise AssertionError(f"no validation in {project}")


@pytest.fixture(scope="module")
def parts_project(tmp_path_factory, batch_run) -> tuple[Path, dict]:
    """The small project in two parts after ``--stages validate,run`` (the device scores
    the first 48 held-out tokens): (project file, the batch's JSON)."""
    f = tmp_path_factory.mktemp("parts") / "parts.qstudio"
    f.write_text(SMALL.format(target=default_target()).replace(
        "context_length = 64", "context_length = 64\nparts = 2").replace(
        "heldout_tokens = 96", "heldout_tokens = 96\ndevice_tokens = 48"))
    r = studio("--batch", f, "--stages", "validate,run", "--json")
    assert r.returncode in (0, 1), r.stderr[-3000:]
    return f, json.loads(r.stdout)


def test_two_parts_run_and_validate_as_one(parts_project, small_project):
    """The parts' tokens are the one graph's; their validation scores all 96 held-out tokens
    part by part on the host (the one graph's host figures) and the first 48 on the HTP
    simulator, and the simulator's greedy text is the one graph's."""
    f, parts = parts_project
    export = next(j for j in parts["jobs"] if j["stage"] == "export")
    assert "2 parts" in export["summary"]
    tokens, one = _runs(f), _runs(small_project)
    assert set(tokens) == {"cpu", f"htp-sim:{default_target()}"}
    for device, ids in tokens.items():
        assert ids == one[device], device
    got, ref = _validation(f), _validation(small_project)
    assert (got["device_tokens"], got["tokens"], got["scored_by_part"]) == (48, 96, 2)
    # the host's figures on all 96 tokens, part by part: the one graph's (FP32 to float
    # rounding; the quantized parts to the 1e-3 their scales allow, as the device's figures)
    assert abs(got["perplexity_fp32_heldout"] - ref["perplexity_fp32"]) < 1e-4 * ref[
        "perplexity_fp32"]
    assert abs(got["perplexity_host_qdq"] - ref["perplexity_host_qdq"]) < 1e-3 * ref[
        "perplexity_host_qdq"]
    for key in ("logits_cosine_mean", "top1_agreement"):
        assert abs(got["host_qdq"][key] - ref["host_qdq"][key]) < 1e-3, key
    # the simulator on the first 48, judged against FP32 on the same 48
    assert got["perplexity_fp32"] != got["perplexity_fp32_heldout"]
    assert got["htp"]["logits_cosine_mean"] > 0.99 and got["top1_agreement"] > 0.9
    assert got["greedy_htp"] == ref["greedy_htp"]  # the project's prompt, 8 tokens
    assert 0 < got["greedy_prefix_agreement"] <= got["greedy_agreement"] <= 1
    details = {m["name"]: m["detail"] for m in parts["metrics"] if m["name"] in (
        "top1_agreement", "perplexity_host_qdq")}
    assert "first 48 of 96 held-out tokens" in details["top1_agreement"]
    assert "all 96 held-out tokens, scored part by part" in details["perplexity_host_qdq"]

    r = studio("--batch", f, "--stages", "layerdiff")
    assert r.returncode == 2
    # the layer diff of a model in parts compares one part at a time: it says which to set
    assert "exported in 2 parts: set layerdiff.part to the part to compare (1..2" in r.stderr


class Killed(Exception):
    """What a test's progress raises to stop a stage where a kill would."""


def _compile_job(parts_project, tmp_path: Path):
    """The parts project's compile job, its stored inputs and an empty work folder."""
    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.core.stagegraph import plan
    from studio.services.history import current_keys

    project = pf.load(parts_project[0])
    jobs = plan(project, ["compile"])
    job = jobs[-1]
    store = ArtifactStore(project.folder / "artifacts")
    keys = current_keys(project, ["export", "quantize"])
    inputs = {jobs[d].label: store.get(keys[jobs[d].stage]).path for d in job.deps}
    out = tmp_path / "kept"
    out.mkdir()
    return project, job, inputs, out


def test_a_killed_compile_of_parts_keeps_the_parts_it_finished(tmp_path, parts_project):
    """The compile stage over a model in two parts, killed while part 2 is checked, then
    run again in the same work folder: part 1's context binaries are kept (not compiled
    again) and the result is a whole compile."""
    from studio.core.artifacts import PART_DONE
    from studio.core.progress import RecordingProgress
    from studio.worker.stages import run_in_process

    project, job, inputs, out = _compile_job(parts_project, tmp_path)

    class KillAt(RecordingProgress):
        def update(self, fraction: float, message: str = "") -> None:
            if message.startswith("checking placement of prefill (part2 of 2)"):
                raise Killed(message)
            super().update(fraction, message)

    try:
        run_in_process(project, job, inputs, out, KillAt())
    except Killed:
        pass
    else:
        raise AssertionError("the compile was not interrupted")
    assert (out / "part1_of_2" / PART_DONE).is_file()
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "part1_of_2").glob("*_ctx*")}
    assert kept
    rec = RecordingProgress()
    result = run_in_process(project, job, inputs, out, rec)
    assert any("1 of 2 parts: compiled by an interrupted run, kept" in m for m in rec.lines)
    assert not any("(part1 of 2)" in m for _, m in rec.updates)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "part1_of_2").glob("*_ctx*")} == kept
    assert list(result["placement"]) == [f"part{i}_of_2/{g}" for i in (1, 2)
                                         for g in ("prefill", "decode")]
    assert not list(out.rglob(PART_DONE))


def test_a_compile_killed_after_its_parts_keeps_them_and_the_staged_graphs(tmp_path,
                                                                          parts_project):
    """Killed while it makes the weight-shared binaries (after every part compiled), the
    compile stage run again in the same work folder keeps both parts' binaries and the
    deployable graphs it staged (exported and quantized again, these take minutes a part at
    real size), and finishes."""
    from studio.core.artifacts import PART_DONE
    from studio.core.progress import RecordingProgress
    from studio.worker.stages import run_in_process

    project, job, inputs, out = _compile_job(parts_project, tmp_path)

    class KillAt(RecordingProgress):
        def update(self, fraction: float, message: str = "") -> None:
            if message.startswith("the weight-shared binary of part 1/2"):
                raise Killed(message)
            super().update(fraction, message)

    with pytest.raises(Killed):
        run_in_process(project, job, inputs, out, KillAt())
    staged = {p.relative_to(out): p.stat().st_mtime_ns
              for p in (out / "genie-staging").rglob("*.onnx")}
    assert len(staged) == 4  # each part's prefill and decode graph
    rec = RecordingProgress()
    result = run_in_process(project, job, inputs, out, rec)
    assert any("2 of 2 parts: compiled by an interrupted run, kept" in m for m in rec.lines)
    assert any("staged by an interrupted run: kept" in m for _, m in rec.updates)
    assert not any(m.startswith("part 1/2: quantizing") for _, m in rec.updates)
    # staged under names Genie takes in order: no part's graph is compiled twice
    assert not any("again under a name Genie takes in order" in m for _, m in rec.updates)
    assert result["weight_sharing"] and not (out / "genie-staging").exists()
    assert not list(out.rglob(PART_DONE))


def test_parts_compiled_in_processes_of_their_own_run_as_the_stored_compile(
        tmp_path, monkeypatch, parts_project):
    """The compile stage with its two parts compiled at once, each in a process of its own
    (what a host with the cores and the memory does for large parts): the same placement,
    and the HTP simulator's tokens from its binaries are the stored run's."""
    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.core.progress import RecordingProgress
    from studio.core.stagegraph import plan
    from studio.services.history import current_keys
    from studio.worker.stages import run_in_process

    f, _ = parts_project
    project = pf.load(f)
    store = ArtifactStore(project.folder / "artifacts")
    keys = current_keys(project, ["export", "quantize", "compile", "run"])
    jobs = plan(project, ["compile"])
    job = jobs[-1]
    inputs = {jobs[d].label: store.get(keys[jobs[d].stage]).path for d in job.deps}
    out = tmp_path / "compiled"
    out.mkdir()
    project.pipeline["part_processes"] = 2
    rec = RecordingProgress()
    result = run_in_process(project, job, inputs, out, rec)
    assert "2 parts compiled 2 at a time, each in a process of its own" in rec.lines
    assert any("compiling part1 of 2, part2 of 2 for" in m for _, m in rec.updates)
    stored = store.get(keys[job.label]).path
    assert result["placement"] == json.loads(
        (stored / "result.json").read_text())["placement"]
    runs = plan(project, ["run"])
    run = next(j for j in runs if j.stage == "run" and "htp-sim" in j.label)
    export = store.get(keys["export"]).path
    given = {runs[d].label: out if runs[d].stage == "compile" else export for d in run.deps}
    (tmp_path / "run").mkdir()
    got = run_in_process(project, run, given, tmp_path / "run", RecordingProgress())
    assert got["tokens"] == _runs(f)[f"htp-sim:{default_target()}"]


def test_cancelling_a_compile_in_processes_ends_them(tmp_path, monkeypatch, parts_project):
    """Cancelled while its parts compile in processes of their own, the stage ends them:
    no compile process outlives it."""
    import os

    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.core.errors import Cancelled
    from studio.core.progress import RecordingProgress
    from studio.core.stagegraph import plan
    from studio.services.history import current_keys
    from studio.worker.stages import run_in_process

    f, _ = parts_project
    project = pf.load(f)
    store = ArtifactStore(project.folder / "artifacts")
    keys = current_keys(project, ["quantize"])
    jobs = plan(project, ["compile"])
    inputs = {jobs[d].label: store.get(keys[jobs[d].stage]).path for d in jobs[-1].deps}

    def children() -> list[int]:
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                cmd = (stat.parent / "cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and b"spawn_main" in cmd:  # not the tracker
                pids.append(int(stat.parent.name))
        return pids

    class CancelWhileCompiling(RecordingProgress):
        def check(self) -> None:
            if any("at a time)" in m for _, m in self.updates) and children():
                raise Cancelled()

    before = set(children())
    project.pipeline["part_processes"] = 2
    (tmp_path / "out").mkdir()
    with pytest.raises(Cancelled):
        run_in_process(project, jobs[-1], inputs, tmp_path / "out", CancelWhileCompiling())
    assert set(children()) <= before


def test_a_compile_stage_on_ray_compiles_its_parts_as_ray_tasks(tmp_path, monkeypatch,
                                                                 parts_project):
    """The compile stage run as the Ray executor runs it (a Ray task over the project's
    store): its two parts go to Ray as tasks of their own, each asking for a CPU and its
    predicted memory; the same placement as the stored compile, and the HTP simulator's
    tokens from its binaries are the stored run's."""
    ray = pytest.importorskip("ray")
    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.core.progress import RecordingProgress
    from studio.core.stagegraph import plan, stage_config
    from studio.services.history import current_keys
    from studio.services.ray_executor import _STORE_ID, run_task
    from studio.worker.stages import run_in_process

    f, _ = parts_project
    project = pf.load(f)
    store = ArtifactStore(project.folder / "artifacts")
    keys = current_keys(project, ["compile", "run"])
    jobs = plan(project, ["compile"])
    job = jobs[-1]
    inputs = {jobs[d].label: str(store.get(keys[jobs[d].stage]).path) for d in job.deps}
    id_file = store.root / _STORE_ID
    if not id_file.exists():
        id_file.write_text("parts-test")
    out = tmp_path / "on-ray"
    out.mkdir()
    spec = {"job_id": 1, "config": stage_config(project, job).to_dict(), "inputs": inputs,
            "input_keys": {jobs[d].label: keys[jobs[d].stage] for d in job.deps},
            "workdir": str(out)}
    # no token authentication: it would write a token where the Ray sweep test's cluster
    # (tests/cli/test_sweep.py, maybe running now) reads its own
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, object_store_memory=128 * 2**20)
    try:
        got = ray.get(ray.remote(run_task).options(num_cpus=1).remote(
            spec, str(store.root), id_file.read_text().strip(), "auto", {}), timeout=600)
    finally:
        ray.shutdown()
    assert got["type"] == "result", got
    assert ("2 parts compiled as Ray tasks (on any node that sees the project's store)"
            in got["log"])
    stored = store.get(keys[job.label]).path
    assert got["result"]["placement"] == json.loads(
        (stored / "result.json").read_text())["placement"]
    runs = plan(project, ["run"])
    run = next(j for j in runs if j.stage == "run" and "htp-sim" in j.label)
    export = store.get(keys["export"]).path
    given = {runs[d].label: out if runs[d].stage == "compile" else export
             for d in run.deps}
    (tmp_path / "run").mkdir()
    tokens = run_in_process(project, run, given, tmp_path / "run", RecordingProgress())
    assert tokens["tokens"] == _runs(f)[f"htp-sim:{default_target()}"]


def test_parts_the_simulator_cannot_hold_together_are_not_loaded_to_generate(
        monkeypatch, parts_project):
    """Generating needs every part's binaries loaded at once; where they pass what the HTP
    simulator holds (measured on the 3 B shape: 6.69 GB held, 7.08 GB not), the simulator
    refuses in one line before loading any (validation, which scores the parts one at a time,
    then gives this line as why it has no greedy check, instead of loading 8 parts to find
    out)."""
    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.core.devices import device
    from studio.core.errors import StudioError
    from studio.engine.devices import backend, htp_sim
    from studio.engine.llm_runtime import load_graph_spec
    from studio.services.history import current_keys

    f, _ = parts_project
    project = pf.load(f)
    store = ArtifactStore(project.folder / "artifacts")
    keys = current_keys(project, ["validate"])
    export = store.get(keys["export"]).path
    compiled = store.get(keys[f"compile[{default_target()}]"]).path
    spec = load_graph_spec(compiled)
    sim = backend(device(f"htp-sim:{default_target()}"))
    held = htp_sim.binary_bytes(compiled)
    assert 0 < held < htp_sim.SIM_HOLDS_BYTES
    sim.open_generator(export, compiled, spec, False)  # the sample's two parts: held
    monkeypatch.setattr(htp_sim, "SIM_HOLDS_BYTES", held - 1)
    with pytest.raises(StudioError) as e:
        sim.open_generator(export, compiled, spec, False)
    assert "cannot hold the 2 parts' context binaries at once" in e.value.message
    assert "\n" not in e.value.message


def test_a_model_in_parts_bundles_one_context_binary_per_part_and_genie_runs_it(
        parts_project, tmp_path):
    """`studio bundle` on the model exported in two parts: each part's decode graph and its
    own AR-16 prefill graph (exported from the checkpoint a part at a time) in Genie's form,
    the residual stream handed from part to part as uint16 integers with the handing part's
    encodings; Genie (libGenie.so on the HTP simulator) loads the four context binaries in
    order and gives the studio's greedy text over the same graphs and over the project's own
    compiled parts."""
    import onnx
    from onnx import numpy_helper

    from tests.cli.conftest import share_store

    f, _ = parts_project
    proj = tmp_path / "pb.qstudio"
    proj.write_text(f.read_text() + "\n[bundle]\nprompts = 2\nnew_tokens = 16\n")
    share_store(f, proj)  # export, quantize and compile from the cache
    out = tmp_path / "out"
    r = studio("bundle", proj, "--out", out, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    # what ships: a weight-shared binary per part (its prefill and decode graphs over one copy
    # of its weights); the four separate binaries the simulator ran beside them in the store
    bins = [f"weight_shared_ar16_ar1_cl65_part{i}_of_2.bin" for i in (1, 2)]
    assert res["ctx_bins"] == bins and "(2 context binaries)" in res["summary"]
    cfg = json.loads((out / "genie_config.json").read_text())["dialog"]
    assert cfg["engine"]["model"]["binary"]["ctx-bins"] == bins
    shared = res["weight_shared"]
    assert [r["part"] for r in shared] == [1, 2]
    assert all(r["structure"]["equal"] and r["bytes"] < r["separate_bytes"] for r in shared)
    assert shared[0]["graphs"] < shared[1]["graphs"]  # Genie takes them in name order
    assert len(res["checks"]) == 2
    for c in res["checks"]:
        assert c["identical"], c  # the same binaries: the same text, no near-tie excuse
        assert c["studio_tokens"] == 16
    assert [c["prompt_passes"] for c in res["checks"]] == [1, 2]  # the AR-16 graph's chunks
    manifest = json.loads((out / "manifest.json").read_text())
    rows = {(g["kind"], g["part"]): g for g in manifest["graphs"]}
    assert set(rows) == {(k, p) for k in ("prefill", "decode") for p in (1, 2)}
    for kind in ("prefill", "decode"):  # part 1 takes the ids, part 2 what part 1 hands it
        assert "input_ids" in rows[kind, 1]["inputs"]
        assert "hidden_states_after_1" in rows[kind, 1]["outputs"]
        assert "hidden_states_after_1" in rows[kind, 2]["inputs"] and "logits" in rows[
            kind, 2]["outputs"]
    assert sorted(res["dlc"]) == [f"part{i}_of_2/{g}" for i in (1, 2)
                                  for g in ("decode", "prefill")]

    # the hand-off itself, in the Genie graphs: uint16 out of part 1, into part 2 unconverted
    # and read with part 1's scale and zero point
    from studio.engine.deploy import genie_parts
    from studio.engine.llm_runtime import load_graph_spec

    project_store = proj.with_suffix(".studio") / "artifacts" / "objects"
    qdir = next(m.parent for m in project_store.glob("*/*/artifact.json")
                if json.loads(m.read_text())["stage"] == "quantize")
    spec = load_graph_spec(qdir)
    one, two = genie_parts([qdir / p / "decode.onnx" for p in ("part1_of_2", "part2_of_2")],
                           spec, tmp_path / "g", "decode")
    m1, m2 = onnx.load(str(one)), onnx.load(str(two))
    out1 = next(o for o in m1.graph.output if o.name == "hidden_states_after_1")
    in2 = next(i for i in m2.graph.input if i.name == "hidden_states_after_1")
    assert out1.type.tensor_type.elem_type == in2.type.tensor_type.elem_type == (
        onnx.TensorProto.UINT16)
    assert not [n for n in m2.graph.node if n.op_type == "QuantizeLinear"
                and n.input[0] == "hidden_states_after_1"]
    dq = next(n for n in m2.graph.node if n.op_type == "DequantizeLinear"
              and n.input[0] == "hidden_states_after_1")
    q = next(n for n in m1.graph.node if n.output[0] == "hidden_states_after_1")
    i1 = {i.name: numpy_helper.to_array(i) for i in m1.graph.initializer}
    i2 = {i.name: numpy_helper.to_array(i) for i in m2.graph.initializer}
    assert i2[dq.input[1]] == i1[q.input[1]] and i2[dq.input[2]] == i1[q.input[2]]


def test_a_bundle_the_simulator_cannot_hold_is_checked_part_by_part(parts_project, tmp_path):
    """Where the simulator cannot hold every part's binaries at once (the 3 B and 8 B shapes;
    here told so by QSTUDIO_SIM_HOLDS_BYTES), the bundle is still stored: each part's binaries
    loaded alone, fed the hand-off the part before recorded, the last part's tokens against
    FP32's on every prompt — and the scores part by part equal the chained binaries'."""
    import numpy as np

    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.core.catalog import get_chip
    from studio.engine import deployed
    from studio.engine.llm_runtime import load_graph_spec
    from studio.services.history import current_keys
    from tests.cli.conftest import share_store

    f, _ = parts_project
    proj = tmp_path / "pp.qstudio"
    proj.write_text(f.read_text() + "\n[bundle]\nprompts = 2\nnew_tokens = 8\n"
                    "score_tokens = 0\n")
    share_store(f, proj)
    out = tmp_path / "out"
    r = studio("bundle", proj, "--out", out, "--json",
               env=dict(os.environ, QSTUDIO_SIM_HOLDS_BYTES="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["checks"] == [] and len(res["by_part"]) == 2
    for c in res["by_part"]:
        first, last = c["parts"]
        assert first["loaded_alone"] and first["handoff_finite"]
        assert first["handoff_cosine_to_fp32"] > 0.99, first  # the hidden states, part 1
        assert 0 <= first["handoff_range"][0] <= first["handoff_range"][1] <= 65535
        assert last["loaded_alone"] and last["top1_same_as_fp32"] >= 0.75 * last["tokens"]
    assert "every part checked alone on 2 prompts" in res["summary"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verification"]["by_part"] == res["by_part"]
    assert all(g["executed"] == "executed on the HTP simulator, part by part"
               for g in manifest["graphs"])

    # part by part, the shipped binaries give the chained binaries' logits
    project = pf.load(f)
    keys = current_keys(project, ["compile"])
    compiled = ArtifactStore(project.folder / "artifacts").get(
        keys[f"compile[{default_target()}]"]).path
    spec = load_graph_spec(compiled)
    chip = get_chip(default_target())
    ids = list(range(40, 61))  # two AR-16 passes (the second padded), as Genie runs them
    whole = deployed.open_runner(compiled, chip, spec).teacher_forced(ids)
    streamed = deployed.PartScorer(compiled, chip, spec)
    got = streamed.teacher_forced_logits(ids)
    assert got.shape == (len(ids), spec["vocab_size"])
    assert np.array_equal(got, whole[:, :spec["vocab_size"]])
    (handed,) = streamed.handoffs  # part 1's rows, as the binaries hand them on
    assert handed.shape == (len(ids), spec["hidden_size"]) and handed.dtype == np.uint16
    assert streamed.handoff_encodings[0][0] > 0


def test_a_precision_change_redoes_only_the_part_that_holds_the_layer(parts_project):
    """One layer of part 1 raised to another precision: quantize and compile run again (new
    keys), but part 2 — whose graphs, calibration inputs (part 1's FP32 outputs) and
    precisions did not change — is taken from the earlier run: the same files (hard links),
    said in the log; part 1 is quantized and compiled again. (Last in this file: it edits
    the module's project and puts it back.)"""
    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.services.history import current_keys

    f, _ = parts_project
    original = f.read_text()

    def artifacts() -> dict[str, Path]:
        project = pf.load(f)
        store = ArtifactStore(project.folder / "artifacts")
        keys = {label.split("[")[0]: key
                for label, key in current_keys(project, ["compile"]).items()}
        return {stage: store.get(keys[stage]).path for stage in ("quantize", "compile")
                if store.get(keys[stage]) is not None}

    def inode(path: Path) -> int:
        return path.stat().st_ino

    r = studio("--batch", f, "--stages", "compile")
    assert r.returncode == 0, r.stderr[-3000:]
    before = artifacts()
    try:
        f.write_text(original.replace(
            "[validation]", '[quantization.overrides]\n"model.layers.0.mlp.down_proj" = '
            '"INT4"\n\n[validation]'))
        assert artifacts() == {}  # other settings: new keys for both stages
        r = studio("--batch", f, "--stages", "compile", "--json")
        assert r.returncode == 0, r.stderr[-3000:]
        after = artifacts()
    finally:
        f.write_text(original)
    q0, q1 = before["quantize"], after["quantize"]
    assert inode(q1 / "part2_of_2" / "decode.onnx") == inode(q0 / "part2_of_2" / "decode.onnx")
    assert inode(q1 / "part1_of_2" / "decode.onnx") != inode(q0 / "part1_of_2" / "decode.onnx")
    quant = json.loads((q1 / "quant.json").read_text())
    down = next(x for x in quant["layers"] if x["layer"] == "model.layers.0.mlp.down_proj")
    assert "INT4" in json.dumps(down)
    c0, c1 = before["compile"], after["compile"]
    bins = sorted(p.name for p in (c0 / "part2_of_2").iterdir())
    assert bins and all(inode(c1 / "part2_of_2" / b) == inode(c0 / "part2_of_2" / b)
                        for b in bins)
    assert all(inode(c1 / "part1_of_2" / b) != inode(c0 / "part1_of_2" / b)
               for b in sorted(p.name for p in (c0 / "part1_of_2").iterdir()))
    summary = {j["stage"]: j["summary"] for j in json.loads(r.stdout)["jobs"]}
    assert summary["quantize"].endswith("; part 2 of 2 as quantized before (same graphs, "
                                        "calibration inputs and precisions)"), summary
    assert summary["compile"].endswith("; part 2 of 2 as compiled before from the same graphs")


def _stored(project: Path, stage: str) -> Path:
    """The folder of the stored artifact of ``stage`` (``stage[target]``) for the project's
    current settings."""
    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.services.history import current_keys

    p = pf.load(project)
    art = ArtifactStore(p.folder / "artifacts").get(current_keys(p, [stage.split("[")[0]])[stage])
    assert art is not None, stage
    return art.path


def test_bisect_part_by_part_names_the_part_and_the_layer(parts_project, tmp_path):
    """A model in two parts, bisected part by part: each part fed what the FP32 part before
    it hands on, its output run on to the logits by the FP32 part after it. With the second
    part's first q_proj given a bad encoding (its Q/DQ scale x 0.02), part 2's
    diff names that layer on host QDQ and the HTP simulator, part 1's does not, and part 2's
    own error at the logits is the larger."""
    import shutil

    import onnx

    from studio.core import project as pf
    from studio.core.catalog import get_chip
    from studio.core.layerdiff import bisect_verdict, summarize
    from studio.engine.layerdiff import find_probes, layer_diff
    from studio.engine.llm_runtime import load_graph_spec, load_tokenizer
    from tests.engine.test_layerdiff import _clip_activation

    f, _ = parts_project
    export, quant = _stored(f, "export"), _stored(f, "quantize")
    spec = load_graph_spec(export)
    names = [p["name"] for p in spec["parts"]]
    assert len(names) == 2
    qdir = tmp_path / "quantize"
    shutil.copytree(quant, qdir)
    # the first op of part 2's first block (the sample's softmax leaves the band by itself
    # further on: 0.14 at model.layers.2, KL 0.0068 at the logits, untouched)
    layer = f"model.layers.{spec['parts'][1]['start']}.self_attn.q_proj"
    probe = next(x for x in find_probes(onnx.load(str(export / names[1] / "prefill.onnx"),
                                                  load_external_data=False))
                 if x.name == layer)
    _clip_activation(qdir / names[1], "prefill", probe.tensor, 0.02)
    p = pf.load(f)
    ids = load_tokenizer(export)(p.input_path(p.validation["heldout_text"]).read_text()).input_ids
    windows = [ids[i * 16:(i + 1) * 16] for i in range(2)]
    chip = get_chip(default_target())
    reads = {}
    for part in (1, 2):
        data = layer_diff(export, qdir, windows, graph="prefill", part=part,
                          htp={"chip": chip, "fp16": False,
                               "base": qdir / names[part - 1] / "prefill.onnx"})
        assert data["part"]["index"] == part and data["part"]["of"] == 2
        stop = spec["parts"][0]["stop"]
        assert data["part"]["output"] == ("logits" if part == 2 else
                                          f"hidden_states_after_{stop - 1}")
        blocks = {int(r["name"].split(".")[2]) for r in data["rows"]
                  if r["name"].startswith("model.layers.")}
        assert blocks == set(range(stop) if part == 1 else range(stop, spec["num_layers"]))
        s = summarize(data)
        reads[part] = (data, bisect_verdict({**data, **{k: v for k, v in s.items()
                                                        if k != "line"},
                                             "device": "HTP simulator"}, data["rows"]))
    d2, v2 = reads[2]
    assert v2["layer"] == layer and v2["steps"][2]["host_qdq"]["name"] == layer
    assert v2["steps"][2]["htp"]["name"] == layer
    d1, v1 = reads[1]
    assert v1["layer"] != layer
    for k in ("qdq", "htp"):
        assert d2["logits"][k]["kl_divergence"] > d1["logits"][k]["kl_divergence"]
    # the FP32 side through the parts is the FP32 model: its logits are FP32's own
    assert d1["logits"]["fp32"]["kl_divergence"] < 1e-9
    print(f"\nbisect in parts: part 1 {v1['verdict']}\n  part 2 {v2['verdict']}\n  "
          f"KL part 1 {d1['logits']['htp']['kl_divergence']:.4g}, part 2 "
          f"{d2['logits']['htp']['kl_divergence']:.4g}")


def test_studio_bisect_walks_the_parts(parts_project):
    """`studio bisect FILE` on a model in two parts: a layer diff per part (each part's own
    error at the logits), one verdict naming the part; --part N bisects one; a part the model
    does not have is refused in one line."""
    f, _ = parts_project
    r = studio("bisect", f, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert [row["part"] for row in got["parts"]] == [1, 2]
    assert got["verdict"].startswith(("the most error at the output comes from part ",
                                      "no part's own error reaches the output"))
    assert all(row["output_kl"] >= 0 and row["verdict"].startswith(f"part {row['part']}/2")
               and row["output_kl_of"].startswith("the HTP, simulated on HTP simulator")
               for row in got["parts"])
    r = studio("bisect", f, "--part", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "of part 2/2" in r.stdout and "verdict: part 2/2" in r.stdout
    assert "(cached)" in r.stderr
    r = studio("bisect", f, "--part", "3")
    assert r.returncode == 2 and "exported in 2 parts (1..2)" in r.stderr


def test_parts_with_quantized_graph_io_hand_on_integers(parts_project):
    """Two parts with quantized graph I/O (the default): the deployable binaries take each
    part's KV cache as uint16 with one encoding per cache tensor (recorded for an app), hand
    the residual stream from part to part as integers, and the model validates on the
    simulator part by part and generates through the chain."""
    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.engine.deploy import read
    from studio.services.history import current_keys

    f, summary = parts_project
    assert all(g["passed"] for g in summary["gates"]), summary["gates"]
    got = _validation(f)
    assert got["scored_by_part"] == 2 and got["htp"]["logits_cosine_mean"] > 0.99
    project = pf.load(f)
    keys = current_keys(project, ["compile"])
    rec = read(ArtifactStore(project.folder / "artifacts").get(
        keys[f"compile[{default_target()}]"]).path)
    assert rec["graph_io"] == "quantized" and rec["parts"] == 2
    one, two = rec["kv_cache"]["encodings"]  # each part's own cache tensors
    assert set(one) == {f"{t}_{i}" for i in (0, 1) for t in ("key", "value")}
    assert set(two) == {f"{t}_{i}" for i in (2, 3) for t in ("key", "value")}
    rows = {(r["kind"], r["part"]): r for r in rec["graphs"]}
    for kind in ("prefill", "decode"):
        assert "hidden_states_after_1" in rows[kind, 1]["outputs"]
        assert "hidden_states_after_1" in rows[kind, 2]["inputs"]
    # the simulator generated through the two parts' integer hand-off (validate's greedy)
    assert got["greedy_htp"] and 0 < got["greedy_agreement"] <= 1
