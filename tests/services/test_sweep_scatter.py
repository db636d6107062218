"""The sweep report's plot: the run report's Pareto chart, each axis naming the source of its
figures (taken from the points, not written in)."""

from __future__ import annotations

from studio.services.sweep_report import scatter_svg


def _pt(label, acc, size, state="succeeded", source="simulated"):
    return {"label": label, "settings": {"quantization.scheme": "W8A8"}, "state": state,
            "reason": "", "run_id": 1, "accuracy": {"value": acc, "source": source},
            "size": {"value": size, "source": "measured", "title": "context binaries"}}


def test_the_axes_carry_the_points_sources_and_every_point_is_drawn():
    rec = {"pareto_front": [0, 1], "best": 1, "accuracy_title": "top-1 agreement",
           "points": [_pt("p1", 0.9, 9e6), _pt("p2", 0.97, 8e6, source="measured"),
                      _pt("p3", 0.8, 10e6, "failed")]}
    svg = scatter_svg(rec)
    assert "context binaries MiB (measured)" in svg
    assert "top-1 agreement (measured, simulated)" in svg
    assert svg.count("<circle") == 4  # three points and the best one's ring
    assert "polyline" in svg  # the front, p1 and p2, joined


def test_no_point_with_both_figures_is_said_not_drawn():
    rec = {"pareto_front": [], "best": None, "points": [
        {**_pt("p1", 0.9, 9e6), "accuracy": None}]}
    assert scatter_svg(rec) == "<p>No point has both an accuracy and a size yet.</p>"
