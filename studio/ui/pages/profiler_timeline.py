"""The Profiler's Timeline tab: the shown profile's events over time.

Three kinds of timeline, each labelled by where it comes from:

- **host CPU, measured**: the decode step on the host CPU under ONNX Runtime's profiler
  (recorded by the profile stage), one track per thread;
- **HTP cores, estimated**: the simulator records no start times and no per-core data, so
  the HTP tracks are the performance model's schedule of the graph on the chosen chip;
- **imported**: a file with timestamps (a device's chrome trace, ORT JSON) the user opened.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QVBoxLayout, QWidget

from studio.core.errors import StudioError
from studio.core.timeline import TimelineData
from studio.services.estimate import schedule_events
from studio.ui.loading import LatestLoad
from studio.ui.timeline import TimelineView
from studio.ui.widgets import label


class TimelineTab(QWidget):
    loaded = Signal()

    def __init__(self, ctl, parent=None):
        super().__init__(parent)
        self.ctl = ctl
        self.host = None  # EventTable (measured) of the shown profile job
        self.imported = None  # EventTable of an imported profile with times
        self.graph = None  # the quantized decode graph the profile job profiled
        self.chip = ""
        self.result: TimelineData | None = None
        self._load = LatestLoad(ctl)
        lay = QVBoxLayout(self)
        row = QHBoxLayout()
        row.addWidget(label("Show:"))
        self.kind = QComboBox()
        self.kind.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.kind.currentIndexChanged.connect(self.load)
        row.addWidget(self.kind)
        self.status = label("", "muted", wrap=True)
        row.addWidget(self.status, 1)
        lay.addLayout(row)
        self.view = TimelineView()
        lay.addWidget(self.view, 1)

    def apply_theme(self) -> None:
        self.view.apply_theme()

    def set_sources(self, host, graph, chip: str, imported=None) -> None:
        """What the shown profile offers; refills the choice and draws the first."""
        self.host, self.graph, self.chip, self.imported = host, graph, chip, imported
        self.kind.blockSignals(True)
        self.kind.clear()
        if imported is not None:
            self.kind.addItem("imported file (its own timestamps)", "imported")
        if host is not None:
            self.kind.addItem("host CPU, measured (ONNX Runtime profiler)", "host")
        if graph is not None and chip:
            self.kind.addItem(f"HTP cores, estimated ({chip})", "estimated")
        self.kind.blockSignals(False)
        self.result = None

    def load(self, *_args) -> None:
        kind = self.kind.currentData()
        self._load.drop()
        if kind is None:
            self.view.set_data(None)
            self.status.setText("This profile has no events with times. The HTP simulator "
                                "records none: run the profile stage again (it records a "
                                "host-CPU timeline) or import a device trace.")
            self.result = None
            self.loaded.emit()
            return
        if kind == "host":
            self._show(TimelineData.from_events(self.host, default_source="measured"),
                       "measured on the host CPU: the quantized graph under ONNX Runtime, "
                       "3 decode steps; not the NPU")
            return
        if kind == "imported":
            self._show(TimelineData.from_events(self.imported, default_source="imported"),
                       "imported: the file's own timestamps")
            return
        graph, chip = self.graph, self.chip
        self.status.setText("Scheduling the graph on the chip's HTP cores…")

        def work():
            return schedule_events(graph, chip)

        def done(got) -> None:
            table, est = got
            data = TimelineData.from_events(table, default_source="estimated")
            self._show(data, f"estimated by the performance model {est['model_version']}: "
                             f"one decode step on {chip}, {est['makespan_s'] * 1e6:.1f} µs of "
                             "op time across the HTP cores (plus a fitted per-pass overhead "
                             "the tracks do not show). The simulator records no timeline.")

        def failed(exc: Exception) -> None:
            self.view.set_data(None)
            self.status.setText(exc.message if isinstance(exc, StudioError)
                                else f"scheduling the graph failed: {exc!r}")
            self.loaded.emit()

        self._load.start(work, done=done, failed=failed)

    def _show(self, data: TimelineData, note: str) -> None:
        self.result = data
        self.view.set_data(data)
        extra = f" · {data.untimed} events without times not drawn" if data.untimed else ""
        self.status.setText(f"{len(data):,} events on {len(data.tracks)} tracks · {note}{extra}")
        self.loaded.emit()
