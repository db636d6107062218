"""``studio bisect FILE [--target T] [--graph prefill|decode] [--part N] [--device D] [--json]``: where a quantized
model leaves FP32, in the seed's three steps — (1) FP32 vs the HTP without quantization
(FP16), (2) the quantized model's error and the layers it comes from, (3) the first layer
whose activations leave the tolerance band on host QDQ and on the HTP — and a verdict naming
the layer. Progress on stderr; the project file is not changed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from studio.cli.batch import EventPrinter
from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import device_arg
from studio.services.bisect import bisect


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("--target", dest="bisect_target", help="the target chip (default: the first)")
    p.add_argument("--graph", dest="bisect_graph", choices=("prefill", "decode"),
                   default="prefill", help="the graph to bisect (default: prefill)")
    p.add_argument("--part", dest="bisect_part", type=int,
                   help="a model exported in parts: bisect only this part (1..parts; default: "
                        "each part in turn, the others in FP32)")
    p.add_argument("--device", dest="bisect_device", type=device_arg,
                   help="run the HTP side on a device through its agent: "
                        "agent:NAME@htp:CHIP (or @htp-sim:CHIP)")
    p.add_argument("--json", dest="bisect_json", action="store_true",
                   help="print the steps and the verdict as JSON")


def run(args: argparse.Namespace, ctx: Context) -> int:
    got = bisect(Path(args.file), args.bisect_target, args.bisect_graph,
                 on_event=EventPrinter(quiet=False), device=args.bisect_device,
                 log=lambda line: print(line, file=sys.stderr, flush=True),
                 part=args.bisect_part)
    if args.bisect_json:
        print(json.dumps(got, indent=1))
        return 0
    r = got["result"]
    part = r.get("part")
    print(f"bisection of the {got['graph']} graph"
          + (f" of part {part['index']}/{part['of']} (blocks {part['blocks'][0]}–"
             f"{part['blocks'][1] - 1}, the other parts in FP32)" if part else "")
          + f" on {got['target']}: FP32 and host QDQ "
          f"measured on host-cpu, the HTP {r['source']} on {r['device']}; {r['windows']} "
          f"held-out window(s), {r['probes']} tensors")
    for row in got.get("parts") or []:
        if len(got["parts"]) > 1:
            print(f"  part {row['part']}: final-logits KL {row['output_kl']:.3g} nats "
                  f"({row['output_kl_of']}); "
                  + row["verdict"].split(": ", 1)[1])
    for s in got["steps"]:
        print(f"  {s['step']}. {s['title']}: {s['finding']}")
        if s.get("note"):
            print(f"     ({s['note']})")
    print(f"verdict: {got['verdict']}")
    if got["layer"]:
        print(f"  open it: Validation page, Layer diff -> {got['tensor']}; Precision page, "
              f"layer grid -> {got['layer']} (or studio layerdiff {args.file} --all)")
    sys.stdout.flush()
    return 0


COMMAND = registered("bisect", add_arguments, run)
