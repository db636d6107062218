"""The compile stage: placement checked and context binaries compiled for one target chip."""

from __future__ import annotations

import shutil
from typing import Any

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.progress import Progress
from studio.engine.weightstore import graph_bytes
from studio.worker.context import StageContext
from studio.worker.stages._llm import EMBED_LIMIT, GRAPHS, htp_options


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    from studio.engine import qnn
    from studio.engine.chain import part_dirs
    from studio.engine.llm_runtime import load_graph_spec

    qdir = ctx.input("quantize")
    fp16 = ctx.fp16
    chip = ctx.chip
    extra = htp_options(ctx)
    placement, compiled = {}, {}
    folders = part_dirs(load_graph_spec(qdir), qdir)
    steps = [(src, g) for src in folders for g in GRAPHS]
    for i, (src, g) in enumerate(steps):
        where = "" if src == qdir else f"{src.name}/"
        label = g if src == qdir else f"{g} ({src.name.replace('_', ' ')})"
        dst = ctx.out / where
        dst.mkdir(parents=True, exist_ok=True)
        progress.check()
        progress.update(i / len(steps), f"checking placement of {label} on {chip.name}")
        rep = qnn.placement_report(src / f"{g}.onnx", chip, fp16=fp16, extra_options=extra)
        placement[where + g] = rep
        if not rep["all_on_npu"]:
            names = ", ".join(f"{n['name']} ({n['op_type']})" for n in rep["cpu_nodes"][:5])
            raise StudioError(
                f"{len(rep['cpu_nodes'])} node(s) of the {label} graph cannot run on the NPU of "
                f"{chip.name}: {names}; change their precision or the recipe"
            )
        progress.update((i + 0.5) / len(steps), f"compiling {label} context binary for "
                                                 f"{chip.name}")
        # a context binary is embedded in its ONNX model unless the model would come near
        # protobuf's 2 GB limit (real 1-8 B LLMs): then it is written beside it (_qnn.bin)
        size = graph_bytes(src / f"{g}.onnx")
        compiled[where + g] = qnn.compile_context(src / f"{g}.onnx", dst / f"{g}_ctx.onnx",
                                                  chip, fp16=fp16, embed=size < EMBED_LIMIT,
                                                  extra_options=extra)
    shutil.copy2(qdir / "graph.json", ctx.out / "graph.json")
    atomic_write_json(ctx.out / "placement.json", placement)
    sdk = next(iter(compiled.values())).get("sdk_version", "")
    if extra:
        progress.log("warning: block-wise (LPBQ) 4-bit weights: the x86 HTP simulator was "
                     "measured computing them wrong (logits cosine ~0.62 vs 0.999 on the host "
                     "QDQ model, tiny-coder); validate on a device before trusting them")
    ctx.fact("compile_seconds", sum(c.get("seconds", 0.0) for c in compiled.values()), "s")
    return {
        "summary": f"context binaries for {chip.name} (QNN SDK {sdk}); all nodes on the NPU",
        "placement": {g: {k: v for k, v in r.items() if k != "cpu_nodes"} for g, r in placement.items()},
        "sdk_version": sdk, "tool": {"qnn_sdk": sdk}, "metrics": [],
    }
