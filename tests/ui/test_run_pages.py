"""Results scoped to a run: the Validation page compares a run with an earlier one (figures,
changes, the settings that differ), the Overview names the run its cards come from and marks
the cards a later edit made stale; both fit a 1024×700 window.

The two runs (weight granularity per-channel, then per-tensor) run once for the module on
the real engine, from the session's exported sample project, with small validation shapes.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

import pytest

from studio.services import history
from studio.ui.pages.figures import fmt_figure
from tests.conftest import copy_store

CHIP = "snapdragon-8-gen-3"


def _copy(src: Path, dest_dir: Path) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest_dir / src.name)
    copy_store(src.with_suffix(".studio"), dest_dir / src.with_suffix(".studio").name)
    return dest_dir / src.name


def _run(studio, stages):
    out: dict = {}

    def go() -> None:
        try:
            out["summary"] = asyncio.run(studio.run_pipeline(stages))
        except BaseException as exc:  # noqa: BLE001 - raised below
            out["error"] = exc

    t = threading.Thread(target=go)
    t.start()
    t.join(600)
    if "error" in out:
        raise out["error"]
    assert out["summary"].state == "succeeded", out["summary"].to_dict()
    return out["summary"]


@pytest.fixture(scope="module")
def runs_made(compiled_template, tmp_path_factory) -> dict:
    """``{"one": project after the first run, "two": the same project after the second,
    "ids": (first run id, second run id)}``: validate run with per-channel weights, then
    with per-tensor weights (edits through the session's command stack), export cached from
    the template (whose own export run has no validation)."""
    from studio.services.session import Studio

    base = tmp_path_factory.mktemp("runs")
    path = _copy(compiled_template, base / "two")
    studio = Studio.open(path)
    try:
        studio.set("validation", "heldout_tokens", 16)
        studio.set("validation", "greedy_tokens", 2)
        studio.set("quantization", "weight_granularity", "per_channel")
        first = _run(studio, ["validate"]).run_id
        studio.save()
        one = _copy(path, base / "one")
        studio.set("quantization", "weight_granularity", "per_tensor")
        second = _run(studio, ["validate"]).run_id
        studio.save()
    finally:
        studio.close()
    assert second > first
    return {"one": one, "two": path, "ids": (first, second)}


def _open(make_window, copy_project, src: Path, dest: Path, size=(1024, 700)):
    win = make_window()
    win.resize(*size)
    assert win.open_project(copy_project(src, dest))
    return win


def _settle(qtbot, ms: int = 200) -> None:
    qtbot.wait(ms)


def _runs_of(win):
    studio = win.ctl.studio
    return [r.id for r in history.validation_runs(studio.project, studio.jobs)]


def _table(page) -> dict[str, list[str]]:
    """The side-by-side table by row title (``"run 1"`` / ``"change"`` rows follow the
    figure they belong to and are keyed ``"<figure>/<title>"``)."""
    out: dict[str, list[str]] = {}
    rows = page.figure_rows()
    out["header"] = rows[0]
    figure = ""
    for r in rows[1:]:
        title = r[0].strip()
        if r[0].startswith("    "):
            out[f"{figure}/{title}"] = r[1:]
        else:
            figure = title
            out[title] = r[1:]
    return out


@pytest.mark.slow
def test_history_pairs_the_two_runs_validation(runs_made):
    """The services helpers the page draws from: two runs with validation results, figures
    and deltas per target and column, the changed setting, each column's source."""
    from studio.services.session import Studio

    a, b = runs_made["ids"]
    studio = Studio.open(runs_made["two"])
    try:
        runs = history.validation_runs(studio.project, studio.jobs)
        assert [r.id for r in runs] == [b, a]
        assert runs[0].settings["quantization"]["weight_granularity"] == "per_tensor"
        cmp = history.validation_compare(studio.jobs, b, a)
        assert cmp["settings_recorded"]
        assert cmp["settings"] == [
            {"key": "quantization.weight_granularity", "a": "per_channel", "b": "per_tensor"}
        ]
        rows = {(r["figure"], r["column"]): r for r in cmp["targets"][CHIP]}
        t1, t2 = history.validation_table(studio.jobs, a), history.validation_table(studio.jobs, b)
        for (fig, col), r in rows.items():
            assert r["previous"] == t1[CHIP][col][fig] and r["value"] == t2[CHIP][col][fig]
            assert r["delta"] == pytest.approx(r["value"] - r["previous"])
        # the recipe change moved the quantized model's numbers, not FP32's
        assert rows[("perplexity", "fp32")]["delta"] == 0
        assert rows[("perplexity", "htp")]["delta"] != 0
        assert rows[("logits_cosine_mean", "host_qdq")]["delta"] != 0
        assert ("logits_cosine_mean", "fp32") not in rows  # FP32 is the reference
        src = history.validation_sources(studio.jobs, b)[CHIP]
        assert src["fp32"]["source"] == src["host_qdq"]["source"] == "measured"
        assert src["htp"] == {"source": "simulated", "device": "htp-sim"}
        alone = history.validation_compare(studio.jobs, a, None)
        assert alone["against"] is None and alone["settings"] == []
        assert all(r["previous"] is None for r in alone["targets"][CHIP])
        newest = history.newest_run_with_results(studio.project, studio.jobs)
        assert newest is not None and newest.id == b
    finally:
        studio.close()


@pytest.mark.slow
def test_validation_page_shows_both_runs_and_the_picker_switches(
    runs_made, make_window, copy_project, tmp_path, qtbot
):
    a, b = runs_made["ids"]
    win = _open(make_window, copy_project, runs_made["two"], tmp_path / "p")
    page = win.show_page("Validation")
    _settle(qtbot)
    assert page.content.isVisibleTo(page) and not page.empty.isVisibleTo(page)
    labels = [page.run_combo.itemText(i) for i in range(page.run_combo.count())]
    assert labels[0].startswith(f"run {b} — ") and labels[1].startswith(f"run {a} — ")
    assert "succeeded" in labels[0] and "W8A16, per-tensor weights" in labels[0]
    assert "W8A16, per-channel weights" in labels[1]
    assert page.run_combo.currentData() == b and page.against.currentData() == a
    assert page.against.isVisibleTo(page)

    studio = win.ctl.studio
    t1 = history.validation_table(studio.jobs, a)[CHIP]
    t2 = history.validation_table(studio.jobs, b)[CHIP]
    table = _table(page)
    assert table["header"] == ["Figure", "FP32 · CPU", "host QDQ · CPU", "HTP · simulator"]
    assert table["source"] == ["measured", "measured", "simulated"]
    ppl = table["perplexity"]
    assert ppl == [
        fmt_figure("perplexity", t2[c]["perplexity"])
        for c in ("fp32", "host_qdq", "htp")
    ]
    assert table[f"perplexity/run {a}"][2] == fmt_figure("perplexity", t1["htp"]["perplexity"])
    assert table["perplexity/change"][0] == "unchanged"  # FP32 does not depend on the recipe
    d = t2["htp"]["perplexity"] - t1["htp"]["perplexity"]
    assert table["perplexity/change"][2].replace("−", "-").startswith(f"{d:+.3f}")
    cos = table["logits cosine, mean"]
    assert cos[0] == "—" and cos[2] == f"{t2['htp']['logits_cosine_mean']:.6f}"
    assert table[f"logits cosine, mean/run {a}"][1] == f"{t1['host_qdq']['logits_cosine_mean']:.6f}"
    assert table["greedy agreement"][2].endswith("%")
    # a change is coloured by direction (perplexity: lower is better)
    row = next(i for i in range(page.figures.rowCount())
               if page.figures.row(i).payload == "delta")
    want = "#1b8a3f" if d < 0 else "#c62828"
    assert page.figures.row(row).colors[3] == want
    assert page.changes_box.title() == f"What changed from run {a} to run {b}"
    text = page.changes.text()
    assert "quantization.weight_granularity" in text and "per_channel → per_tensor" in text
    assert not page.recipe_button.isVisibleTo(page)
    assert page.target.currentText() == CHIP
    assert page.job_label.text().startswith(f"run {b} · job #")
    # the figures table is never cut at 1024×700
    assert not page.figure_view.horizontalScrollBar().isVisible()

    # the picker: the older run is the oldest with validation, shown alone; then compared
    # with the newer one
    page.run_combo.setCurrentIndex(1)
    assert page.run_combo.currentData() == a and page.against.currentData() is None
    table = _table(page)
    assert table["perplexity"][2] == fmt_figure("perplexity", t1["htp"]["perplexity"])
    assert "perplexity/change" not in table
    assert f"Run {a} is shown alone" in page.changes.text()
    assert page.job_label.text().startswith(f"run {a} · job #")
    page.against.setCurrentIndex(page.against.findData(b))
    table = _table(page)
    assert table[f"perplexity/run {b}"][2] == fmt_figure("perplexity", t2["htp"]["perplexity"])
    assert "per_tensor → per_channel" in page.changes.text()
    # a refresh (another process ran, the page was shown again) keeps the picked run
    page.refresh()
    assert page.run_combo.currentData() == a


@pytest.mark.slow
def test_validation_page_with_one_run_asks_for_another(
    runs_made, make_window, copy_project, tmp_path, qtbot
):
    a, _ = runs_made["ids"]
    win = _open(make_window, copy_project, runs_made["one"], tmp_path / "p")
    page = win.show_page("Validation")
    _settle(qtbot)
    assert page.content.isVisibleTo(page)
    assert page.run_combo.count() == 1 and page.run_combo.currentText().startswith(f"run {a} — ")
    assert not page.against.isVisibleTo(page)
    assert "run the pipeline again after a change to compare" in page.changes.text().lower()
    assert page.recipe_button.isVisibleTo(page)
    table = _table(page)
    assert "perplexity/change" not in table and "perplexity" in table
    assert table["source"] == ["measured", "measured", "simulated"]
    page.recipe_button.click()
    assert win.current_page() == "Precision"


def _cards_text(over) -> list[str]:
    return [c.where.text() for c in over.cards.cards]


@pytest.mark.slow
def test_overview_names_its_run_and_fits_1024x700(
    runs_made, make_window, copy_project, tmp_path, qtbot
):
    a, b = runs_made["ids"]
    win = _open(make_window, copy_project, runs_made["two"], tmp_path / "p")
    over = win.show_page("Overview")
    qtbot.waitUntil(lambda: over._keys is not None, timeout=20_000)
    qtbot.waitUntil(lambda: over.model_grid.count() > 0, timeout=20_000)  # the model card
    _settle(qtbot)
    # the project's current figures: the newest of each stage for its settings, each card
    # naming its run — run b's (per tensor), never run a's per-channel ones
    assert over.results_box.title().startswith("Results of run")
    assert f"Newest run: Run {b}" in over.run_label.text()
    studio = win.ctl.studio
    rows = history.current_results(studio.jobs, over._keys)
    want = [(j.id, m.name) for j, figures in rows for m in figures]
    assert want and len(over.cards.cards) == len(want)
    for job, text in zip(over._card_jobs, _cards_text(over), strict=True):
        assert text.startswith(f"run {job.run_id} · {job.stage}")
    runs_shown = {j.stage: j.run_id for j in over._card_jobs}
    assert runs_shown["validate"] == b and a not in runs_shown.values()
    assert not over.stale_cards() and not over.stale_banner.isVisibleTo(over)

    # nothing scrolls sideways and no card title is cut
    assert not over.scroll.horizontalScrollBar().isVisible()
    assert over.scroll.widget().width() <= over.scroll.viewport().width()
    assert over.cards.columns >= 2
    for card in over.cards.cards:
        assert card.title.sizeHint().width() <= card.title.width(), card.title.text()
        assert card.geometry().right() <= over.cards.width()
    # and the same holds at a narrow window (one column) and a wide one
    for size in ((900, 600), (1600, 900)):
        win.resize(*size)
        _settle(qtbot)
        assert not over.scroll.horizontalScrollBar().isVisible(), size
        for card in over.cards.cards:
            assert card.title.sizeHint().width() <= card.title.width(), (size, card.title.text())


@pytest.mark.slow
def test_an_edit_marks_cards_stale_and_a_new_run_clears_it(
    runs_made, make_window, copy_project, tmp_path, qtbot
):
    """The Overview follows the settings: back to per-channel weights, it shows run a's
    figures (made with them), none stale and none of run b's; back to per-tensor, run b's. An edit nothing was
    run with (the greedy check's length) marks the validate cards stale (undo clears it: it
    is the key, not any edit); Run again from the banner runs the stale stage only, and the
    new run's figures replace them while the others stay."""
    a, b = runs_made["ids"]
    win = _open(make_window, copy_project, runs_made["two"], tmp_path / "p")
    ctl = win.ctl
    over = win.show_page("Overview")
    qtbot.waitUntil(lambda: over._keys is not None, timeout=20_000)
    assert not over.stale_cards()

    def run_of(stage: str) -> set[int]:
        return {j.run_id for j in over._card_jobs if j.stage == stage}

    ctl.set("quantization", "weight_granularity", "per_channel")
    qtbot.waitUntil(lambda: run_of("validate") == {a}, timeout=20_000)
    # run a took its per-channel graphs from the cache (no quantize time of its own): no
    # quantize card, rather than run b's per-tensor time marked stale (the export, the same
    # for both, is the newest run's)
    assert not [j for j in over._card_jobs if j.run_id == b and j.stage != "export"]
    assert not over.stale_cards()
    ctl.undo()
    qtbot.waitUntil(lambda: run_of("validate") == {b}, timeout=20_000)
    assert not over.stale_cards()

    ctl.set("validation", "greedy_tokens", 3)
    qtbot.waitUntil(lambda: bool(over.stale_cards()), timeout=20_000)
    stale = over.stale_cards()
    stale_stages = {j.stage for j, c in zip(over._card_jobs, over.cards.cards, strict=True)
                    if c.stale}
    assert stale_stages == {"validate"}
    for card in stale:
        text = card.stale_label.text().replace("\u2011", "-")  # a non-breaking hyphen
        assert text == f"⚠ settings changed since run {b}: re-run"
    assert all(c.stale_label.isVisibleTo(over) for c in stale)
    assert over.stale_banner.isVisibleTo(over)
    assert f"Settings changed since run {b}: its validate figures" in over.stale_text.text()

    ctl.undo()
    qtbot.waitUntil(lambda: not over.stale_cards(), timeout=20_000)
    assert not over.stale_banner.isVisibleTo(over)
    ctl.redo()
    qtbot.waitUntil(lambda: bool(over.stale_cards()), timeout=20_000)

    # run again from the banner: the stale stage, the project as it is now
    made = ("quantize", "compile")  # (the export, taken from the cache, is every run's)
    before = {(j.stage, j.run_id) for j in over._card_jobs if j.stage in made}
    over.rerun_button.click()
    task = ctl.last_run
    assert task is not None
    qtbot.waitUntil(task.done, timeout=300_000)
    summary = task.result()
    assert summary.state == "succeeded"
    c = summary.run_id
    assert c > b
    qtbot.waitUntil(lambda: run_of("validate") == {c}, timeout=20_000)
    qtbot.waitUntil(lambda: over._keys is not None and not over.stale_cards(), timeout=20_000)
    assert not over.stale_banner.isVisibleTo(over)
    assert {(j.stage, j.run_id) for j in over._card_jobs if j.stage in made} == before
    assert before and all(r == b for _, r in before)
    assert all(t.startswith(f"run {c} · validate") for j, t in zip(
        over._card_jobs, _cards_text(over), strict=True) if j.stage == "validate")
    studio = ctl.studio
    assert history.run_info(studio.project, studio.jobs, c).stages == ["validate"]

    page = win.show_page("Validation")
    qtbot.waitUntil(lambda: page.run_combo.count() == 3, timeout=20_000)
    assert _runs_of(win) == [c, b, a]
    assert page.run_combo.currentData() == c and page.against.currentData() == b
    assert "2 → 3" in page.changes.text() and "greedy" in page.changes.text()
    t2 = history.validation_table(studio.jobs, b)[CHIP]
    t3 = history.validation_table(studio.jobs, c)[CHIP]
    for column in ("fp32", "host_qdq", "htp"):  # the same graphs and held-out tokens
        assert t3[column]["perplexity"] == t2[column]["perplexity"], column
    assert _table(page)["perplexity"][2] == fmt_figure("perplexity", t2["htp"]["perplexity"])
