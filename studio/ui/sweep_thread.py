"""A sweep on its own asyncio loop in a worker thread, its events handed to the UI's
thread (the work queue's runner starts it; the Sweeps page follows it)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from PySide6.QtCore import QCoreApplication, QEventLoop, QObject, Signal


class SweepThread(QObject):
    """One sweep on its own asyncio loop in a worker thread. ``event`` carries copies of the
    runner's events (dicts, made in the worker thread) and, last, ``{"kind": "done",
    "summary": dict}`` or ``{"kind": "done", "error": exception}``; it is queued to the
    thread the object lives in (the UI's)."""

    event = Signal(object)

    def __init__(self, runner, parent: QObject | None = None):
        super().__init__(parent)
        self.runner = runner
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cancel_asked = False
        self.thread = threading.Thread(target=self._work, name="qstudio-sweep", daemon=True)
        runner.listeners.append(self._copy)

    def start(self) -> None:
        self.thread.start()

    @property
    def cancel_asked(self) -> bool:
        return self._cancel_asked

    def _copy(self, ev: dict[str, Any]) -> None:
        """In the runner's thread: the objects go on changing there, so the UI gets copies."""
        kind = ev.get("kind")
        if kind == "point":
            out: dict[str, Any] = {"kind": "point", "point": ev["point"].to_dict()}
        elif kind == "job":
            j = ev["job"]
            out = {"kind": "job", "job": {**j.to_dict(), "label": j.label,
                                          "progress": j.progress}}
        else:
            out = {"kind": "sweep", "state": ev.get("state"), "points": ev.get("points"),
                   "jobs": len(self.runner.unique)}
        self.event.emit(out)

    def _work(self) -> None:
        try:
            with asyncio.Runner() as r:
                self._loop = r.get_loop()
                if self._cancel_asked:  # Cancel came before the loop existed
                    self.runner.cancel()
                summary = r.run(self.runner.run())
        except BaseException as exc:  # noqa: BLE001 - handed to the UI thread
            self._loop = None
            self.event.emit({"kind": "done", "error": exc})
        else:
            self._loop = None
            self.event.emit({"kind": "done", "summary": summary.to_dict()})

    def cancel(self) -> None:
        """Stop the sweep: ``runner.cancel`` runs on the runner's loop."""
        self._cancel_asked = True
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self.runner.cancel)
            except RuntimeError:  # the loop just closed: the sweep is over
                pass

    def wait(self, timeout_s: float) -> bool:
        """Keep the UI's events going until the thread ends; True if it did."""
        deadline = time.monotonic() + timeout_s
        while self.thread.is_alive() and time.monotonic() < deadline:
            QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
            self.thread.join(0.02)
        QCoreApplication.processEvents()  # the last queued events (done)
        return not self.thread.is_alive()
