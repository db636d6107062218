"""The performance model: properties, a hand-computed roofline, the scheduler, the fit."""

from __future__ import annotations

import math
import tomllib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from studio.core import archs, perffit
from studio.core import perfmodel as pm
from studio.core.catalog import get_chip
from studio.core.errors import StudioError

EFF = pm.Efficiency(bw_fraction=0.8, overhead_ms=2.0, compute_fraction=0.3,
                    float_decode_fraction=0.01)


def chip(bw=80.0, tops=40.0, cores=1) -> pm.ChipPerf:
    return pm.ChipPerf("test", "Test", bw, tops, cores)


def arch(layers=4, hidden=256, heads=4, kv=2, inter=512, vocab=1000, tied=True) -> archs.Arch:
    return archs.Arch.from_config({
        "model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": inter,
        "vocab_size": vocab, "tie_word_embeddings": tied})


def tps(a=None, c=None, scheme="W4A16", context=512, eff=EFF) -> float:
    return pm.estimate(a or arch(), c or chip(), scheme, context, min(64, context),
                       eff).decode_tokens_per_s


sizes = st.builds(arch, layers=st.integers(1, 8), hidden=st.sampled_from([64, 128, 256]),
                  heads=st.sampled_from([2, 4]), kv=st.sampled_from([1, 2]),
                  inter=st.integers(64, 1024), vocab=st.integers(100, 5000))


@settings(max_examples=40, deadline=None, database=None)
@given(sizes, st.floats(5, 200), st.floats(1.01, 4), st.integers(1, 4))
def test_decode_rises_with_bandwidth(a, bw, factor, cores):
    assert tps(a, chip(bw * factor, cores=cores)) >= tps(a, chip(bw, cores=cores))


@settings(max_examples=40, deadline=None, database=None)
@given(sizes, st.integers(1, 512), st.integers(1, 4))
def test_decode_falls_with_weight_bytes(a, extra, layers):
    bigger = archs.Arch(**{**a.__dict__, "intermediate": a.intermediate + extra})
    deeper = archs.Arch(**{**a.__dict__, "layers": a.layers + layers})
    assert bigger.weight_bytes(archs.SCHEMES["W4A16"]) > a.weight_bytes(archs.SCHEMES["W4A16"])
    assert tps(bigger) < tps(a) and tps(deeper) < tps(a)
    # fewer bits per weight: more tokens per second
    assert tps(a, scheme="W4A16") > tps(a, scheme="W8A16")
    assert tps(a, scheme="W8A8") > tps(a, scheme="W8A16")


@settings(max_examples=40, deadline=None, database=None)
@given(sizes, st.integers(1, 4096), st.integers(1, 4096))
def test_decode_falls_with_context(a, c1, extra):
    assert tps(a, context=c1 + extra) < tps(a, context=c1)


def test_memory_bound_decode_is_bytes_over_bandwidth():
    """A big model at one token is pure DDR traffic: tok/s = 1 / (bytes / (bw x frac) + oh)."""
    a = arch(layers=8, hidden=1024, heads=8, kv=2, inter=4096, vocab=32000)
    est = pm.estimate(a, chip(50.0), "W8A16", 256, 16, EFF)
    assert est.decode.bound == "memory"
    b = float(est.decode.graph.dram_bytes.sum())
    assert math.isclose(est.decode.total_s, b / (50e9 * 0.8) + 0.002, rel_tol=1e-12)
    # weights: every linear and the lm_head, at 1 byte (W8); the KV cache at 2 bytes
    w = a.layers * a.layer_params + a.head_params
    kv = 2 * a.layers * a.kv_dim * 256 * 2
    assert b > w + kv and b < (w + kv) * 1.01


def test_tiny_graph_matches_a_hand_computed_roofline():
    # op 0: 1000 MACs, 1e6 bytes (memory-bound); op 1: 1e9 MACs, 1000 bytes (compute-bound)
    g = pm.OpGraph(["a", "b"], ["MatMul", "MatMul"], [0, 0], [1e3, 1e9], [1e6, 1e3],
                   [(0, 1)])
    c = chip(bw=10.0, tops=2.0, cores=1)
    eff = pm.Efficiency(0.5, 1.0, 0.25, 0.01)
    r = pm.roofline(g.macs, g.dram_bytes, c, eff)
    # peak: 2e12 x 0.25 = 5e11 ops/s; bandwidth 10e9 x 0.5 = 5e9 B/s
    assert r["compute_s"] == pytest.approx([2e3 / 5e11, 2e9 / 5e11])
    assert r["memory_s"] == pytest.approx([1e6 / 5e9, 1e3 / 5e9])
    assert list(r["bound"]) == ["memory", "compute"]
    assert r["intensity"] == pytest.approx([2e3 / 1e6, 2e9 / 1e3])
    assert float(r["ridge"]) == pytest.approx(100.0)
    ge = pm.estimate_ops(g, c, eff)
    assert ge.sched.start.tolist() == pytest.approx([0.0, 2e-4])
    assert ge.total_s == pytest.approx(2e-4 + 4e-3 + 1e-3)


@st.composite
def dags(draw):
    n = draw(st.integers(1, 25))
    pairs = [(i, j) for j in range(n) for i in range(j)]
    edges = draw(st.lists(st.sampled_from(pairs), max_size=40, unique=True)) if pairs else []
    durations = draw(st.lists(st.floats(0, 10), min_size=n, max_size=n))
    return durations, edges, draw(st.integers(1, 4))


@settings(max_examples=80, deadline=None, database=None)
@given(dags())
def test_scheduler_respects_dependencies_and_never_overlaps(dag):
    d, edges, cores = dag
    s = pm.schedule(d, edges, cores)
    d = np.asarray(d)
    assert np.allclose(s.finish, s.start + d)
    for a, b in edges:
        assert s.start[b] >= s.finish[a] - 1e-12
    assert set(s.core.tolist()) <= set(range(cores))
    for c in range(cores):
        idx = np.where(s.core == c)[0]
        order = idx[np.argsort(s.start[idx], kind="stable")]
        for x, y in zip(order[:-1], order[1:], strict=True):
            assert s.start[y] >= s.finish[x] - 1e-12
    assert s.makespan >= d.sum() / cores - 1e-9


def test_scheduler_uses_the_cores_and_rejects_cycles():
    s = pm.schedule([1.0, 1.0, 1.0], [(0, 2), (1, 2)], 2)
    assert s.core.tolist() == [0, 1, 0] and s.start.tolist() == [0.0, 0.0, 1.0]
    assert s.makespan == 2.0
    with pytest.raises(ValueError, match="cycle"):
        pm.schedule([1.0, 1.0], [(0, 1), (1, 0)], 1)


@pytest.mark.parametrize(("name", "params"), [
    ("llama-3.2-1b", 1_235_814_400), ("llama-3.2-3b", 3_212_749_824),
    ("llama-3-8b", 8_030_261_248), ("llama-2-7b", 6_738_415_616),
    ("qwen2.5-1.5b", 1_543_714_304), ("qwen2.5-7b", 7_615_616_512),
    ("qwen2-0.5b", 494_032_768),
])
def test_bundled_configs_give_the_published_parameter_counts(name, params):
    a = archs.load_arch(name)
    # the model leaves out norm weights (< 0.01 %)
    assert a.params == pytest.approx(params, rel=2e-4)


def test_config_keys_of_the_families():
    qwen3 = archs.Arch.from_config({"model_type": "qwen3", "hidden_size": 1024,
                                 "num_hidden_layers": 28, "num_attention_heads": 16,
                                 "num_key_value_heads": 8, "head_dim": 128,
                                 "intermediate_size": 3072, "vocab_size": 151936,
                                 "tie_word_embeddings": True,
                                 "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}})
    assert qwen3.head_dim == 128 and qwen3.q_dim == 2048 and qwen3.rope_theta == 1e6
    gemma2 = archs.Arch.from_config({"model_type": "gemma2", "hidden_size": 2304,
                                  "num_hidden_layers": 26, "num_attention_heads": 8,
                                  "num_key_value_heads": 4, "head_dim": 256,
                                  "intermediate_size": 9216, "vocab_size": 256000,
                                  "sliding_window": 4096})
    assert gemma2.tied_embeddings and gemma2.sliding_layers == 13
    assert gemma2.kv_cache_bytes(archs.SCHEMES["FP16"], 8192) < \
        2 * 26 * 4 * 256 * 8192 * 2
    mistral = archs.Arch.from_config({"model_type": "mistral", "hidden_size": 4096,
                                   "num_hidden_layers": 32, "num_attention_heads": 32,
                                   "num_key_value_heads": 8, "intermediate_size": 14336,
                                   "vocab_size": 32000, "sliding_window": 4096})
    assert not mistral.tied_embeddings and mistral.kv_context(0, 8192) == 4096
    phi3 = archs.Arch.from_config({"text_config": {"model_type": "phi3", "hidden_size": 3072,
                                                "num_hidden_layers": 32,
                                                "num_attention_heads": 32,
                                                "intermediate_size": 8192,
                                                "vocab_size": 32064}})
    assert phi3.kv_heads == 32 and phi3.head_dim == 96


@pytest.mark.parametrize(("cfg", "match"), [
    ({"hidden_size": 64}, "no 'num_hidden_layers'"),
    ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 3,
      "intermediate_size": 8, "vocab_size": 9}, "not a multiple"),
    ({"hidden_size": -1}, "positive integer"),
])
def test_bad_configs_are_one_line_errors(cfg, match):
    with pytest.raises(StudioError, match=match) as e:
        archs.Arch.from_config(cfg)
    assert "\n" not in str(e.value)


def test_unknown_figures_scheme_and_context_are_refused():
    with pytest.raises(StudioError, match="cannot estimate for QCS9100.*DDR bandwidth"):
        pm.estimate(arch(), get_chip("qcs9100"), "W4A16", 512)
    with pytest.raises(StudioError, match="unknown scheme"):
        pm.estimate(arch(), chip(), "W3A16", 512, eff=EFF)
    with pytest.raises(StudioError, match="context"):
        pm.estimate(arch(), chip(), "W4A16", 0, eff=EFF)


def test_the_shipped_fit_is_what_the_calibration_computes():
    cal = perffit.calibrate()
    eff, shipped = pm.load_fit()
    assert shipped["model_version"] == pm.MODEL_VERSION
    assert cal["params"] == {"bw_fraction": eff.bw_fraction, "overhead_ms": eff.overhead_ms,
                             "compute_fraction": eff.compute_fraction,
                             "float_decode_fraction": eff.float_decode_fraction}
    for k in ("decode_mdape", "decode_loo_mdape", "prefill_mdape", "anchors_used"):
        assert cal[k] == shipped[k], k
    assert perffit.fit_toml(cal) == pm.FIT_PATH.read_text()
    # the vectorised calibration path equals the estimator for every anchor
    for r in cal["rows"]:
        est = pm.estimate(archs.load_arch(r["config"]), r["chip"], r["scheme"], r["context"],
                          eff=eff)
        assert est.decode_tokens_per_s == pytest.approx(r["estimated_decode_tokens_per_s"],
                                                        abs=1e-3)
    # leave-one-out is never better than the in-sample figure, and both are medians of rows
    assert cal["decode_loo_mdape"] >= cal["decode_mdape"]
    assert cal["decode_mdape"] == pytest.approx(float(np.median([r["ape"] for r in cal["rows"]])),
                                                abs=0.01)


def test_anchor_table_has_a_source_and_a_config_for_every_row():
    data = tomllib.loads(pm.ANCHORS_PATH.read_text())
    for row in data["anchor"]:
        assert row["source"] and (archs.CONFIGS_DIR / f"{row['config']}.json").is_file()
        get_chip(row["chip"])


def test_the_heldout_set_is_sourced_and_apart_from_the_fit():
    """Every held-out row names its source; none repeats a configuration the model is fitted
    to (model sizes, scheme, chip and context), so the held-out figure judges the model."""
    rows = perffit.load_heldout()
    assert len(rows) >= 200
    assert all(r.source and r.runtime and r.decode_tokens_per_s > 0 for r in rows)
    fitted = {(a.config, a.scheme, a.chip, a.context) for a in perffit.load_anchors()}
    assert not [r for r in rows if (r.config, r.scheme, r.chip, r.context) in fitted]
    for r in rows:
        assert not r.config or (archs.CONFIGS_DIR / f"{r.config}.json").is_file(), r.config


def test_the_heldout_report_estimates_what_it_can_and_says_why_not_the_rest():
    rep = perffit.heldout_report()
    assert rep["clean"]["rows"] >= 90 and rep["all"]["rows"] >= rep["clean"]["rows"]
    assert {"snapdragon-8-elite", "snapdragon-x-elite"} <= set(rep["by_chip"])
    assert all(s["rows"] for s in rep["by_size"].values())
    reasons = {s["reason"] for s in rep["skipped"]}
    assert "the chip catalog has no such chip" in reasons
    assert "the architecture's sizes are not public" in reasons
    row = rep["rows"][0]
    assert row["error"] == pytest.approx(
        row["estimated_decode_tokens_per_s"] / row["decode_tokens_per_s"] - 1, abs=1e-3)
    print(f"\nheld-out MdAPE {rep['clean']['mdape']} % on {rep['clean']['rows']} rows; "
          + ", ".join(f"{k} {v['mdape']} %" for k, v in rep["by_chip"].items()))


def test_the_npu_path_of_a_laptop_caps_its_bandwidth():
    """The X Elite's 128-bit bus gives 135 GB/s, its NPU about 67 (the catalog's sourced
    figure): the estimator takes the NPU's."""
    c = get_chip("snapdragon-x-elite")
    assert c.ddr_gbps == 135.0 and c.npu_gbps == 67.0 and "[NPU6]" in c.npu_source
    assert pm.ChipPerf.of(c).ddr_gbps == 67.0
    assert pm.ChipPerf.of(get_chip("snapdragon-8-elite")).ddr_gbps == 84.8  # no NPU figure


def test_a_catalog_npu_figure_needs_its_source(tmp_path):
    from studio.core.catalog import load_catalog

    text = pm.resources_dir().joinpath("catalog", "chips.toml").read_text().replace(
        'npu_source = "[NPU6]', 'npu_note = "[NPU6]')
    f = tmp_path / "chips.toml"
    f.write_text(text)
    with pytest.raises(StudioError, match="npu_gbps has no npu_source"):
        load_catalog(f)


def test_float_graph_io_pays_its_edge_conversions():
    """A float-I/O pass reads the float32 cache and writes it back quantized, and
    dequantizes the new rows and the logits: exactly those bytes more, so more at a longer
    context; a quantized-I/O pass (the published graphs) pays none."""
    a, s = arch(), archs.get_scheme("W8A16")
    for ctx in (64, 512):
        plain = pm.transformer_ops(a, s, 1, ctx)
        f = pm.transformer_ops(a, s, 1, ctx, float_io=True)
        cache = a.layers * 2 * a.kv_dim * ctx
        rows = a.layers * 2 * a.kv_dim
        extra = (cache * (4 + s.kv_bytes) + rows * (s.kv_bytes + 4)
                 + a.vocab * (s.act_bytes + 4))
        assert f.dram_bytes.sum() - plain.dram_bytes.sum() == pytest.approx(extra)
        assert pm.FLOAT_IO_OP in f.names and pm.FLOAT_IO_OP not in plain.names
    slow = pm.pass_seconds(a, chip(), s, 512, eff=EFF, float_io=True)
    assert slow > pm.pass_seconds(a, chip(), s, 512, eff=EFF)


def test_a_vision_language_config_gives_its_vision_tower():
    """Qwen2.5-VL-3B's published sizes: a 1280-wide ViT of 32 blocks (window attention over
    8 x 8 patches but in blocks 7, 15, 23, 31), 2 x 2 patches merged into one 2048-wide token:
    a 448-pixel image is 1024 patches, 256 tokens."""
    a = archs.load_arch("qwen2.5-vl-3b")
    v = a.vision
    assert v is not None and (v.depth, v.hidden, v.out_hidden, v.window) == (32, 1280, 2048, 8)
    assert v.full_blocks == (7, 15, 23, 31) and v.gated_mlp
    assert (v.patches(448), v.tokens(448)) == (1024, 256)
    # by hand: patch embedding, 32 blocks (attention 4 h^2, gated MLP 3 h i), the merger
    h, i = 1280, 3420
    assert v.params == 3 * 2 * 14 * 14 * h + 32 * (4 * h * h + 3 * h * i) + \
        (4 * h) ** 2 + 4 * h * 2048
    g = pm.vision_ops(v, archs.get_scheme("W8A16"), 448)
    att = [m for n, m in zip(g.names, g.macs, strict=True) if n.endswith("/attention")]
    assert att[0] == 2 * h * 1024 * 64 and att[7] == 2 * h * 1024 * 1024  # window, full
    with pytest.raises(StudioError, match="multiple of 28"):
        v.patches(450)
    # Qwen2-VL names the ViT's width embed_dim and the language model's hidden_size
    q2 = archs.Arch.from_config({
        "model_type": "qwen2_vl", "hidden_size": 1536, "num_hidden_layers": 28,
        "num_attention_heads": 12, "num_key_value_heads": 2, "intermediate_size": 8960,
        "vocab_size": 151936, "tie_word_embeddings": True,
        "vision_config": {"depth": 32, "embed_dim": 1280, "hidden_size": 1536, "mlp_ratio": 4,
                          "num_heads": 16, "patch_size": 14, "spatial_merge_size": 2}})
    assert q2.vision is not None
    assert (q2.vision.hidden, q2.vision.out_hidden, q2.vision.intermediate) == (1280, 1536, 5120)
    assert not q2.vision.gated_mlp and q2.vision.window is None


def test_an_image_adds_the_vision_tower_to_the_time_to_first_token():
    a = archs.load_arch("qwen2.5-vl-3b")
    text = pm.estimate(a, chip(), "W4A16", 1024, 64, EFF)
    vl = pm.estimate(a, chip(), "W4A16", 1024, 64, EFF, image=448)
    assert vl.decode_tokens_per_s == text.decode_tokens_per_s  # decode reads no image
    d = vl.to_dict()
    assert d["vision"]["image_tokens"] == 256 and d["vision"]["patches"] == 1024
    assert d["time_to_first_token_ms"] == pytest.approx(
        d["vision"]["encoder_ms"] + d["vision"]["prefill_ms"], abs=0.01)
    assert d["vision"]["prefill_ms"] > text.prefill.total_s * 1000  # 64 + 256 tokens
    with pytest.raises(StudioError, match="no vision tower"):
        pm.estimate(arch(), chip(), "W4A16", 512, 64, EFF, image=448)
    with pytest.raises(StudioError, match="do not fit the context"):
        pm.estimate(a, chip(), "W4A16", 300, 64, EFF, image=448)
