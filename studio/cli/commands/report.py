"""``studio report FILE [--run N] [--format html|md|pdf|json] [--out PATH]``: the report of
any run in the project's history (default: the newest run with results), written from the
run history's recorded job results.

The PDF is printed with Qt, which the command line may not import: ``studio/__main__.py``
hands a printer in (:attr:`studio.cli.command.Context.pdf_printer`); ``python -m studio.cli``
has none and says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import MAX_RUN_ID, out_path, whole
from studio.core import project as projectfile
from studio.core.artifacts import ArtifactStore
from studio.core.errors import StudioError
from studio.core.jobs import JobStore
from studio.services import reports


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("--run", dest="report_run", type=whole(1, MAX_RUN_ID), metavar="N",
                   help="which run (default: the newest run with results; see studio info)")
    p.add_argument("--format", dest="report_format", default="html",
                   help="html (default), md, pdf or json")
    p.add_argument("--out", dest="report_out", metavar="PATH",
                   help="where to write it (default: <project>.studio/reports/run-N.<ext>)")


def run(args: argparse.Namespace, ctx: Context) -> int:
    fmt = reports.check_format(args.report_format)
    if fmt == "pdf" and ctx.pdf_printer is None:
        raise StudioError("--format pdf needs the studio command (python -m studio), which "
                          "prints with Qt: or choose html, md or json")
    p = projectfile.load(Path(args.file))
    db = p.folder / "runs.sqlite"
    if not db.exists():
        raise StudioError(f"{p.path.name} has no runs yet: run the pipeline first "
                          f"(studio --batch {args.file})")
    out = out_path(args.report_out) if args.report_out else None
    jobs = JobStore(db)
    try:
        run_id = args.report_run if args.report_run is not None else reports.default_run(jobs)
        data = reports.report_data(p, jobs, ArtifactStore(p.folder / "artifacts"), run_id)
    finally:
        jobs.close()
    out = out or reports.default_out(p, run_id, fmt)
    reports.write(data, fmt, out, ctx.pdf_printer)
    print(out)
    if not getattr(args, "quiet", False):
        gates = data["gates"]
        failed = sum(not g["passed"] for g in gates)
        what = (f"{failed} of {len(gates)} gates failed" if failed else
                f"{len(gates)} gates passed" if gates else "no gates checked")
        print(f"report of run {run_id} ({fmt}): {what}", file=sys.stderr)
    return 0


COMMAND = registered("report", add_arguments, run)
