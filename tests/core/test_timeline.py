"""Timeline data: sorting per track, selection totals clipped to the window, rasterising."""

import numpy as np
import pytest

from studio.core.events import EventTable
from studio.core.timeline import TimelineData


def _data() -> TimelineData:
    rows = [
        {"op": "a", "block": "x", "track": "T0", "start": 0.0, "dur": 10.0},
        {"op": "c", "block": "y", "track": "T0", "start": 12.0, "dur": 0.25},
        {"op": "b", "block": "y", "track": "T0", "start": 10.0, "dur": 0.5},
        {"op": "d", "block": "x", "track": "core 0", "start": 4.0, "dur": 4.0},
        {"op": "e", "block": "x", "track": "T0"},  # no times: counted, not drawn
    ]
    return TimelineData.from_events(EventTable.from_rows(rows), {"core 0": "estimated"})


def test_tracks_are_sorted_and_labelled():
    d = _data()
    assert [t.label for t in d.tracks] == ["T0", "core 0 (estimated)"]
    assert d.tracks[0].start.tolist() == [0.0, 10.0, 12.0]
    assert d.untimed == 1 and len(d) == 4 and d.extent() == (0.0, 12.25)


def test_selection_totals_are_clipped_to_the_window():
    s = _data().select(5.0, 10.25)
    # a: 5..10 -> 5; b: 10..10.25 -> 0.25; d: 5..8 -> 3; c outside
    assert s["events"] == 3
    assert s["total"] == pytest.approx(8.25)
    assert s["by_name"] == pytest.approx({"a": 5.0, "d": 3.0, "b": 0.25})
    assert s["by_category"] == pytest.approx({"x": 8.0, "y": 0.25})


def test_raster_keeps_time_and_picks_the_dominant_category():
    d = _data()
    cat, busy = d.raster(0, 0.0, 20.0, 10)
    x, y = d.categories.index("x"), d.categories.index("y")
    assert cat.tolist() == [x] * 5 + [y, y] + [-1] * 3
    assert busy.sum() * 2.0 == pytest.approx(10.75)  # column width 2: all busy time kept


def test_raster_of_many_sub_pixel_events_keeps_the_total():
    n = 50_000
    rng = np.random.default_rng(0)
    start = np.sort(rng.uniform(0, 1000, n))
    table = EventTable(codes={"block": rng.integers(0, 3, n).astype(np.int32)},
                       vocab={"block": ["a", "b", "c"]},
                       num={"start": start, "dur": np.full(n, 0.001)})
    d = TimelineData.from_events(table)
    cat, busy = d.raster(0, 0.0, 1000.0, 500)
    assert busy.sum() * 2.0 == pytest.approx(n * 0.001)
    assert (cat >= 0).all()


def test_bad_input():
    with pytest.raises(ValueError, match="negative duration"):
        TimelineData.from_events(EventTable.from_rows([{"start": 1.0, "dur": -1.0}]))
    with pytest.raises(ValueError, match="source"):
        TimelineData.from_events(EventTable.from_rows([{"track": "t", "start": 0.0,
                                                        "dur": 1.0}]), {"t": "guessed"})
