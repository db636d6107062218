"""Activation memory planning: how many bytes a graph's tensors need at once.

A graph runs as a sequence of *steps* (its nodes in topological order). Each activation
tensor is written by one step (graph inputs: before step 0) and read until its last
consumer (graph outputs: until the last step). Three figures come out of that:

- **naive**: every tensor gets its own buffer, the sum of all activation bytes;
- **lower bound**: the largest number of bytes alive at any one step (no allocator can do
  better without recomputing or aliasing tensors);
- **arena**: the size of one arena where buffers are reused once their tensor is dead, from
  a real offset-assigning allocator, the *greedy by size* planner of TFLite's arena
  (Pisarchyk & Lee, "Efficient memory management for deep neural net inference", 2020):
  largest tensors first, each at the best-fitting gap among the tensors whose lifetimes
  overlap its own. ``lower bound <= arena <= naive``.

Every buffer is rounded up to ``alignment`` bytes (64 like TFLite's arena), in all three
figures alike; ``alignment=1`` gives the raw sums.

Pure Python + numpy: the engine (:mod:`studio.engine.memplan`) builds the tensor list from
an ONNX file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from studio.core.errors import StudioError

DEFAULT_ALIGNMENT = 64
KINDS = ("input", "intermediate", "output")


@dataclass(frozen=True)
class Tensor:
    """One activation tensor: alive from step ``start`` to step ``end``, both included.

    ``producer`` is the node that writes it ("" for a graph input), ``op_type`` that node's
    op type ("input" for a graph input); ``kind`` is input / intermediate / output."""

    name: str
    nbytes: int
    start: int
    end: int
    producer: str = ""
    op_type: str = ""
    kind: str = "intermediate"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "nbytes": self.nbytes, "start": self.start, "end": self.end,
                "producer": self.producer, "op_type": self.op_type, "kind": self.kind}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Tensor:
        return cls(str(d["name"]), int(d["nbytes"]), int(d["start"]), int(d["end"]),
                   str(d.get("producer", "")), str(d.get("op_type", "")),
                   str(d.get("kind", "intermediate")))


@dataclass(frozen=True)
class Placement:
    """Where the arena allocator put a tensor: bytes ``[offset, offset + size)`` during
    steps ``[start, end]`` (``size`` is the aligned size)."""

    name: str
    offset: int
    size: int
    start: int
    end: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "offset": self.offset, "size": self.size,
                "start": self.start, "end": self.end}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Placement:
        return cls(str(d["name"]), int(d["offset"]), int(d["size"]), int(d["start"]),
                   int(d["end"]))


@dataclass
class MemoryPlan:
    """The plan of one graph's activations. Byte figures are aligned sizes (see module doc);
    ``live_bytes[i]`` is what is alive during step ``i`` (numpy int64, for plotting)."""

    steps: int
    alignment: int
    tensor_count: int
    raw_bytes: int  # sum of the tensors' own sizes (no alignment)
    naive_bytes: int
    lower_bound_bytes: int
    arena_bytes: int
    peak_step: int  # the first step where live_bytes is largest (-1: no steps)
    peak_node: str
    peak_op_type: str
    peak_tensors: list[Tensor]  # the largest tensors alive at the peak step, largest first
    live_bytes: np.ndarray
    placements: list[Placement] = field(default_factory=list)
    bytes_by_kind: dict[str, int] = field(default_factory=dict)  # naive bytes per kind

    @property
    def reuse_saving(self) -> float:
        """Fraction of the naive bytes the arena saves (0.35 = 35 % smaller)."""
        return 1.0 - self.arena_bytes / self.naive_bytes if self.naive_bytes else 0.0

    @property
    def bound_saving(self) -> float:
        return 1.0 - self.lower_bound_bytes / self.naive_bytes if self.naive_bytes else 0.0

    @property
    def arena_overhead(self) -> float:
        """How far the arena is above the lower bound (0.02 = 2 % larger)."""
        return self.arena_bytes / self.lower_bound_bytes - 1.0 if self.lower_bound_bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps, "alignment": self.alignment, "tensor_count": self.tensor_count,
            "raw_bytes": self.raw_bytes, "naive_bytes": self.naive_bytes,
            "lower_bound_bytes": self.lower_bound_bytes, "arena_bytes": self.arena_bytes,
            "reuse_saving": self.reuse_saving, "bound_saving": self.bound_saving,
            "peak_step": self.peak_step, "peak_node": self.peak_node,
            "peak_op_type": self.peak_op_type,
            "peak_tensors": [t.to_dict() for t in self.peak_tensors],
            "live_bytes": [int(x) for x in self.live_bytes],
            "placements": [p.to_dict() for p in self.placements],
            "bytes_by_kind": dict(self.bytes_by_kind),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryPlan:
        return cls(
            steps=int(d["steps"]), alignment=int(d["alignment"]),
            tensor_count=int(d["tensor_count"]), raw_bytes=int(d["raw_bytes"]),
            naive_bytes=int(d["naive_bytes"]), lower_bound_bytes=int(d["lower_bound_bytes"]),
            arena_bytes=int(d["arena_bytes"]), peak_step=int(d["peak_step"]),
            peak_node=str(d.get("peak_node", "")), peak_op_type=str(d.get("peak_op_type", "")),
            peak_tensors=[Tensor.from_dict(t) for t in d.get("peak_tensors", [])],
            live_bytes=np.asarray(d.get("live_bytes", []), dtype=np.int64),
            placements=[Placement.from_dict(p) for p in d.get("placements", [])],
            bytes_by_kind={str(k): int(v) for k, v in d.get("bytes_by_kind", {}).items()},
        )


def _aligned(n: int, alignment: int) -> int:
    return -(-int(n) // alignment) * alignment


def _check(tensors: list[Tensor], steps: int, alignment: int) -> None:
    if alignment < 1:
        raise StudioError(f"alignment must be at least 1 byte, not {alignment}")
    seen: set[str] = set()
    for t in tensors:
        if t.name in seen:
            raise StudioError(f"tensor {t.name!r} appears twice in the memory plan's list")
        seen.add(t.name)
        if t.nbytes < 0:
            raise StudioError(f"tensor {t.name!r} has a negative size ({t.nbytes} bytes)")
        if not 0 <= t.start <= t.end < max(steps, 1):
            raise StudioError(f"tensor {t.name!r} lives over steps [{t.start}, {t.end}], "
                              f"outside the graph's {steps} steps")
        if t.kind not in KINDS:
            raise StudioError(f"tensor {t.name!r} has kind {t.kind!r}; use one of {KINDS}")


def live_curve(tensors: list[Tensor], steps: int, alignment: int = DEFAULT_ALIGNMENT
               ) -> np.ndarray:
    """Bytes alive during each step (int64 array of length ``steps``)."""
    diff = np.zeros(max(steps, 1) + 1, dtype=np.int64)
    if tensors:
        size = np.array([_aligned(t.nbytes, alignment) for t in tensors], dtype=np.int64)
        np.add.at(diff, np.array([t.start for t in tensors]), size)
        np.add.at(diff, np.array([t.end for t in tensors]) + 1, -size)
    return np.cumsum(diff[:-1])[:steps]


def greedy_by_size(tensors: list[Tensor], alignment: int = DEFAULT_ALIGNMENT
                   ) -> list[Placement]:
    """Offsets in one arena, largest tensors first, each in the smallest gap (best fit)
    between the already placed tensors whose lifetimes overlap its own, else above them.
    Two tensors alive at the same step never share a byte."""
    order = sorted(range(len(tensors)),
                   key=lambda i: (-tensors[i].nbytes, tensors[i].start - tensors[i].end,
                                  tensors[i].start, tensors[i].name))
    n = len(tensors)
    starts = np.zeros(n, dtype=np.int64)
    ends = np.zeros(n, dtype=np.int64)
    offs = np.zeros(n, dtype=np.int64)
    tops = np.zeros(n, dtype=np.int64)  # offset + size
    out: dict[int, Placement] = {}
    for k, i in enumerate(order):
        t = tensors[i]
        size = _aligned(t.nbytes, alignment)
        mask = (starts[:k] <= t.end) & (ends[:k] >= t.start)
        offset = 0
        if size and mask.any():
            o, z = offs[:k][mask], tops[:k][mask]
            srt = np.argsort(o, kind="stable")
            o, z = o[srt], z[srt]
            below = np.concatenate(([0], np.maximum.accumulate(z)[:-1]))  # free from here
            gaps = o - below
            fits = np.flatnonzero(gaps >= size)
            if fits.size:
                best = fits[np.argmin(gaps[fits])]
                offset = int(below[best])
            else:
                offset = int(z.max())
        starts[k], ends[k], offs[k], tops[k] = t.start, t.end, offset, offset + size
        out[i] = Placement(t.name, offset, size, t.start, t.end)
    return [out[i] for i in range(n)]


def plan_memory(tensors: list[Tensor], steps: int, step_labels: list[tuple[str, str]] | None = None,
                alignment: int = DEFAULT_ALIGNMENT, top: int = 8) -> MemoryPlan:
    """Plan ``tensors`` over a graph of ``steps`` steps. ``step_labels[i]`` is (node name,
    op type) of step ``i``, for naming the peak; ``top`` how many of the largest tensors
    alive at the peak to keep."""
    tensors = list(tensors)
    _check(tensors, steps, alignment)
    live = live_curve(tensors, steps, alignment)
    placements = greedy_by_size(tensors, alignment)
    arena = max((p.offset + p.size for p in placements), default=0)
    peak = int(np.argmax(live)) if steps > 0 and live.size else -1
    node, op = ("", "")
    if step_labels is not None and 0 <= peak < len(step_labels):
        node, op = step_labels[peak]
    at_peak = sorted((t for t in tensors if t.start <= peak <= t.end),
                     key=lambda t: (-t.nbytes, t.name))[:top]
    by_kind: dict[str, int] = {}
    for t in tensors:
        by_kind[t.kind] = by_kind.get(t.kind, 0) + _aligned(t.nbytes, alignment)
    return MemoryPlan(
        steps=int(steps), alignment=int(alignment), tensor_count=len(tensors),
        raw_bytes=sum(t.nbytes for t in tensors),
        naive_bytes=sum(_aligned(t.nbytes, alignment) for t in tensors),
        lower_bound_bytes=int(live.max()) if live.size else 0, arena_bytes=int(arena),
        peak_step=peak, peak_node=node, peak_op_type=op, peak_tensors=at_peak,
        live_bytes=live, placements=placements, bytes_by_kind=by_kind,
    )


def overlaps(placements: list[Placement]) -> list[tuple[str, str]]:
    """Pairs of placements alive at a common step that share arena bytes (should be none)."""
    bad = []
    ps = sorted(placements, key=lambda p: p.offset)
    for a_i, a in enumerate(ps):
        for b in ps[a_i + 1:]:
            if b.offset >= a.offset + a.size:
                break
            if a.size and b.size and a.start <= b.end and b.start <= a.end:
                bad.append((a.name, b.name))
    return bad


@dataclass
class GraphMemory:
    """One graph's memory: the activation plan and, beside it, the bytes that are not
    activations. Figures are computed from the graph's shapes and dtypes (source
    ``estimated``), not measured on a device.

    - ``weight_bytes``: initializers and Constant outputs at their stored dtype (a QDQ
      graph's int8 / int4 / uint16 weights count at their quantized size, plus scales and
      zero points); ``weight_bytes_fp32`` the same weights as FP32 (scales and zero points
      left out); ``weight_bytes_by_dtype`` the split;
    - ``folded_bytes``: tensors computed only from weights (a DequantizeLinear of a weight,
      a shape computation): a backend folds them into constants, so they are not planned
      as activations;
    - ``kv_cache_bytes``: the ``past_*`` inputs (the cache the runtime keeps between steps),
      ``kv_output_bytes`` the ``present_*`` outputs (what the step writes into it); both
      are left out of the plan, as the runtime owns those buffers;
    - ``input_bytes`` / ``output_bytes``: the other graph inputs and outputs (in the plan).
    """

    graph: str
    path: str
    plan: MemoryPlan
    weight_bytes: int
    weight_bytes_fp32: int
    weight_bytes_by_dtype: dict[str, int]
    folded_bytes: int
    kv_cache_bytes: int
    kv_output_bytes: int
    input_bytes: int
    output_bytes: int
    nodes: int
    source: str = "estimated"
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph, "path": self.path, "plan": self.plan.to_dict(),
            "weight_bytes": self.weight_bytes, "weight_bytes_fp32": self.weight_bytes_fp32,
            "weight_bytes_by_dtype": dict(self.weight_bytes_by_dtype),
            "folded_bytes": self.folded_bytes, "kv_cache_bytes": self.kv_cache_bytes,
            "kv_output_bytes": self.kv_output_bytes, "input_bytes": self.input_bytes,
            "output_bytes": self.output_bytes, "nodes": self.nodes, "source": self.source,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GraphMemory:
        return cls(
            graph=str(d["graph"]), path=str(d["path"]), plan=MemoryPlan.from_dict(d["plan"]),
            weight_bytes=int(d["weight_bytes"]), weight_bytes_fp32=int(d["weight_bytes_fp32"]),
            weight_bytes_by_dtype={str(k): int(v)
                                   for k, v in d.get("weight_bytes_by_dtype", {}).items()},
            folded_bytes=int(d.get("folded_bytes", 0)),
            kv_cache_bytes=int(d["kv_cache_bytes"]), kv_output_bytes=int(d["kv_output_bytes"]),
            input_bytes=int(d["input_bytes"]), output_bytes=int(d["output_bytes"]),
            nodes=int(d["nodes"]), source=str(d.get("source", "estimated")),
            notes=[str(n) for n in d.get("notes", [])],
        )
