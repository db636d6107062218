"""Weight-shared context binaries: a part's prefill (AR-N) and decode (AR-1) graphs compiled
into one QNN context binary that holds their common weights once.

ONNX Runtime's QNN EP shares one QNN context between the sessions created with the session
config ``ep.share_ep_contexts = 1``; the session created with ``ep.stop_share_ep_contexts =
1`` as well ends the sharing and writes the context binary. Each graph still gets its own
``…_ctx.onnx`` (an EPContext node), and every one of them names the same ``.bin``.

The x86 HTP simulator cannot load such a binary (it answers ``QNN_COMMON_ERROR_NOT_SUPPORTED``;
Genie error 1000), so it is a device artifact. What this host can do is check it by
structure: :func:`compare_structure` reads the shared binary and the separately compiled
binaries of the same graphs (the ones the simulator executed) with the QNN System library
(:mod:`studio.engine.qnn_system`) and requires them equal graph by graph — tensor names,
shapes, data types and quantization encodings of every graph input and output.

The sharing is process-wide state inside the EP: one shared compile at a time per process
(a lock here), and a compile that fails half-way can leave graphs behind; the count of
graphs in the written binary is checked so such a binary is never taken for a good one.
Run it in a worker process, as the studio's stages do.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.engine import qnn
from studio.engine.qnn_system import context_info

onnx = lazy_module("onnx")

EXECUTED = "executed on the HTP simulator"
STRUCTURE_ONLY = "checked by structure only: a device executes it"
MODES = ("auto", "on", "off")
SCALE_RTOL = 1e-6  # scales are float32 in both binaries: equal up to float32 rounding

_SHARE_LOCK = threading.Lock()


def sharing_wanted(mode: str, for_device: bool) -> bool:
    """Whether a bundle holds weight-shared binaries: ``mode`` is the setting
    (``"auto"``: on for a bundle made for a device, ``"on"``, ``"off"``)."""
    if mode not in MODES:
        raise StudioError(f"unknown weight sharing '{mode}'; use one of {', '.join(MODES)}")
    return mode == "on" or (mode == "auto" and bool(for_device))


# ---------------------------------------------------------------------------------------
# compile
# ---------------------------------------------------------------------------------------
def _ep_context(ctx_onnx: Path) -> tuple[str, str]:
    """(graph name, the ``.bin`` file it names) of a compiled ``…_ctx.onnx``."""
    model = onnx.load(str(ctx_onnx), load_external_data=False)
    nodes = [n for n in model.graph.node if n.op_type == "EPContext"]
    if len(nodes) != 1:
        raise StudioError(f"{ctx_onnx.name} has {len(nodes)} EPContext nodes, not one: the "
                          "graph did not compile whole onto the HTP")
    attrs = {a.name: a for a in nodes[0].attribute}
    if "embed_mode" in attrs and attrs["embed_mode"].i != 0:
        raise StudioError(f"{ctx_onnx.name} embeds its binary; a shared binary is a file")
    ref = attrs["ep_cache_context"].s.decode("utf-8", "replace")
    name = attrs["partition_name"].s.decode() if "partition_name" in attrs else nodes[0].name
    return name, ref


def compile_shared(
    graphs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    chip,
    extra_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Compile ``graphs`` (e.g. a part's prefill and decode QDQ graphs, whose initializers
    have the same names and values) into ONE QNN context binary whose graphs share their
    weights, in ``out_dir``.

    Each graph must run whole on the HTP (strict placement); the compile prepares the
    binary without executing it (``enable_htp_prepare_only``). Returns ``{"bin": path,
    "ctx_onnx": [path per graph, in order], "graphs": [QNN graph name per graph, in order],
    "bytes": size of the .bin, "seconds", "sdk_version"}``. The files appear when all is
    written: binary first, then the context models.
    """
    srcs = _graphs_to_share(graphs)
    stems = [p.stem for p in srcs]
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    extra = {"enable_htp_prepare_only": "1", **dict(extra_options or {})}
    tmp = Path(tempfile.mkdtemp(prefix=".qnn-share-", dir=out))
    try:
        staged = [tmp / f"{s}_ctx.onnx" for s in stems]
        t0 = time.perf_counter()
        _share_sessions(srcs, staged, chip, extra)
        seconds = time.perf_counter() - t0
        names, bins, info = _check_shared_binary(tmp, staged, len(srcs))
        for f in sorted(tmp.iterdir()):  # the binary first, the context models last
            if f.suffix != ".onnx":
                os.replace(f, out / f.name)
        ctx_paths = []
        for c in staged:
            os.replace(c, out / c.name)
            ctx_paths.append(out / c.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bin_path = out / bins[0]
    return {
        "bin": bin_path,
        "ctx_onnx": ctx_paths,
        "graphs": names,
        "bytes": bin_path.stat().st_size,
        "seconds": seconds,
        "sdk_version": info.get("sdk_build"),
    }


def _graphs_to_share(graphs: Sequence[str | os.PathLike]) -> list[Path]:
    """The graphs as paths: two or more, with names of their own, every file there."""
    srcs = [Path(g) for g in graphs]
    if len(srcs) < 2:
        raise StudioError("weight sharing needs two graphs or more (e.g. prefill and decode)")
    stems = [p.stem for p in srcs]
    if len(set(stems)) != len(stems):
        raise StudioError(f"the graphs to share weights have clashing names {stems}: give "
                          "each a file name of its own")
    for p in srcs:
        if not p.is_file():
            raise StudioError(f"model file {p} not found; check the path")
    return srcs


def _share_sessions(srcs: list[Path], staged: list[Path], chip,
                    extra: dict[str, Any]) -> None:
    """One session per graph sharing the EP's context (the last one closes the share),
    writing the context models ``staged`` and the shared binary; released at once. One
    shared compile at a time in this process."""
    with _SHARE_LOCK:
        sessions = []
        try:
            for i, (src, ctx) in enumerate(zip(srcs, staged, strict=True)):
                config = {
                    "ep.context_enable": "1",
                    "ep.context_file_path": str(ctx),
                    "ep.context_embed_mode": "0",
                    "ep.share_ep_contexts": "1",
                }
                if i == len(srcs) - 1:
                    config["ep.stop_share_ep_contexts"] = "1"
                sessions.append(qnn.make_session(src, chip, extra_options=extra,
                                                 session_config=config))
        finally:
            del sessions


def _check_shared_binary(tmp: Path, staged: list[Path], n_graphs: int
                         ) -> tuple[list[str], list[str], dict[str, Any]]:
    """The QNN graph each context model names, the one binary they all name (checked to
    hold exactly those graphs), and the binary's context info."""
    missing = [c.name for c in staged if not c.is_file()]
    if missing:
        raise StudioError(f"the QNN EP wrote no context model {missing[0]}: the shared "
                          "compile did not finish")
    named = [_ep_context(c) for c in staged]
    bins = sorted({ref for _, ref in named})
    if len(bins) != 1:
        raise StudioError(f"the QNN EP wrote {len(bins)} binaries ({', '.join(bins)}) for "
                          f"{n_graphs} graphs, not one shared binary: this onnxruntime-qnn "
                          "did not share the context")
    bin_staged = tmp / bins[0]
    if not bin_staged.is_file():
        raise StudioError(f"the shared context binary {bins[0]} the context models name "
                          "was not written")
    info = context_info(bin_staged)
    in_bin = [g["name"] for g in info["graphs"]]
    names = [n for n, _ in named]
    if sorted(in_bin) != sorted(names):
        raise StudioError(
            f"the shared binary holds graphs {in_bin}, the context models name {names}: "
            "this process kept graphs of an earlier shared compile; compile in a new "
            "process")
    return names, bins, info


# ---------------------------------------------------------------------------------------
# structure check
# ---------------------------------------------------------------------------------------
def _signature(g: dict[str, Any]) -> tuple:
    return tuple((t["name"], tuple(t["shape"])) for t in g["inputs"] + g["outputs"])


def _match(shared: list[dict], separate: list[dict]) -> tuple[list[tuple[int, int]], str]:
    """Pairs (shared index, separate index) and how they were matched: by QNN graph name
    when every name is found in both; else by the graph's I/O tensor names and shapes when
    each signature is unique; else in order."""
    s_names = [g["name"] for g in shared]
    p_names = [g["name"] for g in separate]
    if len(set(s_names)) == len(s_names) and sorted(s_names) == sorted(p_names):
        return [(i, p_names.index(n)) for i, n in enumerate(s_names)], "graph name"
    s_sig = [_signature(g) for g in shared]
    p_sig = [_signature(g) for g in separate]
    if len(set(s_sig)) == len(s_sig) and sorted(s_sig) == sorted(p_sig):
        return [(i, p_sig.index(s)) for i, s in enumerate(s_sig)], \
            "input and output tensor names and shapes"
    n = min(len(shared), len(separate))
    return [(i, i) for i in range(n)], "order"


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=SCALE_RTOL, abs_tol=0.0)


def _encoding_diffs(where: str, a: dict | None, b: dict | None) -> list[str]:
    if a is None or b is None:
        return [] if a is b else [f"{where}: encoding {a and a['kind']} vs {b and b['kind']}"]
    out = []
    if a["kind"] != b["kind"]:
        return [f"{where}: encoding {a['kind']} vs {b['kind']}"]
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if k == "scale":
            if va is None or vb is None:
                out.append(f"{where}: scale {va} vs {vb}")
            elif not _close(va, vb):
                out.append(f"{where}: scale {va:.9g} vs {vb:.9g}")
        elif k == "scales":
            va, vb = va or [], vb or []
            if len(va) != len(vb):
                out.append(f"{where}: {len(va or [])} scales vs {len(vb or [])}")
            else:
                bad = [i for i, (x, y) in enumerate(zip(va, vb, strict=True)) if not _close(x, y)]
                if bad:
                    i = bad[0]
                    out.append(f"{where}: {len(bad)} of {len(va)} scales differ (first at "
                               f"{i}: {va[i]:.9g} vs {vb[i]:.9g})")
        elif va != vb:
            out.append(f"{where}: {k} {va} vs {vb}")
    return out


def _tensor_diffs(where: str, a: dict, b: dict) -> list[str]:
    out = []
    for k in ("name", "shape", "dtype", "type"):
        if a.get(k) != b.get(k):
            out.append(f"{where}: {k} {a.get(k)} vs {b.get(k)}")
    return out + _encoding_diffs(where, a.get("encoding"), b.get("encoding"))


def _graph_diffs(a: dict, b: dict) -> list[str]:
    out = []
    for side in ("inputs", "outputs"):
        ta, tb = a[side], b[side]
        if len(ta) != len(tb):
            out.append(f"{len(ta)} {side} vs {len(tb)}")
        by_name = {t["name"]: t for t in tb}
        for i, t in enumerate(ta):
            other = by_name.get(t["name"])
            if other is None:
                out.append(f"{side[:-1]} {t['name']}: not in the separately compiled graph")
                continue
            j = tb.index(other)
            if j != i:
                out.append(f"{side[:-1]} {t['name']}: position {i} vs {j}")
            out += _tensor_diffs(f"{side[:-1]} {t['name']}", t, other)
        for t in tb:
            if not any(x["name"] == t["name"] for x in ta):
                out.append(f"{side[:-1]} {t['name']}: not in the shared binary's graph")
    return out


def compare_structure(shared: str | os.PathLike,
                      separate: Sequence[str | os.PathLike]) -> dict[str, Any]:
    """Check a weight-shared binary against the separately compiled binaries of the same
    graphs, by structure (the simulator cannot load the shared one).

    ``shared`` and each of ``separate`` is a context binary or a ``…_ctx.onnx``. Both are
    read with the QNN System library; graphs are matched (by QNN graph name, else by their
    I/O tensor names and shapes, else in order: ``matched_by`` says which) and must agree
    in: graph count; for every graph input and output its name, position, shape, data type,
    tensor type and quantization encoding (kind, axis, bit width, block sizes and offsets
    exactly; scales to a relative :data:`SCALE_RTOL`); and the backend, SDK build and SoC
    model the binaries were made for.

    Returns ``{"equal", "status", "checks": [what was compared], "matched_by",
    "differences": [binary-level], "graphs": [{"shared", "separate", "inputs", "outputs",
    "differences"}], "shared_file", "separate_files"}``.
    """
    s_info = context_info(shared)
    p_infos = [context_info(p) for p in separate]
    p_graphs = [g for info in p_infos for g in info["graphs"]]
    top: list[str] = []
    if len(s_info["graphs"]) != len(p_graphs):
        top.append(f"the shared binary holds {len(s_info['graphs'])} graphs, the separate "
                   f"binaries {len(p_graphs)}")
    for key in ("backend", "sdk_build", "soc_model"):
        theirs = sorted({str(i.get(key)) for i in p_infos})
        if theirs != [str(s_info.get(key))]:
            top.append(f"{key} {s_info.get(key)} vs {', '.join(theirs)}")
    pairs, how = _match(s_info["graphs"], p_graphs)
    graphs = []
    for i, j in pairs:
        a, b = s_info["graphs"][i], p_graphs[j]
        graphs.append({"shared": a["name"], "separate": b["name"], "inputs": len(a["inputs"]),
                       "outputs": len(a["outputs"]), "differences": _graph_diffs(a, b)})
    equal = not top and all(not g["differences"] for g in graphs)
    return {
        "equal": equal,
        "status": STRUCTURE_ONLY,
        "checks": [
            "graph count",
            f"graphs matched by {how}",
            "per graph: input and output tensor names and positions",
            "shapes",
            "data types",
            "tensor types",
            "quantization encodings (kind, axis, bit width, block sizes, offsets exactly; "
            f"scales to a relative {SCALE_RTOL:g})",
            "backend, SDK build and SoC model",
        ],
        "matched_by": how,
        "differences": top,
        "graphs": graphs,
        "shared_file": str(s_info["file"]),
        "separate_files": [str(i["file"]) for i in p_infos],
    }


def summary(report: Mapping[str, Any]) -> str:
    """One line for a log or a report: the verdict, what it rests on, the first difference."""
    graphs = report.get("graphs", [])
    tensors = sum(g["inputs"] + g["outputs"] for g in graphs)
    name = Path(str(report.get("shared_file", "the shared binary"))).name
    if report.get("equal"):
        return (f"{name}: {len(graphs)} graphs equal in structure to their separately compiled "
                f"binaries ({tensors} I/O tensors: names, shapes, dtypes, encodings) — "
                f"{report.get('status', STRUCTURE_ONLY)}")
    diffs = list(report.get("differences", [])) + [
        f"graph {g['shared']}: {d}" for g in graphs for d in g["differences"]]
    more = f" (+{len(diffs) - 1} more)" if len(diffs) > 1 else ""
    return (f"{name}: differs from its separately compiled binaries: "
            f"{diffs[0] if diffs else 'no graphs matched'}{more}")
