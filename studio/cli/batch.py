"""``studio --batch FILE [--stages S,..] [--target T ...] [--remeasure] [--json] [--quiet]``:
run a project's pipeline headless (CI), with one progress line per job on stderr.

Exit codes: 0 success, 1 an accuracy gate failed, 2 bad input or a run that did not succeed,
3 a stage crashed (the summary's exit code).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from studio.cli.command import Context
from studio.core import project as projectfile
from studio.services.pipeline import plan, preflight
from studio.services.session import Studio


class EventPrinter:
    """Terminal progress: one line per job state change, a live line on a terminal."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self._last: dict[int, tuple[str, int]] = {}

    def __call__(self, event: dict[str, Any]) -> None:
        if self.quiet or event["kind"] != "job":
            return
        job = event["job"]
        pct = int(job.progress * 100)
        key = (job.state, pct // 10 if not self.tty else pct)
        if self._last.get(job.id) == key:
            return
        self._last[job.id] = key
        if job.state == "running":
            line = f"  {job.label:<28} {pct:3d}%  {job.message}"
            if self.tty:
                sys.stderr.write("\r\033[K" + line[:150])
            else:
                sys.stderr.write(line + "\n")
        elif job.state in ("succeeded", "failed", "cancelled", "interrupted"):
            if self.tty:
                sys.stderr.write("\r\033[K")
            mark = {"succeeded": "ok", "failed": "FAILED", "cancelled": "--"}.get(job.state, "!!")
            took = f"{job.elapsed:6.1f}s" if job.elapsed is not None else ""
            cached = " (cached)" if job.cached else ""
            sys.stderr.write(f"{mark:>6} {job.label:<28} {took}{cached}  {job.message}\n")
        sys.stderr.flush()


def run_batch(args: argparse.Namespace, ctx: Context) -> int:
    # --stages "" names no stage (refused by the plan), it does not mean all of them
    stages = ([s.strip() for s in args.stages.split(",") if s.strip()]
              if args.stages is not None else None)
    # the plan and its inputs first: bad input is refused before the project folder exists
    project = projectfile.load(Path(args.batch))
    preflight(project, plan(project, stages, args.target))
    studio = Studio(project)
    if not args.quiet:
        if studio.interrupted_jobs:
            print(f"note: {studio.interrupted_jobs} job(s) of an earlier run were interrupted; "
                  "resuming from the cached stages", file=sys.stderr)
        print(f"QStudio batch: {studio.project.name} ({studio.project.path})", file=sys.stderr)
    studio.pipeline.listeners.append(EventPrinter(args.quiet))
    try:
        summary = asyncio.run(studio.run_pipeline(stages, args.target,
                                                  remeasure=args.remeasure))
    finally:
        studio.close()
    if args.json:
        print(json.dumps(summary.to_dict(), indent=1))
    if not args.quiet:
        for g in summary.gates:
            mark = "pass" if g["passed"] else "FAIL"
            on = f", {g['stage']}" if g.get("stage", "validate") != "validate" else ""
            print(f"  gate {g['gate']} [{g['target']}{on}]: {g['value']:.4f} "
                  f"(threshold {g['threshold']}) {mark}", file=sys.stderr)
        if summary.report:
            print(f"report: {summary.report}", file=sys.stderr)
        print(f"{summary.state} in {summary.seconds:.1f}s", file=sys.stderr)
    if summary.state != "succeeded":
        failed = [j for j in summary.jobs if j.state == "failed"]
        msg = summary.error or (failed[0].message if failed else summary.state)
        print(f"error: {msg}", file=sys.stderr)
        return summary.exit_code or 2
    return 0 if summary.gates_passed else 1
