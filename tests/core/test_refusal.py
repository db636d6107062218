"""What the target HTP can run: one rule (``core.recipe.refusal``) for the Precision page, its
rule table and anyone else (CLI, preflight)."""

from __future__ import annotations

import pytest

from studio.core.catalog import get_chip
from studio.core.recipe import override_part, override_refusal, refusal

GEN3, NO_FP16 = get_chip("snapdragon-8-gen-3"), get_chip("qcm6490")


def test_the_catalog_has_a_chip_without_float():
    assert GEN3.fp16 and not NO_FP16.fp16


@pytest.mark.parametrize("part, prec, kw, needle", [
    ("activations", "INT4", {}, "INT4 is for weights only"),
    ("layer", "INT4", {}, "INT4 is for weights only"),
    ("weights", "FP16", {}, "weights alone cannot be float"),
    ("weights", "INT8", {"has_weight": False}, "has no weights"),
    ("layer", "FP16", {"chips": [GEN3, NO_FP16]}, "QCM6490 (qcm6490)"),
    ("layer", "FP32", {"chips": [NO_FP16]}, "fp16 = false"),
    ("activations", "INT8", {"scheme": "FP16"}, "FP16 scheme"),
    ("activations", "INT2", {}, "is not one of"),
    ("bias", "INT8", {}, "unknown part"),
])
def test_refused_choices_say_why(part, prec, kw, needle):
    why = refusal(part, prec, **kw)
    assert why and needle in why


@pytest.mark.parametrize("part, prec, kw", [
    ("weights", "INT4", {}),
    ("weights", "INT16", {"chips": [NO_FP16]}),
    ("activations", "INT8", {"has_weight": False}),
    ("layer", "FP16", {"chips": [GEN3]}),
    ("layer", "INT16", {"chips": [NO_FP16], "scheme": "W8A8"}),
])
def test_what_the_htp_runs_is_not_refused(part, prec, kw):
    assert refusal(part, prec, **kw) is None


def test_override_rules_are_read_as_the_quantizer_reads_them():
    assert override_part("*.down_proj", "INT16") == "activations"
    assert override_part("*.down_proj", "INT4") == "weights"
    assert override_part("*.down_proj.weight", "INT8") == "weights"
    assert override_part("lm_head", "FP32") == "layer"
    layers = {"model.layers.0.mlp.down_proj": True, "model.layers.0.residual": False,
              "model.layers.1.residual": False}
    assert override_refusal("*.down_proj", "FP16", layers, [GEN3]) is None
    why = override_refusal("*.down_proj", "FP16", layers, [NO_FP16])
    assert why.startswith("'*.down_proj' = FP16: ") and "qcm6490" in why
    why = override_refusal("*.residual", "INT4", layers)
    assert "sets weights" in why and "2 layer(s)" in why and "model.layers.0.residual" in why
    assert override_refusal("*.residual", "INT8", layers) is None
    assert override_refusal("no.such.layer.weight", "INT4", layers) is None  # unmatched: not here
    assert "empty" in override_refusal(" ", "INT8", layers)
