"""Timeline data for drawing: profile events with start times, sorted per track, with a
level-of-detail reduction so 200 000 events draw as a few thousand rectangles.

Pure numpy. Build with :meth:`TimelineData.from_events` from an
:class:`~studio.core.events.EventTable`; events without a start time are left out and
counted (``untimed``), so the UI can say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from studio.core.events import EventTable
from studio.core.profile import SOURCES


@dataclass
class Track:
    name: str
    source: str
    start: np.ndarray  # sorted
    end: np.ndarray
    name_code: np.ndarray
    category: np.ndarray

    @property
    def label(self) -> str:
        return f"{self.name} ({self.source})" if self.source == "estimated" else self.name


@dataclass
class TimelineData:
    tracks: list[Track]
    names: list[str]
    categories: list[str]
    unit: str = "us"
    untimed: int = 0
    _cat_index: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return int(sum(len(t.start) for t in self.tracks))

    @classmethod
    def from_events(cls, table: EventTable, track_sources: dict[str, str] | None = None,
                    color_by: str = "block", default_source: str = "measured"
                    ) -> TimelineData:
        if color_by not in ("block", "op_type", "track"):
            raise ValueError(f"cannot colour a timeline by {color_by!r}; use block or op_type")
        start = table.num["start"].astype(np.float64)
        dur = table.num["dur"].astype(np.float64)
        timed = np.isfinite(start) & np.isfinite(dur)
        if (dur[timed] < 0).any():
            raise ValueError("an event has a negative duration; the profile is damaged")
        track_sources = track_sources or {}
        for src in track_sources.values():
            if src not in SOURCES:
                raise ValueError(f"track source {src!r} is not one of {SOURCES}")
        tcodes = table.codes["track"]
        ncodes = table.codes["op"]
        ccodes = table.codes[color_by]
        tracks = []
        for code, tname in enumerate(table.vocab["track"]):
            m = timed & (tcodes == code)
            if not m.any():
                continue
            s = start[m]
            order = np.argsort(s, kind="stable")
            s = s[order]
            tracks.append(Track(
                name=tname or "events", source=track_sources.get(tname, default_source),
                start=s, end=s + dur[m][order], name_code=ncodes[m][order].astype(np.int32),
                category=ccodes[m][order].astype(np.int32)))
        unit = table.time_unit
        return cls(tracks, list(table.vocab["op"]), list(table.vocab[color_by]) or [""], unit,
                   int((~timed).sum()))

    # ---- queries ----------------------------------------------------------------------
    def extent(self) -> tuple[float, float]:
        if not self.tracks:
            return 0.0, 0.0
        return (float(min(t.start[0] for t in self.tracks)),
                float(max(t.end.max() for t in self.tracks)))

    def select(self, t0: float, t1: float) -> dict:
        """Events overlapping [t0, t1]: count, time inside the window (clipped) in total, by
        name and by category, largest first."""
        if t1 < t0:
            t0, t1 = t1, t0
        by_name: dict[str, float] = {}
        by_cat: dict[str, float] = {}
        count, total = 0, 0.0
        for t in self.tracks:
            hi = np.searchsorted(t.start, t1, side="right")
            s, e = t.start[:hi], t.end[:hi]
            m = e > t0
            if not m.any():
                continue
            clipped = np.minimum(e[m], t1) - np.maximum(s[m], t0)
            count += int(m.sum())
            total += float(clipped.sum())
            for codes, vocab, acc in ((t.name_code[:hi][m], self.names, by_name),
                                      (t.category[:hi][m], self.categories, by_cat)):
                sums = np.bincount(codes, weights=clipped, minlength=len(vocab))
                for i in np.nonzero(sums)[0]:
                    acc[vocab[i]] = acc.get(vocab[i], 0.0) + float(sums[i])
        order = lambda d: dict(sorted(d.items(), key=lambda kv: -kv[1]))  # noqa: E731
        return {"events": count, "total": total, "by_name": order(by_name),
                "by_category": order(by_cat)}

    def name_codes(self, text: str) -> np.ndarray:
        """The codes of the event names that hold ``text`` (case-insensitive)."""
        needle = text.strip().lower()
        if not needle:
            return np.zeros(0, np.int32)
        return np.array([i for i, n in enumerate(self.names) if needle in n.lower()], np.int32)

    def find(self, text: str) -> dict:
        """The events whose name holds ``text``: ``{"codes", "track", "index", "start",
        "end", "total"}``, the matches ordered by start time (arrays)."""
        codes = self.name_codes(text)
        tr, ix, st, en = [], [], [], []
        if len(codes):
            for ti, t in enumerate(self.tracks):
                idx = np.nonzero(np.isin(t.name_code, codes))[0]
                tr.append(np.full(len(idx), ti, np.int32))
                ix.append(idx)
                st.append(t.start[idx])
                en.append(t.end[idx])
        if not st:
            empty = np.zeros(0)
            return {"codes": codes, "track": empty.astype(np.int32),
                    "index": empty.astype(np.int64), "start": empty, "end": empty, "total": 0.0}
        start, end = np.concatenate(st), np.concatenate(en)
        order = np.argsort(start, kind="stable")
        return {"codes": codes, "track": np.concatenate(tr)[order],
                "index": np.concatenate(ix)[order], "start": start[order], "end": end[order],
                "total": float((end - start).sum())}

    def raster(self, track: int, t0: float, t1: float, pixels: int,
               only: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Track ``track`` drawn into ``pixels`` columns over the window [t0, t1]:
        ``(category, busy)`` per column — the category with the most time in the column
        (-1: nothing) and the fraction of the column's time covered by events. Events wider
        than the window, sub-pixel events and everything between are handled the same way
        (vectorised), so drawing costs the same for 1 000 or 200 000 events. ``only``: name
        codes to draw (a search's matches), the other events left out."""
        t = self.tracks[track]
        ncat = max(len(self.categories), 1)
        cat = np.full(pixels, -1, np.int64)
        busy = np.zeros(pixels)
        if t1 <= t0 or pixels <= 0 or len(t.start) == 0:
            return cat, busy
        hi = int(np.searchsorted(t.start, t1, side="right"))
        s, e, c = t.start[:hi], t.end[:hi], t.category[:hi]
        m = e > t0
        if only is not None:
            m &= np.isin(t.name_code[:hi], only)
        s, e, c = np.maximum(s[m], t0), np.minimum(e[m], t1), c[m].astype(np.int64)
        px = (t1 - t0) / pixels
        a = (s - t0) / px  # fractional column coordinates
        b = (e - t0) / px
        ia = np.minimum(np.floor(a).astype(np.int64), pixels - 1)
        ib = np.minimum(np.floor(b).astype(np.int64), pixels - 1)
        weight = np.zeros((ncat, pixels + 1))
        same = ia == ib  # inside one column: its fraction of the column
        np.add.at(weight, (c[same], ia[same]), b[same] - a[same])
        # spanning columns: partial first and last column, full columns between
        sp = ~same
        np.add.at(weight, (c[sp], ia[sp]), (ia[sp] + 1) - a[sp])
        np.add.at(weight, (c[sp], ib[sp]), b[sp] - ib[sp])
        full = np.zeros((ncat, pixels + 1))
        np.add.at(full, (c[sp], ia[sp] + 1), 1.0)
        np.add.at(full, (c[sp], ib[sp]), -1.0)
        weight += np.cumsum(full, axis=1)
        weight = weight[:, :pixels]
        total = weight.sum(axis=0)
        has = total > 1e-9
        cat[has] = np.argmax(weight[:, has], axis=0)
        busy = np.minimum(total, 1.0)
        return cat, busy
