"""A sample's own precision rules: MiniLM starts with its feed-forward outputs in FP16 where
the targets run float on their HTP, and with none where one of them does not."""

from __future__ import annotations

from studio.core.catalog import get_chip
from studio.core.samples import sample_overrides
from studio.services.session import Studio


def test_minilm_starts_with_its_outlier_blocks_in_fp16_where_the_targets_run_float(tmp_path):
    rules = {"/model/encoder/layer.*/output/*": "FP16"}
    assert sample_overrides("sample:minilm", [get_chip("snapdragon-8-gen-3")]) == rules
    assert sample_overrides("sample:minilm", [get_chip("snapdragon-8-gen-3"),
                                              get_chip("qcm6490")]) == {}  # no float there
    assert sample_overrides("sample:tiny-coder", [get_chip("snapdragon-8-gen-3")]) == {}
    s = Studio.create(tmp_path / "m.qstudio", "sample:minilm")
    assert s.project.quantization["overrides"] == rules
    s.close()
    s = Studio.create(tmp_path / "old.qstudio", "sample:minilm", ["qcm6490"])
    assert s.project.quantization["overrides"] == {}
    s.close()
    given = {"quantization": {"overrides": {"/model/embeddings/*": "FP16"}}}
    s = Studio.create(tmp_path / "own.qstudio", "sample:minilm", **given)
    assert s.project.quantization["overrides"] == {"/model/embeddings/*": "FP16"}
    s.close()
