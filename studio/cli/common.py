"""Helpers more than one command of the ``studio`` command line uses."""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
import time
from pathlib import Path

from studio.core.devices import check_name, device_names
from studio.core.errors import StudioError
from studio.core.fsutil import check_destination
from studio.core.jobs import JobStore
from studio.core.settings import SECTIONS, check_value, spec_of


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


def whole(low: int, high: int | None = None, hint: str = ""):
    """An argparse ``type``: a whole number from ``low`` to ``high`` (refused at parsing,
    before any work: one line, exit 2)."""

    def parse(text: str) -> int:
        value = int(text)  # a ValueError: argparse's "invalid int value: 'x'"
        if value < low or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{value} is not {span}{hint}")
        return value

    parse.__name__ = "int"
    return parse


#: the largest run id (SQLite's integers are 64-bit)
MAX_RUN_ID = 2**63 - 1


def number(low: float | None = None, high: float | None = None, *, above: float | None = None):
    """An argparse ``type``: a finite number within its bounds (``above``: strictly more)."""

    def parse(text: str) -> float:
        value = float(text)  # a ValueError: argparse's "invalid float value: 'x'"
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number")
        if ((low is not None and value < low) or (high is not None and value > high)
                or (above is not None and value <= above)):
            parts = ([f"more than {above:g}"] if above is not None else []) + (
                [f"at least {low:g}"] if low is not None else []) + (
                [f"at most {high:g}"] if high is not None else [])
            raise argparse.ArgumentTypeError(f"{value:g} must be {' and '.join(parts)}")
        return value

    parse.__name__ = "float"
    return parse


def setting_arg(key: str):
    """An argparse ``type`` for a flag that stands for the setting ``key`` (``section.key``):
    parsed as the setting's declared type and checked against its declared range, so the
    flag and the project file accept the same values (studio.core.settings)."""

    def parse(text: str):
        section, _, leaf = key.partition(".")
        kind = SECTIONS[section].specs()[leaf][1]
        value = float(text) if kind is float else int(text)
        try:
            check_value(key, value, spec_of(key))
        except StudioError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
        return value

    parse.__name__ = "number"
    return parse


def device_arg(text: str) -> str:
    """An argparse ``type`` for ``--device``: a device as a user names it (a kind's shorthand
    or an id), checked for its form at parsing (:func:`studio.core.devices.check_name`). An
    empty or blank name names no device and is refused (it used to mean the host CPU)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} names no device: leave --device out for the default, or give one of "
            + ", ".join(device_names()))
    try:
        check_name(text)
    except StudioError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


device_arg.__name__ = "device"


def out_path(value: str, *, folder: bool = False) -> Path:
    """A path the user gives a command to write (``--out``, an export file, a new project,
    a store), made absolute without following a link at its end and checked before any work
    by the one rule for every writer (:func:`studio.core.fsutil.check_destination`): its
    folder must exist (it is never made), and a link, a device, a FIFO or a folder where a
    file goes is refused, not written through."""
    return check_destination(Path(os.path.abspath(Path(value).expanduser())), folder=folder)


def when(t: float | None) -> str:
    """A run's time as local date and time, or a dash."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "—"


def open_history(p):
    """The project's run history, or None when it has none yet (nothing is created)."""
    db = p.folder / "runs.sqlite"
    return JobStore(db) if db.exists() else None
