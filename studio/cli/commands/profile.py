"""``studio profile show FILE [--run N] [--target T] [--by block|op_type|layer|layer-block]
[--json]``, ``studio profile export FILE [--run N] [--target T] --format chrome|csv OUT``,
``studio profile import PROFILE_FILE [--onnx MODEL] [--json]``: show, export or import
profiles.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studio.cli.command import Context, Parser
from studio.cli.commands import registered
from studio.cli.common import MAX_RUN_ID, out_path, whole
from studio.core import project as projectfile
from studio.services import profile_view as pv
from studio.services import profiles


def add_arguments(p: argparse.ArgumentParser) -> None:
    prs = p.add_subparsers(dest="profile_command", parser_class=Parser, required=True)
    ps = prs.add_parser("show", help="a run's op table: by block (the seed's table), op type, "
                                     "layer, or layer x block")
    ps.add_argument("file")
    ps.add_argument("--run", type=whole(1, MAX_RUN_ID), help="the run (default: the newest with a profile)")
    ps.add_argument("--target", dest="profile_target", help="the chip / device id")
    ps.add_argument("--by", default="block", choices=["block", "op_type", "layer",
                                                      "layer-block"])
    ps.add_argument("--graph", dest="profile_graph", default="decode",
                    choices=["decode", "vision"], help="the decode step (default) or a "
                    "vision-language model's vision encoder")
    ps.add_argument("--json", dest="profile_json", action="store_true")
    pe = prs.add_parser("export", help="write a run's profile as chrome-trace JSON or CSV")
    pe.add_argument("file")
    pe.add_argument("out")
    pe.add_argument("--run", type=whole(1, MAX_RUN_ID), help="the run (default: the newest with a profile)")
    pe.add_argument("--target", dest="profile_target", help="the chip / device id")
    pe.add_argument("--format", dest="profile_format", required=True, choices=["chrome", "csv"])
    pi = prs.add_parser("import", help="read a profile another tool wrote (QNN CSV, optrace "
                                       "schematic, ORT JSON, chrome trace, AI Hub JSON)")
    pi.add_argument("profile_file")
    pi.add_argument("--onnx", help="the ONNX model it profiles (places ops in the seed's table)")
    pi.add_argument("--json", dest="profile_json", action="store_true")


def run(args: argparse.Namespace, ctx: Context) -> int:
    if args.profile_command == "export":
        out_path(args.out)  # before any work
    if args.profile_command == "import":
        data = profiles.import_profile_file(args.profile_file, onnx_path=args.onnx)
    else:
        p = projectfile.load(Path(args.file))
        data = profiles.load_run_profile(p, args.run, args.profile_target,
                                         getattr(args, "profile_graph", "decode"))
    if args.profile_command == "export":
        out = profiles.export(data, args.profile_format, args.out)
        print(f"wrote {out} ({args.profile_format}, {len(data.table)} events, "
              f"{data.source})")
        return 0
    if args.profile_json:
        print(json.dumps(profiles.summary(data), indent=1, default=str))
        return 0
    st = data.stats
    print(f"{data.title} · {data.source} · {len(data.profile.ops)} ops")
    if st.get("runs"):
        load = st.get("median_other_load")
        print(f"median of {st['runs']} runs {st['median']:,.0f} {data.unit}, "
              f"±{st['spread']:.1%} (range {st['range']:.0%})"
              + (f", other processes used {load:.0%} of the host CPUs" if load is not None
                 else ""))
        for w in st.get("warnings", []):
            print(f"warning: {w}")
    by = getattr(args, "by", "block")
    if by == "layer-block":
        layers, blocks, m = pv.layer_block_table(data)
        short = [b.split(" / ")[0].replace("attention: ", "attn ")[:10] for b in blocks]
        print(f"{'layer':<15}" + "".join(f"{b:>11}" for b in short))
        for i, name in enumerate(layers):
            print(f"{name:<15}" + "".join(f"{v:>10.1%} " for v in m[i]))
        return 0
    print(f"{by:<24} {'median':>14} {'share':>7} {'min':>14} {'max':>14} {'ops':>5}")
    for r in pv.breakdown(data, by):
        print(f"{r.name[:24]:<24} {r.value:>14,.0f} {r.share:>7.1%} {r.low:>14,.0f} "
              f"{r.high:>14,.0f} {r.count:>5}")
    return 0


COMMAND = registered("profile", add_arguments, run)
