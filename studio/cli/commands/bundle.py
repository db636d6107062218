"""``studio bundle FILE [--target CHIP] [--out DIR] [--parts N] [--prefill-length N]
[--json]``: a Genie bundle for a target chip, checked by running Genie on the HTP simulator.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import native_output_to_stderr, out_path, setting_arg
from studio.core import project as projectfile
from studio.services.bundle import build_bundle


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("--target", help="the chip (default: the first target)")
    p.add_argument("--out", help="where the bundle folder goes (default: the project folder's "
                                 "bundles/CHIP)")
    p.add_argument("--parts", type=setting_arg("bundle.parts"), help="the parts the bundle must hold: the "
                                             "compile stage's (export.parts); another count "
                                             "is refused (default: bundle.parts, 0: any)")
    p.add_argument("--prefill-length", type=setting_arg("bundle.prefill_length"), help="tokens per pass of the AR-N prefill "
                                                      "graph (default: bundle.prefill_length; "
                                                      "1: no prefill graph)")
    p.add_argument("--json", dest="bundle_json", action="store_true")


def run(args: argparse.Namespace, ctx: Context) -> int:
    native_output_to_stderr()
    out = build_bundle(projectfile.load(Path(args.file)), args.target,
                       out_path(args.out, folder=True) if args.out else None, args.parts,
                       args.prefill_length)
    code = 0 if out["gates_passed"] else 1  # an accuracy gate failed on the shipped binaries
    if args.bundle_json:
        print(json.dumps(out, indent=1))
        return code
    print(f"{out['summary']}\nwrote {out['folder']}")
    for name, f in out["files"].items():
        print(f"  {name:<28} {f['bytes']:>12,} bytes  sha256 {f['sha256'][:16]}…")
    for c in out["checks"]:
        print(f"  {'same' if c['identical'] else 'DIFFERENT'}: {c['prompt']!r} + "
              f"{c['studio_tokens']} tokens (Genie {c['genie_wall_s']:.1f} s, simulated)")
    for g in out["gates"]:
        print(f"  gate {g['gate']} on the shipped binaries: {g['value']:.4f} "
              f"({out['source']}; threshold {g['threshold']}) "
              f"{'pass' if g['passed'] else 'FAIL'}")
    return code


COMMAND = registered("bundle", add_arguments, run)
