"""A job's log as a user reads it: the stage's progress messages as timed lines, and the
libraries' noise told apart from the studio's own lines.

A stage reports most of what it does as progress messages ("part 1/2: position 16/128"),
and few log lines: a job's stored log holds both, each progress message once, stamped
with the seconds since the job started (what ``studio --batch`` prints as it goes), so a
long validation's log is never empty. Third-party libraries write to the worker's stderr
(ONNX Runtime's and QNN's start-up chatter, opset and tracer warnings): :func:`is_noise`
says which lines those are, so the Jobs page can hide them by default and show them in its
raw view. Pure Python, no Qt.
"""

from __future__ import annotations

import re

#: progress lines stored per job at most (a stage that reports every step of a long loop
#: would otherwise fill the history)
MAX_PROGRESS_LINES = 2000

#: a stored progress line: ``[   12.3 s] 45% part 1/2: position 16/128``
PROGRESS_LINE = re.compile(r"^\[\s*\d+(\.\d+)? s\] ")

#: lines third-party libraries write that say nothing about the job, each seen in a job's
#: log here (terminal colour codes are removed before matching)
NOISE = tuple(re.compile(p) for p in (
    r"LIBNATIVE: No alternate configuration",  # QNN's libnative start-up notice
    r"\[W:onnxruntime:",  # ONNX Runtime warnings
    # the QNN EP on the x86 simulator, at every HTP session: there is no power to configure
    r"CreateHtpPowerConfigId\] Failed to create HTP power config id",
    # onnxruntime.quantization at every 16-bit quantization of an opset-17 graph
    r"opset version is \d+, which does not support 16-bit integer quantization natively",
    r"TracerWarning",  # torch.jit tracing warnings (the exporter traces on purpose)
    r"^\s*warnings\.warn\(",  # the source line Python prints under a warning
    r"(?:Deprecation|Future)Warning:",
    r"^\s*$",
))
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def progress_line(elapsed_s: float, fraction: float | None, message: str) -> str:
    """A progress message as a stored log line."""
    pct = f"{fraction:4.0%} " if fraction is not None else ""
    return f"[{elapsed_s:7.1f} s] {pct}{message}"


def is_progress(line: str) -> bool:
    return bool(PROGRESS_LINE.match(line))


def plain(line: str) -> str:
    """The line without terminal colour codes (ONNX Runtime colours its errors)."""
    return _ANSI.sub("", line)


def is_noise(line: str) -> bool:
    """Whether a log line is a library's chatter rather than the studio's (hidden unless the
    raw log is asked for)."""
    text = plain(line)
    return any(p.search(text) for p in NOISE)


def readable(lines: list[str]) -> list[str]:
    """The lines a user reads by default: without the libraries' noise."""
    return [x for x in lines if not is_noise(x)]
