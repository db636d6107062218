"""``studio new FILE --sample NAME | --checkpoint DIR | --onnx MODEL.onnx [--target T ...]
[--scheme S] [--calibration DATA.npz] [--validation DATA.npz] [--shape NAME=D,..] [--placement P]
[--seq-len N]``: create a project file; bad input is refused before anything is written.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import parse_shapes, setting_arg
from studio.core import project as projectfile
from studio.core.errors import StudioError
from studio.services.graphs import check_graph_samples
from studio.services.projects import source_ref
from studio.services.prompts import project_lines
from studio.services.session import Studio


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--sample", help="a built-in sample model, e.g. tiny-coder")
    g.add_argument("--checkpoint", help="a local Hugging Face checkpoint folder")
    g.add_argument("--onnx", dest="new_onnx", metavar="MODEL.onnx",
                   help="any ONNX network (model.kind onnx-graph)")
    p.add_argument("--target", dest="new_targets", action="append", help="target chip (repeatable)")
    p.add_argument("--scheme", default=None, help="W8A16 (default), W8A8 or FP16")
    p.add_argument("--calibration", dest="new_calibration", metavar="DATA.npz",
                   help="ONNX graphs: calibration samples, one array per input")
    p.add_argument("--validation", dest="new_validation", metavar="DATA.npz",
                   help="ONNX graphs: held-out validation samples")
    p.add_argument("--shape", dest="new_shapes", action="append", default=[],
                   metavar="NAME=D,D,...", help="ONNX graphs: a fixed shape for a dynamic input")
    p.add_argument("--placement", dest="new_placement", choices=("strict", "partition", "rewrite"),
                   help="encoders and ONNX graphs: the way past ops the HTP refuses")
    p.add_argument("--image-size", dest="new_image_size", type=setting_arg("export.image_size"),
                   help="vision-language checkpoints: the image side the vision encoder takes "
                        "(default 448 where the checkpoint's image processor gives it; within "
                        "its min_pixels / max_pixels, a multiple of patch x merge)")
    p.add_argument("--seq-len", dest="new_seq_len", type=setting_arg("graph.seq_len"),
                   help="encoders: the exported sequence length (default 128)")


def run(args: argparse.Namespace, ctx: Context) -> int:
    Studio.new_file(Path(args.file))  # a file there, or no folder for it: before any work
    # an unknown sample or a folder that is not a checkpoint: a clear error, nothing written
    if args.sample:
        source = source_ref("sample", args.sample)
    elif args.new_onnx:
        source = source_ref("onnx", args.new_onnx)
    else:
        source = source_ref("checkpoint", args.checkpoint)
    sections: dict[str, Any] = {}
    quant: dict[str, Any] = {}
    if args.scheme:
        quant["scheme"] = args.scheme
    if args.new_placement:
        quant["placement"] = args.new_placement
    if quant:
        sections["quantization"] = quant
    graph: dict[str, Any] = {}
    if args.new_shapes:
        graph["shapes"] = parse_shapes(args.new_shapes)
    for key, value in (("calibration", args.new_calibration),
                       ("validation", args.new_validation)):
        if value:
            path = Path(value).expanduser().resolve()
            if not path.is_file() or path.suffix.lower() not in (".npz", ".npy"):
                raise StudioError(f"--{key} {value}: no such .npz / .npy file of sample inputs")
            graph[key] = str(path)
    if args.new_seq_len is not None:
        graph["seq_len"] = args.new_seq_len
    if args.new_image_size is not None:
        if not args.checkpoint:
            raise StudioError("--image-size is for vision-language checkpoints (--checkpoint)")
        sections["export"] = {"image_size": args.new_image_size}
    if graph:
        if projectfile.infer_kind(source) == "causal-lm":
            raise StudioError("--calibration, --validation, --shape and --seq-len are for "
                              "encoders and ONNX graphs; a causal LM calibrates on text "
                              "(quantization.calibration_text)")
        sections["graph"] = graph
    if args.new_onnx and graph.get("calibration"):
        # the shapes and the sample files against the graph: now, not minutes into a run
        check_graph_samples(Path(source), graph.get("shapes", {}), Path(graph["calibration"]),
                            Path(graph["validation"]) if graph.get("validation") else None)
    studio = Studio.create(Path(args.file), source, args.new_targets,
                           image_size_name="--image-size", **sections)
    print(f"created {studio.project.path}")

    for line in project_lines(studio.project):  # the chat template; a VL model's image
        print(f"  {line}")
    studio.close()
    return 0


COMMAND = registered("new", add_arguments, run)
