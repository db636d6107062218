"""The timeline widget on a real Qt window (offscreen)."""

from studio.core.events import EventTable
from studio.core.timeline import TimelineData


def _data():
    rows = []
    for t, track in enumerate(["host thread 0", "HTP core 0"]):
        for i in range(200):
            rows.append({"op": f"op{i % 7}", "block": ["gate/up", "RMSNorm"][i % 2],
                         "track": track, "start": i * 10.0 + t, "dur": 6.0})
    return TimelineData.from_events(EventTable.from_rows(rows), {"HTP core 0": "estimated"})


def test_timeline_draws_selects_hovers_and_follows_the_minimap(qtbot):
    from studio.ui.timeline import TimelineView

    view = TimelineView()
    qtbot.addWidget(view)
    view.resize(1000, 500)
    view.show()
    assert view.empty.isVisibleTo(view) and not view.plot.isVisibleTo(view)
    view.set_data(_data())
    assert view.plot.isVisibleTo(view)
    ticks = [label for _, label in view.plot.getAxis("left")._tickLevels[0]]
    assert ticks == ["host thread 0", "HTP core 0 (estimated)"]
    assert view.image.image is not None and view.image.image.shape[1] == 20
    assert "gate/up" in view.legend.text()

    totals = view.select(100.0, 200.0)
    assert totals["events"] > 0 and "Selection" in view.totals.text()
    assert view.describe_at(101.0, 0).startswith("op")

    before = view.redraws
    view.plot.setXRange(500.0, 600.0, padding=0)
    assert view.redraws > before
    assert view.mini_region.getRegion() == (500.0, 600.0)
    view.mini_region.setRegion((900.0, 1000.0))
    x0, x1 = view.plot.getViewBox().viewRange()[0]
    assert abs(x0 - 900.0) < 1e-6 and abs(x1 - 1000.0) < 1e-6

    view.set_data(None)
    assert view.empty.isVisibleTo(view)
