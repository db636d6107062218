"""Labels follow their result: a figure made with an older recipe than the project's is
marked stale where it shows (LLM ▸ Runs, ``studio info``), by the one rule the Overview uses
(the artifact key the project gives the job now); a run that takes the export from the cache
keeps the export's time from the run that computed it, and says so."""

from __future__ import annotations

import asyncio
import json
import time

from studio.core import project as projectfile
from studio.core.metrics import Metric
from studio.services import history
from tests.cli.conftest import studio as studio_cli

CHIP = "snapdragon-8-gen-3"
LABEL = f"run[htp-sim:{CHIP}]"


def _simulated_run_job(studio) -> int:
    """A succeeded run job on the HTP simulator, recorded as the pipeline records one: the
    settings it ran with, the artifact key the project gives it now, its figures."""
    keys = history.current_keys(studio.project, ["run"])
    run = studio.jobs.create_run({"stages": ["run"], "targets": None, "retry": None,
                                  "settings": studio.project.to_dict()})
    jid = studio.jobs.add_job(run, "run", f"htp-sim:{CHIP}")
    now = time.time()
    studio.jobs.update_job(
        jid, state="succeeded", started=now - 1, finished=now, progress=1.0,
        artifact_key=keys[LABEL], message="16 tokens",
        result={"summary": "16 tokens", "text": "x = 1", "step_s": [0.02, 0.021],
                "source": "simulated"})
    studio.jobs.add_metrics(jid, [Metric("decode_tokens_per_s", 48.0, "tok/s", "simulated",
                                         "htp-sim", CHIP)])
    return jid


def test_llm_runs_marks_simulator_figures_made_with_an_older_recipe(window, project_path,
                                                                     qtbot):
    assert window.open_project(project_path)
    ctl = window.ctl
    jid = _simulated_run_job(ctl.studio)
    page = window.show_page("LLM")
    qtbot.waitUntil(lambda: page._stale_load.task is not None and page._stale_load.task.done(),
                    timeout=20_000)
    (card,) = page._job_cards[jid]
    box = page._job_boxes[jid]
    assert page.stale == {} and not card.stale and not page.stale_note.isVisibleTo(page)
    assert box.title().startswith(f"htp-sim:{CHIP}")

    # an edit the run stage reads: its simulator figures no longer match the project
    ctl.set("run", "max_new_tokens", 8)
    qtbot.waitUntil(lambda: jid in page.stale, timeout=20_000)
    run_id = ctl.studio.jobs.job(jid).run_id
    assert page.stale[jid] == f"settings changed since run {run_id}"
    assert card.stale and "settings changed" in card.stale_label.text()
    assert box.title().startswith("⚠ stale · ")
    assert page.stale_note.isVisibleTo(page)
    assert f"{LABEL} of run {run_id} (settings changed" in page.stale_note.text()

    # an edit the run stage does not read marks nothing; undoing the one it reads clears it
    ctl.undo()
    qtbot.waitUntil(lambda: not page.stale, timeout=20_000)
    assert not card.stale and not box.title().startswith("⚠")
    assert not page.stale_note.isVisibleTo(page)
    ctl.set("", "name", "renamed")
    qtbot.wait(400)
    qtbot.waitUntil(lambda: page._stale_load.task.done(), timeout=20_000)
    assert not page.stale


def test_studio_info_marks_figures_of_an_older_recipe(project_path):
    from studio.services.session import Studio

    studio = Studio.open(project_path)
    try:
        jid = _simulated_run_job(studio)
        run_id = studio.jobs.job(jid).run_id
    finally:
        studio.close()
    r = studio_cli("info", project_path, "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (m,) = json.loads(r.stdout)["latest_metrics"]
    assert m["name"] == "decode_tokens_per_s" and m["stale"] == ""
    assert "(stale" not in studio_cli("info", project_path, timeout=300).stdout

    p = projectfile.load(project_path)  # the file changes what the run stage reads
    p.run["max_new_tokens"] = 8
    projectfile.save(p, project_path)
    (m,) = json.loads(studio_cli("info", project_path, "--json", timeout=300).stdout
                      )["latest_metrics"]
    assert m["stale"] == f"settings changed since run {run_id}"
    text = studio_cli("info", project_path, timeout=300).stdout
    assert f"(stale: settings changed since run {run_id})" in text, text


def _in_thread(fn):
    """``fn()`` in a thread of its own (the window's loop runs in this one)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result(600)


def test_a_cached_export_keeps_its_time_from_the_run_that_computed_it(
    sample_export, copy_project, tmp_path, make_window, qtbot
):
    from studio.services.session import Studio

    path = copy_project(sample_export, tmp_path / "p")
    studio = Studio.open(path)
    try:
        (computed,) = [j for j in studio.jobs.jobs() if j.stage == "export"]
        assert not computed.cached
        assert "export_seconds" in {m.name for m in studio.jobs.metrics(job_id=computed.id)}
        summary = _in_thread(lambda: asyncio.run(studio.run_pipeline(["export"])))  # cached
        assert summary.state == "succeeded" and summary.jobs[0].cached
        cached = summary.jobs[0]
        own = {m.name for m in studio.jobs.metrics(job_id=cached.id)}
        assert own and "export_seconds" not in own  # a served job has no run facts

        rows = history.current_results(studio.jobs, history.current_keys(studio.project))
        by_job = {job.id: figures for job, figures in rows}
        assert {m.name for m in by_job[cached.id]} == own
        (kept,) = by_job[computed.id]
        assert kept.name == "export_seconds"
        assert kept.detail.startswith(f"from run {computed.run_id} (cached: run "
                                      f"{cached.run_id} reused its export")
        assert history.current_results(studio.jobs)  # without keys: the same rows
        assert {j.id for j, _ in history.current_results(studio.jobs)} == set(by_job)
    finally:
        studio.close()

    win = make_window()
    assert win.open_project(path)
    over = win.show_page("Overview")
    qtbot.waitUntil(lambda: over._keys is not None, timeout=20_000)
    cards = {c.title.text(): c for c in over.cards.cards}
    card = cards["export time"]
    assert card.where.text().startswith(f"run {computed.run_id} · export")
    assert "cached" in card.badge.toolTip() and not card.stale


def test_validation_marks_a_picked_run_made_with_an_older_recipe(window, project_path, qtbot):
    assert window.open_project(project_path)
    ctl = window.ctl
    studio = ctl.studio
    label = f"validate[{CHIP}]"
    keys = history.current_keys(studio.project, ["validate"])
    run = studio.jobs.create_run({"stages": ["validate"], "settings": studio.project.to_dict()})
    jid = studio.jobs.add_job(run, "validate", CHIP)
    now = time.time()
    studio.jobs.update_job(jid, state="succeeded", started=now - 1, finished=now, progress=1.0,
                           artifact_key=keys[label], message="cosine 0.998",
                           result={"summary": "cosine 0.998", "logits_cosine_mean": 0.998,
                                   "perplexity_fp32": 10.0, "perplexity_quantized": 10.2})
    studio.jobs.add_metrics(jid, [Metric("logits_cosine_mean", 0.998, "", "simulated",
                                         "htp-sim", CHIP)])
    page = window.show_page("Validation")
    qtbot.waitUntil(lambda: page._stale_load.task is not None and page._stale_load.task.done(),
                    timeout=20_000)
    assert page.content.isVisibleTo(page) and not page.stale_note.isVisibleTo(page)
    ctl.set("validation", "greedy_tokens", 3)  # a setting the validate stage reads
    qtbot.waitUntil(lambda: jid in page.stale, timeout=20_000)
    assert page.stale_note.isVisibleTo(page)
    assert f"{label} of run {run} (settings changed since run {run})" in page.stale_note.text()
