"""The report's "Compared with run N" section, from a real comparison of two runs recorded in
a real run history (SQLite), and its plain statement when there is no previous run."""

from __future__ import annotations

import json

import pytest

from studio.core import project as projectfile
from studio.core.compare import compare_with_previous
from studio.core.jobs import JobStore
from studio.core.metrics import Metric
from studio.engine.report import write_report

TARGET = "snapdragon-8-gen-3"


def _project(tmp_path, scheme: str):
    p = projectfile.new_project("rep", "sample:tiny-coder", [TARGET],
                                quantization={"scheme": scheme})
    p.path = tmp_path / "rep.qstudio"
    return p


def _record_run(store: JobStore, project, metrics: list[Metric]) -> int:
    """One finished run the way the pipeline records it: its settings, a validate job and
    the job's metrics."""
    run = store.create_run({"stages": ["validate"], "targets": [TARGET],
                            "settings": project.to_dict()})
    job = store.add_job(run, "validate", TARGET)
    store.update_job(job, state="succeeded", progress=1.0, result={"summary": "ok"})
    store.add_metrics(job, metrics)
    store.finish_run(run, "succeeded")
    return run


def _validate_metrics(top1: float, cos: float, ppl: float) -> list[Metric]:
    return [
        Metric("top1_agreement", top1, "fraction", "simulated", "htp-sim", TARGET),
        Metric("logits_cosine_mean", cos, "", "simulated", "htp-sim", TARGET),
        Metric("perplexity_host_qdq", ppl, "", "measured", "host-cpu"),
    ]


@pytest.fixture
def two_runs(tmp_path):
    store = JobStore(tmp_path / "runs.sqlite")
    first = _project(tmp_path, "W8A16")
    second = _project(tmp_path, "W8A8")
    a = _record_run(store, first, _validate_metrics(0.96875, 0.9990, 70.0))
    b = _record_run(store, second, _validate_metrics(0.90625, 0.9950, 75.5))
    yield store, second, a, b
    store.close()


def test_report_shows_the_comparison_with_the_previous_run(two_runs, tmp_path):
    store, project, a, b = two_runs
    comparison = compare_with_previous(store, b)
    assert comparison is not None and comparison["run_a"]["id"] == a
    out = tmp_path / "report"
    out.mkdir()
    html_path, json_path = write_report(project, {}, out, comparison)

    data = json.loads(json_path.read_text())
    assert data["comparison"]["run_a"]["id"] == a and data["comparison"]["run_b"]["id"] == b
    assert [s["key"] for s in data["comparison"]["settings"]] == ["quantization.scheme"]

    html = html_path.read_text()
    section = html[html.index(f"<h2>Compared with run {a}</h2>"):]
    section = section[:section.index("<h2>", 4)]
    # the changed setting, old and new
    assert "<code>quantization.scheme</code></td><td>W8A16</td><td>W8A8</td>" in section
    # each metric with both values, the delta, the relative change, its source badge
    row = next(r for r in section.split("<tr>") if r.startswith("<td>top1_agreement<"))
    assert f"htp-sim / {TARGET}" in row
    assert "0.9688 fraction" in row and "0.9062 fraction" in row
    assert "-0.0625" in row and "-6.45%" in row
    assert 'class="badge" style="background:#8a5a00">simulated<' in row
    assert "worse" in row
    ppl = next(r for r in section.split("<tr>") if r.startswith("<td>perplexity_host_qdq<"))
    assert ">measured<" in ppl and "+5.5" in ppl and "+7.86%" in ppl and "worse" in ppl
    assert section.count("<tr>") == 1 + 1 + 1 + 3  # two header rows, one setting, 3 metrics


def test_an_improvement_is_marked_better(tmp_path):
    store = JobStore(tmp_path / "runs.sqlite")
    p = _project(tmp_path, "W8A8")
    _record_run(store, p, _validate_metrics(0.90, 0.995, 75.0))
    b = _record_run(store, p, _validate_metrics(0.95, 0.997, 71.0))
    comparison = compare_with_previous(store, b)
    store.close()
    html_path, _ = write_report(p, {}, tmp_path, comparison)
    html = html_path.read_text()
    for name in ("top1_agreement", "perplexity_host_qdq"):
        row = next(r for r in html.split("<tr>") if r.startswith(f"<td>{name}<"))
        assert "better" in row and "worse" not in row, name
    assert "No setting changed since run 1" in html


def test_first_run_says_there_is_nothing_to_compare_with(tmp_path):
    store = JobStore(tmp_path / "runs.sqlite")
    p = _project(tmp_path, "W8A16")
    a = _record_run(store, p, _validate_metrics(0.96875, 0.999, 70.0))
    comparison = compare_with_previous(store, a)
    store.close()
    assert comparison is None
    html_path, json_path = write_report(p, {}, tmp_path, comparison)
    assert json.loads(json_path.read_text())["comparison"] is None
    html = html_path.read_text()
    assert "<h2>Compared with the previous run</h2>" in html
    assert "No previous run with results" in html and "Compared with run" not in html


def test_the_report_lists_the_layers_an_override_changed(tmp_path):
    from studio.engine.report import render_layers

    base = "scheme W8A8 (per_channel)"
    layers = [
        {"layer": "model.layers.0.mlp.down_proj", "weight": "INT8", "activation": "INT16",
         "weight_rule": base, "activation_rule": "override '*.down_proj'"},
        {"layer": "model.layers.0.mlp.up_proj", "weight": "INT8", "activation": "INT8",
         "weight_rule": base, "activation_rule": base},
    ]
    html = render_layers(layers)
    assert "2 weighted layers" in html and "1 by the scheme, 1 by an override" in html
    assert "model.layers.0.mlp.down_proj" in html and "up_proj" not in html
    assert ("override &#39;*.down_proj&#39;" in html or "override &#x27;*.down_proj&#x27;" in html
            or "override '*.down_proj'" in html)
    assert render_layers([]) == ""


def test_the_comparison_chart_falls_back_to_the_figures_both_runs_share():
    from studio.engine.report import _comparison_rows

    def m(name, a, b):
        return {"name": name, "device": "host-cpu", "target": "", "a": a, "b": b}

    comp = {"metrics": [m("kl_divergence_base", 0.1, 0.2), m("export_seconds", None, 3.0)]}
    # a partial run shares no headline figure: the chart draws what both runs have
    assert _comparison_rows({"comparison": comp, "targets": ["x"]}) == [
        ("kl_divergence_base (host-cpu)", 0.1, 0.2)]
    comp["metrics"].append(m("decode_tokens_per_s", 10.0, 12.0))
    assert [r[0] for r in _comparison_rows({"comparison": comp, "targets": ["x"]})] == [
        "decode_tokens_per_s (host-cpu)"]
