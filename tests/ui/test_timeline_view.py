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


def test_search_by_op_name_dims_the_rest_and_steps_through_the_matches(qtbot):
    from studio.ui.timeline import TimelineView

    view = TimelineView()
    qtbot.addWidget(view)
    view.resize(1000, 500)
    view.show()
    view.set_data(_data())
    plain = view.image.image.copy()
    view.find_box.setText("OP3")  # case-insensitive: op3 only
    assert view.matches is not None and len(view.matches["start"]) == 58  # 29 per track
    assert view.find_label.text().startswith("58 matches (1 name)")
    dimmed = view.image.image
    assert dimmed[..., 3].max() == plain[..., 3].max()  # the matches in full colour
    assert (dimmed[..., 3] < plain[..., 3]).any()  # the rest dimmed
    first = view.step(1)
    assert first.startswith("op3 ·") and "start 30 µs" in first  # op3 first runs at 30 µs
    assert view.mark.isVisible() and view.find_label.text().startswith("1 of 58")
    assert view.step(-1).startswith("op3 ·") and view.find_label.text().startswith("58 of 58")
    assert view.mark.rect().left() == 1991.0  # the last op3: step 199 on the second track
    view.plot.setXRange(0.0, 100.0, padding=0)  # a match out of view: the view goes to it
    view.step(-1)
    x0, x1 = view.plot.getViewBox().viewRange()[0]
    assert x0 <= view.mark.rect().left() < view.mark.rect().right() <= x1 and x0 > 1000
    assert view.find("no such op") == 0 and view.find_label.text() == "no op named like " \
        "'no such op'"
    assert not view.next_button.isEnabled()
    view.find_box.clear()
    assert view.matches is None and not view.mark.isVisible()
