"""``studio layerdiff FILE [--target T] [--all] [--json]``: the layerdiff stage's result, FP32
vs host QDQ vs HTP tensor by tensor.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.core import project as projectfile
from studio.services.layerdiff import layerdiff_result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("--target", dest="ld_target", help="the target chip (default: the first)")
    p.add_argument("--all", dest="ld_all", action="store_true",
                   help="list every tensor, not only the boundaries between blocks")
    p.add_argument("--json", dest="ld_json", action="store_true",
                   help="print the result and every tensor's figures as JSON")


def _g(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def run(args: argparse.Namespace, ctx: Context) -> int:
    p = projectfile.load(Path(args.file))
    got = layerdiff_result(p, args.ld_target)
    if args.ld_json:
        print(json.dumps(got, indent=1))
        return 0
    r, rows = got["result"], got["rows"]
    pairs, title = list(r["pairs"]), r["pair_titles"]
    print(f"layer diff of {p.name} on {r['target']}: {r['graph']} graph, {r['windows']} "
          f"held-out window(s) of {r['window_tokens']} tokens, {r['probes']} tensors")
    print(f"  host QDQ: measured on host-cpu (ONNX Runtime, graph optimizations off); "
          f"HTP: {r['source']} on {r['device']}")
    print("  relative error ||a - b|| / ||b|| (cosine):")
    shown = [x for x in rows if args.ld_all or x["kind"] == "boundary"]
    width = max(len(x["name"]) for x in shown)
    print("  " + "tensor".ljust(width) + "".join(f"  {title[q]:>22}" for q in pairs))
    for x in shown:
        cells = "".join(f"  {_g(x[q]['rel_error']):>9} ({x[q]['cosine']:.6f})" for q in pairs)
        print("  " + x["name"].ljust(width) + cells)
    for q in pairs:
        fj = r["first_jump"].get(q)
        print(f"  first jump, {title[q]}: " + (
            f"{fj['name']} ({fj['op']}), {_g(fj['input_rel_error'])} -> {_g(fj['rel_error'])}"
            if fj else "none"))
    part = r.get("parting")
    if "parting" in r:
        print("  host QDQ and the HTP part at: " + (
            f"{part['name']} ({part['op']}): vs FP32 host QDQ {_g(part['qdq_rel_error'])}, "
            f"HTP {_g(part['htp_rel_error'])}; {part['worse']} worse" if part else "nowhere"))
    for a in r.get("apart", [])[:3]:
        print(f"    {a['name']}: error gain host QDQ {_g(a['qdq_gain'])}x, "
              f"HTP {_g(a['htp_gain'])}x")
    lg = r["logits"]
    print("  final logits vs FP32 (KL nats, top-1):" + "".join(
        f"  {name} {_g(lg[k]['kl_divergence'])}, {lg[k]['top1_agreement']:.1%}"
        for k, name in (("qdq", "host QDQ"), ("qdq_default", "host QDQ ORT-default"),
                        ("htp", "HTP")) if k in lg))
    changed = [k for k, v in r["extra_outputs"].items() if not v["logits_identical"]]
    print("  extra outputs changed the logits of: " + ", ".join(changed) if changed
          else "  extra outputs left every runtime's logits bit-identical")
    return 0


COMMAND = registered("layerdiff", add_arguments, run)
