"""The report a run writes as its last stage names the run's state as it ends, never
"running" (the real pipeline: the sample's export from the cache, then the report)."""

from __future__ import annotations

import asyncio
import json

from tests.conftest import copy_store


def test_the_report_of_a_finished_run_says_it_succeeded(sample_export, tmp_path):
    import shutil

    from studio.services.reports import report_data
    from studio.services.session import Studio

    path = tmp_path / sample_export.name
    shutil.copy2(sample_export, path)
    copy_store(sample_export.with_suffix(".studio"), path.with_suffix(".studio"))
    studio = Studio.open(path)
    try:
        summary = asyncio.run(studio.run_pipeline(["export", "report"]))
        assert summary.state == "succeeded", summary.to_dict()
        assert [j.stage for j in summary.jobs] == ["export", "report"]
        written = json.loads((path.with_suffix(".studio") / "reports" / "latest.json")
                             .read_text())
        assert written["run"]["id"] == summary.run_id
        assert written["run"]["state"] == "succeeded"
        html = (path.with_suffix(".studio") / "reports" / "latest.html").read_text()
        assert f"of run {summary.run_id} (started" in html
        assert ", running)" not in html and ", succeeded)" in html
        # the report made again later from the history says the same
        again = report_data(studio.project, studio.jobs, studio.store, summary.run_id)
        assert again["run"]["state"] == "succeeded"
    finally:
        studio.close()
