"""The declared stage graph: keys cover exactly the declared settings, are reproducible, and a
stage cannot read what its key does not cover."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from studio.core import project as pf
from studio.core.errors import StudioError
from studio.core.samples import data_path, sample_path
from studio.core.settings import SECTION_KEYS, SECTIONS
from studio.core.stagegraph import (
    DECLARATIONS,
    PLAN_KEYS,
    STAGES,
    UNREAD_KEYS,
    declared_by,
    kind_stages,
    plan,
    plan_keys,
    stage_config,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/tiny-coder/tiny-coder.qstudio"
VERSIONS = {"qstudio-code": "fixed", "onnxruntime": "1"}


def _all_keys(project: pf.Project) -> list[str]:
    """Every key of the project file: top-level keys and section.key."""
    keys = ["schema_version", "name", "targets", "sweeps"]
    for section, values in SECTION_KEYS.items():
        keys += [f"{section}.{k}" for k in values]
    assert set(project.to_dict()) <= {"schema_version", "name", "targets", "sweeps",
                                      *SECTION_KEYS}
    return keys


@pytest.fixture(scope="module")
def graph_example(tmp_path_factory) -> Path:
    """An onnx-graph project: a small MLP (with a Celu) and its calibration samples."""
    import numpy as np

    from tests.engine.small_graphs import FEEDS, mlp

    folder = tmp_path_factory.mktemp("graph-example")
    mlp(folder / "mlp.onnx", "celu")
    np.savez(folder / "calib.npz", x=np.concatenate([f["x"][None] for f in FEEDS]))
    p = pf.new_project("mlp", "mlp.onnx", None, graph={"calibration": "calib.npz"})
    p.path = folder / "mlp.qstudio"
    pf.save(p)
    return p.path


def _changed(tmp: Path, key: str, kind: str = "causal-lm"):
    """A valid different value for ``key`` (in a project of model kind ``kind``)."""
    if key in ("graph.calibration", "graph.validation") or (
            kind != "causal-lm" and key == "model.source"):
        import numpy as np

        from tests.engine.small_graphs import FEEDS, mlp

        if key == "model.source":
            return str(mlp(tmp / "other.onnx", "gelu-div"))
        f = tmp / f"{key}.npz"
        np.savez(f, x=np.concatenate([f["x"][None] for f in FEEDS[:3]]))
        return str(f)
    if key in ("model.source", "model.draft"):
        copy = tmp / "model-copy"
        shutil.copytree(sample_path("tiny-coder" if key == "model.source" else "tiny-coder-draft"),
                        copy)
        with open(copy / "config.json", "a") as f:
            f.write("\n")  # same model, different bytes
        return str(copy)
    if key in ("quantization.calibration_text", "validation.heldout_text"):
        f = tmp / f"{key}.txt"
        f.write_text(data_path("calibration").read_text() + "\n# more\n")
        return str(f)
    if key in ("quantization.calibration_images", "validation.heldout_images", "run.image"):
        from studio.engine import vision_input

        folder = tmp / key
        folder.mkdir(exist_ok=True)
        (folder / "a.png").write_bytes(vision_input.png_bytes(vision_input.calibration_images(1, 28)[0]))
        return str(folder / "a.png" if key == "run.image" else folder)
    table = {
        "sweeps": [{"name": "other", "axes": {"quantization.scheme": ["W8A8"]}}],
        "name": "renamed",
        "targets": ["snapdragon-8-gen-3", "snapdragon-8-elite"],
        "export.prompt_length": 31,
        "export.context_length": 96,
        "quantization.scheme": "W8A8",
        "quantization.weight_granularity": "per_tensor",
        "quantization.calibration_samples": 3,
        "quantization.calibration_method": "Percentile",
        "quantization.block_size": 64,
        "quantization.kv_cache": "int8",
        "pruning.drop_blocks": 2,
        "waterfall.window": 16,
        "waterfall.k": 3,
        "waterfall.new_tokens": 40,
        "quantization.overrides": {"lm_head": "INT16"},
        "quantization.vision_overrides": {"visual.merger.*": "INT16"},
        "validation.heldout_tokens": 128,
        "validation.greedy_tokens": 8,
        "gates.min_logits_cosine": 0.95,
        "gates.max_perplexity_increase": 0.1,
        "gates.min_top1_agreement": 0.8,
        "run.prompt": "import os",
        "run.max_new_tokens": 9,
        "run.devices": ["cpu"],
        "pipeline.stages": (["export", "quantize"] if kind == "causal-lm"
                            else ["import", "graph-quantize"]),
        "quantization.placement": "rewrite",
        "graph.shapes": {"x": [1, 16]},
        "graph.seq_len": 64,
        "graph.repeats": 3,
        "gates.min_output_cosine": 0.9,
        "gates.min_ranking_top1": 0.5,
        "sensitivity.heldout_tokens": 96,
        "sensitivity.high": "FP32",
        "sensitivity.low": "",
        "sensitivity.confirm_on_htp": "snapdragon-8-gen-3",
        "autoprecision.on_htp": "snapdragon-8-gen-3",
        "sensitivity.confirm_top": 5,
        "autoprecision.metric": "cosine",
        "autoprecision.max_perplexity_change": 0.05,
        "autoprecision.min_logits_cosine": 0.995,
        "layerdiff.windows": 3,
        "profile.repeats": 3,
        "layerdiff.tensors": "blocks",
        "layerdiff.graph": "decode",
        "layerdiff.fp16_step": True,
        "bundle.new_tokens": 32,
        "bundle.prompts": 2,
        "bundle.parts": 2,
        "bundle.max_context_mb": 512,
        "bundle.prefill_length": 8,
        "bundle.score_tokens": 16,
        "export.parts": "auto",
    }
    return table[key] if key in table else _declared_change(key)


def _declared_change(key: str):
    """A valid other value for a setting the table above leaves out, from its declaration
    (another choice, or the next number in its range): a new setting needs no entry."""
    section, _, leaf = key.partition(".")
    cls = SECTIONS[section]
    spec, hint = cls.specs()[leaf]
    default = cls.default(leaf)
    choices = spec.allowed()
    if choices:
        return next(c for c in choices if c != default)
    if hint is bool:
        return not default
    if hint is float:
        return default * 0.9 if default else 0.5
    if hint is int:
        up = default + 1
        return up if spec.max is None or up <= spec.max else default - 1
    raise AssertionError(f"{key}: give _changed a value for it (a {hint})")


def _set(p: pf.Project, key: str, value) -> pf.Project:
    d = p.to_dict()
    section, _, leaf = key.partition(".")
    if leaf:
        d[section][leaf] = value
    else:
        d[section] = value
    out = pf.from_dict(d)
    out.path = p.path
    return out


def _downstream(stages: set[str]) -> set[str]:
    """The declared stages that read one of ``stages``' outputs, transitively."""
    out = set(stages)
    changed = True
    while changed:
        changed = False
        for d in DECLARATIONS:
            hit = d.needs_all and out or any(n.stage in out for n in d.needs)
            if hit and d.name not in out:
                out.add(d.name)
                changed = True
    return out


def _keys(p: pf.Project) -> dict[str, str]:
    jobs = plan(p, list(kind_stages(p.model["kind"])))
    return {j.label: k for j, k in zip(jobs, plan_keys(p, jobs, VERSIONS), strict=True)}


def test_every_project_key_is_declared_somewhere():
    p = pf.load(EXAMPLE)
    for key in _all_keys(p):
        assert declared_by(key) or key in PLAN_KEYS or key in UNREAD_KEYS, key
    for d in DECLARATIONS:  # and every declared setting exists
        for key in d.settings:
            assert key in _all_keys(p), (d.name, key)


def _check_key_changes(base: pf.Project, tmp_path: Path, key: str) -> None:
    kind = base.model["kind"]
    before = _keys(base)
    if key == "schema_version":
        assert key in UNREAD_KEYS  # one version exists: nothing to change
        return
    if key == "quantization.activation_granularity":  # one value runs: the other is refused
        assert key in UNREAD_KEYS
        with pytest.raises(StudioError, match="per_token cannot run on the HTP"):
            _set(base, key, "per_token")
        return
    if key == "model.kind":  # the kind chooses the pipeline: other stages, other jobs
        # an ONNX file is a graph; a pipeline of one kind's stages is not another kind's
        with pytest.raises(StudioError, match="model.kind"):
            _set(base, key, "encoder")
        d = base.to_dict()
        d["model"]["kind"] = "encoder" if kind == "causal-lm" else "causal-lm"
        d["model"]["source"] = "sample:minilm" if kind == "causal-lm" else "sample:tiny-coder"
        del d["pipeline"]["stages"]
        other = _keys(pf.from_dict(d))
        assert not (set(other) & set(before)) - {"report"}
        return
    after = _keys(_set(base, key, _changed(tmp_path, key, kind)))
    common = set(before) & set(after)
    changed = {label.split("[")[0] for label in common if before[label] != after[label]}
    if key in PLAN_KEYS or key in UNREAD_KEYS:
        # only the report, which takes every job of the plan as input, may see other inputs
        allowed = {d.name for d in DECLARATIONS if d.needs_all} if key in PLAN_KEYS else set()
        assert changed <= allowed, f"{key} shapes the plan; it changed the keys of {changed}"
        return
    # a setting only another kind's stages read changes nothing here
    mine = set(kind_stages(kind))
    expected = _downstream(set(declared_by(key)) & mine) & mine
    assert changed == expected, f"{key}: keys changed for {changed}, declared {expected}"


@pytest.mark.parametrize("key", _all_keys(pf.load(EXAMPLE)))
def test_a_key_changes_exactly_the_stages_that_declare_it(tmp_path, key):
    _check_key_changes(pf.load(EXAMPLE), tmp_path, key)


@pytest.mark.parametrize("key", _all_keys(pf.load(EXAMPLE)))
def test_in_a_graph_project_too(tmp_path, graph_example, key):
    _check_key_changes(pf.load(graph_example), tmp_path, key)


def test_two_copies_of_a_project_give_identical_keys(tmp_path):
    keys = []
    for name in ("a", "b"):
        folder = tmp_path / name / "deeper" if name == "b" else tmp_path / name
        folder.mkdir(parents=True)
        f = folder / "proj.qstudio"
        shutil.copy(EXAMPLE, f)
        keys.append(_keys(pf.load(f)))
    assert keys[0] == keys[1]
    assert len(set(keys[0].values())) == len(keys[0])  # and no two jobs share a key


def test_a_stage_cannot_read_a_setting_it_does_not_declare():
    p = pf.load(EXAMPLE)
    jobs = plan(p, ["validate"])
    cfg = stage_config(p, jobs[-1])
    assert cfg.get("run.prompt") == p.run["prompt"]  # validate declares the prompt
    with pytest.raises(StudioError, match="does not declare"):
        cfg.get("run.max_new_tokens")
    assert set(cfg.settings) == set(STAGES["validate"].settings)
    # file references are hashed by content, never by path
    assert "files" not in cfg.hashed["validation.heldout_text"]
    assert set(cfg.hashed["validation.heldout_text"]) == {"sha256"}
    assert str(cfg.path("validation.heldout_text")).endswith(".txt")
