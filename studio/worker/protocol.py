"""The JSON-lines protocol between the service layer and a worker subprocess.

The service starts ``python -m studio.worker`` and writes one JSON job spec on its stdin.
The worker writes one JSON object per line on its stdout:

``{"type": "progress", "fraction": 0.4, "message": "..."}``
``{"type": "log", "line": "..."}``
``{"type": "partial", "data": {...}}``  (a partial result a page may draw while the job runs)
``{"type": "result", "result": {...}}``  (last line of a successful job)
``{"type": "error", "kind": "user" | "bug", "message": "...", "traceback": "..."}``

Anything the worker's libraries print goes to its stderr, which the service keeps as log.
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any

from studio.core.errors import Cancelled


class JsonLinesProgress:
    """A :class:`~studio.core.progress.Progress` that writes protocol lines."""

    def __init__(self, out: IO[str] | None = None):
        self.out = out or sys.stdout
        self._last = -1.0

    def emit(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj, default=str) + "\n")
        self.out.flush()

    def update(self, fraction: float, message: str = "") -> None:
        f = round(min(1.0, max(0.0, fraction)), 3)
        if f != self._last or message:
            self._last = f
            self.emit({"type": "progress", "fraction": f, "message": message})

    def log(self, message: str) -> None:
        self.emit({"type": "log", "line": message})

    def partial(self, data: dict[str, Any]) -> None:
        self.emit({"type": "partial", "data": data})

    def check(self) -> None:
        # Cancellation terminates the worker process (SIGTERM); nothing to poll here.
        return None


__all__ = ["JsonLinesProgress", "Cancelled"]
