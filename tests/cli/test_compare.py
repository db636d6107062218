"""`studio compare` on two real runs of the sample project (the real simulator): W8A16, then
W8A8. The comparison names the changed recipe and the accuracy deltas; the second run's
report carries the same comparison."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from studio.core import project as projectfile
from tests.cli.conftest import share_store, studio

pytestmark = pytest.mark.slow

STAGES = "validate,report"


def _scheme(f: Path, scheme: str) -> None:
    p = projectfile.load(f)
    p.quantization.update(scheme=scheme)
    projectfile.save(p)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, batch_run, small_project):
    """The small sample project run twice (validate and the report): W8A16, then W8A8. It
    starts from a copy of the shared small project's artifact store (not its run history),
    so the W8A16 stages come from the cache and only W8A8 is computed."""
    f = tmp_path_factory.mktemp("compare") / "cmp.qstudio"
    f.write_text(small_project.read_text())
    share_store(small_project, f)
    seconds = []
    for scheme in ("W8A16", "W8A8"):
        _scheme(f, scheme)
        t0 = time.perf_counter()
        r = studio("--batch", f, "--stages", STAGES, "--json", "--quiet")
        seconds.append(time.perf_counter() - t0)
        assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: a gate failed (W8A8 may)
        assert json.loads(r.stdout)["state"] == "succeeded"
    print(f"two runs: {seconds[0]:.0f}s + {seconds[1]:.0f}s")
    return f


def test_compare_json_lists_the_recipe_change_and_the_accuracy_deltas(two_runs):
    r = studio("compare", two_runs, "--json")
    assert r.returncode == 0, r.stderr
    comp = json.loads(r.stdout)
    assert (comp["run_a"]["id"], comp["run_b"]["id"]) == (1, 2)
    assert comp["settings_recorded"]
    assert {"key": "quantization.scheme", "a": "W8A16", "b": "W8A8"} in comp["settings"]
    top1 = [m for m in comp["metrics"] if m["name"] == "top1_agreement"]
    assert top1 and all(m["source"] == "simulated" and m["device"] == "htp-sim" for m in top1)
    for m in top1:
        assert m["a"] is not None and m["b"] is not None
        assert m["delta"] == pytest.approx(m["b"] - m["a"])
    # one run given: that run against the newest
    one = json.loads(studio("compare", two_runs, "1", "--json").stdout)
    assert (one["run_a"]["id"], one["run_b"]["id"]) == (1, 2)
    # given explicitly, the same runs the other way round
    back = json.loads(studio("compare", two_runs, "2", "1", "--json").stdout)
    assert {"key": "quantization.scheme", "a": "W8A8", "b": "W8A16"} in back["settings"]
    b1 = next(m for m in back["metrics"] if m["name"] == "top1_agreement")
    assert b1["delta"] == pytest.approx(-top1[0]["delta"])


def test_compare_text_names_the_change_and_the_metrics(two_runs):
    r = studio("compare", two_runs)
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    lines = r.stdout.splitlines()
    assert lines[0] == "run 2 vs run 1"
    assert "  quantization.scheme: 'W8A16' → 'W8A8'" in lines
    # the catalogue's title, where and way of writing the figure, as the pages write it
    top1 = next(ln for ln in lines if ln.strip().startswith("top-1 agreement with FP32 "))
    assert "simulated" in top1 and "HTP simulator · " in top1 and "→" in top1
    assert re.search(r"\d+\.\d% → \d+\.\d%", top1)
    # an unchanged figure's change is 0, never -0
    assert not any(re.search(r"(?<![\w.])[-−]0(\.0+)?(\s|%|$)", ln) for ln in lines)
    ppl = next(ln for ln in lines if ln.strip().startswith("perplexity, FP32 "))
    assert "measured" in ppl and "host CPU" in ppl
    # a figure only one run has (a stage the other run took from the cache) says so
    for ln in lines:
        if "→ —" in ln:
            assert ln.rstrip().endswith("only in run 1"), ln
        if "— →" in ln:
            assert ln.rstrip().endswith("only in run 2"), ln


def test_the_second_report_compares_with_the_first(two_runs):
    reports = two_runs.with_suffix(".studio") / "reports"
    data = json.loads((reports / "latest.json").read_text())
    assert data["comparison"]["run_a"]["id"] == 1 and data["comparison"]["run_b"]["id"] == 2
    assert [s["key"] for s in data["comparison"]["settings"]] == ["quantization.scheme"]
    html = (reports / "latest.html").read_text()
    assert "<h2>Compared with run 1</h2>" in html
    assert "<code>quantization.scheme</code></td><td>W8A16</td><td>W8A8</td>" in html


def test_info_names_the_run_of_the_latest_figures(two_runs):
    r = studio("info", two_runs)
    assert r.returncode == 0, r.stderr
    assert "latest figures (run 2):" in r.stdout
    assert "run 2: succeeded" in r.stdout and "run 1: succeeded" in r.stdout
