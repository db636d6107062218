"""A queue item's work (:class:`studio.services.queuework.ItemWork`) on its own asyncio loop
in a worker thread, its events handed to the UI's thread (the work queue's runner starts it;
the run pages and the Sweeps page follow it)."""

from __future__ import annotations

import asyncio
import threading

from PySide6.QtCore import QObject, Signal

from studio.services.queuework import ItemWork


class ItemThread(QObject):
    """One item's work on its own asyncio loop in a worker thread. ``event`` carries the
    work's events as it copies them (made in the worker thread) and, last, ``{"kind":
    "done", "summary": result}`` or ``{"kind": "done", "error": exception}``; it is queued
    to the thread the object lives in (the UI's)."""

    event = Signal(object)

    def __init__(self, work: ItemWork, parent: QObject | None = None):
        super().__init__(parent)
        self.work = work
        self._loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._work, name=f"qstudio-queue-{work.item.id}",
                                       daemon=True)
        work.listeners.append(lambda ev: self.event.emit(work.copy(ev)))

    def start(self) -> None:
        self.thread.start()

    @property
    def cancel_asked(self) -> bool:
        return self.work.cancel_asked

    def _work(self) -> None:
        try:
            with asyncio.Runner() as r:
                self._loop = r.get_loop()
                result = r.run(self.work.run())
        except BaseException as exc:  # noqa: BLE001 - handed to the UI thread
            self._loop = None
            self.event.emit({"kind": "done", "error": exc})
        else:
            self._loop = None
            self.event.emit({"kind": "done", "summary": result})

    def cancel(self, job_id: int | None = None) -> None:
        """Stop the work (or one job of it): ``work.cancel`` runs on the work's loop (one
        asked before the loop exists holds: the work reads ``cancel_asked`` as it starts)."""
        if job_id is None:
            self.work.cancel_asked = True
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self.work.cancel, job_id)
            except RuntimeError:  # the loop just closed: the work is over
                pass
