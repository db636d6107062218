"""`studio overrides export / import`: per-tensor precision as QNN / AIMET encodings JSON."""

from __future__ import annotations

import json

import pytest

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
