"""``studio waterfall FILE [--chip CHIP] [--json]``: the optimization waterfall, each step
measured on the host CPU and estimated for a chip.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import native_output_to_stderr
from studio.core import project as projectfile
from studio.services import waterfall as wfs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("--chip", help="the chip to estimate for (default: the first target)")
    p.add_argument("--json", dest="waterfall_json", action="store_true")


def run(args: argparse.Namespace, ctx: Context) -> int:
    native_output_to_stderr()
    data = wfs.waterfall(projectfile.load(Path(args.file)), args.chip)
    if args.waterfall_json:
        print(json.dumps(data, indent=1))
        return 0
    for line in wfs.table_lines(data):
        print(line)
    print(f"window {data['window']} of {data['context']} tokens · speculative: prompt lookup, "
          f"k <= {data['k']}, {data['tokens_per_pass']:.2f} tokens per target pass · pruned "
          f"without block(s) {data['dropped_blocks']}")
    print(data["estimate_note"])
    return 0


COMMAND = registered("waterfall", add_arguments, run)
