"""The layer diff on the trained sample model: one real batch run (export, quantize, compile,
layerdiff: real quantizer, real ONNX Runtime, the real QNN HTP simulator), then the services,
the CLI and the engine read what it stored. Run with ``-s`` to see the figures."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest

from studio.core import project as pf
from studio.core.errors import StudioError
from studio.core.stagegraph import DEFAULT_STAGES, STAGES, plan
from tests.cli.conftest import studio

FIGURES: dict[str, object] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_figures():
    yield
    if FIGURES:
        print("\nlayer diff figures:\n" + json.dumps(FIGURES, indent=1, default=str))


@pytest.fixture(scope="module")
def project_file(layerdiff_run) -> Path:
    return layerdiff_run[0]


@pytest.fixture(scope="module")
def batch(layerdiff_run):
    """The one run: ``studio --batch FILE --stages layerdiff`` (shared with the window's
    tests)."""
    FIGURES["batch_seconds"] = round(layerdiff_run[2], 1)
    return layerdiff_run[1]


@pytest.fixture(scope="module")
def got(batch, project_file):
    from studio.services.layerdiff import layerdiff_result

    return layerdiff_result(pf.load(project_file))


@pytest.fixture(scope="module")
def artifacts(batch, project_file) -> dict[str, Path]:
    """The stored artifact folder of every job of the layerdiff plan (job label -> folder)."""
    from studio.core.artifacts import ArtifactStore
    from studio.services.history import current_keys

    p = pf.load(project_file)
    store = ArtifactStore(p.folder / "artifacts")
    out = {}
    for label, key in current_keys(p, ["layerdiff"]).items():
        art = store.get(key)
        assert art is not None, label
        out[label.split("[")[0]] = art.path
    return out


def _finite(x) -> bool:
    return isinstance(x, float) and math.isfinite(x)


def test_declared_like_the_other_optional_stages(project_file):
    p = pf.load(project_file)
    d = STAGES["layerdiff"]
    assert d.optional and "layerdiff" not in DEFAULT_STAGES and d.fan_out == "target"
    assert {"layerdiff.windows", "layerdiff.tensors", "validation.heldout_text"} <= set(d.settings)
    t = p.targets[0]
    jobs = plan(p, ["layerdiff"])
    assert [j.label for j in jobs] == ["export", "quantize", f"compile[{t}]", f"layerdiff[{t}]"]
    assert jobs[3].deps == [0, 1, 2]
    assert (p.layerdiff["windows"], p.layerdiff["tensors"]) == (2, "modules")
    for bad, match in (({"windows": 0}, "windows"), ({"tensors": "every"}, "tensors")):
        d2 = p.to_dict()
        d2["layerdiff"] = {**d2["layerdiff"], **bad}
        with pytest.raises(StudioError, match=match):
            pf.from_dict(d2)


def test_a_row_for_every_boundary_and_module_output_with_finite_figures(got):
    rows, r = got["rows"], got["result"]
    names = [x["name"] for x in rows]
    boundaries = [x["name"] for x in rows if x["kind"] == "boundary"]
    assert boundaries == ["model.embed_tokens", *(f"model.layers.{i}" for i in range(4)),
                          "model.norm", "lm_head"]
    for i in range(4):
        b = f"model.layers.{i}"
        for m in ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                  "self_attn.scores", "self_attn.softmax", "self_attn.context",
                  "self_attn.o_proj", "residual", "post_attention_layernorm", "mlp.gate_proj",
                  "mlp.act_fn", "mlp.up_proj", "mlp.product", "mlp.down_proj"):
            assert f"{b}.{m}" in names, f"{b}.{m}"
    assert len(rows) == r["probes"] == 7 + 4 * 15 and not got["missing_in_qdq"]
    assert r["pairs"] == ["qdq_vs_fp32", "htp_vs_fp32", "htp_vs_qdq"]
    for x in rows:
        for pair in r["pairs"]:
            f = x[pair]
            assert _finite(f["rel_error"]) and _finite(f["cosine"]), (x["name"], pair)
            assert -1.0 <= f["cosine"] <= 1.0 + 1e-9
    # the curves along depth are the boundaries' figures, one per pair
    c = r["curves"]
    assert c["names"] == boundaries
    for pair in r["pairs"]:
        assert len(c[pair]["rel_error"]) == len(boundaries)
    # a probe's inputs are probes upstream of it
    assert rows[names.index("model.layers.0.self_attn.scores")]["inputs"] == [
        "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"]
    assert rows[names.index("model.layers.1")]["inputs"] == [
        "model.layers.1.residual", "model.layers.1.mlp.down_proj"]
    FIGURES["curves"] = {p: [round(v, 5) for v in c[p]["rel_error"]] for p in r["pairs"]}


def test_extra_outputs_do_not_change_the_logits_on_any_runtime(got):
    ex = got["extra_outputs"]
    assert set(ex) == {"fp32", "qdq", "qdq_default", "htp"}
    for k, v in ex.items():
        assert v["logits_identical"] and v["logits_max_abs_change"] == 0.0, k
    m = {x["name"]: x for x in got["result"]["metrics"]}
    assert m["layerdiff_extra_outputs_logits_change_htp"]["value"] == 0.0


def test_figures_carry_their_sources_and_the_log_names_where_they_part(got, project_file):
    from studio.core.jobs import JobStore

    r = got["result"]
    m = {x["name"]: x for x in r["metrics"]}
    for name, x in m.items():
        if name.endswith(("_htp", "_htp_vs_host_qdq")):
            assert (x["source"], x["device"]) == ("simulated", "htp-sim"), name
        else:
            assert (x["source"], x["device"]) == ("measured", "host-cpu"), name
        assert x["target"] == got["target"]
    assert r["source"] == "simulated" and r["device_id"].startswith("htp-sim:")
    lg = r["logits"]
    assert {"fp32", "qdq", "qdq_default", "htp"} <= set(lg)
    assert lg["fp32"]["kl_divergence"] == 0.0 and lg["fp32"]["top1_agreement"] == 1.0
    assert r["first_jump"]["qdq_vs_fp32"] is not None
    # measured on the sample (W8A16): host QDQ rounds every step of the decomposed RMSNorm
    # to 16 bits, the HTP computes the norm in one piece; that is where they part
    assert r["parting"]["module"].endswith("norm") and r["parting"]["worse"] == "host QDQ"
    store = JobStore(pf.load(project_file).folder / "runs.sqlite")
    try:
        job = next(j for j in store.jobs() if j.stage == "layerdiff")
        log = "\n".join(store.log(job.id))
    finally:
        store.close()
    assert "layer diff: " in log and "part" in log
    FIGURES.update(summary=r["summary"], parting=r["parting"], logits={
        k: {f: round(v[f], 6) for f in ("kl_divergence", "top1_agreement", "logits_cosine")}
        for k, v in lg.items()})


def test_the_cli_prints_it_and_bad_input_is_one_line(batch, project_file, tmp_path):
    r = studio("layerdiff", project_file)
    assert r.returncode == 0, r.stderr
    assert "host QDQ and the HTP part at" in r.stdout and "model.layers.3" in r.stdout
    assert "simulated" in r.stdout and "measured" in r.stdout
    j = studio("layerdiff", project_file, "--json", "--all")
    assert j.returncode == 0 and len(json.loads(j.stdout)["rows"]) == 67
    # a project with no layer diff for its current settings
    other = tmp_path / "other.qstudio"
    shutil.copy(project_file, other)
    r = studio("layerdiff", other)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no layer diff for the current settings" in lines[0]
    assert "--stages layerdiff" in lines[0]
    r = studio("layerdiff", project_file, "--target", "nonsense")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_fp32_against_itself_is_exact(artifacts, tmp_path):
    """Sanity: the FP32 graph with every probe exposed gives the base logits bit for bit, and
    its tensors against themselves give cosine 1, relative error 0."""
    import numpy as np
    import onnx

    from studio.engine.layerdiff import _Acc, find_probes, graph_with_outputs
    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session
    from studio.engine.onnxio import load_spec
    from studio.engine.sensitivity import host_session

    e = artifacts["export"]
    probes = find_probes(onnx.load(str(e / "prefill.onnx")), "modules")
    names = [p.tensor for p in probes]
    fx = graph_with_outputs(e / "prefill.onnx", names, tmp_path / "fx.onnx")
    gen = StaticKVGenerator(make_cpu_session(e / "prefill.onnx"),
                            make_cpu_session(e / "decode.onnx"), load_spec(e))
    feed = gen.prefill_feed(list(range(3, 19)))
    a = host_session(fx).run(names, feed)
    b = host_session(fx).run(names, feed)
    base = host_session(e / "prefill.onnx").run(["logits"], feed)[0]
    assert np.array_equal(a[names.index("logits")], base)
    for x, y in zip(a, b, strict=True):
        acc = _Acc()
        acc.add(x, y, None)
        f = acc.figures(steps=False)
        assert f["cosine"] == pytest.approx(1.0, abs=1e-12) and f["rel_error"] == 0.0


def test_a_corrupt_or_foreign_quantized_graph_is_one_line(artifacts, tmp_path):
    from studio.engine.layerdiff import layer_diff

    e, q = artifacts["export"], artifacts["quantize"]
    bad = tmp_path / "quantize"
    shutil.copytree(q, bad)
    windows = [list(range(3, 19))]
    (bad / "prefill.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(StudioError, match="not a readable ONNX model") as err:
        layer_diff(e, bad, windows)
    assert "\n" not in err.value.message
    (bad / "prefill.onnx").unlink()
    with pytest.raises(StudioError, match="missing: re-run quantize"):
        layer_diff(e, bad, windows)
    with pytest.raises(StudioError, match="exactly P=16"):
        layer_diff(e, q, [list(range(3, 10))])


def test_the_stage_without_a_quantize_result_is_one_line(project_file, artifacts, tmp_path):
    from studio.core.progress import RecordingProgress
    from studio.core.stagegraph import stage_config
    from studio.worker.stages import StageContext, stage_function

    p = pf.load(project_file)
    job = plan(p, ["layerdiff"])[-1]
    ctx = StageContext(stage_config(p, job), {"export": artifacts["export"]}, tmp_path)
    with pytest.raises(StudioError, match="quantize is missing") as err:
        stage_function("layerdiff")(ctx, RecordingProgress())
    assert "\n" not in err.value.message


def test_a_device_that_parts_from_the_simulator_is_named(got):
    """The device's reading beside the simulator's: the sample's real rows as the simulator
    gave them, and as a device would give them if one op went wrong there (its HTP-vs-FP32
    error set to 0.5 from that op on): "on the device only: the simulator agrees", pointing
    at the device's SDK build; the simulator's own rows as the device's read the same."""
    import copy

    from studio.core.layerdiff import bisect_verdict, device_vs_simulator

    rows = got["rows"]
    sim_read = bisect_verdict(got["result"], rows)
    same = device_vs_simulator(sim_read, rows, rows, "phone", "HTP simulator")
    assert same["simulator"]["agrees"] and same["verdict"].startswith(sim_read["verdict"])
    bad = copy.deepcopy(rows)
    i = next(k for k, r in enumerate(bad) if r["name"] == "model.layers.0.self_attn.q_proj")
    for r in bad[i:]:
        r["htp_vs_fp32"]["rel_error"] = max(r["htp_vs_fp32"]["rel_error"], 0.5)
    read = device_vs_simulator(bisect_verdict({**got["result"], "device": "phone"}, bad), bad,
                               rows, "phone", "HTP simulator")
    assert not read["simulator"]["agrees"]
    assert read["tensor"] == "model.layers.0.self_attn.q_proj"
    assert read["verdict"].startswith("diverges at model.layers.0.self_attn.q_proj on phone "
                                      "only: the simulator (HTP simulator) agrees")
    assert "SDK build" in read["verdict"]


def test_the_report_draws_the_curves(got):
    from studio.engine.report import render_layerdiff

    html = render_layerdiff(got["result"])
    assert html.startswith("<h2>Layer diff") and html.count("<polyline") == 3
    assert "simulated" in html and "measured" in html and "model.embed_tokens" in html


def _clip_activation(qdir: Path, graph: str, module_tensor: str, factor: float) -> None:
    """The quantized graph given a bad encoding on purpose: the scale of ``module_tensor``'s
    Q/DQ pair times ``factor`` (< 1 clips the activation to that share of its range)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from studio.engine.layerdiff import qdq_tensor_map

    path = qdir / f"{graph}.onnx"
    model = onnx.load(str(path), load_external_data=False)
    dq_out = qdq_tensor_map(model, [module_tensor])[module_tensor]["tensor"]
    dq = next(n for n in model.graph.node if dq_out in n.output)
    scale = dq.input[1]
    init = next(i for i in model.graph.initializer if i.name == scale)
    init.CopyFrom(numpy_helper.from_array(
        (numpy_helper.to_array(init) * np.float32(factor)).astype(np.float32), scale))
    onnx.save(model, str(path))


@pytest.mark.parametrize("graph", ["prefill", "decode"])
def test_bisect_names_the_layer_given_a_bad_encoding(artifacts, project_file, tmp_path, graph):
    """The seed's three steps on a real divergence: the output of model.layers.1's
    down_proj clipped to 2 % of its range in the quantized graph. Step 1 (FP32 on the HTP in
    FP16) stays in band; host QDQ and the HTP simulator both leave the band at that layer,
    and the verdict names it — on the prefill graph and on one decode step."""
    import shutil

    from studio.core.catalog import get_chip
    from studio.core.layerdiff import bisect_verdict, summarize
    from studio.engine.layerdiff import find_probes, layer_diff
    from studio.engine.llm_runtime import load_tokenizer

    p = pf.load(project_file)
    qdir = tmp_path / "quantize"
    shutil.copytree(artifacts["quantize"], qdir)
    fmodel = __import__("onnx").load(str(artifacts["export"] / f"{graph}.onnx"),
                                     load_external_data=False)
    probe = next(x for x in find_probes(fmodel) if x.name == "model.layers.1.mlp.down_proj")
    _clip_activation(qdir, graph, probe.tensor, 0.02)
    ids = load_tokenizer(artifacts["export"])(
        p.input_path(p.validation["heldout_text"]).read_text()).input_ids
    P = 16
    W = P + 1 if graph == "decode" else P
    windows = [ids[i * P:i * P + W] for i in range(2)]
    chip = get_chip(p.targets[0])
    data = layer_diff(artifacts["export"], qdir, windows, mode="modules", graph=graph,
                      htp={"chip": chip, "fp16": False, "base": qdir / f"{graph}.onnx",
                           "fp16_step": True})
    assert data["graph"] == graph and "htp_fp16_vs_fp32" in data["pairs"]
    s = summarize(data)
    result = {**data, **{k: v for k, v in s.items() if k != "line"},
              "device": f"HTP simulator ({chip.name})"}
    got = bisect_verdict(result, data["rows"])
    step1, _, step3 = got["steps"]
    assert step1["out_of_band"] is None and "stays within FP16's band" in step1["finding"]
    assert step3["host_qdq"]["name"] == step3["htp"]["name"] == "model.layers.1.mlp.down_proj"
    assert got["layer"] == "model.layers.1.mlp.down_proj"
    assert got["verdict"].startswith("diverges at model.layers.1.mlp.down_proj on host QDQ "
                                     "and HTP simulator")
    FIGURES[f"bisect_{graph}"] = {"verdict": got["verdict"], "qdq": step3["host_qdq"][
        "rel_error"], "htp": step3["htp"]["rel_error"], "fp16_worst": step1["worst_rel_error"]}


def test_studio_bisect_runs_the_three_steps_and_leaves_the_file_alone(project_file, tmp_path):
    """`studio bisect FILE` on the sample (W8A16): the layer diff with the HTP in FP16
    beside it, the three steps and a verdict; the project file is not changed, a model in
    parts' --part is refused for a model exported whole."""
    import json as _json

    from tests.cli.conftest import studio
    from tests.conftest import copy_store

    f = tmp_path / project_file.name
    f.write_text(project_file.read_text())
    copy_store(project_file.with_suffix(".studio"), f.with_suffix(".studio"))
    before = f.read_text()
    r = studio("bisect", f, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    got = _json.loads(r.stdout)
    assert [s["step"] for s in got["steps"]] == [1, 2, 3] and got["graph"] == "prefill"
    assert "htp_fp16_vs_fp32" in got["result"]["pairs"]
    assert got["steps"][0]["out_of_band"] is None  # the HTP in FP16 follows FP32
    assert got["verdict"] and f.read_text() == before
    assert "layerdiff[" in r.stderr and "ok " in r.stderr  # progress on stderr
    r = studio("bisect", f)
    assert r.returncode == 0 and "verdict: " in r.stdout and "(cached)" in r.stderr
    r = studio("bisect", f, "--part", "2")  # a model in parts: tests/cli/test_parts_cli.py
    assert r.returncode == 2 and "exported whole" in r.stderr


@pytest.mark.slow
def test_studio_bisect_on_a_device_through_its_agent(project_file, tmp_path, monkeypatch):
    """`studio bisect FILE --device agent:NAME@htp-sim:CHIP`: the HTP side of every step runs
    on the agent (a real agent on loopback; on an x86 host its HTP is the simulator, so the
    figures are labelled simulated): the graphs and feeds are uploaded, the tensors come
    back, and the reading is the one the local bisection gives."""
    import json as _json

    from tests.cli.conftest import default_target, studio
    from tests.cli.test_agent import Agent
    from tests.conftest import copy_store

    f = tmp_path / project_file.name
    f.write_text(project_file.read_text())
    copy_store(project_file.with_suffix(".studio"), f.with_suffix(".studio"))
    agent = Agent(tmp_path / "agent")
    cfg = tmp_path / "cfg"
    env = dict(os.environ, QSTUDIO_CONFIG_DIR=str(cfg))
    try:
        r = studio("devices", "add", "lab", "--url", agent.url, "--token", agent.token, env=env)
        assert r.returncode == 0, r.stderr
        dev = f"agent:lab@htp-sim:{default_target()}"
        r = studio("bisect", f, "--device", dev, "--json", env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        got = _json.loads(r.stdout)
        from studio.core.devices import device

        assert got["device"] == device(dev).name
        res = got["result"]
        assert res["source"] == "simulated" and res["device_id"] == dev
        assert set(res["pairs"]) == {"qdq_vs_fp32", "htp_vs_fp32", "htp_vs_qdq",
                                     "htp_fp16_vs_fp32"}
        assert got["steps"][0]["out_of_band"] is None and got["verdict"]
        local = _json.loads(studio("bisect", f, "--json").stdout)
        # the same HTP (this machine's simulator behind the agent): the same reading, and
        # the device's read beside the simulator's says they agree
        assert got["verdict"].startswith(local["verdict"].replace(local["result"]["device"],
                                                                  got["result"]["device"]))
        assert got["simulator"]["agrees"] and "reads the same" in got["verdict"]
        assert got["simulator"]["name"] == local["result"]["device"]
        r = studio("bisect", f, "--device", "agent:lab@cpu", env=env)
        assert r.returncode == 2 and "an agent's HTP" in r.stderr
    finally:
        agent.stop()
