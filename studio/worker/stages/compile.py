"""The compile stage: placement checked and context binaries compiled for one target chip."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.partcache import files_digest
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
    todo = [k for k in range(len(folders)) if k not in done]
    reused: list[int] = []
    n_steps, i = len(todo) * len(GRAPHS), 0
    for k in todo:
        src, part = folders[k], parts[k]
        where = "" if src == qdir else f"{src.name}/"
        dst = ctx.out / where
        mine = [where + x for x in GRAPHS]
        part_key = None
        if where and ctx.parts.root is not None:  # a part: compiled before from these graphs?
            progress.update(i / n_steps, f"looking for {src.name.replace('_', ' ')} compiled "
                                         "before")
            part_key = ctx.parts.key("compile-part", salt=ctx.part_salt, chip=chip.key,
                                     fp16=fp16, extra=extra, embed_limit=EMBED_LIMIT,
                                     graphs=files_digest(src))
            row = ctx.parts.get(part_key, dst)
            if row is not None:
                placement.update(row["placement"])
                compiled.update({g: {**c, "ctx_path": str(dst / Path(c["ctx_path"]).name),
                                     "bin_files": [str(dst / Path(b).name)
                                                   for b in c["bin_files"]], "reused": True}
                                 for g, c in row["compiled"].items()})
                partresume.mark(dst, row, {})
                reused.append(k)
                i += len(GRAPHS)
                continue
        for g in GRAPHS:
            label = g if src == qdir else f"{g} ({src.name.replace('_', ' ')})"
            dst.mkdir(parents=True, exist_ok=True)
            progress.check()
            progress.update(i / n_steps, f"checking placement of {label} on {chip.name}")
            rep = qnn.placement_report(src / f"{g}.onnx", chip, fp16=fp16, extra_options=extra)
            placement[where + g] = rep
            if not rep["all_on_npu"]:
                names = ", ".join(f"{n['name']} ({n['op_type']})" for n in rep["cpu_nodes"][:5])
                raise StudioError(
                    f"{len(rep['cpu_nodes'])} node(s) of the {label} graph cannot run on the NPU "
                    f"of {chip.name}: {names}; change their precision or the recipe"
                )
            progress.update((i + 0.5) / n_steps, f"compiling {label} context binary for "
                                                 f"{chip.name}")
            # a context binary is embedded in its ONNX model unless the model would come near
            # protobuf's 2 GB limit (real 1-8 B LLMs): then it is written beside it (_qnn.bin)
            size = graph_bytes(src / f"{g}.onnx")
            compiled[where + g] = qnn.compile_context(src / f"{g}.onnx", dst / f"{g}_ctx.onnx",
                                                      chip, fp16=fp16, embed=size < EMBED_LIMIT,
                                                      extra_options=extra)
            i += 1
        if where:  # the part's graphs are compiled: a kill keeps them, other settings too
            row = {"start": part.start, "stop": part.stop,
                   "placement": {x: placement[x] for x in mine},
                   "compiled": {x: compiled[x] for x in mine}}
            partresume.mark(dst, row, {})
            if part_key is not None:
                ctx.parts.put(part_key, dst, row)
    if reused:
        progress.log(f"{len(reused)} of {len(parts)} parts (" + ", ".join(
            str(k + 1) for k in reused) + "): the same graphs were compiled for this target "
            "before, taken from then")
    partresume.unmark(ctx.out)
    order = [("" if src == qdir else f"{src.name}/") + g for src in folders for g in GRAPHS]
    placement = {k: placement[k] for k in order}
    compiled = {k: compiled[k] for k in order}
    shutil.copy2(qdir / "graph.json", ctx.out / "graph.json")
    atomic_write_json(ctx.out / "placement.json", placement)
    sdk = next(iter(compiled.values())).get("sdk_version", "")
    ctx.fact("compile_seconds", sum(c.get("seconds", 0.0) for c in compiled.values()
                                    if not c.get("reused")), "s")
    return {
        "summary": f"context binaries for {chip.name} (QNN SDK {sdk}); all nodes on the NPU"
                   + (f"; part{'s' if len(reused) > 1 else ''} "
                      f"{', '.join(str(k + 1) for k in reused)} of {len(parts)} as compiled "
                      "before from the same graphs" if reused else ""),
        "placement": {g: {k: v for k, v in r.items() if k != "cpu_nodes"} for g, r in placement.items()},
        "sdk_version": sdk, "tool": {"qnn_sdk": sdk}, "metrics": [],
    }
