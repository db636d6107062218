"""The CPU threads one ONNX Runtime session uses (the host CPU's graphs and the HTP
simulator's host side): 2 by default, what the workstations this studio is sized for have,
or ``QSTUDIO_THREADS`` (1-64) where several runs share a machine (a test suite split over
workers sets 1)."""

from __future__ import annotations

import os


def host_threads() -> int:
    raw = os.environ.get("QSTUDIO_THREADS", "").strip()
    if raw.isdigit() and 1 <= int(raw) <= 64:
        return int(raw)
    return 2


#: read once, when the engine is imported
HOST_THREADS = host_threads()
