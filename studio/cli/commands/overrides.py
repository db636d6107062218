"""``studio overrides export FILE OUT | import FILE ENCODINGS | adopt FILE``: per-tensor
precision as QNN / AIMET encodings JSON, and the auto-precision stage's rules into the recipe.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from studio.cli.command import Context, Parser
from studio.cli.commands import registered
from studio.cli.common import out_path
from studio.services import precision
from studio.services.session import Studio


def add_arguments(p: argparse.ArgumentParser) -> None:
    osub = p.add_subparsers(dest="overrides_command", parser_class=Parser, required=True)
    oe = osub.add_parser("export", help="write the quantized graph's encodings-override JSON")
    oe.add_argument("file")
    oe.add_argument("out")
    oi = osub.add_parser("import", help="add an encodings JSON's precisions to the recipe")
    oi.add_argument("file")
    oi.add_argument("encodings")
    oa = osub.add_parser("adopt", help="copy the auto-precision stage's rules into the recipe")
    oa.add_argument("file")


def run(args: argparse.Namespace, ctx: Context) -> int:
    out = out_path(args.out) if args.overrides_command == "export" else None  # before any work
    studio = Studio.open(Path(args.file))
    try:
        if args.overrides_command == "export":
            n = precision.export_overrides(studio, out)
            print(f"wrote {args.out}: {n['activations']} activation and {n['params']} weight "
                  "encodings (qnn-onnx-converter --quantization_overrides)")
            return 0
        if args.overrides_command == "adopt":
            rules = precision.adopt_autoprecision(studio)
            print(f"{studio.project.path.name}: {len(rules)} auto-precision rule(s) in "
                  "quantization.overrides" + ("" if rules else " (the base already met the "
                                              "target)"))
            for pattern, prec in rules.items():
                print(f"  {pattern} = {prec}")
            return 0
        added, unnamed = precision.import_overrides(studio, Path(args.encodings))
        print(f"added {len(added)} override(s) to {studio.project.path.name}")
        for pattern, prec in added.items():
            print(f"  {pattern} = {prec}")
        if unnamed:
            print(f"  {len(unnamed)} tensor(s) no rule can name (kept at the scheme's "
                  f"precision): {', '.join(unnamed[:5])}", file=sys.stderr)
        return 0
    finally:
        studio.close()


COMMAND = registered("overrides", add_arguments, run)
