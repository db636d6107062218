"""Errors the user can act on.

A :class:`StudioError` carries one line that says what is wrong and what to do; a raw QNN /
Genie / ONNX Runtime code in it is decoded (:mod:`studio.core.errorcodes`). The CLI
prints it on stderr and exits 2; the GUI shows it in a message. Anything else escaping
a stage is a bug and is reported with its traceback.
"""

from __future__ import annotations


class StudioError(Exception):
    """Bad input or an unusable environment: one line, no traceback, exit code 2."""

    exit_code = 2

    def __init__(self, message: str):
        # the table of backend codes needs dataclasses (and inspect behind it), which
        # studio --help, importing this module, does not; an error is raised rarely
        from studio.core.errorcodes import explain

        # a raw backend code in the message (QNN "err 1002", Genie "status -7", ONNX
        # Runtime's input errors) gets its cause and fix: nobody is left with a bare code
        message = explain(" ".join(str(message).split()))
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class GateFailed(StudioError):
    """An accuracy gate of the project failed (exit code 1 in batch mode)."""

    exit_code = 1


class StageCrashed(StudioError):
    """A stage failed with an unexpected error (a bug): exit code 3, traceback in the log."""

    exit_code = 3


class Cancelled(Exception):
    """Raised inside background work when its progress object reports cancellation."""
