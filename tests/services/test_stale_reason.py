"""Why a stored figure no longer matches the project: its settings, or (the same settings)
an input file or the studio's code (a real run history in a SQLite file)."""

from __future__ import annotations

from studio.core import project as pf
from studio.core.jobs import JobStore
from studio.services import history


def test_a_stale_figure_says_whether_the_settings_changed(tmp_path):
    path = tmp_path / "p.qstudio"
    project = pf.new_project("p", "sample:tiny-coder")
    pf.save(project, path)
    project = pf.load(path)
    jobs = JobStore(tmp_path / "runs.sqlite")
    try:
        run = jobs.create_run({"stages": None, "settings": project.to_dict()})
        jid = jobs.add_job(run, "quantize", "")
        jobs.update_job(jid, state="succeeded", artifact_key="k-then")
        job = jobs.job(jid)
        assert history.stale_reason(project, jobs, job, {job.label: "k-then"}) == ""
        # same settings, another key: an input file or the stage code changed
        assert history.stale_reason(project, jobs, job, {job.label: "k-now"}) == \
            f"inputs or the studio's code changed since run {run}"
        project.quantization["scheme"] = "W8A8"
        assert history.stale_reason(project, jobs, job, {job.label: "k-now"}) == \
            f"settings changed since run {run}"
    finally:
        jobs.close()
