"""Runs the bad-input corpus (tests/cli/test_bad_input_corpus.py) in one child process:
``python -m tests.cli.corpus_driver ROOT CASES.json RESULTS.json``.

Each case is the real command line (``studio.cli.main.main``) on its arguments, in a process
whose HOME is a temporary folder; for each the driver records the exit code, what the command
wrote on stderr, whether an exception escaped (the traceback a user would see) and every path
under ROOT (the HOME included) that appeared, changed or went away. One process for the whole
corpus keeps it to seconds: the interpreter and the studio are imported once.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import stat
import sys
import time
import traceback
from pathlib import Path

#: a case that takes longer has hung (a FIFO read, an unbounded expansion)
CASE_TIMEOUT_S = 30


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under ``root`` (links and FIFOs looked at, never followed or opened)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(folder, name)
            st = os.lstat(p)
            kind = stat.S_IFMT(st.st_mode)
            out[p] = (kind, st.st_size if stat.S_ISREG(st.st_mode) else 0,
                      st.st_mtime_ns if stat.S_ISREG(st.st_mode) else 0)
    return out


class Hang(BaseException):
    pass


def _alarm(_sig, _frame):
    raise Hang()


def run_case(argv: list[str]) -> dict:
    from studio.cli.main import main

    err, out = io.StringIO(), io.StringIO()
    escaped = ""
    started = time.monotonic()
    signal.alarm(CASE_TIMEOUT_S)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(argv)
    except Hang:
        rc, escaped = -1, f"hung for {CASE_TIMEOUT_S} s"
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - what a user would see as a traceback
        rc, escaped = 1, traceback.format_exc()
    finally:
        signal.alarm(0)
    return {"rc": rc, "stderr": err.getvalue(), "escaped": escaped,
            "seconds": round(time.monotonic() - started, 3)}


def main() -> int:
    root, cases_file, results_file = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    cases = json.loads(cases_file.read_text())
    signal.signal(signal.SIGALRM, _alarm)
    results = {}
    for name, argv in cases.items():
        before = snapshot(root)
        got = run_case(argv)
        after = snapshot(root)
        got["changed"] = sorted(p for p in set(before) | set(after)
                                if before.get(p) != after.get(p))
        results[name] = got
    results_file.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
