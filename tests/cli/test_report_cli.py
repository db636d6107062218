"""``studio report``: the report of any run of the history as HTML, Markdown, PDF or JSON,
from a real finished run (the shared batch run, copied, plus a second run served by the
cache), and one line with exit code 2 for each kind of bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import jsonschema
import pytest

from tests.cli.conftest import ROOT, studio
from tests.conftest import copy_store

pytestmark = pytest.mark.slow

SCHEMA = json.loads((ROOT / "resources/schemas/report-1.schema.json").read_text())


def studio_main(*args):
    """``python -m studio``: the entry point that hands the command line its PDF printer."""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "studio", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def two_runs(batch_run, small_project, tmp_path_factory):
    """A copy of the batch-run project with two more whole-pipeline runs (every stage from
    the cache; the shared project's newest run may be another test's partial one):
    (project file, [newest run, older run])."""
    from studio.core.jobs import JobStore
    from studio.services.history import runs_with_results

    d = tmp_path_factory.mktemp("reported")
    f = d / small_project.name
    shutil.copy2(small_project, f)
    copy_store(small_project.with_suffix(".studio"), f.with_suffix(".studio"),
                    ignore=shutil.ignore_patterns("run.lock", "*.lock"))
    for _ in range(2):
        r = studio("--batch", f, "--quiet")
        assert r.returncode in (0, 1), r.stderr[-2000:]
    jobs = JobStore(f.with_suffix(".studio") / "runs.sqlite")
    ids = runs_with_results(jobs)
    jobs.close()
    assert len(ids) >= 2
    return f, ids


def test_the_json_report_validates_and_names_its_schema(two_runs, tmp_path):
    f, ids = two_runs
    out = tmp_path / "r.json"
    r = studio("report", f, "--format", "json", "--out", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    data = json.loads(out.read_text())
    jsonschema.validate(data, SCHEMA)
    assert data["$schema"] == SCHEMA["$id"] and data["schema_version"] == 1
    # the newest run, compared with the one before it
    assert data["run"]["id"] == ids[0] and data["comparison"]["run_a"]["id"] == ids[1]
    assert all(m["source"] in ("measured", "simulated") for m in data["metrics"])
    # the report stage's own JSON (published by the pipeline) follows the same schema
    latest = json.loads((f.with_suffix(".studio") / "reports/latest.json").read_text())
    jsonschema.validate(latest, SCHEMA)
    assert latest["run"]["id"] == ids[0] and latest["figures"]["sweeps"] == []
    # the deployable binaries, each marked with how it was checked
    (binaries,) = data["figures"]["binaries"]
    checked = {b["file"]: b["checked"] for b in binaries["rows"]}
    assert checked["decode_ar1_cl65.bin"] == "executed on the HTP simulator"
    assert checked["weight_shared_ar16_ar1_cl65.bin"] == (
        "checked by structure only: a device executes it")


def test_the_markdown_has_the_gates_table_and_the_comparison(two_runs, tmp_path):
    f, ids = two_runs
    r = studio("report", f, "--format", "md", "--out", tmp_path / "r.md")
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "r.md").read_text()
    assert studio("report", f, "--format", "json", "--out", tmp_path / "r.json").returncode == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert "| gate | target | binaries | value | source | threshold | result |" in md
    assert "| compiled (validate) |" in md
    for g in data["gates"]:
        row = next(line for line in md.splitlines() if line.startswith(f"| {g['gate']} |"))
        assert g["target"] in row and ("pass" if g["passed"] else "FAIL") in row
        assert f"| {g['source']} |" in row and g["source"] == "simulated"
    assert "## Headline figures" in md and "| simulated |" in md and "| measured |" in md
    assert f"## Compared with run {ids[1]}" in md
    # a simulator timing is never called latency of the device
    sim = [line for line in md.splitlines() if "| decode speed |" in line
           and "| simulated |" in line]
    assert sim and all("not device latency" in line for line in sim)


def test_the_html_is_self_contained_and_draws_the_charts_it_has_data_for(two_runs, tmp_path):
    f, ids = two_runs
    r = studio("report", f)
    assert r.returncode == 0, r.stderr
    out = f.with_suffix(".studio") / "reports" / f"run-{ids[0]}.html"
    assert r.stdout.strip() == str(out)
    html = out.read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I)
    assert "<link" not in html and "<script" not in html and "@import" not in html

    def section(title: str) -> str:
        start = html.index(title)
        return html[start:html.index("<h2>", start + 4)]

    assert "<svg" in section("<h2>Op breakdown") and "simulated" in section("<h2>Op breakdown")
    assert "<svg" in section(f"<h2>Compared with run {ids[1]}</h2>")
    assert "<svg" in section("<h3>Decode latency per step</h3>")
    # what this run has no data for is said, not drawn as an empty box
    missing = section("<h2>Not in this report</h2>")
    for name in ("Optimization waterfall", "Per-layer sensitivity", "Sweeps"):
        assert f"<b>{name}</b>:" in missing
    assert "<h2>Optimization waterfall" not in html and "<h2>Per-layer sensitivity" not in html


def test_the_pdf_is_printed_by_qt(two_runs, tmp_path):
    f, _ = two_runs
    out = tmp_path / "r.pdf"
    r = studio_main("report", f, "--format", "pdf", "--out", out)
    assert r.returncode == 0, r.stderr
    pdf = out.read_bytes()
    assert pdf.startswith(b"%PDF")
    pages = len(re.findall(rb"/Type\s*/Page\b(?!s)", pdf))
    assert pages >= 2 and re.search(rb"/Count %d\b" % pages, pdf)
    assert b"/Subtype /Image" in pdf  # the charts, drawn from their SVG
    # the command line alone (no Qt) says where a PDF can be printed
    r = studio("report", f, "--format", "pdf", "--out", tmp_path / "no.pdf")
    assert r.returncode == 2 and "python -m studio" in r.stderr
    assert not (tmp_path / "no.pdf").exists()


def test_an_older_run_can_be_reported(two_runs, tmp_path):
    f, ids = two_runs
    r = studio("report", f, "--run", ids[1], "--format", "json")
    assert r.returncode == 0, r.stderr
    out = f.with_suffix(".studio") / "reports" / f"run-{ids[1]}.json"
    data = json.loads(out.read_text())
    jsonschema.validate(data, SCHEMA)
    assert data["run"]["id"] == ids[1]
    assert data["comparison"] is None or data["comparison"]["run_b"]["id"] == ids[1]
    assert {"export", "quantize"} <= set(data["stages"]) and "report" not in data["stages"]


def test_bad_input_is_one_line_and_exit_code_2(two_runs, tmp_path):
    from studio.core.jobs import JobStore

    f, ids = two_runs
    # a run that recorded no result: its only job failed
    jobs = JobStore(f.with_suffix(".studio") / "runs.sqlite")
    bare = jobs.create_run({"stages": ["export"], "settings": None})
    job = jobs.add_job(bare, "export", "")
    jobs.update_job(job, state="failed", error="boom")
    jobs.finish_run(bare, "failed")
    jobs.close()
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    fresh = tmp_path / "fresh.qstudio"
    shutil.copy2(f, fresh)
    cases = {
        "is not in this project's history": ("--run", max(ids) + 100),
        f"run {bare} has no results": ("--run", bare),
        "choose one of html, md, pdf, json": ("--format", "docx"),
        "a folder on its path is a file": ("--out", blocker / "r.html"),
        "is a folder": ("--out", tmp_path),
    }
    for words, args in cases.items():
        r = studio("report", f, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
        assert words in r.stderr, (args, r.stderr)
    r = studio("report", fresh)
    assert r.returncode == 2 and "no runs yet" in r.stderr and r.stderr.count("\n") == 1
    assert not (fresh.with_suffix(".studio")).exists()
