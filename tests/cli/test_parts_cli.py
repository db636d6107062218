"""``export.parts = 2`` through the pipeline: the sample in two parts gives the one-part
run's tokens on the host CPU and on the HTP simulator, and the one-part validation figures;
a stage not built for parts says so in one line."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_two_parts_run_and_validate_as_one(tmp_path, batch_run, small_project):
    _, whole = batch_run
    f = tmp_path / "parts.qstudio"
    f.write_text(SMALL.format(target=default_target()).replace(
        "context_length = 64", "context_length = 64\nparts = 2"))
    r = studio("--batch", f, "--stages", "validate,run", "--json")
    assert r.returncode in (0, 1), r.stderr[-3000:]
    parts = json.loads(r.stdout)
    export = next(j for j in parts["jobs"] if j["stage"] == "export")
    assert "2 parts" in export["summary"]
    tokens, one = _runs(f), _runs(small_project)
    assert set(tokens) == {"cpu", f"htp-sim:{default_target()}"}
    for device, ids in tokens.items():
        assert ids == one[device], device
    figures = {(m["name"], m["target"]): m["value"] for m in parts["metrics"]
               if m["name"] in ("logits_cosine_mean", "perplexity_quantized", "top1_agreement",
                                    "greedy_agreement", "perplexity_fp32")}
    assert len(figures) == 5, figures
    for (name, target), value in figures.items():
        ref = next(m["value"] for m in whole["metrics"]
                   if m["name"] == name and m["target"] == target)
        assert abs(value - ref) < 1e-3 * max(1.0, abs(ref)), (name, value, ref)

    r = studio("--batch", f, "--stages", "layerdiff")
    assert r.returncode == 2
    assert "the layer diff stage does not take a model exported in parts yet" in r.stderr
