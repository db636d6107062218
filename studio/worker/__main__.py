"""Worker subprocess: runs one stage of one job and reports JSON lines (see protocol.py)."""

from __future__ import annotations

import io
import json
import os
import sys
import traceback


def _die_with_parent() -> None:
    """A worker must not outlive the process that started it (kill -9 of a batch run)."""
    parent = os.getppid()
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def main() -> int:
    _die_with_parent()
    # Keep the protocol on a private copy of stdout; native libraries that print to fd 1
    # (the QNN backend does) end up on stderr instead of corrupting the protocol.
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    out = io.TextIOWrapper(os.fdopen(proto_fd, "wb"), encoding="utf-8", line_buffering=True)
    sys.stdout = sys.stderr

    from studio.core.errors import StudioError
    from studio.worker.protocol import JsonLinesProgress

    progress = JsonLinesProgress(out)
    try:
        spec = json.loads(sys.stdin.read())
        from studio.worker.stages import run_stage

        result = run_stage(spec, progress)
        progress.emit({"type": "result", "result": result})
        return 0
    except StudioError as exc:
        progress.emit({"type": "error", "kind": "user", "message": exc.message,
                       "exit_code": exc.exit_code})
        return 2
    except BaseException as exc:  # noqa: BLE001 - reported to the service with its traceback
        progress.emit({"type": "error", "kind": "bug",
                       "message": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc()})
        return 1


if __name__ == "__main__":
    sys.exit(main())
