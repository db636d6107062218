"""``studio sweep FILE [--name N | --axis KEY=V1,V2 ... | --ladder N] [--executor local|ray] [--workers K]
[--ray-address ADDR] [--transfer auto|copy] [--stages S,..] [--best RULE] [--search TRIALS
[--minutes M]] [--show] [--apply best|pN] [--json]``: run (or show) a recipe sweep and print
its points, front and best."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import number, whole
from studio.core import project as projectfile
from studio.core.errors import StudioError
from studio.core.units import signed
from studio.services.sensitivity import ladder
from studio.services.session import Studio
from studio.services.sweep_report import fmt_bytes, point_rows, write_sweep_report
from studio.services.sweeps import SweepRunner, apply_point_edits, find_spec, recorded, search


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("--name", help="which [[sweeps]] of the project (or a name for --axis)")
    p.add_argument("--axis", action="append", metavar="KEY=V1,V2",
                   help="a grid axis instead of a declared sweep (repeatable), e.g. "
                        "quantization.scheme=W8A16,W8A8; tables as a JSON list")
    p.add_argument("--ladder", type=whole(1, 64), metavar="RUNGS",
                   help="a precision ladder from the current sensitivity result: rung 0 is "
                        "the recipe as it is, rung k raises its k most sensitive layers (over "
                        "W4A16: their weights to INT8), each rung measured by the real stages; "
                        "with --best smallest, the smallest rung that passes every gate")
    p.add_argument("--executor", default=None, choices=("local", "ray"),
                   help="local (this machine's worker processes) or ray; default: the "
                        "project's pipeline.executor")
    p.add_argument("--workers", type=whole(1, 1024), help="jobs at once (default: what the cores and "
                                              "memory allow; on Ray, the cluster's CPUs)")
    p.add_argument("--ray-address", help="a running Ray cluster (HOST:PORT); default: start "
                                         "a local one")
    p.add_argument("--transfer", default="auto", choices=("auto", "copy"), help="Ray: auto (shared store where the "
                                                      "node sees it) or copy (through Ray)")
    p.add_argument("--stages", dest="sweep_stages",
                   help="comma-separated stages each point runs (default: up to validate)")
    p.add_argument("--best", help="smallest | most-accurate | fastest (among points that "
                                  "pass every gate)")
    p.add_argument("--search", type=whole(1, 10_000), metavar="TRIALS",
                   help="instead of the whole grid, a multi-objective search (optuna NSGA-II: "
                        "accuracy up, size down) over its axes, at most TRIALS points")
    p.add_argument("--minutes", type=number(above=0, high=7 * 24 * 60), help="with --search: stop asking for trials "
                                                 "after this many minutes")
    p.add_argument("--show", action="store_true", help="print the recorded sweep, run nothing")
    p.add_argument("--apply", metavar="POINT", help="write a point's settings into the project "
                                                   "file: best, or a label like p3")
    p.add_argument("--json", dest="sweep_json", action="store_true", help="print JSON")


def _progress(quiet: bool):
    seen: dict[str, str] = {}

    def on_event(ev: dict[str, Any]) -> None:
        if quiet:
            return
        if ev["kind"] == "point":
            p = ev["point"]
            if seen.get(p.point.id) == p.state:
                return
            seen[p.point.id] = p.state
            if p.state in ("succeeded", "failed", "invalid", "cancelled"):
                why = f"  {p.reason}" if p.reason else ""
                kept = " (recorded earlier)" if p.kept else ""
                print(f"  point {p.point.label:<4} {p.state:<10}{kept} {p.point.describe()}{why}",
                      file=sys.stderr)
        elif ev["kind"] == "job":
            j = ev["job"]
            if j.state in ("succeeded", "failed") and not j.cached:
                took = (j.finished or 0) - (j.started or 0)
                mark = "ok" if j.state == "succeeded" else "FAILED"
                print(f"  {mark:>6} {j.label:<28} {took:6.1f}s  for {len(j.points)} point(s)",
                      file=sys.stderr)
        sys.stderr.flush()

    return on_event


def _table(rec: dict[str, Any]) -> None:
    print(f"sweep {rec['name']}: {rec['state']}")
    rows = point_rows(rec)
    compiler = any(r["dram_bytes"] is not None for r in rows)  # profile in the sweep's stages
    print(f"{'pt':<4} {'state':<10} {'accuracy':>10} {'ppl Δ':>8} {'size':>11} "
          f"{'weights':>11} {'tok/s est':>9}"
          + (f" {'DRAM/step':>11} {'VTCM/step':>11}" if compiler else "") + "  settings")
    for r in rows:
        acc = f"{r['accuracy']:.6f}" if r["accuracy"] is not None else "—"
        ppl = (signed(r["perplexity_increase"], ".2%") if r["perplexity_increase"] is not None
               else "—")
        tps = f"{r['tokens_per_s']:.1f}" if r["tokens_per_s"] is not None else "—"
        mark = "*" if r["best"] else ("+" if r["front"] else " ")
        print(f"{r['label']:<3}{mark} {r['state']:<10} {acc:>10} {ppl:>8} "
              f"{fmt_bytes(r['size_bytes']):>11} {fmt_bytes(r['weight_bytes']):>11} {tps:>9}"
              + (f" {fmt_bytes(r['dram_bytes']):>11} {fmt_bytes(r['vtcm_bytes']):>11}"
                 if compiler else "") + f"  {r['settings']}")
        if r["reason"]:
            print(f"{'':16}{r['reason']}")
    print(f"accuracy: {rec['accuracy_title']} (simulated, HTP); size: compiled context "
          "binaries (measured file sizes); weights: estimated from the recipe; tok/s: "
          "performance model (estimated)"
          + ("; DRAM/VTCM per step: the HTP compiler's figures (optrace, deterministic)"
             if compiler else ""))
    print("+ on the Pareto front (accuracy vs size); * best by rule "
          f"{rec['best_rule']}")


def _apply(path: Path, rec: dict[str, Any], which: str) -> str:
    pts = rec["points"]
    if which == "best":
        if rec["best"] is None:
            raise StudioError(f"no point of {rec['name']} passes every gate: apply one by "
                              "label (e.g. --apply p1)")
        chosen = pts[rec["best"]]
    else:
        chosen = next((p for p in pts if p["label"] == which), None)
        if chosen is None:
            raise StudioError(f"no point {which!r} in {rec['name']}: use best or one of "
                              + ", ".join(p["label"] for p in pts))
    project = projectfile.load(path)
    edits = apply_point_edits(project, chosen["settings"])
    for e in edits:
        e.apply(project)
    projectfile.save(project)
    return chosen["label"]


def run(args: argparse.Namespace, ctx: Context) -> int:
    path = Path(args.file)
    project = projectfile.load(path)
    stages = ([s.strip() for s in args.sweep_stages.split(",") if s.strip()]
              if args.sweep_stages is not None else None)
    if stages == []:
        raise StudioError("--stages names no stage: give e.g. export,quantize,compile,validate")
    if args.ladder and args.axis:
        raise StudioError("--ladder and --axis both say what to sweep: give one")
    spec, studio = _sweep_spec(args, project, stages)
    summary = None
    try:
        if not args.show:
            summary, spec_name = _run_sweep(args, project, studio, spec)
        else:
            spec_name = spec.name + ("-search" if args.search else "")
        rec = recorded(project, studio.jobs, spec_name)
        if rec is None:
            raise StudioError(f"the sweep {spec.name!r} has not run yet: run it without --show")
        report = write_sweep_report(project, rec)
        applied = _apply(path, rec, args.apply) if args.apply else None
    finally:
        studio.close()
    if args.sweep_json:
        out = dict(rec)
        if not args.show:
            out["run"] = summary.to_dict()
        out["report"] = str(report)
        if applied:
            out["applied"] = applied
        print(json.dumps(out, indent=1, default=str))
    else:
        _table(rec)
        print(f"report: {report}")
        if applied:
            print(f"applied {applied} to {path}")
    return _exit_code(args, rec)


def _sweep_spec(args: argparse.Namespace, project, stages: list[str] | None):
    """The sweep to run (a ladder's rungs from the project's stored sensitivity result)
    and the session it runs in; an ``--apply`` point the sweep cannot have refused before
    it runs."""
    points, studio = None, None
    try:
        if args.ladder:  # its rungs come from the project's stored sensitivity result

            studio = Studio(project)
            points = ladder(project, studio.jobs, studio.store, args.ladder)
        spec = find_spec(project, args.name, args.axis, args.best, stages, points)
        if args.apply:  # a point the sweep cannot have: refused before it runs
            n = args.search or spec.size()
            label = args.apply
            if label != "best" and not (label[:1] == "p" and label[1:].isdigit()
                                        and 1 <= int(label[1:]) <= n):
                raise StudioError(f"--apply {label!r}: give best or a point label p1 .. p{n}")
    except BaseException:
        if studio is not None:
            studio.close()
        raise
    return spec, studio or Studio(project)


def _run_sweep(args: argparse.Namespace, project, studio, spec):
    """The sweep's points (or a search over them) run; its summary and the name it is
    recorded under."""
    runner = SweepRunner(project, studio.jobs, studio.store, spec, args.executor,
                         args.workers, args.ray_address, args.transfer)
    runner.listeners.append(_progress(args.quiet))
    if not args.quiet:
        what = (f"search of {args.search} trial(s) over {spec.size()} grid points"
                if args.search else f"{spec.size()} points")
        print(f"QStudio sweep {spec.name}: {what} ({project.path})", file=sys.stderr)
    if args.search:
        summary = asyncio.run(search(
            project, studio.jobs, studio.store, spec, args.search, args.minutes,
            args.executor, args.workers, args.ray_address, args.transfer,
            runner.listeners))
        spec_name = summary.name
    else:
        summary = asyncio.run(runner.run())
        spec_name = spec.name
    if not args.quiet:
        d = summary.to_dict()
        print(f"{summary.state} in {summary.seconds:.1f}s on {summary.executor}; "
              f"{d['jobs']['computed']} job(s) computed "
              f"({', '.join(f'{k} {v}' for k, v in d['jobs']['by_stage'].items())}), "
              f"{d['jobs']['cached']} from the store", file=sys.stderr)
    return summary, spec_name


def _exit_code(args: argparse.Namespace, rec: dict[str, Any]) -> int:
    """A sweep with a failed point (a gate or a stage) is not a success; one whose points
    the project refuses, all of them, ran nothing."""
    if rec["state"] == "cancelled":
        return 2
    failed = [p for p in rec["points"] if p["state"] == "failed"]
    invalid = [p for p in rec["points"] if p["state"] == "invalid"]
    if args.ladder:  # the lower rungs failing the gates is what a ladder measures
        return 0 if rec["best"] is not None else 1
    return 1 if failed or (invalid and len(invalid) == len(rec["points"])) else 0


COMMAND = registered("sweep", add_arguments, run)
