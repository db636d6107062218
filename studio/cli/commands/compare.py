"""``studio compare FILE [RUN_A [RUN_B]] [--json]``: two runs of the project's history:
the settings that changed and each metric's delta.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import MAX_RUN_ID, open_history, when, whole
from studio.core import figures
from studio.core import project as projectfile
from studio.core.errors import StudioError
from studio.core.units import signed as with_sign
from studio.services import history


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("run_a", nargs="?", type=whole(1, MAX_RUN_ID), metavar="RUN_A",
                   help="the run to compare against (default: the second newest with results)")
    p.add_argument("run_b", nargs="?", type=whole(1, MAX_RUN_ID), metavar="RUN_B",
                   help="the run to compare (default: the newest with results)")
    p.add_argument("--json", dest="compare_json", action="store_true",
                   help="print the comparison as JSON")


def run(args: argparse.Namespace, ctx: Context) -> int:
    p = projectfile.load(Path(args.file))
    store = open_history(p)
    if store is None:
        raise StudioError(f"{p.path.name} has no runs yet: run the pipeline twice "
                          "(e.g. studio --batch FILE, change the recipe, run again)")
    try:
        if args.run_a is not None and args.run_a == args.run_b:
            raise StudioError(f"run {args.run_a} was given twice: name two different runs")
        comp = history.compare(store, args.run_a, args.run_b)
    finally:
        store.close()
    a, b = comp["run_a"]["id"], comp["run_b"]["id"]
    if a == b:
        raise StudioError(f"run {a} is the newest run with results: name a second run to "
                          "compare it with (see studio info)")
    if args.compare_json:
        print(json.dumps(comp, indent=1))
        return 0
    print(f"run {b} vs run {a}")
    for side in ("run_a", "run_b"):
        r = comp[side]
        print(f"  run {r['id']}: {r['state']}, started {when(r['created'])}")
    if not comp["settings_recorded"]:
        print("settings: not recorded for both runs (runs of an older QStudio)")
    elif comp["settings"]:
        print("settings changed:")
        for s in comp["settings"]:
            print(f"  {s['key']}: {s['a']!r} → {s['b']!r}")
    else:
        print("settings: none changed")
    rows = comp["metrics"]
    if not rows:
        print("metrics: neither run recorded any")
        return 0
    print(f"metrics (run {a} → run {b}):")
    table = []
    for m in rows:
        rel = "" if not m["relative"] else f"({with_sign(m['relative'], '.2%')})"
        mark = {True: "better", False: "worse"}.get(m["better"], "")
        if m["delta"] == 0:
            mark = "same"
        elif m["a"] is None or m["b"] is None:
            mark = f"only in run {a if m['b'] is None else b}"
        name = m["name"]

        def value(v: float | None, name: str = name, unit: str = m["unit"]) -> str:
            return figures.fmt(name, v, unit)

        delta = m["delta"]
        change = "—" if delta is None else (
            ("+" if delta > 0 else "−" if delta < 0 else "") + value(abs(delta)))
        table.append((figures.title(name), m["source"], figures.where(m["device"], m["target"]),
                      f"{value(m['a'])} → {value(m['b'])}", change, rel, mark))
    widths = [max(len(r[i]) for r in table) for i in range(6)]
    for r in table:
        cells = [r[i].ljust(widths[i]) for i in range(6)] + [r[6]]
        print(("  " + "  ".join(cells)).rstrip())
    return 0


COMMAND = registered("compare", add_arguments, run)
