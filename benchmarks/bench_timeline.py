"""Timeline of 200 000 profile events: load (set_data + first paint) and redraw during pan
and zoom, against the same view with 1 000 events (a baseline measured in the same run).

    QT_QPA_PLATFORM=offscreen python benchmarks/bench_timeline.py [--events N] [--repeats R]

Limits from the issue: load <= 1 s, redraw <= 33 ms (median).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402

from studio.core.events import EventTable  # noqa: E402
from studio.core.timeline import TimelineData  # noqa: E402

CATS = ["QKV projection", "attention: QK", "gate/up", "down_proj", "RMSNorm", "data movement"]


def make_table(n: int, tracks: int = 16, seed: int = 0) -> EventTable:
    rng = np.random.default_rng(seed)
    per = n // tracks
    starts, durs, trk = [], [], []
    for t in range(tracks):
        d = rng.exponential(8.0, per)
        gaps = rng.exponential(2.0, per)
        s = np.cumsum(d + gaps) - d
        starts.append(s)
        durs.append(d)
        trk.append(np.full(per, t, np.int32))
    m = per * tracks
    return EventTable(
        codes={"track": np.concatenate(trk), "op": rng.integers(0, 500, m).astype(np.int32),
               "block": rng.integers(0, len(CATS), m).astype(np.int32)},
        vocab={"track": [f"thread {t}" for t in range(tracks)],
               "op": [f"/model/layers.{i % 24}/op_{i}" for i in range(500)], "block": CATS},
        num={"start": np.concatenate(starts), "dur": np.concatenate(durs)}, time_unit="us")


def _pan(view, lo: float, span: float, steps: int = 60) -> list[float]:
    """Seconds per redraw while a window of 1/10 of the profile pans across it."""
    out = []
    w = span / 10
    for i in range(steps):
        a = lo + (span - w) * i / (steps - 1)
        t0 = time.perf_counter()
        view.plot.setXRange(a, a + w, padding=0)
        view.grab()
        out.append(time.perf_counter() - t0)
    return out


def measure(n: int, repeats: int) -> dict:
    from PySide6.QtWidgets import QApplication

    from studio.ui.timeline import TimelineView

    app = QApplication.instance() or QApplication([])
    table = make_table(n)
    view = TimelineView()
    view.resize(1400, 700)
    view.show()
    app.processEvents()
    loads = []
    for _ in range(repeats):
        view.set_data(None)
        app.processEvents()
        t0 = time.perf_counter()
        view.set_data(TimelineData.from_events(table))
        view.grab()
        loads.append(time.perf_counter() - t0)
    lo, hi = view.data.extent()
    span = hi - lo
    redraw = _pan(view, lo, span)  # pan at 1/10 of the profile
    for i in range(60):  # zoom from the whole profile to 1/1000 of it
        w = span * (1e-3 ** (i / 59))
        mid = lo + span / 2
        t0 = time.perf_counter()
        view.plot.setXRange(mid - w / 2, mid + w / 2, padding=0)
        view.grab()
        redraw.append(time.perf_counter() - t0)
    # a search by op name (layer 7's ops: 1 name in 24), then the same pan with it shown
    t0 = time.perf_counter()
    found = view.find("layers.7/")
    view.grab()
    find_s = time.perf_counter() - t0
    searched = _pan(view, lo, span)
    view.close()
    return {"events": len(table), "load_s": statistics.median(loads),
            "redraw_ms": 1e3 * statistics.median(redraw),
            "redraw_p90_ms": 1e3 * float(np.percentile(redraw, 90)),
            "found": found, "find_ms": 1e3 * find_s,
            "search_redraw_ms": 1e3 * statistics.median(searched)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    base = measure(1_000, args.repeats)
    big = measure(args.events, args.repeats)
    print(f"baseline {base['events']:>7,} events: load {base['load_s'] * 1e3:7.1f} ms, "
          f"redraw median {base['redraw_ms']:5.1f} ms (p90 {base['redraw_p90_ms']:.1f})")
    print(f"timeline {big['events']:>7,} events: load {big['load_s'] * 1e3:7.1f} ms, "
          f"redraw median {big['redraw_ms']:5.1f} ms (p90 {big['redraw_p90_ms']:.1f})")
    print(f"ratio vs baseline: load {big['load_s'] / base['load_s']:.2f}x, redraw "
          f"{big['redraw_ms'] / base['redraw_ms']:.2f}x")
    print(f"search 'layers.7/' on {big['events']:,} events: {big['found']:,} matches in "
          f"{big['find_ms']:.1f} ms; redraw with the matches shown median "
          f"{big['search_redraw_ms']:.1f} ms (baseline {base['search_redraw_ms']:.1f} ms)")
    ok_load = big["load_s"] <= 1.0
    ok_redraw = big["redraw_ms"] <= 33.0 and big["search_redraw_ms"] <= 33.0
    print(f"limits: load <= 1 s {'OK' if ok_load else 'MISSED'}, redraw <= 33 ms "
          f"{'OK' if ok_redraw else 'MISSED'}")
    return 0 if ok_load and ok_redraw else 1


if __name__ == "__main__":
    raise SystemExit(main())
