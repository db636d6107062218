"""Helpers more than one command of the ``studio`` command line uses."""

from __future__ import annotations

import io
import os
import sys
import time

from studio.core.errors import StudioError


def native_output_to_stderr() -> None:
    """Keep stdout for our own output: the QNN backend prints log lines on file descriptor 1,
    which would corrupt ``--json`` and the streamed text. Fd 1 becomes a copy of fd 2 and
    ``sys.stdout`` writes to a private duplicate of the original stdout."""
    sys.stdout.flush()
    try:
        private = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no usable descriptors (a windowed app): nothing to protect
        return
    sys.stdout = io.TextIOWrapper(os.fdopen(private, "wb"), encoding="utf-8",
                                  line_buffering=True)


def parse_shapes(specs: list[str]) -> dict[str, list[int]]:
    """``--shape NAME=D,D,...`` options (``studio new``, ``studio graph``) as {input: dims}."""
    shapes = {}
    for spec in specs:
        name, _, dims = spec.partition("=")
        try:
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise StudioError(f"--shape {spec!r}: write NAME=D,D,... with whole numbers, e.g. "
                              "image=1,3,224,224") from None
    return shapes


def when(t: float | None) -> str:
    """A run's time as local date and time, or a dash."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "—"


def open_history(p):
    """The project's run history, or None when it has none yet (nothing is created)."""
    from studio.core.jobs import JobStore

    db = p.folder / "runs.sqlite"
    return JobStore(db) if db.exists() else None
