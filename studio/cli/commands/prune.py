"""``studio prune FILE [--drop N] [--out DIR] [--json]``: rank the blocks by ablation and
write a pruned checkpoint.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import out_path, setting_arg
from studio.core import project as projectfile
from studio.core.units import signed
from studio.services.pruning import prune


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("--drop", type=setting_arg("pruning.drop_blocks"), help="blocks to drop (default: pruning.drop_blocks)")
    p.add_argument("--out", help="folder for the pruned checkpoint; a project file for it is "
                                 "written beside it (OUT.qstudio)")
    p.add_argument("--json", dest="prune_json", action="store_true")


def run(args: argparse.Namespace, ctx: Context) -> int:
    p = projectfile.load(Path(args.file))
    out = prune(p, args.drop, out_path(args.out, folder=True) if args.out else None)
    if args.prune_json:
        print(json.dumps(out, indent=1))
        return 0
    t = out["ablation"]
    print(f"perplexity over {t['tokens']} held-out tokens: {t['baseline_ppl']:.2f} "
          "(measured, host CPU, FP32)")
    print(f"{'dropped block':>14} {'perplexity':>11} {'change':>8}")
    for r in t["blocks"]:
        print(f"{r['block']:>14} {r['ppl']:>11.2f} {signed(r['delta'], '.1%'):>8}")
    print(f"pruned (without {t['dropped']}): ppl {t['pruned_ppl']:.2f} "
          f"({signed(t['pruned_delta'], '.1%')})")
    if out.get("checkpoint"):
        print(f"wrote {out['checkpoint']} and {out['project']} (model.source = the pruned "
              f"checkpoint): studio --batch {out['project']}")
    return 0


COMMAND = registered("prune", add_arguments, run)
