"""The progress object handed to every piece of background work.

Background work is a plain function ``run(inputs, progress) -> result``. ``progress``
reports fractions and log lines and carries cancellation; tests pass :class:`NullProgress`
or :class:`RecordingProgress`, the worker subprocess passes one that writes JSON lines.
"""

from __future__ import annotations

import threading
from typing import Protocol

from studio.core.errors import Cancelled


class Progress(Protocol):
    def update(self, fraction: float, message: str = "") -> None:
        """Report overall progress in [0, 1] with a short status message."""

    def log(self, message: str) -> None:
        """Append one line to the job's log."""

    def check(self) -> None:
        """Raise :class:`Cancelled` when the work was cancelled."""


class NullProgress:
    def update(self, fraction: float, message: str = "") -> None:
        pass

    def log(self, message: str) -> None:
        pass

    def check(self) -> None:
        pass


class RecordingProgress:
    """Keeps everything it is told; can be told to cancel after N checks (for tests)."""

    def __init__(self, cancel_after: int | None = None):
        self.updates: list[tuple[float, str]] = []
        self.lines: list[str] = []
        self.checks = 0
        self.cancel_after = cancel_after

    def update(self, fraction: float, message: str = "") -> None:
        self.updates.append((fraction, message))

    def log(self, message: str) -> None:
        self.lines.append(message)

    def check(self) -> None:
        self.checks += 1
        if self.cancel_after is not None and self.checks > self.cancel_after:
            raise Cancelled()


class SubProgress:
    """Maps [0, 1] of a sub-task onto [start, end] of its parent."""

    def __init__(self, parent: Progress, start: float, end: float):
        self.parent, self.start, self.end = parent, start, end

    def update(self, fraction: float, message: str = "") -> None:
        f = min(1.0, max(0.0, fraction))
        self.parent.update(self.start + (self.end - self.start) * f, message)

    def log(self, message: str) -> None:
        self.parent.log(message)

    def check(self) -> None:
        self.parent.check()


class EventProgress:
    """A progress that reports nothing and raises Cancelled once ``event`` is set (Stop in
    a front end, a cancel request to the agent): cancellation from another thread."""

    def __init__(self, event=None) -> None:
        self.event = event if event is not None else threading.Event()

    def update(self, fraction: float, message: str = "") -> None:
        pass

    def log(self, message: str) -> None:
        pass

    def check(self) -> None:
        if self.event.is_set():
            raise Cancelled()
