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
    from studio.engine import partresume, qnn
    from studio.engine.chain import part_dirs
    from studio.engine.llm_parts import iter_parts
    from studio.engine.llm_runtime import load_graph_spec

    qdir = ctx.input("quantize")
    fp16 = ctx.fp16
    chip = ctx.chip
    extra = htp_options(ctx)
    placement, compiled = {}, {}
    spec = load_graph_spec(qdir)
    folders = part_dirs(spec, qdir)
    parts = list(iter_parts(spec))
    # a kept work folder: the parts a killed run compiled are kept (a model in parts)
    done = partresume.keep_finished(ctx.out, parts) if len(parts) > 1 else {}
    if len(parts) == 1:
        partresume.clear(ctx.out)
    for row in done.values():
        placement.update(row["placement"])
        compiled.update(row["compiled"])
    if done:
        progress.log(f"{len(done)} of {len(parts)} parts: compiled by an interrupted run, kept")
    steps = [(src, g) for k, src in enumerate(folders) if k not in done for g in GRAPHS]
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
        if where and g == GRAPHS[-1]:  # the part's graphs are compiled: a kill keeps them
            part = parts[folders.index(src)]
            mine = [where + x for x in GRAPHS]
            partresume.mark(dst, {"start": part.start, "stop": part.stop,
                                  "placement": {k: placement[k] for k in mine},
                                  "compiled": {k: compiled[k] for k in mine}}, {})
    partresume.unmark(ctx.out)
    order = [("" if src == qdir else f"{src.name}/") + g for src in folders for g in GRAPHS]
    placement = {k: placement[k] for k in order}
    compiled = {k: compiled[k] for k in order}
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
