"""``studio graph MODEL.onnx --calibration DATA.npz [--shape NAME=D,..] [--target CHIP]
[--placement strict|partition|rewrite] [--scheme W8A16|W8A8] [--weights per_channel|per_tensor]
[--out DIR] [--json]``: any ONNX network onto a target's NPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import native_output_to_stderr, out_path, parse_shapes
from studio.services.graphs import deploy_graph


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx file")
    p.add_argument("--calibration", required=True,
                   help=".npz with one array per input ([N, ...] samples), or .npy")
    p.add_argument("--validation", help="held-out samples in the same form (default: the "
                                        "last calibration samples)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D,D,...",
                   help="a fixed shape for a dynamic input (repeatable)")
    p.add_argument("--target", default="snapdragon-8-gen-3", help="the chip")
    p.add_argument("--placement", choices=("strict", "partition", "rewrite"), default="strict",
                   help="ops the HTP refuses: fail (strict), leave them to the CPU "
                        "(partition) or replace them by known equivalents (rewrite)")
    p.add_argument("--scheme", choices=("W8A16", "W8A8"), default="W8A16")
    p.add_argument("--weights", choices=("per_channel", "per_tensor"), default="per_channel",
                   help="weight quantization granularity")
    p.add_argument("--out", help="folder for the files (default: MODEL.studio-graph/ beside "
                                 "the model)")
    p.add_argument("--json", dest="graph_json", action="store_true")


def run(args: argparse.Namespace, ctx: Context) -> int:
    shapes = parse_shapes(args.shape)
    model = Path(args.model).expanduser().resolve()
    out = out_path(args.out, folder=True) if args.out else model.with_suffix(
        ".studio-graph")
    native_output_to_stderr()
    res = deploy_graph(model, out, Path(args.calibration).expanduser(), args.target, shapes,
                       args.placement, args.scheme, args.weights,
                       validation=Path(args.validation).expanduser() if args.validation else None)
    if args.graph_json:
        print(json.dumps(res, indent=1))
        return 0
    n = res["on_npu"]
    print(f"{model.name} on {res['target']} ({res['placement']}): {n['qnn_nodes']} of "
          f"{n['total_nodes']} nodes on the NPU in {n['qnn_subgraphs']} subgraph(s)"
          + (f", {n['transitions']} NPU<->CPU transitions carrying {n['bytes_crossing']} bytes"
             if n["transitions"] else ""))
    for node in res["cpu_nodes"]:
        print(f"  on the CPU: {node['name']} ({node['op_type']}): {node['reason']}")
    for r in res["rewrites"]:
        print(f"  rewrite {r['rewrite']} at {len(r['nodes'])} place(s): {r['description']}")
    if res["rewrite_check"]:
        print(f"  rewrite check: max |error| {res['rewrite_check']['max_abs_error']:.3g} vs "
              "the original graph (FP32)")
    for name, o in res["validation"]["outputs"].items():
        print(f"{name}: cosine {o['cosine']:.5f}, max |error| {o['max_abs_error']:.4g} vs FP32 "
              f"({res['validation']['on']})")
    lat = res["latency_ms"]
    print(f"latency per inference: {lat['htp']['value']:.2f} ms ({lat['htp']['source']}: "
          f"{lat['htp']['note']}); FP32 on the host CPU {lat['cpu_fp32']['value']:.2f} ms "
          f"(measured)\nwrote {out}")
    return 0


COMMAND = registered("graph", add_arguments, run)
