"""Parse QNN profiling CSVs (``profiling_level`` basic / detailed / optrace) into a Profile.

The QNN EP writes one CSV with the columns ``Msg Timestamp, Message, Time, Unit of
Measurement, Timing Source, Event Level, Event Identifier`` (plus ``ONNX Source Ops`` when
``enable_framework_op_trace`` is on). Each session writes its finalize (or load-binary)
rows once, then one block per run that ends with the ``EXECUTE`` row ``QNN (execute)
time``; ``detailed`` and ``optrace`` blocks carry one ``NODE … CYCLES …
<qnn op>:OpId_N (cycles)`` row per HTP op. There is no timeline: ``Msg Timestamp`` is 0.

QNN op names are mapped back to ONNX nodes by, in order: the CSV's ``ONNX Source Ops``
column, the EP's ``qnn_op_trace.json``, and name matching against the ONNX model; ONNX
nodes are mapped to transformer layers by name (``/model/layers.3/...`` -> 3).
"""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import replace
from pathlib import Path
from statistics import median

from studio.core.errors import StudioError
from studio.core.events import EventTable
from studio.core.profile import SOURCES, Profile, ProfileEvent, ProfileOp, layer_of, repeat_stats
from studio.engine.onnx_import import open_onnx
from studio.engine.opblocks import op_block
from studio.engine.opcost import op_costs

REQUIRED_COLUMNS = ("Message", "Time", "Unit of Measurement", "Event Level", "Event Identifier")
SOURCE_OPS_COLUMN = "ONNX Source Ops"

# "x_QuantizeLinear:OpId_16 (cycles)", "Input OpId_2 (cycles)"
# "<qnn op>:OpId_N (cycles)"; ops the backend made itself carry no name: "OpId_N (cycles)"
_NODE_ID = re.compile(r"^(?:(?P<name>.*?)[: ])?OpId_(?P<id>\d+)(?: \((?P<unit>[A-Za-z]+)\))?\s*$")
_QDQ = ("QuantizeLinear", "DequantizeLinear")
_GRAPH_IO = ("Input", "Output")
_UNITS = {"cycles": "cycles", "us": "us", "ms": "ms", "ns": "ns", "count": "count"}


def parse_profile_csv(
    csv_path: str | os.PathLike,
    onnx_path: str | os.PathLike | None = None,
    op_trace_json: str | os.PathLike | None = None,
    source: str = "simulated",
    target: dict | None = None,
    level: str | None = None,
) -> Profile:
    """Read a QNN profiling CSV into a :class:`~studio.core.profile.Profile`.

    ``source`` labels the numbers ("simulated" for the x86 HTP simulator, "measured" on a
    Snapdragon, "imported" for a CSV the user brought). Per-op values are the mean over
    the profiled runs (each run's value is kept in ``samples``).
    """
    if source not in SOURCES:
        raise StudioError(f"unknown profile source '{source}'; use one of {', '.join(SOURCES)}")
    path = Path(csv_path)
    rows, has_source_ops = _read_rows(path)

    nodes = _onnx_nodes(onnx_path) if onnx_path is not None else {}
    trace_map, trace_target = _read_trace(op_trace_json) if op_trace_json is not None else ({}, {})

    got = _CsvSamples(path, has_source_ops)
    for i, row in rows:
        got.add(i, row)
    ops = [
        _make_op(meta, tuple(got.op_samples[ident]), nodes, trace_map)
        for ident, meta in got.op_meta.items()
    ]
    units = {op.unit for op in ops}
    if len(units) > 1:
        raise StudioError(
            f"profile CSV {path} mixes per-op units {sorted(units)}; profile again with one level"
        )
    runs = got.runs
    if ops:
        # Each op belongs to one QNN graph and has one row per run; a session split into
        # several QNN graphs writes one EXECUTE row per graph and run.
        runs = max(len(op.samples) for op in ops)
    return Profile(
        source=source,
        ops=ops,
        events=got.events(),
        unit=next(iter(units)) if units else "cycles",
        runs=runs,
        level=level or ("detailed" if ops else "basic"),
        target={**trace_target, **(target or {})},
        origin=str(path),
    )


class _CsvSamples:
    """A profiling CSV's rows gathered: each op's (NODE rows) and each event's values over
    the runs, with what describes them, and the EXECUTE rows counted."""

    def __init__(self, path: Path, has_source_ops: bool) -> None:
        self.path, self.has_source_ops = path, has_source_ops
        self.op_samples: dict[str, list[float]] = {}
        self.op_meta: dict[str, dict] = {}
        self.ev_samples: dict[str, list[float]] = {}
        self.ev_meta: dict[str, dict] = {}
        self.runs = 0

    def add(self, i: int, row: dict) -> None:
        """Row ``i`` of the file (its line number, for the errors)."""
        path = self.path
        message = row["Message"].strip().upper()
        ident = row["Event Identifier"].strip()
        unit = _unit(row["Unit of Measurement"], path, i)
        try:
            value = float(row["Time"])
        except (TypeError, ValueError):
            raise StudioError(
                f"profile CSV {path} line {i}: Time '{row['Time']}' is not a number; "
                "the file is damaged or not a QNN profile"
            ) from None
        if message == "NODE":
            self.add_node(i, row, ident, unit, value)
        else:
            if message == "EXECUTE":
                self.runs += 1
            self.ev_samples.setdefault(ident, []).append(value)
            self.ev_meta.setdefault(
                ident, {"unit": unit, "kind": message, "level": row["Event Level"].strip()}
            )

    def add_node(self, i: int, row: dict, ident: str, unit: str, value: float) -> None:
        m = _NODE_ID.match(ident)
        if not m:
            raise StudioError(
                f"profile CSV {self.path} line {i}: NODE row '{ident}' has no '<op>:OpId_N' "
                "identifier; the file is damaged or not a QNN profile"
            )
        self.op_samples.setdefault(ident, []).append(value)
        if ident not in self.op_meta:
            src = (row.get(SOURCE_OPS_COLUMN) or "").strip() if self.has_source_ops else ""
            self.op_meta[ident] = {
                "name": (m.group("name") or "").strip() or f"OpId_{m.group('id')}",
                "op_id": int(m.group("id")),
                "unit": unit,
                "source_ops": tuple(s for s in src.split(";") if s) if src else (),
            }

    def events(self) -> list[ProfileEvent]:
        """The events, each the mean of its values over the runs."""
        return [
            ProfileEvent(
                name=ident,
                value=sum(self.ev_samples[ident]) / len(self.ev_samples[ident]),
                unit=meta["unit"],
                kind=meta["kind"],
                level=meta["level"],
                samples=tuple(self.ev_samples[ident]),
            )
            for ident, meta in self.ev_meta.items()
        ]


# ---------------------------------------------------------------------------------------
def _read_rows(path: Path) -> tuple[list[tuple[int, dict]], bool]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = [h.strip() for h in (reader.fieldnames or [])]
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                raise StudioError(
                    f"{path} is not a QNN profiling CSV (missing column(s) {', '.join(missing)}); "
                    "pass the CSV written by profiling_level basic/detailed/optrace"
                )
            reader.fieldnames = header
            rows = []
            for row in reader:
                if not any((v or "").strip() for k, v in row.items() if k is not None):
                    continue
                if any(row.get(c) is None for c in REQUIRED_COLUMNS):
                    raise StudioError(
                        f"profile CSV {path} line {reader.line_num}: too few columns; "
                        "the file is damaged or truncated"
                    )
                rows.append((reader.line_num, row))
    except FileNotFoundError:
        raise StudioError(f"profile CSV {path} not found; check the path") from None
    except UnicodeDecodeError:
        raise StudioError(f"{path} is not a text CSV; pass the QNN profiling CSV") from None
    except csv.Error as e:
        raise StudioError(
            f"{path} is not a readable CSV ({e}); pass the QNN profiling CSV"
        ) from None
    if not rows:
        raise StudioError(f"profile CSV {path} holds no rows; run the model with profiling first")
    return rows, SOURCE_OPS_COLUMN in header


def _unit(text: str, path: Path, line: int) -> str:
    u = (text or "").strip().lower()
    if u not in _UNITS:
        raise StudioError(
            f"profile CSV {path} line {line}: unknown unit '{text}'; the file is damaged or "
            "not a QNN profile"
        )
    return _UNITS[u]


def _onnx_nodes(onnx_path: str | os.PathLike) -> dict[str, str]:
    """{node name: op type} of an ONNX model (weights not loaded)."""
    model = open_onnx(Path(onnx_path), check=False)
    out = {n.name: n.op_type for n in model.graph.node if n.name}
    for fn in model.functions:
        for n in fn.node:
            if n.name:
                out.setdefault(n.name, n.op_type)
    return out


def _read_trace(trace_path: str | os.PathLike) -> tuple[dict[str, dict], dict]:
    """({qnn op name: {"qnn_op_type", "sources"}}, target) from qnn_op_trace.json."""
    p = Path(trace_path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StudioError(f"op trace {p} not found; check the path") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise StudioError(
            f"op trace {p} is not JSON ({e}); pass the EP's qnn_op_trace.json"
        ) from None
    if not isinstance(data, dict) or "subgraph_traces" not in data:
        raise StudioError(f"{p} is not a QNN op trace (no subgraph_traces); pass qnn_op_trace.json")
    out: dict[str, dict] = {}
    for sub in data.get("subgraph_traces") or []:
        for m in sub.get("op_mappings") or []:
            name = m.get("dst_name")
            if not name:
                continue
            sources = tuple(
                s["name"] for s in m.get("sources") or [] if s.get("type") == "OP" and s.get("name")
            )
            out[name] = {"qnn_op_type": m.get("dst_qnn_op_type"), "sources": sources}
    target = {}
    socs = data.get("soc_traces") or []
    if socs:
        ct = socs[0].get("compilation_target") or {}
        arch = str(ct.get("htp_arch", "")).lower().lstrip("v")
        if arch.isdigit():
            target["htp_arch"] = int(arch)
        if isinstance(ct.get("soc_model"), int):
            target["soc_model"] = ct["soc_model"]
    return out, target


def _guess_type(name: str) -> str:
    """'/model/layers.0/mlp/MatMul_1' -> 'MatMul', 'x_QuantizeLinear' -> 'QuantizeLinear'."""
    if re.fullmatch(r"OpId_\d+", name):
        return "unnamed backend op"  # ops the HTP backend inserted itself
    last = name.rstrip("/").rsplit("/", 1)[-1]
    last = re.sub(r"_\d+$", "", last)
    if "_" in last:
        tail = last.rsplit("_", 1)[-1]
        if tail[:1].isupper():
            last = tail
    return last or "Unknown"


def _primary(qnn_name: str, sources: tuple[str, ...], nodes: dict[str, str]) -> str | None:
    if qnn_name in sources:
        return qnn_name
    for s in sources:
        if nodes.get(s, _guess_type(s)) not in _QDQ:
            return s
    return sources[0] if sources else None


def _match_by_name(qnn_name: str, nodes: dict[str, str]) -> str | None:
    if qnn_name in nodes:
        return qnn_name
    # ORT rewrites keep the original name as a prefix: '/x/MatMul/MatMulAddFusion'.
    best = None
    for n in nodes:
        if (
            len(n) < len(qnn_name)
            and qnn_name.startswith(n)
            and qnn_name[len(n)] in "/_:"
            and (best is None or len(n) > len(best))
        ):
            best = n
    return best


def _make_op(
    meta: dict, samples: tuple[float, ...], nodes: dict[str, str], trace: dict[str, dict]
) -> ProfileOp:
    name = meta["name"]
    value = sum(samples) / len(samples)
    if name in _GRAPH_IO:
        return ProfileOp(
            qnn_name=name,
            op_type=name,
            value=value,
            unit=meta["unit"],
            op_id=meta["op_id"],
            samples=samples,
        )
    t = trace.get(name, {})
    sources = meta["source_ops"] or t.get("sources", ())
    onnx_node = _primary(name, sources, nodes) if sources else None
    if onnx_node is None and nodes:
        onnx_node = _match_by_name(name, nodes)
    if not sources and onnx_node is not None:
        sources = (onnx_node,)
    if onnx_node is not None and onnx_node not in nodes and nodes:
        # A name the EP or ORT made up: fall back to the ONNX node it was derived from.
        onnx_node = _match_by_name(onnx_node, nodes) or onnx_node
    key = onnx_node or name
    op_type = nodes.get(key) if nodes else None
    op_type = op_type or _guess_type(key)
    layer = layer_of(onnx_node) if onnx_node else None
    if layer is None:
        layer = next((layer_of(s) for s in sources if layer_of(s) is not None), layer_of(name))
    return ProfileOp(
        qnn_name=name,
        op_type=op_type,
        value=value,
        unit=meta["unit"],
        onnx_node=onnx_node,
        onnx_nodes=tuple(sources),
        layer=layer,
        op_id=meta["op_id"],
        qnn_op_type=t.get("qnn_op_type"),
        samples=samples,
    )


def parse_profile_run(
    run: dict, onnx_path: str | os.PathLike | None = None, chip: object | None = None
) -> Profile:
    """Parse what :func:`studio.engine.profiling.profile_run` returned (its CSV and op trace),
    labelled with its source ("simulated" on x86) and, when given, the target chip."""
    target = {}
    if chip is not None:
        target = {
            "chip": getattr(chip, "key", str(chip)),
            **{k: getattr(chip, k) for k in ("htp_arch", "soc_model") if hasattr(chip, k)},
        }
    return parse_profile_csv(
        run["csv"],
        onnx_path=onnx_path,
        op_trace_json=run.get("op_trace"),
        source=run.get("source", "simulated"),
        target=target,
        level=run.get("level"),
    )


# ---- repeats and the event table ------------------------------------------------------------
def join_parts(profiles: list[Profile], names: list[str]) -> Profile:
    """One run of a model in parts as one profile: each part's ops in order, their QNN
    names prefixed with the part's (``part2_of_3/...``: each part is its own QNN graph, with
    its own op ids), events summed by name."""
    if not profiles:
        raise StudioError("no parts to join")
    ops = [replace(op, qnn_name=f"{name}/{op.qnn_name}")
           for p, name in zip(profiles, names, strict=True) for op in p.ops]
    events = []
    for ev in profiles[0].events:
        total = sum(e.value for p in profiles for e in p.events if e.name == ev.name)
        events.append(replace(ev, value=float(total), samples=()))
    return replace(profiles[0], ops=ops, events=events)


def merge_repeats(profiles: list[Profile], other_load: list[float]) -> Profile:
    """One profile from several profiled runs of the same graph (one run each).

    Each op keeps every run's value in ``samples`` and the **median** as its value; the
    profile's ``stats`` hold the per-run totals, their spread and the host load of each run
    (:func:`studio.core.profile.repeat_stats`), with the warnings to show.
    """
    if not profiles:
        raise StudioError("no profiled runs to merge")
    first = profiles[0]
    by_id: dict[tuple, list[float]] = {}
    for p in profiles:
        for op in p.ops:
            by_id.setdefault((op.qnn_name, op.op_id), []).extend(op.samples or (op.value,))
    ops = [
        replace(op, samples=tuple(by_id[(op.qnn_name, op.op_id)]),
                value=float(median(by_id[(op.qnn_name, op.op_id)])))
        for op in first.ops
    ]
    events = []
    for ev in first.events:
        vals = [e.value for p in profiles for e in p.events if e.name == ev.name]
        events.append(replace(ev, samples=tuple(vals), value=float(median(vals))))
    totals = [p.total() for p in profiles]
    return replace(
        first, ops=ops, events=events, runs=len(profiles),
        stats=repeat_stats(totals, other_load, first.unit),
    )


def event_table(profile: Profile, blocks: dict[str, str] | None = None, track: str = "HTP",
                costs: dict[str, tuple[float, float]] | None = None):
    """The profile's ops as an :class:`~studio.core.events.EventTable`, one row per op with
    its median cycles (or time) and its block from :func:`studio.engine.opblocks.node_blocks`.
    ``costs`` (ONNX node -> (MACs, DRAM bytes), analytic, from
    :func:`studio.engine.opcost.op_costs`) fills ``macs`` and ``dram_read`` from the ONNX
    nodes each op came from: load-independent figures beside the cycles.
    The simulator's CSV has no start times: ``start`` / ``dur`` stay empty for cycle
    profiles."""
    blocks = blocks or {}
    cycles = profile.unit == "cycles"
    rows = []
    for op in profile.ops:
        row = {
            "op": op.qnn_name, "op_type": op.op_type, "onnx_node": op.onnx_node or "",
            "layer": op.layer if op.layer is not None else -1,
            "block": op_block(op.op_type, op.onnx_node, blocks), "track": track,
        }
        if cycles:
            row["cycles"] = op.value
        else:
            row["dur"] = op.value
        if costs:
            nodes = op.onnx_nodes or ((op.onnx_node,) if op.onnx_node else ())
            found = [costs[n] for n in nodes if n in costs]
            if found:
                row["macs"] = sum(m for m, _ in found)
                row["dram_read"] = sum(b for _, b in found)
        rows.append(row)
    return EventTable.from_rows(rows, time_unit=profile.unit if not cycles else "us")


def node_costs(onnx_path: str | os.PathLike) -> dict[str, tuple[float, float]]:
    """ONNX node name -> (MACs, DRAM bytes) of a graph (analytic, see studio.engine.opcost)."""
    g = op_costs(Path(onnx_path))
    return {n: (float(m), float(b)) for n, m, b in zip(g.names, g.macs, g.dram_bytes,
                                                       strict=True)}
