"""`studio overrides export / import`: per-tensor precision as QNN / AIMET encodings JSON."""

from __future__ import annotations

import json

import pytest

from studio.core.errors import StudioError
from tests.cli.conftest import share_store, studio


@pytest.mark.slow
def test_encodings_export_then_import_into_another_recipe(batch_run, small_project, tmp_path):
    enc = tmp_path / "w8a16.json"
    r = studio("overrides", "export", small_project, enc)
    assert r.returncode == 0, r.stderr
    data = json.loads(enc.read_text())
    assert data["version"] == "0.6.1" and data["param_encodings"] and data["activation_encodings"]
    # a W8A8 copy of the project takes the W8A16 file's precisions as overrides
    copy = tmp_path / "copy.qstudio"
    copy.write_text(small_project.read_text().replace('scheme = "W8A16"', 'scheme = "W8A8"'))
    r = studio("overrides", "import", copy, enc)
    assert r.returncode == 2 and "no export result" in r.stderr  # nothing to map onto yet
    share_store(small_project, copy)  # the export is the small project's: from the cache
    assert studio("--batch", copy, "--stages", "export", "--quiet").returncode == 0
    r = studio("overrides", "import", copy, enc)
    assert r.returncode == 0, r.stderr
    assert "override(s)" in r.stdout and "= INT16" in r.stdout
    # 16-bit biases and RoPE tables of a W8A16 file have no rule on a W8A8 recipe: reported
    assert "no rule can name" in r.stderr and "bias" in r.stderr
    r = studio("--batch", copy, "--stages", "quantize", "--quiet")
    assert r.returncode == 0, r.stderr
    back = tmp_path / "back.json"
    assert studio("overrides", "export", copy, back).returncode == 0
    again = json.loads(back.read_text())

    def bits(d, section, keep=lambda k: True):
        return {k: v[0]["bitwidth"] for k, v in d[section].items() if keep(k)}

    w = lambda k: k.endswith(".weight")  # noqa: E731
    assert bits(again, "param_encodings", w) == bits(data, "param_encodings", w)
    mm = lambda k: k.endswith("MatMul_output_0")  # noqa: E731
    assert bits(again, "activation_encodings", mm) == bits(data, "activation_encodings", mm)
    assert set(bits(data, "activation_encodings", mm).values()) == {16}


def test_a_file_that_is_not_an_encodings_file_is_refused(batch_run, small_project, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    r = studio("overrides", "import", small_project, bad)
    assert r.returncode == 2
    assert "is not an encodings file" in r.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_auto_precision_rules_are_adopted_into_the_recipe(sensitivity_run, small_project,
                                                           tmp_path):
    """sensitivity → autoprecision (target: the W8A8 base's cosine, a hair higher) →
    `studio overrides adopt`: the rules land in quantization.overrides, where studio info
    shows them as what sets those layers. The sensitivity settings are the session's shared
    sensitivity project's (tests/conftest.py: sensitivity_run), so its export and sensitivity
    come from the cache; the autoprecision stage runs."""
    f = tmp_path / "auto.qstudio"
    f.write_text(small_project.read_text().replace('scheme = "W8A16"', 'scheme = "W8A8"')
                 + "\n[sensitivity]\nheldout_tokens = 96\n")
    share_store(sensitivity_run[0], f)
    r = studio("overrides", "adopt", f)
    assert r.returncode == 2 and "no autoprecision result" in r.stderr
    r = studio("--batch", f, "--stages", "sensitivity", "--json")
    assert r.returncode == 0, r.stderr
    jobs = {j["stage"]: j for j in json.loads(r.stdout)["jobs"]}
    assert jobs["export"]["cached"] and jobs["sensitivity"]["cached"], jobs
    info = json.loads(studio("info", f, "--json").stdout)
    base = next(m["value"] for m in info["latest_metrics"] if m["name"] == "logits_cosine_base")
    f.write_text(f.read_text() + f'\n[autoprecision]\nmetric = "cosine"\n'
                 f"min_logits_cosine = {base + 1e-6!r}\n")
    r = studio("--batch", f, "--stages", "autoprecision", "--quiet")
    assert r.returncode == 0, r.stderr
    r = studio("overrides", "adopt", f)
    assert r.returncode == 0, r.stderr
    rules = {line.split(" = ")[0].strip(): line.split(" = ")[1].strip()
             for line in r.stdout.splitlines()[1:]}
    assert rules and set(rules.values()) == {"INT16"}, r.stdout
    info = json.loads(studio("info", f, "--json").stdout)
    assert info["quantization"]["overrides"] == rules
    by = {row["layer"]: row for row in info["layers"]}
    for pattern in rules:
        assert by[pattern]["activation"] == "INT16"
        assert by[pattern]["activation_rule"] == f"override {pattern!r}"
    # adopting again changes nothing
    before = f.read_text()
    assert studio("overrides", "adopt", f).returncode == 0 and f.read_text() == before


def test_a_ladder_is_built_from_the_current_sensitivity_result(sensitivity_run):
    """The ladder's rungs (read, nothing run): rung k raises the k layers whose raise alone
    gained most, to the result's high precision, over the project's own overrides; layers
    that gained nothing are not rungs."""
    from studio.core import project as pf
    from studio.engine.sensitivity import raise_ranking, rule_for
    from studio.services.sensitivity import ladder, sensitivity_result
    from studio.services.session import Studio

    project = pf.load(sensitivity_run[0])
    project.quantization["overrides"] = {"model.layers.0.mlp.up_proj": "INT16"}
    session = Studio(project)
    try:
        data = sensitivity_result(project, session.jobs, session.store)["data"]
        rungs = ladder(project, session.jobs, session.store, 3)
        with pytest.raises(StudioError, match="at least one rung"):
            ladder(project, session.jobs, session.store, 0)
    finally:
        session.close()
    ranking, gains = raise_ranking(data)
    top = [n for n in ranking if gains[n] > 0][:3]
    assert len(top) == 3 and gains[top[0]] >= gains[top[1]] >= gains[top[2]] > 0
    want = [rule_for(n, data["high"], data["scheme"]) for n in top]
    assert len(rungs) == 4 and rungs[0] == {"quantization.overrides": project.quantization[
        "overrides"]}  # rung 0: the recipe as it is
    for k, point in enumerate(rungs[1:], start=1):
        ov = point["quantization.overrides"]
        assert list(ov)[-k:] == want[:k] and {ov[p] for p in want[:k]} == {data["high"]}
        # the project's own rule stays, before the rung's (the last matching pattern wins)
        if "model.layers.0.mlp.up_proj" not in want[:k]:
            assert list(ov)[0] == "model.layers.0.mlp.up_proj"


@pytest.mark.slow
def test_a_ladder_sweep_measures_each_rung_with_the_real_stages(sensitivity_run, small_project,
                                                                 tmp_path):
    """`studio sweep --ladder 1`: refused in one line without a sensitivity result, or with
    one for other settings; with the current one, rung 0 (the recipe as it is) and rung 1
    go through quantize, compile and validate on the HTP simulator like any sweep point,
    and the exit code says whether a rung passed every gate (lower rungs failing is what a
    ladder measures)."""
    text = (small_project.read_text().replace('scheme = "W8A16"', 'scheme = "W8A8"')
            .replace("heldout_tokens = 96", "heldout_tokens = 32")
            .replace("greedy_tokens = 8", "greedy_tokens = 2")
            + "\n[sensitivity]\nheldout_tokens = 96\n")
    f = tmp_path / "ladder.qstudio"
    f.write_text(text)
    r = studio("sweep", f, "--ladder", "1")
    assert r.returncode == 2 and "no sensitivity result" in r.stderr.strip().splitlines()[-1]
    share_store(sensitivity_run[0], f)
    r = studio("--batch", f, "--stages", "sensitivity", "--json")
    assert r.returncode == 0, r.stderr
    assert {j["stage"]: j["cached"] for j in json.loads(r.stdout)["jobs"]}["sensitivity"]
    f.write_text(text.replace('scheme = "W8A8"', 'scheme = "W8A16"'))
    r = studio("sweep", f, "--ladder", "1")
    assert r.returncode == 2
    assert "computed for other settings: scheme 'W8A8' → 'W8A16'" in r.stderr
    f.write_text(text)
    r = studio("sweep", f, "--ladder", "1", "--stages", "quantize,compile,validate", "--json")
    out = json.loads(r.stdout)
    assert out["name"] == "ladder" and len(out["points"]) == 2, r.stderr[-2000:]
    base, rung = out["points"]
    assert r.returncode == (0 if out["best"] is not None else 1), r.stderr[-2000:]
    assert base["settings"]["quantization.overrides"] == {}  # rung 0: the recipe as it is
    (rule,) = rung["settings"]["quantization.overrides"].items()
    assert rule[1] == "INT16"  # W8A8's raise: the layer's activations to 16 bits
    for point in (base, rung):
        assert point["state"] in ("succeeded", "failed"), point
        assert point["accuracy"]["source"] == "simulated" and 0 < point["accuracy"]["value"] <= 1
        assert point["context_bytes"]["source"] == "measured"
