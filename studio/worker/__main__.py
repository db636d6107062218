"""Worker subprocess: runs the stages of a pipeline run, one job spec per stdin line.

It reports JSON lines (see protocol.py) and exits at the end of its input. Heavy imports are
paid once per run; a native crash ends the process and the service starts a new one.
"""

from __future__ import annotations

import io
import json
import os
import sys
import traceback

from studio.core import thirdparty
from studio.core.errors import StudioError
from studio.worker.lifetime import die_with_parent
from studio.worker.protocol import JsonLinesProgress
from studio.worker.stages import run_stage


def run_one(line: str, progress) -> None:
    job_id = None
    try:
        spec = json.loads(line)
        job_id = spec.get("job_id")

        out = run_stage(spec, progress)
        progress.emit({"type": "result", "job_id": job_id, "result": out["result"],
                       "facts": out["facts"]})
    except StudioError as exc:
        progress.emit({"type": "error", "job_id": job_id, "kind": "user",
                       "message": exc.message, "exit_code": exc.exit_code})
    except Exception as exc:  # noqa: BLE001 - reported to the service with its traceback
        progress.emit({"type": "error", "job_id": job_id, "kind": "bug",
                       "message": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc()})


def main() -> int:
    thirdparty.settle()  # as its parent did (a worker Ray starts has an environment of its own)
    die_with_parent()
    # Keep the protocol on a private copy of stdout; native libraries that print to fd 1
    # (the QNN backend does) end up on stderr instead of corrupting the protocol.
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    out = io.TextIOWrapper(os.fdopen(proto_fd, "wb"), encoding="utf-8", line_buffering=True)
    sys.stdout = sys.stderr

    progress = JsonLinesProgress(out)
    for line in sys.stdin:
        if line.strip():
            run_one(line, progress)
    return 0


if __name__ == "__main__":
    sys.exit(main())
