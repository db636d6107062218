"""Per-layer precision sensitivity and auto mixed precision on the trained sample model, with
the real quantizer and real ONNX Runtime (prompt 16, context 64, W8A8 base). The first
sensitivity run is the session's ``studio --batch FILE --stages sensitivity``
(``sensitivity_run`` in tests/conftest.py, shared with the CLI and window tests); the second
(the stability check) and the auto-precision stages run here through ``run_in_process`` on a
plan. Run with ``-s`` to see the figures."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from studio.core import project as pf
from studio.core.errors import StudioError
from studio.core.metrics import Metric
from studio.core.progress import RecordingProgress
from studio.core.stagegraph import DEFAULT_STAGES, STAGES, plan
from studio.worker.stages import run_in_process

K = 3  # layers raised in the top-k / random-k comparison
FIGURES: dict[str, object] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_figures():
    yield
    if FIGURES:
        print("\nsensitivity figures:\n" + json.dumps(FIGURES, indent=1, default=str))


@pytest.fixture(scope="module")
def project(sample_model_dir, sample_data_dir, sensitivity_run) -> pf.Project:
    """The session's W8A8 sample project (96 held-out tokens for the sensitivity stage)."""
    return pf.load(sensitivity_run[0])


def _run(project: pf.Project, stage: str, inputs: dict[str, Path], out: Path):
    jobs = plan(project, [stage])
    job = jobs[-1]
    assert job.stage == stage and {jobs[d].label for d in job.deps} == set(inputs)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    result = run_in_process(project, job, inputs, out, RecordingProgress())
    return result, time.perf_counter() - t0


def _stored(project: pf.Project, stage: str) -> Path:
    """The folder of the stored artifact of ``stage`` for the project's current settings."""
    from studio.core.artifacts import ArtifactStore
    from studio.services.history import current_keys

    art = ArtifactStore(project.folder / "artifacts").get(current_keys(project, [stage])[stage])
    assert art is not None, stage
    return art.path


@pytest.fixture(scope="module")
def export(project) -> Path:
    """The FP32 export the session's batch stored (only read here)."""
    return _stored(project, "export")


@pytest.fixture(scope="module")
def sensitivity(project, sensitivity_run):
    """The session's real sensitivity run, as stored (only read here): (folder, result,
    sensitivity.json)."""
    job = next(j for j in sensitivity_run[1]["jobs"] if j["stage"] == "sensitivity")
    FIGURES["sensitivity_seconds"] = job["seconds"]
    out = _stored(project, "sensitivity")
    result = json.loads((out / "result.json").read_text())
    return out, result, json.loads((out / "sensitivity.json").read_text())


@pytest.fixture(scope="module")
def bench(sensitivity, export, tmp_path_factory):
    """The analysis' base and slice again, from its calibration ranges (no calibration)."""
    from studio.engine.sensitivity import VariantBench

    sdir, _, data = sensitivity
    recipe = {"scheme": data["scheme"], "weight_granularity": data["weight_granularity"],
              "samples": data["calibration_samples"]}
    with VariantBench(export, recipe, data["heldout"]["ids"], tmp_path_factory.mktemp("bench"),
                      ranges=sdir / "calibration_ranges.json") as b:
        yield b


def test_optional_stages_are_declared_and_planned(project):
    for name in ("sensitivity", "autoprecision"):
        assert STAGES[name].optional and name not in DEFAULT_STAGES
        assert name not in project.pipeline["stages"]  # a new project does not run them
    jobs = plan(project, ["autoprecision"])
    assert [j.label for j in jobs] == ["export", "sensitivity", "autoprecision"]
    assert jobs[2].deps == [0, 1] and jobs[1].deps == [0]


def test_sensitivity_ranks_every_layer_and_block(sensitivity, sensitivity_run):
    sdir, result, data = sensitivity
    assert sorted(p.name for p in sdir.iterdir()) == [  # no work folder left
        "artifact.json", "calibration_ranges.json", "result.json", "sensitivity.json"]
    # the stored result is what the run reported (it ran: nothing was stored before)
    batch = sensitivity_run[1]
    job = next(j for j in batch["jobs"] if j["stage"] == "sensitivity")
    assert batch["state"] == "succeeded" and job["state"] == "succeeded" and not job["cached"]
    assert job["summary"] == result["summary"]
    assert all(Metric.from_dict(m).to_dict() in batch["metrics"] for m in result["metrics"])
    assert (data["scheme"], data["high"], data["low"]) == ("W8A8", "INT16", "INT4")
    assert (data["source"], data["device"], data["graph"]) == ("measured", "host-cpu", "prefill")
    assert data["heldout"]["tokens"] == 96 and data["heldout"]["window_tokens"] == 16
    layers = [e["name"] for e in data["layers"]]
    assert len(layers) == 29 and "lm_head" in layers
    assert len([n for n in layers if n.startswith("model.layers.2.")]) == 7
    assert [e["name"] for e in data["blocks"]] == [f"model.layers.{i}" for i in range(4)]
    for e in data["layers"] + data["blocks"]:
        assert e["raise"]["precision"] == "INT16" and e["lower"]["precision"] == "INT4"
        for direction in ("raise", "lower"):
            d = e[direction]["delta"]
            assert d["perplexity"] == pytest.approx(
                e[direction]["perplexity"] - data["base"]["perplexity"])
    # each block's key activations: raised only (INT4 is for weights)
    points = [e["name"] for e in data["points"]]
    assert len(points) == 4 * 3 and "model.layers.0.self_attn.scores" in points
    for e in data["points"]:
        assert e["raise"]["precision"] == "INT16" and "lower" not in e
        assert e["raise"]["weight_bytes"] == data["base"]["weight_bytes"]
    rk = data["ranking"]
    assert sorted(rk["raise_points"]) == sorted(points) and "lower_points" not in rk
    assert sorted(rk["raise"]) == sorted(layers) == sorted(rk["lower"])
    assert sorted(rk["raise_blocks"]) == sorted(rk["lower_blocks"]) == sorted(
        e["name"] for e in data["blocks"])
    by = {e["name"]: e for e in data["layers"]}
    kl = [by[n]["raise"]["delta"]["kl_divergence"] for n in rk["raise"]]
    assert kl == sorted(kl)  # most to gain first
    # INT16 activations leave weight bytes alone; INT4 weights halve the layer's
    w = data["base"]["weight_bytes"]
    assert all(by[n]["raise"]["weight_bytes"] == w for n in layers)
    assert all(w - by[n]["lower"]["weight_bytes"] == by[n]["weight_numel"] // 2 for n in layers)
    # base within a few percent of FP32; 4-bit lm_head hurts, 8-bit weights are fine
    assert abs(data["base"]["perplexity"] / data["fp32"]["perplexity"] - 1) < 0.05
    assert data["base"]["logits_cosine"] > 0.99
    assert by["lm_head"]["lower"]["delta"]["kl_divergence"] > 0
    v = data["variants"]
    assert v["measured"] == 2 * 33 + 12 + 1
    assert v["quantizer_runs"] < 24 and v["spliced"] > 10 and v["patched"] == 33
    assert result["metrics"] and all(
        (m["source"], m["device"]) == ("measured", "host-cpu") for m in result["metrics"])
    assert "htp" not in data and result["htp"] is None  # host figures only by default
    assert result["ranking"]["raise"] == rk["raise"][:5]
    assert "most to gain from INT16" in result["summary"]
    FIGURES["fp32_perplexity"] = round(data["fp32"]["perplexity"], 3)
    FIGURES["base"] = {k: round(data["base"][k], 5) for k in
                       ("perplexity", "logits_cosine", "kl_divergence", "top1_agreement")}
    FIGURES["top_raise"] = [
        {"layer": n, **{k: round(by[n]["raise"]["delta"][k], 6)
                        for k in ("kl_divergence", "perplexity", "logits_cosine")}}
        for n in rk["raise"][:5]]
    FIGURES["top_lower"] = [
        {"layer": n, **{k: round(by[n]["lower"]["delta"][k], 6)
                        for k in ("kl_divergence", "perplexity")}}
        for n in rk["lower"][:5]]
    FIGURES["blocks_raise"] = [
        {"block": e["name"], **{k: round(e["raise"]["delta"][k], 6)
                                for k in ("kl_divergence", "perplexity")}}
        for e in data["blocks"]]
    FIGURES["variants"] = v
    FIGURES["points_raise"] = [
        {"point": n, **{k: round(pb[n]["raise"]["delta"][k], 6)
                        for k in ("kl_divergence", "perplexity")}}
        for pb in [{e["name"]: e for e in data["points"]}] for n in rk["raise_points"][:5]]


def _signature(model):
    from onnx import numpy_helper

    nodes = sorted((n.name, n.op_type, n.domain, tuple(n.input), tuple(n.output),
                    tuple(sorted(a.SerializeToString() for a in n.attribute)))
                   for n in model.graph.node)
    inits = {t.name: (t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes())
             for t in model.graph.initializer}
    return nodes, inits, sorted((o.domain, o.version) for o in model.opset_import)


def test_fast_variants_are_what_the_quantizer_gives(bench, sensitivity):
    """Variants cut out of one joint quantizer run, and 4-bit variants patched onto the base,
    equal what the quantizer gives for each variant alone, node for node and tensor for
    tensor; and they score as the stage measured them."""
    _, _, data = sensitivity
    variants = [{"lm_head": "INT16"}, {"model.layers.1.self_attn.k_proj": "INT16"},
                {"model.layers.2.self_attn.scores": "INT16"},
                {"model.layers.2.mlp.down_proj": "INT4"}]
    spliced = bench.spliced
    fast = list(bench.variant_models(variants))
    assert bench.spliced - spliced == 3  # the INT16 variants came from one quantizer run
    for v, model in zip(variants, fast, strict=True):
        assert _signature(model) == _signature(bench.quantizer_model(v)), v
    by = {e["name"]: e for e in data["layers"] + data["points"]}
    for v, s in zip(variants, bench.evaluate_many(variants), strict=True):
        (name, prec), = v.items()
        direction = "raise" if prec == "INT16" else "lower"
        assert s["kl_divergence"] == by[name][direction]["kl_divergence"]


def test_raising_the_most_sensitive_layers_beats_raising_random_ones(bench, sensitivity):
    """With W8A8 as the base: the top-k layers of the ranking raised to INT16 bring the
    model closer to FP32 than k layers drawn at random (fixed seed)."""
    _, _, data = sensitivity
    top = data["ranking"]["raise"][:K]
    rng = random.Random(0)
    draws = [rng.sample(bench.layers, K) for _ in range(4)]
    scores = bench.evaluate_many([{n: "INT16" for n in s} for s in [top, *draws]])
    top_s, rand = scores[0], scores[1:]
    base, fp32 = data["base"], data["fp32"]["perplexity"]
    FIGURES["top_k_vs_random_k"] = {
        "k": K, "top": top, "random": draws,
        "kl": {"base": round(base["kl_divergence"], 6), "top": round(top_s["kl_divergence"], 6),
               "random": [round(s["kl_divergence"], 6) for s in rand]},
        "perplexity": {"fp32": round(fp32, 3), "base": round(base["perplexity"], 3),
                       "top": round(top_s["perplexity"], 3),
                       "random": [round(s["perplexity"], 3) for s in rand]},
        "cosine": {"base": round(base["logits_cosine"], 6),
                   "top": round(top_s["logits_cosine"], 6),
                   "random": [round(s["logits_cosine"], 6) for s in rand]},
    }
    assert top_s["kl_divergence"] < base["kl_divergence"]
    assert top_s["kl_divergence"] < min(s["kl_divergence"] for s in rand)
    assert top_s["logits_cosine"] > sum(s["logits_cosine"] for s in rand) / len(rand)


@pytest.fixture(scope="module")
def second_run(project, export, tmp_path_factory):
    """The stage's second real run (in process) on the same export and settings, which also
    confirms its top two entries on the HTP simulator (``sensitivity.confirm_on_htp``, a
    setting that changes what is stored, not the host ranking): the one HTP confirmation of
    the suite. (result, seconds, sensitivity.json)."""
    d = project.to_dict()
    d["sensitivity"].update(confirm_on_htp="snapdragon-8-gen-3", confirm_top=2)
    p = pf.from_dict(d)
    p.path = project.path
    out = tmp_path_factory.mktemp("sensitivity-again") / "again"
    result, seconds = _run(p, "sensitivity", {"export": export}, out)
    return result, seconds, json.loads((out / "sensitivity.json").read_text())


def test_the_ranking_is_stable_across_two_runs(sensitivity, second_run):
    """A second real run of the stage (here, in process) ranks as the session's batch run
    did on the same export and settings."""
    _, _, first = sensitivity
    result, seconds, second = second_run
    assert second["htp"]["tried"] == 2 and result["htp"]["chip"] == "snapdragon-8-gen-3"
    assert "on the HTP simulator (snapdragon-8-gen-3)" in result["summary"]
    sim = [m for m in result["metrics"] if m["name"].endswith("_htp")]
    assert len(sim) == 2 and all((m["source"], m["device"]) == ("simulated", "htp-sim")
                                 for m in sim)
    assert all(m["source"] == "measured" for m in result["metrics"] if m not in sim)
    FIGURES["sensitivity_seconds_second_run"] = round(seconds, 1)
    for key in ("raise", "lower", "raise_blocks", "lower_blocks"):
        assert second["ranking"][key][:5] == first["ranking"][key][:5], key
    FIGURES["second_run_identical"] = second["layers"] == first["layers"] and (
        second["blocks"] == first["blocks"]) and second["points"] == first["points"]


def _autoprecision(project, export, sensitivity, out: Path, **settings):
    d = project.to_dict()
    d["autoprecision"].update(settings)
    p = pf.from_dict(d)
    p.path = project.path
    result, seconds = _run(p, "autoprecision", {"export": export, "sensitivity": sensitivity[0]},
                           out)
    return result, json.loads((out / "autoprecision.json").read_text()), seconds


def test_autoprecision_meets_a_cosine_target_from_w8a8(project, export, sensitivity, bench,
                                                       sample_data_dir, tmp_path):
    from studio.core.recipe import effective_precisions
    from studio.engine.quant_recipe import check_overrides
    from studio.engine.quantize import quantize_llm

    _, _, data = sensitivity
    by = {e["name"]: e for e in data["layers"] + data["points"]}
    gain = by[data["ranking"]["raise"][0]]["raise"]["delta"]["logits_cosine"]
    assert gain > 0
    target = data["base"]["logits_cosine"] + gain / 2  # the base misses it
    result, res, seconds = _autoprecision(project, export, sensitivity, tmp_path / "auto",
                                          metric="cosine", min_logits_cosine=target)
    assert res["met"] and result["met"] and 1 <= res["raised"] == len(res["overrides"])
    assert res["after"]["logits_cosine"] >= target > res["before"]["logits_cosine"]
    assert result["base_matches_sensitivity"]
    steps = res["steps"]
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert not steps[0]["meets_target"] and steps[-1]["meets_target"]
    assert all(not s["meets_target"] for s in steps[:-1])  # it stopped at the first that met
    # the rules are the recipe's vocabulary: copy them into quantization.overrides
    rules = result["overrides"]
    assert set(rules.values()) == {"INT16"} and set(rules) <= set(by)
    q = {"scheme": "W8A8", "weight_granularity": "per_channel", "overrides": rules}
    check_overrides(export, {**q, "samples": 2})
    raised = [lp.layer for lp in effective_precisions(list(by), q) if lp.activation == "INT16"]
    assert sorted(raised) == sorted(rules)
    assert res["after"]["weight_bytes"] == res["before"]["weight_bytes"]
    assert res["after"]["activation_bytes_per_token"] > res["before"]["activation_bytes_per_token"]
    assert all((m["source"], m["device"]) == ("measured", "host-cpu") for m in result["metrics"])
    # copied into the project, the rules give the quantize stage the graph that was measured
    calib = (sample_data_dir / "calibration.py.txt").read_text(encoding="utf-8")
    quantize_llm(export, tmp_path / "q", {**q, "samples": 2}, calib, export / "tokenizer")
    got = bench.score(tmp_path / "q" / "prefill.onnx")
    assert got == {k: res["after"][k] for k in got}
    FIGURES["autoprecision_cosine"] = {
        "target": round(target, 6), "raised": res["raised"], "overrides": rules,
        "seconds": round(seconds, 1),
        "before": {k: res["before"][k] for k in ("logits_cosine", "perplexity", "weight_bytes",
                                                  "activation_bytes_per_token")},
        "after": {k: res["after"][k] for k in ("logits_cosine", "perplexity", "weight_bytes",
                                                "activation_bytes_per_token")},
        "curve": [(s["action"], round(s["logits_cosine"], 6), s["weight_bytes"])
                  for s in steps + res["pruning"]],
    }


def test_autoprecision_raises_nothing_when_the_base_meets_the_target(
        project, export, sensitivity, tmp_path):
    _, _, data = sensitivity
    change = abs(data["base"]["perplexity"] / data["fp32"]["perplexity"] - 1)
    result, res, _ = _autoprecision(project, export, sensitivity, tmp_path / "auto",
                                    metric="perplexity", max_perplexity_change=change + 0.01)
    assert res["met"] and res["raised"] == 0 and res["overrides"] == {}
    assert len(res["steps"]) == 1 and "0 layer(s)" in result["summary"]
    lo, hi = res["target"]["perplexity_range"]
    assert lo <= res["after"]["perplexity"] <= hi
    FIGURES["autoprecision_perplexity"] = {"max_perplexity_change": round(change + 0.01, 4),
                                           "raised": res["raised"]}


@pytest.mark.parametrize(
    ("scheme", "high", "low", "match"),
    [
        ("FP16", "auto", "INT4", "needs a quantized scheme"),
        ("W8A16", "INT16", "INT4", "already gives every layer"),
        ("W8A8", "INT4", "", "set it as sensitivity.low"),
        ("W8A8", "auto", "INT8", "already gives every layer"),
        ("W8A8", "auto", "FP16", "raises the layer"),
        ("W8A8", "INT3", "", "not one of auto"),
    ],
)
def test_choices_that_change_nothing_are_refused(scheme, high, low, match):
    from studio.engine.sensitivity import resolve_choices

    with pytest.raises(StudioError, match=match):
        resolve_choices(scheme, high, low)


def test_choices_by_scheme():
    from studio.engine.sensitivity import resolve_choices

    assert resolve_choices("W8A8", "auto", "INT4") == ("INT16", "INT4")
    assert resolve_choices("W8A16", "auto", "") == ("FP16", "")
    assert resolve_choices("W8A16", "FP32", "INT8") == ("FP32", "INT8")
    # over 4-bit weights: a layer's weights to 8 bits; nothing lower than the scheme's INT4
    assert resolve_choices("W4A16", "auto", "INT4") == ("INT8", "")


def test_over_w4a16_a_raise_is_8_bit_weights_patched_as_the_quantizer_gives_them(
        sensitivity, export, tmp_path):
    """Raising a layer (or a block) over W4A16 keeps its 16-bit activations and gives its
    weights 8 bits (a weight-only rule, as published W4A16 models keep a few layers at 8
    bits); the variant is the base with those weights patched in, node for node and tensor
    for tensor what the quantizer gives, and it costs bytes and gains accuracy."""
    from studio.engine.sensitivity import VariantBench, rule_for

    sdir, _, data = sensitivity
    recipe = {"scheme": "W4A16", "weight_granularity": "per_channel",
              "samples": data["calibration_samples"]}
    with VariantBench(export, recipe, data["heldout"]["ids"], tmp_path,
                      ranges=sdir / "calibration_ranges.json") as b:
        layer = {rule_for("model.layers.2.mlp.down_proj", "INT8", "W4A16"): "INT8"}
        block = {rule_for("model.layers.1", "INT8", "W4A16"): "INT8"}
        assert list(layer) == ["model.layers.2.mlp.down_proj.weight"]
        assert list(block) == ["model.layers.1.*.weight"]
        for v in (layer, block):
            patched = b.patched
            model = b.variant_model(v)
            assert b.patched == patched + 1, v
            assert _signature(model) == _signature(b.quantizer_model(v)), v
        base, head = b.evaluate({}), b.evaluate({"lm_head.weight": "INT8"})
        assert head["weight_bytes"] > base["weight_bytes"]
        assert head["activation_bytes_per_token"] == base["activation_bytes_per_token"]
        assert head["kl_divergence"] < base["kl_divergence"]
        FIGURES["w4a16_lm_head_int8"] = {k: (base[k], head[k]) for k in (
            "top1_agreement", "kl_divergence", "weight_bytes")}


@pytest.mark.parametrize(
    ("section", "needle"),
    [
        ("[sensitivity]\nheldout_tokens = 4", "sensitivity.heldout_tokens must be at least 16"),
        ('[sensitivity]\nhigh = "INT3"', "sensitivity.high = 'INT3'"),
        ('[sensitivity]\nlow = "W4"', "sensitivity.low = 'W4'"),
        ('[autoprecision]\nmetric = "bleu"', "autoprecision.metric = 'bleu'"),
        ("[autoprecision]\nmax_perplexity_change = -0.1", "must be 0 or more"),
        ("[autoprecision]\nmin_logits_cosine = 1.5", "at most 1"),
        ('[sensitivity]\nconfirm_on_htp = "snapdragon-99"', "is not a known chip"),
        ('[autoprecision]\non_htp = "snapdragon-99"',
         "autoprecision.on_htp = 'snapdragon-99' is not a known chip"),
        ("[autoprecision]\nmin_top1_agreement = 1.5", "at most 1"),
        ("[sensitivity]\nconfirm_top = 0", "sensitivity.confirm_top must be between 1 and 64"),
    ],
)
def test_bad_settings_give_one_line(tmp_path, section, needle):
    f = tmp_path / "bad.qstudio"
    f.write_text(f'schema_version = 1\n[model]\nsource = "x"\n{section}\n')
    with pytest.raises(StudioError) as exc:
        pf.load(f)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_the_top_entries_are_confirmed_on_the_htp_simulator(second_run):
    """sensitivity.confirm_on_htp: the base and the top entries of the raise ranking scored
    again on the HTP simulator's own kernels, labelled simulated (the stage's second run
    confirmed its top two)."""
    _, _, data = second_run
    res = data["htp"]
    assert (res["source"], res["device"]) == ("simulated", "htp-sim:snapdragon-8-gen-3")
    units = {e["name"]: e for e in data["layers"] + data["points"]}
    best = sorted(units, key=lambda n: units[n]["raise"]["delta"]["kl_divergence"])[:2]
    assert [e["name"] for e in res["entries"]] == best
    assert res["tried"] == 2 and 0 <= res["host_gain_confirmed"] <= 2
    for e in [res["base"], *res["entries"]]:
        assert 0.9 < e["logits_cosine"] <= 1.0 and e["perplexity"] > 1
    FIGURES["htp_confirmation"] = {
        "base_kl_host": round(data["base"]["kl_divergence"], 6),
        "base_kl_htp": round(res["base"]["kl_divergence"], 6),
        "entries": [{"name": e["name"],
                     "host_kl_change": round(e["host_delta"]["kl_divergence"], 6),
                     "htp_kl_change": round(e["delta"]["kl_divergence"], 6)}
                    for e in res["entries"]],
        "confirmed": f"{res['host_gain_confirmed']} of {res['tried']}"}
