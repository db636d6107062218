"""The deployable binaries: one set of context binaries from the compile stage to the device.

The compile stage makes the graphs a phone runs — Genie's AR-N prefill graph and AR-1 decode
graph in Genie's I/O conventions (:mod:`studio.engine.genie`), per part for a model exported
in parts — quantizes the AR-N graph once (with the decode graph's activation scales),
compiles every graph once in the order Genie takes them, and records them in
``deploy.json`` beside the binaries. Validate, ``studio generate`` on the HTP, profile and
the bundle then run those same binaries: the bundle copies them and compiles nothing, so
Genie on the bundle and the studio's runtime on the simulator run the same bytes, and a
difference in their greedy text is a defect (not two quantized models).

Running them is :mod:`studio.engine.deployed`.

Models Genie cannot take yet (sliding-window layers, a vision-language model, the FP16
scheme) keep the studio's own prefill / decode graphs (:func:`supported`)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json, link_or_copy
from studio.core.lazyimport import lazy_module
from studio.core.partcache import files_digest
from studio.core.progress import Progress, SubProgress
from studio.engine import genie, graphio, qnn, qnn_names, weightshare
from studio.engine.calibration import ar_calibration_feeds, calibration_windows
from studio.engine.llm_export import export_ar_graph
from studio.engine.llm_parts import iter_part_ar_graphs
from studio.engine.llm_runtime import make_cpu_session
from studio.engine.part_runner import iter_parts
from studio.engine.qdq import quantize_like
from studio.engine.qnn_names import in_order, pick
from studio.engine.qnn_system import context_binary
from studio.engine.weightstore import graph_bytes

onnx = lazy_module("onnx")

#: the record of the deployable set in a compile stage's output
DEPLOY_FILE = "deploy.json"
#: the folder under a compile stage's output that holds the deployable binaries
DEPLOY_DIR = "genie"
#: in a staging folder, written last: what it was made from and what finish needs
STAGED_FILE = "staged.json"


@dataclass(frozen=True)
class DeploySettings:
    """What the deployable graphs are built from: the checkpoint (the AR-N prefill graph is
    exported from it), the recipe and calibration text the quantized graphs were made with,
    the prefill graph's length (0: the export's prompt length; 1: no prefill graph), the
    compile's extra QNN EP options and ``htp.graph_io``."""

    checkpoint: Path
    recipe: dict[str, Any]
    calibration_text: str
    prefill_length: int = 0
    htp_options: dict[str, str] | None = None
    graph_io: str = "quantized"
    weight_sharing: str = "auto"  # bundle.weight_sharing: auto, on, off


def supported(spec: dict[str, Any], fp16: bool, qdir: Path | None = None) -> str | None:
    """None when the model's deployable graphs are Genie's; else why the compile stage keeps
    the studio's own graphs for it (``qdir``: the quantized graphs, to see their cache)."""
    if qdir is not None and _int8_cache(Path(qdir), spec):
        return "an INT8 KV cache (quantization.kv_cache): Genie's graphs keep a 16-bit cache"
    if qdir is not None and _mask_bits(Path(qdir), spec) == 8:
        return "8-bit activations: Genie feeds a 16-bit attention mask (use W8A16 or W4A16)"
    if fp16:
        return "the FP16 scheme: Genie's graphs are quantized"
    if spec.get("sliding_window") and spec["sliding_window"] < spec["context_length"]:
        return "sliding-window layers: Genie's graphs of them are not supported yet"
    if spec.get("vision"):
        return "a vision-language model: its Genie-form prefill takes no image yet"
    return None


def _decode_graph(qdir: Path, spec: dict[str, Any]):
    """The first part's quantized decode graph (its structure only), or None."""
    names = [p["name"] for p in spec.get("parts") or []]
    graph = qdir / (names[0] if len(names) > 1 else "") / "decode.onnx"
    return onnx.load(str(graph), load_external_data=False).graph if graph.is_file() else None


def _int8_cache(qdir: Path, spec: dict[str, Any]) -> bool:
    g = _decode_graph(qdir, spec)
    return g is not None and any(
        i.name.startswith("past_key_") and i.type.tensor_type.elem_type in (
            onnx.TensorProto.UINT8, onnx.TensorProto.INT8) for i in g.input)


def _mask_bits(qdir: Path, spec: dict[str, Any]) -> int | None:
    """The bits the quantized decode graph's attention mask is quantized to (None: not
    quantized, or no graph)."""
    g = _decode_graph(qdir, spec)
    if g is None:
        return None
    q = next((n for n in g.node if n.op_type == "QuantizeLinear"
              and n.input[0] == "attention_mask"), None)
    if q is None or len(q.input) < 3:
        return None
    zp = next((i for i in g.initializer if i.name == q.input[2]), None)
    return 8 if zp is not None and zp.data_type in (onnx.TensorProto.UINT8,
                                                    onnx.TensorProto.INT8) else 16


def read(compile_dir: Path | None) -> dict[str, Any] | None:
    """The deployable set a compile stage wrote (``deploy.json``), or None (a compile of the
    studio's own graphs, or none)."""
    if compile_dir is None:
        return None
    f = Path(compile_dir) / DEPLOY_FILE
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        raise StudioError(f"{f} is unreadable ({exc}): run the compile stage again") from None


def prefill_ar(spec: dict[str, Any], prefill_length: int) -> int:
    """The AR-N of the prefill graph: ``bundle.prefill_length`` or the export's prompt length
    (1: no prefill graph, prompts go through the decode graph)."""
    cl = int(spec["context_length"]) + 1
    N = int(prefill_length) or int(spec["prompt_length"])
    if N >= cl - 1:
        raise StudioError(f"bundle.prefill_length {N} leaves no room in the context of {cl}: "
                          f"choose 1 (no prefill graph) to {cl - 2}")
    return N


# ---- the Genie-form graphs ------------------------------------------------------------------
def ar_feeds(export_dir: Path, spec: dict[str, Any], N: int, cl: int,
             settings: DeploySettings) -> list[dict]:
    """Calibration feeds for an AR-N graph over CL - N slots (the whole model's, a model in
    parts chained), from the recipe's calibration windows."""
    windows = calibration_windows(settings.calibration_text, export_dir / "tokenizer",
                                  length=int(spec["context_length"]),
                                  count=int(settings.recipe["samples"]), min_length=N + 2)
    return ar_calibration_feeds(export_dir, spec, windows, N, cl - N)


def kv_encodings(graphs_dir: Path, graph_io: str) -> dict[str, Any] | None:
    """The one encoding per cache tensor every Genie graph of a part takes, from its decode
    graph (the AR-N graph is quantized with the decode graph's scales), for quantized graph
    I/O; None for float KV I/O."""
    if graph_io != "quantized":
        return None

    return graphio.cache_encodings(graphs_dir / "decode.onnx")


def genie_prefill_graph(export_dir: Path, qdir: Path, spec: dict[str, Any], N: int, cl: int,
                        work: Path, settings: DeploySettings, progress: Progress) -> Path:
    """The AR-N prefill graph: exported from the checkpoint with N new tokens over CL - N
    cache slots, quantized with the recipe and the decode graph's activation scales, in
    Genie's conventions."""
    progress.update(0.0, f"exporting the AR-{N} prefill graph ({cl - N} cache slots)")
    export_ar_graph(settings.checkpoint, spec, N, cl - N, work / f"prefill_ar{N}.onnx")
    progress.update(0.5, f"quantizing the AR-{N} prefill graph with the decode graph's scales")
    feeds = ar_feeds(export_dir, spec, N, cl, settings)
    quantize_like(work / f"prefill_ar{N}.onnx", work / f"prefill_ar{N}_q.onnx",
                  qdir / "decode.onnx", settings.recipe, feeds)
    out = work / f"prefill_ar{N}_genie.onnx"
    genie.genie_graph(work / f"prefill_ar{N}_q.onnx", out, spec,
                      kv_encodings=kv_encodings(qdir, settings.graph_io))
    return out


def genie_parts(graphs: list[Path], spec: dict[str, Any], work: Path, stem: str,
                kv: list[dict[str, Any] | None] | None = None) -> list[Path]:
    """Each part's quantized graph (decode or AR-N, in order) in Genie's conventions, the
    residual stream passing from part to part as the handing part's uint16 integers (``kv``:
    each part's cache encodings, for quantized KV I/O)."""

    out: list[Path] = []
    handoff: dict[str, Any] = {}
    for i, src in enumerate(graphs):
        dst = work / f"{stem}_part{i + 1}_of_{len(graphs)}.onnx"
        handoff = genie.genie_graph(src, dst, spec, handoff,
                                    kv_encodings=kv[i] if kv else None)["handoff_out"]
        out.append(dst)
    return out


def genie_prefill_parts(export_dir: Path, qdir: Path, spec: dict[str, Any], N: int, cl: int,
                        work: Path, settings: DeploySettings, progress: Progress) -> list[Path]:
    """The AR-N prefill graph of a model exported in parts, one graph per part: each part's
    exported from the checkpoint a part at a time
    (:func:`studio.engine.llm_parts.export_part_ar_graphs`), calibrated on what the previous
    parts' float AR-N graphs hand it, and quantized with the recipe and its own decode
    graph's activation scales."""
    parts = list(iter_parts(spec))
    progress.update(0.0, f"calibration feeds for the AR-{N} graphs")
    feeds = ar_feeds(export_dir, spec, N, cl, settings)
    # a part's FP32 AR-N graph at a time: exported, run on its feeds, quantized, let go
    floats = iter_part_ar_graphs(settings.checkpoint, spec, N, cl - N, work / "ar",
                                 SubProgress(progress, 0.2, 1.0))
    out = []
    for part, src in zip(parts, floats, strict=True):
        progress.check()
        progress.update(0.2 + 0.8 * (part.index + 0.5) / len(parts),
                        f"part {part.index + 1}/{len(parts)}: quantizing its AR-{N} graph with "
                        "its decode graph's scales")
        sess = make_cpu_session(src)
        names = [i.name for i in sess.get_inputs()]
        mine = [{k: f[k] for k in names} for f in feeds]
        if part.hidden_out:
            for f, m in zip(feeds, mine, strict=True):  # what the next part takes
                f[part.hidden_out] = np.asarray(sess.run([part.hidden_out], m)[0])
        del sess
        dst = src.with_name("ar_q.onnx")
        quantize_like(src, dst, qdir / part.name / "decode.onnx", settings.recipe, mine)
        for fp32 in src.parent.glob(f"{src.name}*"):  # the FP32 graph and its weights
            fp32.unlink()
        out.append(dst)
    return genie_parts(out, spec, work, f"prefill_ar{N}_genie",
                       [kv_encodings(qdir / p.name, settings.graph_io) for p in parts])


def compile_in_order(graph: Path, folder: Path, chip, after: str, tries: int = 24,
                     extra_options: dict[str, str] | None = None, compile_fn=None,
                     candidates: int = 4096):
    """Compile ``graph`` so that its QNN graph name sorts after ``after``: Genie takes the
    graphs of a split bundle in the order of their names, and the QNN EP names a graph from
    a hash of the model file's path (:mod:`studio.engine.qnn_names` predicts it). Of
    ``candidates`` file names, the one whose name sorts right after ``after`` (the first part:
    whose hash starts with 1) is compiled: each part then leaves the most room to the parts
    after it, so any number of parts finds names in one compile each. Should a compiled name
    differ from the prediction, other file names are compiled in turn (``tries`` in all).
    Returns (the compile result, the graph name, the source file compiled, whose path a
    weight-shared compile of it must keep).

    ``compile_fn(src, ctx_path)`` replaces the plain compile (returns the compile result
    with ``ctx_path``)."""
    def src_of(salt: int) -> Path:
        return folder / f"{graph.stem}_{salt}.onnx"

    fits = [(name, salt) for salt in range(candidates)
            if in_order(name := qnn_names.graph_name(src_of(salt)), after)]
    order = [salt for _, salt in sorted(fits)[:1]]
    order += [salt for salt in range(tries) if salt not in order][:max(0, tries - len(order))]
    for salt in order:
        src = src_of(salt)
        src.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(graph, src)
        dest = folder / "ctx" / f"{src.stem}_ctx.onnx"
        comp = (compile_fn(src, dest) if compile_fn is not None else
                qnn.compile_context(src, dest, chip, embed=False, extra_options=extra_options))
        name = onnx.load(comp["ctx_path"], load_external_data=False).graph.node[0].name
        if in_order(name, after):
            return comp, name, src
        src.unlink()
        shutil.rmtree(folder / "ctx", ignore_errors=True)
    raise StudioError(f"could not give the Genie graph {graph.name} a name that sorts after "
                      f"the previous part's in {len(order)} tries: build with fewer parts")


def bin_name(kind: str, ar: int, cl: int, part: int, parts: int) -> str:
    """A context binary's file name in a bundle (and Genie's ``ctx-bins``)."""
    return (f"{kind}_ar{ar}_cl{cl}.bin" if parts == 1 else
            f"{kind}_ar{ar}_cl{cl}_part{part}_of_{parts}.bin")


def stage(export_dir: Path, qdir: Path, spec: dict[str, Any], settings: DeploySettings,
          staging: Path, progress: Progress) -> list[Path]:
    """The deployable graphs, ready to compile: per part a folder under ``staging`` (the
    folder itself for a model in one part) with ``prefill.onnx`` (Genie's AR-N graph; none
    with ``bundle.prefill_length = 1``) and ``decode.onnx`` (the AR-1 graph) in Genie's
    conventions. The compile stage compiles them as it compiles any part's graphs (its part
    cache, its resume and its processes), then :func:`finish` records them."""
    C = int(spec["context_length"])
    cl = C + 1
    N = prefill_ar(spec, settings.prefill_length)
    work = staging / "work"
    exported = [p["name"] for p in spec.get("parts") or []]
    made_from = staging_inputs(qdir, spec, settings, N)
    kept = kept_staging(staging, made_from, exported)
    if kept is not None:  # an interrupted compile staged these very graphs: keep them
        progress.update(0.3, "the deployable graphs staged by an interrupted run: kept")
        return kept
    shutil.rmtree(staging, ignore_errors=True)
    if len(exported) > 1:  # exported in parts: a context binary per part and graph
        progress.update(0.02, f"rewriting the {len(exported)} parts' decode graphs to "
                              "Genie's conventions")
        kvs = [kv_encodings(qdir / p, settings.graph_io) for p in exported]
        decode = genie_parts([qdir / p / "decode.onnx" for p in exported], spec, work,
                             "decode_genie", kvs)
        prefill = (genie_prefill_parts(export_dir, qdir, spec, N, cl, work, settings,
                                       SubProgress(progress, 0.03, 0.3)) if N > 1 else [])
    else:
        progress.update(0.02, "rewriting the decode graph to Genie's conventions")

        kvs = [kv_encodings(qdir, settings.graph_io)]
        genie.genie_graph(qdir / "decode.onnx", work / "decode_genie.onnx", spec,
                          kv_encodings=kvs[0])
        decode = [work / "decode_genie.onnx"]
        prefill = ([genie_prefill_graph(export_dir, qdir, spec, N, cl, work, settings,
                                        SubProgress(progress, 0.03, 0.3))] if N > 1 else [])
    graphs = ("prefill", "decode") if prefill else ("decode",)
    folders = (ordered_folders(staging, exported, graphs) if len(exported) > 1
               else [staging])
    for i, dec in enumerate(decode):
        folder = folders[i]
        folder.mkdir(parents=True, exist_ok=True)
        shutil.move(dec, folder / "decode.onnx")
        if prefill:
            shutil.move(prefill[i], folder / "prefill.onnx")
    atomic_write_json(staging / STAGED_FILE, {
        "made_from": made_from, "folders": [f.name for f in folders] if len(exported) > 1
        else None,
        "prefill_ar": N if N > 1 else None, "context_size": cl, "kv_encodings": kvs,
        "weights_bytes": sum(graph_bytes(qdir / p / "decode.onnx") for p in exported)
        if len(exported) > 1 else graph_bytes(qdir / "decode.onnx")})
    shutil.rmtree(work, ignore_errors=True)
    return folders


def ordered_folders(staging: Path, parts: list[str], graphs: tuple[str, ...],
                    candidates: int = 4096) -> list[Path]:
    """Per part its staging folder, named so that the QNN names the compile will give its
    graphs (``<folder>/<graph>.onnx``, predicted by :mod:`studio.engine.qnn_names`) sort after
    the previous part's, graph by graph: Genie takes a split bundle's graphs in the order of
    their names, and a part compiled under a name out of order is compiled again in
    :func:`finish` (at 8 B some ten minutes a part). Of ``candidates`` folder names per part
    the one whose names use the least of the room left is taken; where none fits, the part's
    plain name (then :func:`finish` compiles it again)."""
    after = dict.fromkeys(graphs, "")
    out = []
    for part in parts:
        def paths(i: int, part: str = part) -> dict[str, Path]:
            return {g: staging / f"{part}_n{i}" / f"{g}.onnx" for g in graphs}

        i = pick(paths, after, candidates)
        folder = staging / f"{part}_n{i}" if i is not None else staging / part
        after = {g: qnn_names.graph_name(folder / f"{g}.onnx") for g in graphs}
        out.append(folder)
    return out


def staging_inputs(qdir: Path, spec: dict[str, Any], settings: DeploySettings,
                   N: int) -> dict[str, Any]:
    """What a staging folder is made from: the quantized graphs (their digest), the recipe,
    the checkpoint, the prefill length and the graph I/O. A staging folder made from the same
    is kept by a resumed compile (its AR-N graphs are minutes a part to export and quantize
    again at real size)."""
    return {"quantized": files_digest(qdir), "recipe": settings.recipe,
            "checkpoint": str(settings.checkpoint), "prefill_ar": N,
            "graph_io": settings.graph_io, "context_length": int(spec["context_length"])}


def kept_staging(staging: Path, made_from: dict[str, Any],
                 exported: list[str]) -> list[Path] | None:
    """The part folders of a finished staging made from ``made_from`` (its record is written
    last), else None."""
    try:
        staged = json.loads((staging / STAGED_FILE).read_text())
    except (OSError, ValueError):
        return None
    if staged.get("made_from") != json.loads(json.dumps(made_from)):
        return None
    folders = ([staging / f for f in staged.get("folders") or exported]
               if len(exported) > 1 else [staging])
    if not all((f / "decode.onnx").is_file() for f in folders):
        return None
    return folders


def _binary_bytes(ctx: Path) -> int:
    """The bytes of the context binary a compiled ``_ctx.onnx`` holds or names."""

    info = qnn.read_context_info(ctx)
    if info["embed"]:

        return len(context_binary(ctx))
    return sum((ctx.parent / b).stat().st_size for b in info["bin_files"])


def write_binary(ctx: Path, dest: Path) -> None:
    """The context binary a compiled ``_ctx.onnx`` holds (embedded) or names, as ``dest``."""

    info = qnn.read_context_info(ctx)
    if info["embed"]:

        dest.write_bytes(context_binary(ctx))
    else:  # a hard link where it can be: at 8 B the binaries are gigabytes
        link_or_copy(ctx.parent / info["bin_files"][0], dest)


def finish(out: Path, staging: Path, sources: list[Path], wheres: list[str],
           spec: dict[str, Any], chip, settings: DeploySettings,
           progress: Progress) -> dict[str, Any]:
    """Record the deployable binaries the compile stage compiled from :func:`stage`'s
    folders into ``out/<where>{prefill,decode}_ctx.onnx``: each part's graphs in the order
    Genie takes them (a part whose graph name does not sort after the part before it is
    compiled again under another file name), the weight-shared binaries where wanted, and
    ``deploy.json``."""

    staged = json.loads((staging / STAGED_FILE).read_text())
    cl, N = int(staged["context_size"]), staged["prefill_ar"] or 1
    parts = len(sources)
    rows: list[dict[str, Any]] = []
    compiled_from: dict[tuple[int, int], Path] = {}
    exported = [p["name"] for p in spec.get("parts") or []]
    for ar, kind in ((N, "prefill"), (1, "decode")) if N > 1 else ((1, "decode"),):
        previous = ""
        for i, (src, where) in enumerate(zip(sources, wheres, strict=True)):
            progress.check()
            ctx = out / f"{where}{kind}_ctx.onnx"
            name = onnx.load(str(ctx), load_external_data=False).graph.node[0].name
            compiled_from[ar, i] = src / f"{kind}.onnx"
            if parts > 1 and not in_order(name, previous):
                progress.update(0.9, f"part {i + 1}/{parts}: compiling its {kind} graph "
                                     "again under a name Genie takes in order")
                folder = out / DEPLOY_DIR / f"{kind}_{i + 1}"
                shutil.rmtree(folder, ignore_errors=True)
                comp, name, salted = compile_in_order(src / f"{kind}.onnx", folder, chip,
                                                      previous,
                                                      extra_options=settings.htp_options)
                ctx, compiled_from[ar, i] = Path(comp["ctx_path"]), salted
            previous = name
            rows.append({"file": bin_name(kind, ar, cl, i + 1, parts), "kind": kind, "ar": ar,
                         "context_size": cl, "part": i + 1, "parts": parts,
                         "key": f"{where}{kind}", "ctx": str(ctx.relative_to(out)),
                         "bytes": _binary_bytes(ctx), **genie.graph_io(src / f"{kind}.onnx"),
                         "qnn_graph": name})
    shared = None
    if N > 1 and settings.weight_sharing != "off":
        shared = share_weights(compiled_from, rows, N, cl, parts, chip, out, settings,
                               progress)
    record = {
        "format": "genie-form", "version": 1, "chip": chip.key,
        "context_size": cl, "prefill_ar": N if N > 1 else None, "parts": parts,
        "part_names": exported if parts > 1 else [],
        "graph_io": settings.graph_io,
        "kv_cache": {"dtype": "uint16" if settings.graph_io == "quantized" else "float32",
                     **({"encodings": staged["kv_encodings"]}
                        if settings.graph_io == "quantized" else {})},
        "weights_bytes": int(staged["weights_bytes"]), "graphs": rows,
        "binary_bytes": sum(r["bytes"] for r in rows), "shared": shared,
    }
    atomic_write_json(out / DEPLOY_FILE, record)
    return record


def share_weights(sources: dict[tuple[int, int], Path], rows: list[dict[str, Any]], N: int,
                  cl: int, parts: int, chip, out: Path, settings: DeploySettings,
                  progress: Progress) -> list[dict[str, Any]]:
    """Per part, one context binary holding its AR-N prefill and AR-1 decode graphs with
    their weights once (``ep.share_ep_contexts``), compiled from the very graph files the
    separate binaries were, under names Genie takes in order, and read back with the QNN
    system library against the separate, simulator-executed binaries graph by graph. The x86
    simulator cannot load it: a device executes it. Raises when the structures differ."""

    shared = []
    after = {N: "", 1: ""}
    for i in range(parts):
        progress.check()
        progress.update(0.96, "the weight-shared binary of "
                              + (f"part {i + 1}/{parts}" if parts > 1 else "the model"))
        folder = out / DEPLOY_DIR / f"shared_{i + 1}"
        shutil.rmtree(folder, ignore_errors=True)
        comp = None

        def dst_of(ar: int, salt: int, i: int = i, folder: Path = folder) -> Path:
            src = sources[ar, i]
            return folder / "src" / (src.name if parts == 1 else f"{src.stem}_s{salt}.onnx")

        salts = [0]
        if parts > 1:  # the salt whose predicted names sort right after the last part's
            def paths(salt: int) -> dict[int, Path]:
                return {ar: dst_of(ar, salt) for ar in (N, 1)}

            best = pick(paths, after)
            salts = [best] if best is not None else []
        for salt in salts:
            pair = []
            for ar in (N, 1):  # copies under one salted name each: the graphs' names follow
                src = sources[ar, i]
                dst = dst_of(ar, salt)
                dst.parent.mkdir(parents=True, exist_ok=True)
                link_or_copy(src, dst)
                pair.append(dst)
            comp = weightshare.compile_shared(pair, folder / f"try{salt}", chip,
                                              settings.htp_options)
            names = dict(zip((N, 1), comp["graphs"], strict=True))
            if parts == 1 or all(in_order(names[ar], after[ar]) for ar in (N, 1)):
                after = names
                break
            shutil.rmtree(folder / f"try{salt}", ignore_errors=True)
            comp = None
        if comp is None:
            raise StudioError(f"could not give part {i + 1}'s weight-shared graphs names that "
                              "sort after the previous part's: set bundle.weight_sharing = "
                              "\"off\" or build with fewer parts")
        shutil.rmtree(folder / "src", ignore_errors=True)
        separate = [out / r["ctx"] for ar in (N, 1) for r in rows
                    if r["ar"] == ar and r["part"] == i + 1]
        report = weightshare.compare_structure(comp["bin"], separate)
        if not report["equal"]:
            raise StudioError(f"the weight-shared binary of part {i + 1} differs from the "
                              f"binaries the simulator ran: {weightshare.summary(report)}")
        name = (f"weight_shared_ar{N}_ar1_cl{cl}.bin" if parts == 1 else
                f"weight_shared_ar{N}_ar1_cl{cl}_part{i + 1}_of_{parts}.bin")
        shared.append({"file": name, "part": i + 1,
                       "bin": str(Path(comp["bin"]).relative_to(out)),
                       "bytes": int(comp["bytes"]), "graphs": comp["graphs"],
                       "separate_bytes": sum(r["bytes"] for r in rows if r["part"] == i + 1),
                       "executed": weightshare.STRUCTURE_ONLY,
                       "structure": {"equal": True, "matched_by": report["matched_by"],
                                     "checks": report["checks"],
                                     "summary": weightshare.summary(report)}})
    return shared
