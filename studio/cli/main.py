"""The ``studio`` command.

    studio                       open the desktop app (see studio/__main__.py)
    studio --batch FILE [...]    run a project's pipeline headless (CI)
    studio new FILE --sample tiny-coder | --checkpoint DIR [--target T ...]
    studio info FILE

Exit codes: 0 success, 1 an accuracy gate failed, 2 bad input (one line on stderr),
3 a stage crashed (a bug: its traceback is in the job log).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other bad input
        raise StudioError(f"{message} (see studio --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="studio", description="QStudio: deploy language models to Snapdragon NPUs.")
    p.add_argument("--batch", metavar="FILE", help="run the project's pipeline headless")
    p.add_argument("--stages", help="comma-separated stages to run (their inputs run too)")
    p.add_argument("--target", action="append", help="only this target (repeatable)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    n = sub.add_parser("new", help="create a project file")
    n.add_argument("file")
    g = n.add_mutually_exclusive_group(required=True)
    g.add_argument("--sample", help="a built-in sample model, e.g. tiny-coder")
    g.add_argument("--checkpoint", help="a local Hugging Face checkpoint folder")
    n.add_argument("--target", dest="new_targets", action="append", help="target chip (repeatable)")
    n.add_argument("--scheme", default=None, help="W8A16 (default), W8A8 or FP16")
    i = sub.add_parser("info", help="describe a project file")
    i.add_argument("file")
    i.add_argument("--json", dest="info_json", action="store_true")
    sub.add_parser("targets", help="list the chip catalog")
    return p


class _Printer:
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


def _batch(args) -> int:
    from studio.services.session import Studio

    studio = Studio.open(Path(args.batch))
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    if not args.quiet:
        if studio.interrupted_jobs:
            print(f"note: {studio.interrupted_jobs} job(s) of an earlier run were interrupted; "
                  "resuming from the cached stages", file=sys.stderr)
        print(f"QStudio batch: {studio.project.name} ({studio.project.path})", file=sys.stderr)
    studio.pipeline.listeners.append(_Printer(args.quiet))
    try:
        summary = asyncio.run(studio.run_pipeline(stages, args.target))
    finally:
        studio.close()
    if args.json:
        print(json.dumps(summary.to_dict(), indent=1))
    if not args.quiet:
        for g in summary.gates:
            mark = "pass" if g["passed"] else "FAIL"
            print(f"  gate {g['gate']} [{g['target']}]: {g['value']:.4f} "
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


def _new(args) -> int:
    from studio.services.session import Studio

    source = f"sample:{args.sample}" if args.sample else str(Path(args.checkpoint).resolve())
    if args.sample:
        from studio.core import samples

        samples.sample_path(args.sample)  # unknown sample: a clear error
    sections: dict[str, Any] = {}
    if args.scheme:
        sections["quantization"] = {"scheme": args.scheme}
    if not args.sample:
        from studio.engine import hf_import

        hf_import.open_checkpoint(Path(args.checkpoint))  # not a checkpoint: a clear error
    studio = Studio.create(Path(args.file), source, args.new_targets, **sections)
    print(f"created {studio.project.path}")
    studio.close()
    return 0


def _info(args) -> int:
    from studio.core import project as projectfile

    p = projectfile.load(Path(args.file))
    data = p.to_dict()
    data["file"] = str(p.path)
    from studio.core.jobs import JobStore

    db = p.folder / "runs.sqlite"
    runs = []
    if db.exists():
        store = JobStore(db)
        runs = store.runs(5)
        store.close()
    data["recent_runs"] = [{"id": r["id"], "state": r["state"]} for r in runs]
    metrics = []
    if runs:
        store = JobStore(db)
        metrics = [m.to_dict() for m in store.metrics(run_id=runs[0]["id"])]
        store.close()
    data["latest_metrics"] = metrics
    if args.info_json:
        print(json.dumps(data, indent=1))
        return 0
    print(f"{p.name}  ({p.path})")
    print(f"  model     {p.model['source']}" + (f"  draft {p.model['draft']}" if p.model["draft"] else ""))
    print(f"  export    prompt {p.export['prompt_length']}, context {p.export['context_length']}")
    q = p.quantization
    print(f"  recipe    {q['scheme']} {q['weight_granularity']}, {q['calibration_samples']} "
          f"calibration windows, {len(q['overrides'])} override(s)")
    print(f"  targets   {', '.join(p.targets)}")
    print(f"  stages    {', '.join(p.pipeline['stages'])}")
    for r in data["recent_runs"]:
        print(f"  run {r['id']}: {r['state']}")
    if metrics:
        print(f"  latest run's figures (run {runs[0]['id']}):")
        for m in metrics:
            where = m["device"] + (f" / {m['target']}" if m["target"] else "")
            print(f"    {m['name']:<26} {m['value']:>12.4g} {m['unit']:<9} {m['source']:<10} {where}")
    return 0


def _targets() -> int:
    from studio.core.catalog import load_catalog

    for key, chip in load_catalog().items():
        print(f"{key:<24} {chip.name:<32} htp_arch v{chip.htp_arch}  soc_model {chip.soc_model}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        args = _parser().parse_args(argv)
        if args.command == "new":
            return _new(args)
        if args.command == "info":
            return _info(args)
        if args.command == "targets":
            return _targets()
        if args.batch:
            return _batch(args)
        raise StudioError("nothing to do: give --batch FILE, or a command (new, info, targets)")
    except StudioError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
