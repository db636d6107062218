"""One value per fact: after a full run of the sample, every page (and each of its tabs) of
the window is walked (``studio.ui.figure_walk``), every figure it shows is read off the widgets
(figure cards, the tables of recorded figures, the Validation page's table cell by cell), and
each figure — one catalogue title, taken on one device for one target — must show one value
wherever it shows; the Jobs page's summaries, ``studio info --json`` and the report's headline
must write the same figures the same way."""

from __future__ import annotations

import asyncio
import json

import pytest

from studio.core import figures
from studio.ui import figure_walk
from studio.ui.pages.cards import FigureCard

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def one_run(batch_run, small_project, tmp_path_factory):
    """The small sample project after one full batch run of its own: no other test's runs in
    its history. Its stages' artifacts come from the session's batch run of the same project
    (same settings, same keys), so every stage job of the run but the report is served from
    the store, with the figures that run measured."""
    from tests.cli.conftest import SMALL, default_target, share_store, studio

    f = tmp_path_factory.mktemp("one-run") / "small.qstudio"
    f.write_text(SMALL.format(target=default_target()))
    share_store(small_project, f)
    r = studio("--batch", f, "--json")
    assert r.returncode in (0, 1), r.stderr[-3000:]
    # then a newer run of the run stage with another recipe, the file put back after it: the
    # newest run job is stale, and every page must show the current one (as the Overview)
    text = f.read_text()
    f.write_text(text.replace("max_new_tokens = 8", "max_new_tokens = 12"))
    assert f.read_text() != text
    r = studio("--batch", f, "--stages", "run", "--json")
    assert r.returncode in (0, 1), r.stderr[-3000:]
    f.write_text(text)
    return f


def test_every_figure_shows_one_value_on_every_page_and_output(
        make_window, one_run, copy_project, tmp_path, qtbot):
    from tests.cli.conftest import studio
    from tests.ui.conftest import wait_task

    path = copy_project(one_run, tmp_path / "p")
    win = make_window()
    win.resize(1600, 1000)
    assert win.open_project(path)
    # the Overview checks whether its figures are current in a thread: wait for its cards
    page = win.show_page("Overview")
    qtbot.waitUntil(lambda: bool(page.findChildren(FigureCard)), timeout=60_000)
    walk = wait_task(qtbot, asyncio.ensure_future(figure_walk.walk(win, asyncio.sleep)))
    assert walk.several() == {}
    # each figure is written with the catalogue's title
    assert all(key[0] == figures.title(name) for key, name in walk.keys.items())
    # the walk saw the run's figures, on several pages
    assert walk.shown >= 30 and len(walk.values) >= 20, (walk.shown, len(walk.values))
    places = {p.split(" ▸ ")[0] for w in walk.places.values() for p in w}
    assert {"Overview", "LLM", "Validation"} <= places, places

    # the Jobs page's summaries write the figures they name as the cards do
    said = figure_walk.jobs_said(win, walk)
    assert len(said) >= 4, said
    for key, written, summary in said:
        assert {written} == walk.values[key], (key, summary)

    # studio info --json writes each figure as the pages do
    data = json.loads(studio("info", path, "--json").stdout)
    agree = 0
    stale = set()
    for m in data["latest_metrics"]:
        assert m["title"] == figures.title(m["name"])
        key = (m["title"], m["device"], m["target"])
        if m.get("stale"):  # the latest run's figure of another recipe, marked so
            stale.add(key)
            continue
        if key in walk.values:
            assert walk.values[key] == {m["text"]}, (key, walk.places[key])
            agree += 1
    # the latest run is the run stage's of another recipe: its figures are marked stale; the
    # ones not stale agree with the pages
    assert stale and agree >= 1, (stale, agree)

    # the report's headline too
    out = tmp_path / "report.json"
    # the report of the full run (run 1): its headline as the pages write it
    r = studio("report", path, "--run", "1", "--format", "json", "--out", out)
    assert r.returncode == 0, r.stderr
    head = json.loads(out.read_text())["headline"]
    assert head
    said_too = 0
    for h in head:
        assert h["title"] == figures.title(h["name"])
        key = (h["title"], h["device"], h["target"])
        if key in walk.values:
            assert walk.values[key] == {h["text"]}, key
            said_too += 1
    assert said_too >= 5, said_too

    # the table of them, as `python -m studio.ui.figure_walk FILE` prints it
    text = figure_walk.table(walk, data["latest_metrics"])
    assert "decode speed" in text and "LLM ▸ Runs, Overview" in text
    # each figure with its source (the cards' badges)
    row = next(ln for ln in text.splitlines() if ln.startswith("decode speed ")
               and "HTP simulator" in ln)
    assert " simulated " in row
