"""Read profiles other tools wrote into the studio's profile model.

Formats (:data:`FORMATS`):

- ``qnn-csv``: the QNN profiling CSV (``profiling_level`` basic / detailed / optrace), as
  the QNN EP and ``qnn-net-run`` write it (see :mod:`studio.engine.qnn_profile`);
- ``qnn-optrace-schematic``: the ``…_schematic.bin`` optrace writes beside it — the
  compiler's per-op DRAM / VTCM bytes and DMA flags (``bandwidth_information``) and the HTP
  kernels it chose (``concrete_ops_info``);
- ``ort-json``: ONNX Runtime's profiler output (``SessionOptions.enable_profiling``): host
  timestamps, thread and execution provider per node;
- ``chrome-trace``: Chrome Trace Event Format JSON, as ``qnn-profile-viewer`` writes with
  its chrome-trace reader on a device (process / thread names name the HTP threads);
- ``aihub-json``: an AI Hub profile job's JSON (``execution_summary``,
  ``execution_detail`` per layer with its compute unit).

Every importer returns a :class:`~studio.core.profile.Profile` whose ``table`` is an
:class:`~studio.core.events.EventTable`. Files the user brings are labelled ``imported``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.events import EventTable
from studio.core.fsutil import read_input
from studio.core.profile import SOURCES, Profile, ProfileEvent, ProfileOp, layer_of
from studio.engine.opblocks import node_blocks, op_block
from studio.engine.qnn import read_context_info
from studio.engine.qnn_profile import event_table, parse_profile_csv

FORMATS = ("qnn-csv", "qnn-optrace-schematic", "ort-json", "chrome-trace", "aihub-json")
_ACCEPTED = ("a QNN profiling CSV, an optrace _schematic.bin, ONNX Runtime profiling JSON, "
             "a chrome-trace JSON (qnn-profile-viewer) or an AI Hub profile JSON")


def detect_format(path: str | os.PathLike) -> str:
    p = Path(path)
    try:
        head = p.open("rb").read(4096)
    except FileNotFoundError:
        raise StudioError(f"profile file {p} not found; check the path") from None
    except OSError as e:
        raise StudioError(f"cannot read {p}: {e.strerror}") from None
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff").lstrip()
    if not text:
        raise StudioError(f"{p} is empty; pass {_ACCEPTED}")
    if text.startswith("# python_pprint_graph_summary") or "graph_before_optimization" in text:
        return "qnn-optrace-schematic"
    first = text.splitlines()[0]
    if "Message" in first and "Event Identifier" in first:
        return "qnn-csv"
    if text[0] in "[{":
        data = _load_json(p)
        if isinstance(data, dict) and ("execution_detail" in data or
                                       "execution_summary" in data):
            return "aihub-json"
        if isinstance(data, dict) and "traceEvents" in data:
            return "chrome-trace"
        if isinstance(data, list) and data and isinstance(data[0], dict):
            if any(e.get("cat") in ("Node", "Session") for e in data[:50]):
                return "ort-json"
            if "ph" in data[0]:
                return "chrome-trace"
    raise StudioError(f"{p.name} is not a profile the studio reads; pass {_ACCEPTED}")


def import_profile(path: str | os.PathLike, *, onnx_path: str | os.PathLike | None = None,
                   source: str | None = None, fmt: str | None = None) -> Profile:
    """Read ``path`` (format detected unless ``fmt``) into a Profile with its event table."""
    fmt = fmt or detect_format(path)
    if source is not None and source not in SOURCES:
        raise StudioError(f"unknown profile source '{source}'; use one of {', '.join(SOURCES)}")
    blocks = {}
    if onnx_path is not None:
        blocks = node_blocks(onnx_path)
    reader = {"qnn-csv": _qnn_csv, "qnn-optrace-schematic": _schematic, "ort-json": _ort_json,
              "chrome-trace": _chrome, "aihub-json": _aihub}.get(fmt)
    if reader is None:
        raise StudioError(f"unknown profile format '{fmt}'; use one of {', '.join(FORMATS)}")
    prof = reader(Path(path), blocks, onnx_path)
    prof.source = source or "imported"
    prof.origin = str(path)
    prof.level = prof.level or fmt
    return prof


# ---- helpers ---------------------------------------------------------------------------------
#: the largest profile file read
MAX_PROFILE_BYTES = 1 << 30


def _load_json(p: Path):
    raw = read_input(p, MAX_PROFILE_BYTES, "the profile file")
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise StudioError(f"{p.name} nests too deeply to be a profile; pass "
                          f"{_ACCEPTED}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise StudioError(f"{p.name} is not readable JSON ({e}); the file is damaged or "
                          f"truncated — pass {_ACCEPTED}") from None


def _profile(table: EventTable, unit: str, level: str, ops_from_table: bool = True,
             metric: str = "dur") -> Profile:
    """A Profile whose per-op rows aggregate the table by op name (for breakdowns)."""
    ops: list[ProfileOp] = []
    if ops_from_table and len(table):
        vals = table.value(metric)
        names, types = table["op"], table["op_type"]
        nodes, layers = table["onnx_node"], table.num["layer"]
        acc: dict[str, int] = {}
        sums: list[float] = []
        for i, name in enumerate(names):
            j = acc.setdefault(name, len(acc))
            if j == len(sums):
                sums.append(0.0)
                ops.append(ProfileOp(qnn_name=name, op_type=types[i], value=0.0, unit=unit,
                                     onnx_node=nodes[i] or None,
                                     layer=int(layers[i]) if layers[i] >= 0 else None))
            sums[j] += float(vals[i])
        ops = [ProfileOp(**{**op.__dict__, "value": v}) for op, v in zip(ops, sums,
                                                                          strict=True)]
    prof = Profile(source="imported", ops=ops, unit=unit, runs=1, level=level)
    prof.table = table
    return prof


def _block(op_type: str, node: str, blocks: dict) -> str:
    return op_block(op_type, node, blocks) if blocks else op_block(op_type, node, {})


def compiler_totals(sch: dict, options: dict[str, str] | None = None,
                    binary: str | os.PathLike | None = None) -> dict[str, Any]:
    """The HTP compiler's totals of one run of a graph, from its optrace schematic ``sch``
    (:func:`read_schematic`): DRAM and VTCM bytes read + written, the ops it moved by DMA,
    its HTP ops after optimization, the VTCM it uses, its spill / fill ops — and the size of
    the compiled context ``binary`` (a ``_ctx.onnx`` and its ``.bin`` files). Deterministic
    for a binary (measured: a recompile gives the same figures), unlike the simulator's
    cycles. ``options``: the extra QNN EP options it was compiled with."""
    bw = list(sch["bandwidth"].values())
    out: dict[str, Any] = {
        "dram_bytes": sum(b[0] + b[1] for b in bw), "dram_read": sum(b[0] for b in bw),
        "dram_write": sum(b[1] for b in bw), "vtcm_bytes": sum(b[2] + b[3] for b in bw),
        "dma_ops": sum(1 for b in bw if b[4]), "htp_ops": len(bw),
        # the VTCM the compiler placed blocks in (the end of the highest block), and the ops
        # it added to spill tensors out of VTCM and fill them back
        "vtcm_peak_bytes": sch["vtcm_peak"],
        "spill_fill_ops": sum(1 for op in sch["operations"].values()
                              if "Spill" in op or "Fill" in op),
        "options": dict(options or {}), "binary_bytes": None}
    if binary is not None:
        ctx = Path(binary)
        bins = read_context_info(ctx)["bin_files"]
        out["binary_bytes"] = ctx.stat().st_size + sum(
            (ctx.parent / b).stat().st_size for b in bins if (ctx.parent / b).is_file())
    return out

# ---- QNN CSV ---------------------------------------------------------------------------------
def _qnn_csv(p: Path, blocks: dict, onnx_path) -> Profile:
    prof = parse_profile_csv(p, onnx_path=onnx_path, source="imported")
    prof.table = event_table(prof, blocks)
    return prof


# ---- optrace schematic -----------------------------------------------------------------------
_BW = re.compile(r'\{\s*"opid"\s*:\s*(0x[0-9a-fA-F]+)\s*,\s*"dram_read"\s*:\s*(\d+)\s*,\s*'
                 r'"dram_write"\s*:\s*(\d+)\s*,\s*"vtcm_read"\s*:\s*(\d+)\s*,\s*"vtcm_write"'
                 r'\s*:\s*(\d+)\s*,\s*"is_dma"\s*:\s*(\d+)\s*\}')
_KERNEL_ID = re.compile(r"^\s*(0x[0-9a-fA-F]+)\s*:\s*(\d+)\s*,\s*$")
_OPERATION = re.compile(r"^\s*(0x[0-9a-fA-F]+)\s*:\s*\{\s*$")
_OPNAME = re.compile(r"'operation'\s*:\s*'([^']+)'")
_DEMANGLED = re.compile(r"_Z(?:L)?(\d+)([A-Za-z_][A-Za-z0-9_]*)")


def _kernel_name(mangled: str) -> str:
    """'…_ZL16data_prepare_dmaI14…' -> 'data_prepare_dma' (the kernel function)."""
    m = _DEMANGLED.search(mangled)
    if m:
        n = int(m.group(1))
        return m.group(2)[:n]
    m = re.search(r"N4hnnx\d+([A-Za-z]+)", mangled)
    return m.group(1) if m else mangled[:40]


_TCM_BLOCK = re.compile(r"^\s*\d+\s*:\s*\((0x[0-9a-fA-F]+)\s*,\s*(0x[0-9a-fA-F]+)\)")


def read_schematic(path: str | os.PathLike) -> dict:
    """``{"bandwidth": {opid: (dram_read, dram_write, vtcm_read, vtcm_write, dma)},
    "kernels": {opid: kernel}, "operations": {opid: operation}, "vtcm_peak": bytes | None}``
    of an optrace schematic (``vtcm_peak``: the end of the highest block of its
    ``tcm_block_info``, offset + size — the VTCM the compiled graph uses).
    Parsed line by line with regular expressions (the file is Python text: never executed).
    The low 32 bits of an opid are the QNN ``OpId`` the profiling CSV names."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise StudioError(f"cannot read {p}: {e.strerror}") from None
    if "graph_before_optimization" not in text and "bandwidth_information" not in text:
        raise StudioError(f"{p.name} is not an optrace schematic; pass the _schematic.bin "
                          "that profiling_level optrace writes")
    bw = {}
    for m in _BW.finditer(text):
        bw[int(m.group(1), 16)] = tuple(int(m.group(i)) for i in range(2, 7))
    kernels_idx: dict[int, int] = {}
    keys: list[str] = []
    section = ""
    operations: dict[int, str] = {}
    current = None
    vtcm_peak: int | None = None
    for line in text.splitlines():
        if line.startswith("tcm_block_info"):
            section = "tcm"
            continue
        if section == "tcm":
            tm = _TCM_BLOCK.match(line)
            if tm:
                end = int(tm.group(1), 16) + int(tm.group(2), 16)
                vtcm_peak = end if vtcm_peak is None else max(vtcm_peak, end)
            elif line.strip().startswith("}"):
                section = ""
            continue
        if ":::BEGIN:concrete_ops_info:::" in line:
            section = "kernels"
            continue
        if line.startswith("concrete_ops_info_key"):
            section = "keys"
            continue
        if ":::BEGIN:graph_after_optimization:::" in line:
            section = "after"
            continue
        if ":::END:graph_after_optimization" in line or (section == "keys" and
                                                          line.startswith("]")):
            section = ""
            continue
        if section == "kernels":
            km = _KERNEL_ID.match(line)
            if km:
                kernels_idx[int(km.group(1), 16)] = int(km.group(2))
            elif line.startswith("}"):
                section = ""
        elif section == "keys":
            s = line.strip().rstrip(",")
            if s.startswith('"') and s.endswith('"'):
                keys.append(s.strip('"'))
        elif section == "after":
            om = _OPERATION.match(line)
            if om:
                current = int(om.group(1), 16)
                continue
            nm = _OPNAME.search(line)
            if nm and current is not None:
                operations[current] = nm.group(1)
                current = None
    kernels = {op: _kernel_name(keys[i]) for op, i in kernels_idx.items() if i < len(keys)}
    if not bw and not kernels:
        raise StudioError(f"{p.name} holds no bandwidth_information or chosen kernels; the "
                          "schematic is truncated — profile again with profiling_level optrace")
    return {"bandwidth": bw, "kernels": kernels, "operations": operations,
            "vtcm_peak": vtcm_peak}


def _schematic(p: Path, blocks: dict, onnx_path) -> Profile:
    sch = read_schematic(p)
    rows = []
    for opid in sorted(set(sch["bandwidth"]) | set(sch["kernels"])):
        dr, dw, vr, vw, dma = sch["bandwidth"].get(opid, (None, None, None, None, 0))
        operation = sch["operations"].get(opid, "")
        rows.append({
            "op": f"0x{opid:x} (OpId_{opid & 0xFFFFFFFF})",
            "op_type": operation.replace("q::", "") or "op", "track": "HTP",
            "kernel": sch["kernels"].get(opid, ""), "dram_read": dr, "dram_write": dw,
            "vtcm_read": vr, "vtcm_write": vw, "dma": bool(dma),
            "block": "data movement / Q-DQ" if dma else "other",
        })
    return _profile(EventTable.from_rows(rows), "bytes", "optrace", metric="dram_read")


def merge_bandwidth(table: EventTable, ops: list[ProfileOp], sch: dict) -> EventTable:
    """Fill ``dram_read / dram_write / vtcm_read / vtcm_write / dma`` of a CSV-derived table
    (one row per ``ops`` entry, same order) from the compiler's bandwidth information in the
    schematic ``sch`` (:func:`read_schematic`): every entry whose low 32 bits are the op's
    ``OpId`` is added to it."""
    per: dict[int, list[int]] = {}
    for opid, vals in sch["bandwidth"].items():
        acc = per.setdefault(opid & 0xFFFFFFFF, [0, 0, 0, 0, 0])
        for i, v in enumerate(vals):
            acc[i] = acc[i] + v if i < 4 else max(acc[i], v)
    kern: dict[int, str] = {}
    # the op's compute kernel: an entry that is not a DMA transfer when there is one
    for opid, k in sorted(sch["kernels"].items(),
                          key=lambda kv: sch["bandwidth"].get(kv[0], (0, 0, 0, 0, 1))[4]):
        kern.setdefault(opid & 0xFFFFFFFF, k)
    cols = {c: np.full(len(table), np.nan) for c in
            ("dram_read", "dram_write", "vtcm_read", "vtcm_write")}
    dma = np.zeros(len(table), bool)
    kernels = [""] * len(table)
    for i, op in enumerate(ops):
        if op.op_id is None or op.op_id not in per:
            continue
        v = per[op.op_id]
        for j, c in enumerate(cols):
            cols[c][i] = v[j]
        dma[i] = bool(v[4])
        kernels[i] = kern.get(op.op_id, "")
    num = dict(table.num)
    num.update(cols)
    num["dma"] = dma
    vocab, codes = dict(table.vocab), dict(table.codes)
    index: dict[str, int] = {}
    codes["kernel"] = np.array([index.setdefault(k, len(index)) for k in kernels], np.int32)
    vocab["kernel"] = list(index)
    return EventTable(codes=codes, vocab=vocab, num=num, time_unit=table.time_unit)


# ---- ONNX Runtime profiling JSON -------------------------------------------------------------
def _ort_json(p: Path, blocks: dict, onnx_path) -> Profile:
    data = _load_json(p)
    if not isinstance(data, list):
        raise StudioError(f"{p.name} is not ONNX Runtime profiling JSON (not a list of events)")
    rows = []
    for e in data:
        if not isinstance(e, dict) or e.get("ph", "X") != "X":
            continue
        cat, name = e.get("cat"), str(e.get("name", ""))
        try:
            ts, dur = float(e["ts"]), float(e["dur"])
        except (KeyError, TypeError, ValueError):
            raise StudioError(f"{p.name}: an event has no numeric ts / dur; the file is "
                              "damaged") from None
        args = e.get("args") or {}
        if cat == "Node":
            if not name.endswith("_kernel_time"):
                continue  # fence_before / fence_after markers
            node = name[: -len("_kernel_time")]
            op_type = str(args.get("op_name", ""))
            provider = str(args.get("provider", "")).replace("ExecutionProvider", "")
            rows.append({"op": node, "op_type": op_type, "onnx_node": node,
                         "layer": layer_of(node) if layer_of(node) is not None else -1,
                         "block": _block(op_type, node, blocks),
                         "track": f"{provider or 'host'} thread {e.get('tid', 0)}",
                         "kernel": provider, "start": ts, "dur": dur})
    if not rows:
        raise StudioError(f"{p.name} holds no node events; profile with enable_profiling and "
                          "run the session at least once")
    return _profile(EventTable.from_rows(rows, time_unit="us"), "us", "ort")


# ---- chrome trace (qnn-profile-viewer) -------------------------------------------------------
def _chrome(p: Path, blocks: dict, onnx_path) -> Profile:
    data = _load_json(p)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise StudioError(f"{p.name}: traceEvents is not a list; pass {_ACCEPTED}")
    pnames: dict = {}
    tnames: dict = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M":
            n = (e.get("args") or {}).get("name")
            if e.get("name") == "process_name":
                pnames[e.get("pid")] = n
            elif e.get("name") == "thread_name":
                tnames[(e.get("pid"), e.get("tid"))] = n
    rows = []
    open_b: dict = {}
    for e in events:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph not in ("X", "B", "E"):
            continue
        key = (e.get("pid"), e.get("tid"))
        try:
            ts = float(e["ts"])
        except (KeyError, TypeError, ValueError):
            raise StudioError(f"{p.name}: an event has no numeric ts; the file is damaged"
                              ) from None
        if ph == "B":
            open_b.setdefault(key, []).append(e)
            continue
        if ph == "E":
            stack = open_b.get(key)
            if not stack:
                continue
            b = stack.pop()
            e = {**b, "dur": ts - float(b["ts"])}
            ts = float(b["ts"])
        name = str(e.get("name", ""))
        args = e.get("args") or {}
        proc = pnames.get(key[0])
        if proc and str(proc).startswith("QStudio profile"):
            proc = None  # the studio's own export: its tracks are the thread names
        thread = tnames.get(key) or f"tid {key[1]}"
        op_type = str(args.get("op_type") or args.get("type") or e.get("cat") or "")
        node = str(args.get("onnx_node") or "")
        layer = args.get("layer")
        rows.append({
            "op": name, "op_type": op_type, "onnx_node": node,
            "layer": int(layer) if isinstance(layer, int) else
            (layer_of(node or name) if layer_of(node or name) is not None else -1),
            "block": str(args.get("block") or _block(op_type, node or name, blocks)),
            "track": f"{proc} / {thread}" if proc else thread, "start": ts,
            "dur": float(e.get("dur", 0.0)),
            "cycles": args.get("cycles") if isinstance(args.get("cycles"), int | float) else None,
        })
    if not rows:
        raise StudioError(f"{p.name} holds no complete (X) or begin/end (B/E) events")
    other = data.get("otherData") if isinstance(data, dict) else None
    axis = str((other or {}).get("time_axis", ""))
    if "cycles" in axis:  # a cycles-only profile exported by the studio: keep its unit
        for r in rows:
            r["cycles"], r["start"], r["dur"] = r["dur"], None, None
        prof = _profile(EventTable.from_rows(rows), "cycles", "chrome-trace", metric="cycles")
    else:
        prof = _profile(EventTable.from_rows(rows, time_unit="us"), "us", "chrome-trace")
    if axis:
        prof.note = f"imported chrome trace: {axis}"
    return prof


# ---- AI Hub profile JSON ---------------------------------------------------------------------
def _aihub(p: Path, blocks: dict, onnx_path) -> Profile:
    data = _load_json(p)
    detail = data.get("execution_detail")
    if not isinstance(detail, list):
        raise StudioError(f"{p.name}: execution_detail is not a list of layers; pass an AI Hub "
                          "profile job's JSON")
    rows = []
    for i, layer in enumerate(detail):
        if not isinstance(layer, dict):
            continue
        name = str(layer.get("name", f"layer {i}"))
        op_type = str(layer.get("type", ""))
        t = layer.get("execution_time")
        cycles = layer.get("execution_cycles")
        rows.append({
            "op": name, "op_type": op_type, "onnx_node": name,
            "layer": layer_of(name) if layer_of(name) is not None else -1,
            "block": _block(op_type, name, blocks),
            "track": str(layer.get("compute_unit", "")) or "unknown unit",
            "dur": float(t) if isinstance(t, int | float) else None,
            "cycles": float(cycles) if isinstance(cycles, int | float) else None,
        })
    if not rows:
        raise StudioError(f"{p.name}: execution_detail is empty")
    prof = _profile(EventTable.from_rows(rows, time_unit="us"), "us", "aihub")
    summary = data.get("execution_summary") or {}
    if isinstance(summary, dict):
        prof.events = [ProfileEvent(name=k, value=float(v), unit="us" if "time" in k else "",
                                    kind="SUMMARY")
                       for k, v in summary.items()
                       if isinstance(v, int | float) and not isinstance(v, bool)]
    return prof


def copy_traffic(dst: EventTable, src: EventTable) -> tuple[EventTable, int]:
    """``dst`` with ``dram_* / vtcm_* / dma / kernel`` taken from the rows of ``src`` that
    have the same op name (e.g. from an optrace profile of the same graph); returns the new
    table and how many rows matched."""
    by_name = {r["op"]: r for r in src.rows() if r["dram_read"] is not None}
    cols = ("dram_read", "dram_write", "vtcm_read", "vtcm_write")
    num = {k: v.copy() for k, v in dst.num.items()}
    for c in cols:
        num[c] = np.full(len(dst), np.nan)
    kernels = [""] * len(dst)
    matched = 0
    for i, name in enumerate(dst["op"]):
        r = by_name.get(name)
        if r is None:
            continue
        matched += 1
        for c in cols:
            num[c][i] = r[c] if r[c] is not None else np.nan
        num["dma"][i] = bool(r["dma"])
        kernels[i] = r["kernel"] or ""
    index: dict[str, int] = {}
    codes = dict(dst.codes)
    codes["kernel"] = np.array([index.setdefault(k, len(index)) for k in kernels], np.int32)
    vocab = dict(dst.vocab)
    vocab["kernel"] = list(index)
    return EventTable(codes=codes, vocab=vocab, num=num, time_unit=dst.time_unit), matched
