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


def test_a_measurement_taken_again_is_current_for_its_plan_key(tmp_path):
    """A run or profile measured again keeps its artifact under a key of its own; the stale
    rule reads the plan key back from the artifact's metadata, so the figure is current (and
    stale again once the settings it was measured with change)."""
    from studio.core.artifacts import ArtifactStore
    from studio.core.stagegraph import plan, plan_keys, stage_config
    from studio.services.jobrunner import JobRunner, StageJob, artifact_meta
    from studio.services.versions import tool_versions

    path = tmp_path / "p.qstudio"
    pf.save(pf.new_project("p", "sample:tiny-coder"), path)
    project = pf.load(path)
    planned = plan(project, ["run"])
    versions = tool_versions()
    keys = plan_keys(project, planned, versions)
    i = next(k for k, j in enumerate(planned) if j.stage == "run")
    pj = planned[i]
    store = ArtifactStore(tmp_path / "artifacts").open()
    jobs = JobStore(tmp_path / "runs.sqlite")
    try:
        run = jobs.create_run({"stages": ["run"], "settings": project.to_dict()})
        jid = jobs.add_job(run, "run", pj.target)
        sj = StageJob(jid, stage_config(project, pj),
                      {planned[d].label: keys[d] for d in pj.deps}, versions)
        assert sj.key == keys[i]
        again = JobRunner(store, execute=None).measurement_key(sj, True, 123.0)
        assert again != sj.key
        work = store.new_workdir()
        (work / "result.json").write_text("{}")
        store.commit(again, work, artifact_meta(sj.stage, sj.target, sj.config,
                                                sj.input_keys, versions, {}))
        jobs.update_job(jid, state="succeeded", artifact_key=again)
        job = jobs.job(jid)
        now = history.current_keys(project, ["run"])
        assert history.stale_reasons(project, jobs, [job], now, store) == {}
        # without the store the key alone cannot tell: the plain rule calls it stale
        assert history.stale_reasons(project, jobs, [job], now) == {
            jid: f"inputs or the studio's code changed since run {run}"}
        project.run["max_new_tokens"] = 7  # a setting the run stage reads
        assert history.stale_reasons(project, jobs, [job], None, store) == {
            jid: f"settings changed since run {run}"}
    finally:
        jobs.close()
