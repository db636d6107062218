"""Write a profile as chrome-trace / Perfetto JSON or CSV.

Chrome trace (the Trace Event Format): one ``"X"`` complete event per row with ``ts`` and
``dur`` in microseconds, ``pid`` / ``tid`` per track with ``"M"`` metadata events naming
them, and the row's facts in ``args``. A profile without start times (the HTP simulator's
CSV has none) is laid out back to back per track, and the trace says so in ``otherData``:
the positions are not measured. A cycles-only profile uses cycles as the time axis (1 cycle
drawn as 1 µs), and says that too.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from studio.core.events import COLUMNS, EventTable
from studio.core.profile import Profile


def _table(profile: Profile) -> EventTable:
    if profile.table is not None:
        return profile.table
    metric = "cycles" if profile.unit == "cycles" else "dur"
    return EventTable.from_rows(
        [{"op": op.qnn_name, "op_type": op.op_type, "onnx_node": op.onnx_node or "",
          "layer": op.layer if op.layer is not None else -1, metric: op.value}
         for op in profile.ops])


def to_chrome_trace(profile: Profile) -> dict:
    t = _table(profile)
    start = t.num["start"].astype(np.float64)
    dur = t.num["dur"].astype(np.float64)
    timed = bool(len(t)) and bool(np.isfinite(start).all() and np.isfinite(dur).all())
    axis = "measured timestamps (us)" if timed else ""
    if not timed:
        if np.isfinite(dur).any():
            dur = np.where(np.isfinite(dur), dur, 0.0)
            axis = "no start times in the source: events laid out back to back per track"
        else:
            dur = np.where(np.isfinite(t.num["cycles"]), t.num["cycles"], 0.0)
            axis = ("no start times in the source: events laid out back to back per track; "
                    "the time axis is accelerator cycles (1 cycle drawn as 1 us)")
        start = np.zeros(len(t))
        for code in range(len(t.vocab["track"])):
            m = t.codes["track"] == code
            start[m] = np.concatenate([[0.0], np.cumsum(dur[m])[:-1]]) if m.any() else []
    events: list[dict] = [{"ph": "M", "pid": 1, "tid": 0, "name": "process_name",
                           "args": {"name": f"QStudio profile ({profile.source})"}}]
    for code, name in enumerate(t.vocab["track"]):
        events.append({"ph": "M", "pid": 1, "tid": code + 1, "name": "thread_name",
                       "args": {"name": name or "events"}})
    cols = {c: t[c] for c in COLUMNS if c not in ("start", "dur")}
    for i in range(len(t)):
        args: dict[str, object] = {"source": profile.source}
        for c in ("op_type", "onnx_node", "block", "kernel"):
            if cols[c][i]:
                args[c] = str(cols[c][i])
        if cols["layer"][i] >= 0:
            args["layer"] = int(cols["layer"][i])
        for c in ("cycles", "dram_read", "dram_write", "vtcm_read", "vtcm_write", "macs"):
            v = cols[c][i]
            if np.isfinite(v):
                args[c] = float(v)
        if cols["dma"][i]:
            args["dma"] = True
        events.append({"ph": "X", "pid": 1, "tid": int(t.codes["track"][i]) + 1,
                       "name": str(cols["op"][i]) or str(cols["op_type"][i]) or "op",
                       "cat": str(cols["block"][i]) or str(cols["op_type"][i]) or "op",
                       "ts": float(start[i]), "dur": float(dur[i]), "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": profile.source, "device": profile.device,
                          "origin": profile.origin, "time_axis": axis,
                          "note": profile.note, "target": dict(profile.target)}}


def to_csv(profile: Profile) -> str:
    t = _table(profile)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["source", *COLUMNS])
    for row in t.rows():
        w.writerow([profile.source, *("" if row[c] is None else row[c] for c in COLUMNS)])
    return buf.getvalue()
