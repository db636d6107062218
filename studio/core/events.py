"""Profile events, columnar: one row per op execution (or per op, when a profile has no times).

Every profile the studio shows — simulated on the HTP simulator, imported from a device tool,
estimated by the performance model — becomes one :class:`EventTable`: numpy columns, with
text columns stored as int32 codes into a per-column string list (so 200 000 events are a
few MB and group-bys are ``np.bincount``). Columns:

=============  =======  ==============================================================
op             text     the backend's op name (QNN op, ORT node, AI Hub layer ...)
op_type        text     its type (MatMul, Softmax, QuantizeLinear ...)
onnx_node      text     the ONNX node it comes from ("" when unknown)
layer          int      transformer layer index, -1 outside the layers
block          text     the seed's table row (:data:`BLOCKS`): "QKV projection" ...
track          text     where it ran: a host thread, an HTP core, "HTP" when unknown
kernel         text     the backend kernel the compiler chose ("" when unknown)
start, dur     float    start and duration in ``time_unit`` (NaN when the data has none)
cycles         float    accelerator cycles (NaN when none)
dram_read/write, vtcm_read/write   float   bytes moved (NaN when none)
dma            bool     the op is a DMA transfer
macs           float    multiply-accumulates (analytic; NaN when unknown)
=============  =======  ==============================================================

Pure numpy (no onnx, no Qt).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_bytes

TEXT_COLUMNS = ("op", "op_type", "onnx_node", "block", "track", "kernel")
INT_COLUMNS = ("layer",)
FLOAT_COLUMNS = (
    "start", "dur", "cycles", "dram_read", "dram_write", "vtcm_read", "vtcm_write", "macs",
)
BOOL_COLUMNS = ("dma",)
COLUMNS = TEXT_COLUMNS + INT_COLUMNS + FLOAT_COLUMNS + BOOL_COLUMNS

# The seed's op table: where one decode step of a decoder LM spends its time.
BLOCKS = (
    "QKV projection",
    "attention: QK",
    "attention: softmax",
    "attention: AV",
    "o_proj",
    "gate/up",
    "down_proj",
    "RMSNorm",
    "RoPE",
    "data movement / Q-DQ",
    "embedding / lm_head",
    "other",
)


@dataclass
class EventTable:
    """Columnar profile events. Build with :meth:`from_rows`; columns are numpy arrays."""

    codes: dict[str, np.ndarray] = field(default_factory=dict)  # text column -> int32 codes
    vocab: dict[str, list[str]] = field(default_factory=dict)  # text column -> strings
    num: dict[str, np.ndarray] = field(default_factory=dict)  # int / float / bool columns
    time_unit: str = "us"  # unit of start / dur ("us", "cycles")

    def __post_init__(self) -> None:
        for name in TEXT_COLUMNS:
            self.codes.setdefault(name, np.zeros(0, np.int32))
            self.vocab.setdefault(name, [])
        for name in INT_COLUMNS + FLOAT_COLUMNS + BOOL_COLUMNS:
            self.num.setdefault(name, np.zeros(0, _dtype(name)))
        n = max(len(v) for v in (*self.codes.values(), *self.num.values()))
        for name in COLUMNS:  # columns not given take the length of the others
            store = self.codes if name in TEXT_COLUMNS else self.num
            if len(store[name]) == 0 and n:
                store[name] = _empty_column(name, n)
                if name in TEXT_COLUMNS:
                    self.vocab[name] = [""]
            if len(store[name]) != n:
                raise ValueError(f"event column '{name}' has {len(store[name])} rows, not {n}")

    # ---- construction -----------------------------------------------------------------
    @classmethod
    def from_rows(cls, rows: Iterable[Mapping], time_unit: str = "us") -> EventTable:
        """Rows are dicts with any of :data:`COLUMNS`; missing values are empty / NaN / -1."""
        rows = list(rows)
        unknown = {k for r in rows for k in r} - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown event column(s) {sorted(unknown)}; use {COLUMNS}")
        codes, vocab, num = {}, {}, {}
        for name in TEXT_COLUMNS:
            index: dict[str, int] = {}
            col = np.empty(len(rows), np.int32)
            for i, r in enumerate(rows):
                s = r.get(name) or ""
                col[i] = index.setdefault(str(s), len(index))
            codes[name], vocab[name] = col, list(index)
        for name in INT_COLUMNS + FLOAT_COLUMNS + BOOL_COLUMNS:
            col = _empty_column(name, len(rows))
            for i, r in enumerate(rows):
                v = r.get(name)
                if v is not None:
                    col[i] = v
            num[name] = col
        return cls(codes=codes, vocab=vocab, num=num, time_unit=time_unit)

    # ---- access -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.codes["op"])

    def __getitem__(self, name: str) -> np.ndarray:
        """A numeric column, or a text column decoded to an object array."""
        if name in TEXT_COLUMNS:
            voc = np.asarray(self.vocab[name] or [""], dtype=object)
            return voc[self.codes[name]]
        if name in self.num:
            return self.num[name]
        raise KeyError(f"no event column '{name}'")

    def has(self, name: str) -> bool:
        """Whether a column holds any known value (not all NaN / empty / -1)."""
        if name in TEXT_COLUMNS:
            return any(self.vocab[name]) and len(self) > 0
        col = self.num[name]
        if col.dtype.kind == "f":
            return bool(np.isfinite(col).any())
        if name == "layer":
            return bool((col >= 0).any())
        return bool(col.any())

    def value(self, metric: str = "dur") -> np.ndarray:
        """``metric`` per event with NaN as 0 (for sums)."""
        col = self.num[metric].astype(np.float64, copy=False)
        return np.where(np.isfinite(col), col, 0.0)

    def group_sum(self, by: str, metric: str = "dur") -> dict:
        """Sum of ``metric`` per value of column ``by``, largest first (layers in order)."""
        vals = self.value(metric)
        if by in TEXT_COLUMNS:
            sums = np.bincount(self.codes[by], weights=vals, minlength=len(self.vocab[by]))
            pairs = [(self.vocab[by][i], float(s)) for i, s in enumerate(sums)]
            return dict(sorted(pairs, key=lambda kv: -kv[1]))
        keys = self.num[by]
        out: dict = {}
        for k in np.unique(keys):
            out[int(k)] = float(vals[keys == k].sum())
        return out

    def group_count(self, by: str) -> dict:
        if by in TEXT_COLUMNS:
            counts = np.bincount(self.codes[by], minlength=len(self.vocab[by]))
            return {self.vocab[by][i]: int(c) for i, c in enumerate(counts) if c}
        keys, counts = np.unique(self.num[by], return_counts=True)
        return {int(k): int(c) for k, c in zip(keys, counts, strict=True)}

    def take(self, mask_or_index: np.ndarray) -> EventTable:
        """A sub-table (boolean mask or index array); string lists are kept as they are."""
        return EventTable(
            codes={k: v[mask_or_index] for k, v in self.codes.items()},
            vocab={k: list(v) for k, v in self.vocab.items()},
            num={k: v[mask_or_index] for k, v in self.num.items()},
            time_unit=self.time_unit,
        )

    def rows(self) -> list[dict]:
        """Rows as dicts (for small tables, tests and CSV)."""
        cols = {name: self[name] for name in COLUMNS}
        return [{name: _py(cols[name][i]) for name in COLUMNS} for i in range(len(self))]

    # ---- storage ----------------------------------------------------------------------
    def to_npz_bytes(self) -> bytes:
        arrays = {f"c_{k}": v for k, v in self.codes.items()}
        arrays.update({f"n_{k}": v for k, v in self.num.items()})
        meta = {"vocab": self.vocab, "time_unit": self.time_unit, "version": 1}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]
        return buf.getvalue()

    def save(self, path: str | os.PathLike) -> None:
        """Write ``path`` (.npz) atomically."""
        atomic_write_bytes(Path(path), self.to_npz_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike) -> EventTable:
        try:
            with np.load(Path(path), allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                codes = {k[2:]: z[k].astype(np.int32) for k in z.files if k.startswith("c_")}
                num = {k[2:]: z[k] for k in z.files if k.startswith("n_")}
        except (OSError, ValueError, KeyError) as e:
            raise StudioError(
                f"{path} is not a readable profile event table ({e}); profile the run again"
            ) from None
        return cls(codes=codes, vocab=meta["vocab"], num=num, time_unit=meta["time_unit"])


def _dtype(name: str):
    if name in INT_COLUMNS:
        return np.int32
    if name in BOOL_COLUMNS:
        return np.bool_
    return np.float64


def _empty_column(name: str, n: int) -> np.ndarray:
    if name in TEXT_COLUMNS:
        return np.zeros(n, np.int32)
    if name in INT_COLUMNS:
        return np.full(n, -1, np.int32)
    if name in BOOL_COLUMNS:
        return np.zeros(n, np.bool_)
    return np.full(n, np.nan)


def _py(v):
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and v != v:
        return None
    return v
