"""The report's sweep section from a sweep recorded in a real run history (SQLite): the
points, the Pareto front the core computes, the best point, drawn as an inline SVG scatter
with each axis' source; and the JSON with it validates against the report schema."""

from __future__ import annotations

import json

import jsonschema

from studio.core import project as projectfile
from studio.core.jobs import JobStore
from studio.core.sweep import Point
from studio.engine.report import build_report, render_html, render_markdown
from studio.services import reports

TARGET = "snapdragon-8-gen-3"


def _figures(accuracy: float, size: int, passed: bool) -> dict:
    return {"accuracy": {"value": accuracy, "source": "simulated", "target": TARGET},
            "size": {"value": size, "source": "measured", "target": TARGET,
                     "title": "context binaries"},
            "gates_passed": passed}


def test_the_report_draws_the_pareto_front_of_the_project_sweeps(tmp_path):
    project = projectfile.new_project("rep", "sample:tiny-coder", [TARGET])
    project.path = tmp_path / "rep.qstudio"
    jobs = JobStore(tmp_path / "runs.sqlite")
    jobs.start_sweep("grid", {"name": "grid", "axes": {
        "quantization.scheme": ["W8A16", "W8A8"],
        "quantization.weight_granularity": ["per_channel", "per_tensor"]}}, "local")
    # (settings, accuracy, size, gates passed): the third is both less accurate and larger
    # than the second, so it is off the front; the fourth did not finish
    rows = [({"quantization.scheme": "W8A16", "quantization.weight_granularity": "per_channel"},
             0.99993, 10 * 2**20, True),
            ({"quantization.scheme": "W8A8", "quantization.weight_granularity": "per_channel"},
             0.99960, 8 * 2**20, False),
            ({"quantization.scheme": "W8A8", "quantization.weight_granularity": "per_tensor"},
             0.99950, 9 * 2**20, False)]
    for i, (settings, acc, size, passed) in enumerate(rows):
        p = Point(i, settings)
        jobs.set_point("grid", p.id, i, settings, "succeeded" if passed else "failed",
                       "" if passed else "gate min_top1_agreement", None, "",
                       _figures(acc, size, passed))
    last = Point(3, {"quantization.scheme": "W8A16",
                     "quantization.weight_granularity": "per_tensor"})
    jobs.set_point("grid", last.id, 3, last.settings, "running")
    jobs.finish_sweep("grid", "cancelled")

    fronts = reports.sweep_fronts(project, jobs)
    jobs.close()
    assert [s["name"] for s in fronts] == ["grid"]
    points = fronts[0]["points"]
    assert [p["front"] for p in points] == [True, True, False, False]
    assert [p["best"] for p in points] == [True, False, False, False]
    assert [p["passed"] for p in points] == [True, False, False, False]
    assert fronts[0]["accuracy_source"] == "simulated" and fronts[0]["size_source"] == "measured"

    data = build_report(project, {}, sweeps=fronts)
    jsonschema.validate(json.loads(json.dumps(data)),
                        json.loads(reports.SCHEMA_PATH.read_text()))
    html = render_html(data)
    start = html.index("<h2>Sweep grid")
    section = html[start:html.index("<h2>", start + 4)]
    assert 'class="badge" style="background:#8a5a00">simulated<' in section
    svg = section[section.index("<svg"):section.index("</svg>")]
    # three placed points (the running one has no figures), the best ringed, the front joined
    assert svg.count("<circle") == 3 + 1 and svg.count("<polyline") == 1
    assert "context binaries MiB (measured)" in svg and "(simulated)" in svg
    assert "p4" in section and "running" in section
    # the sweeps are looked at: the report does not call them missing
    assert "<b>Sweeps</b>" not in html
    md = render_markdown(data)
    assert "Sweep grid: 4 points, 2 on the Pareto front" in md and "best by smallest: p1" in md


def test_a_report_without_sweeps_says_so(tmp_path):
    project = projectfile.new_project("rep", "sample:tiny-coder", [TARGET])
    html = render_html(build_report(project, {}, sweeps=[]))
    assert "<b>Sweeps</b>: the project has no recorded sweep" in html
    assert "<b>Op breakdown</b>: this run has no profile stage result" in html
    assert "<svg" not in html  # no data, no empty chart
