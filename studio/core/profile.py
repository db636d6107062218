"""The profile model: per-op rows of one profiled graph, with where the numbers come from.

Pure dataclasses (no heavy imports). Every :class:`Profile` carries a ``source`` label from
the product's honesty-of-numbers rule:

- ``measured``  on a named device (host CPU, a remote Snapdragon, adb);
- ``simulated`` the QNN HTP simulator on x86: real kernels, but its cycles and times follow
  the host CPU, so they are **not** device latency;
- ``estimated`` the studio's performance model for a named SoC;
- ``imported``  read from a file the user brought.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from statistics import median
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from studio.core.events import EventTable

SOURCES = ("measured", "simulated", "estimated", "imported")

SOURCE_NOTES = {
    "measured": "measured on the named device",
    "simulated": (
        "QNN HTP simulator on x86: real HTP kernels, but cycles and times follow the host CPU "
        "(the same for every chip, and they swing with host load: read the spread and load "
        "shown with them); shares of the total are steadier; not device latency"
    ),
    "estimated": "the studio's performance model for the named SoC",
    "imported": "read from a file the user brought",
}

# '/model/layers.3/self_attn/q_proj/MatMul' -> 3, 'model.layers.3.mlp' -> 3,
# '/transformer/h.11/attn/...' -> 11, '/blocks.2/...' -> 2
_LAYER_RE = re.compile(r"(?:^|[/._])(?:layers|layer|h|blocks|block)[._](\d+)(?=$|[/._:])")


def layer_of(name: str | None) -> int | None:
    """The transformer layer index a node name belongs to, or None (embedding, head, I/O)."""
    if not name:
        return None
    m = _LAYER_RE.search(name)
    return int(m.group(1)) if m else None


def layer_label(layer: int | None) -> str:
    return f"layer {layer}" if layer is not None else "outside layers"


@dataclass(frozen=True)
class ProfileOp:
    """One op of the profiled graph.

    ``value`` is the mean over ``samples`` (one per profiled run), in ``unit``
    ("cycles" or "us"). ``qnn_name`` is the backend's op name; ``onnx_node`` the ONNX node
    it comes from (the main one when several ONNX nodes were fused into it, all of them in
    ``onnx_nodes``).
    """

    qnn_name: str
    op_type: str
    value: float
    unit: str
    onnx_node: str | None = None
    onnx_nodes: tuple[str, ...] = ()
    layer: int | None = None
    op_id: int | None = None
    qnn_op_type: str | None = None
    samples: tuple[float, ...] = ()


@dataclass(frozen=True)
class ProfileEvent:
    """A graph-level row (finalize time, execute time, accelerator cycles ...)."""

    name: str
    value: float
    unit: str
    kind: str = ""  # FINALIZE, EXECUTE, BACKEND, ...
    level: str = ""  # ROOT or SUB-EVENT
    samples: tuple[float, ...] = ()


@dataclass
class Profile:
    source: str
    ops: list[ProfileOp] = field(default_factory=list)
    events: list[ProfileEvent] = field(default_factory=list)
    unit: str = "cycles"
    runs: int = 0
    level: str = ""  # basic / detailed / optrace when known
    target: dict = field(
        default_factory=dict
    )  # e.g. {"htp_arch": 75, "soc_model": 57, "chip": key}
    origin: str = ""  # the file it was read from
    note: str = ""
    device: str = ""  # the device id it was profiled on ("" for imported files)
    stats: dict = field(default_factory=dict)  # repeat statistics, see repeat_stats()
    # the events, columnar; stored beside the JSON (events.npz), not in it
    table: EventTable | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"profile source must be one of {SOURCES}, not {self.source!r}")
        if not self.note:
            self.note = SOURCE_NOTES[self.source]

    # ---- totals -------------------------------------------------------------------------
    def total(self) -> float:
        return float(sum(op.value for op in self.ops))

    def totals_by_op_type(self) -> dict[str, float]:
        """Sum of op values per op type, largest first."""
        return _sorted_totals((op.op_type, op.value) for op in self.ops)

    def totals_by_layer(self) -> dict[int | None, float]:
        """Sum of op values per transformer layer, in layer order; None (outside layers) last."""
        acc: dict[int | None, float] = {}
        for op in self.ops:
            acc[op.layer] = acc.get(op.layer, 0.0) + op.value
        keys = sorted(k for k in acc if k is not None) + ([None] if None in acc else [])
        return {k: acc[k] for k in keys}

    def counts_by_op_type(self) -> dict[str, int]:
        acc: dict[str, int] = {}
        for op in self.ops:
            acc[op.op_type] = acc.get(op.op_type, 0) + 1
        return acc

    def top(self, n: int = 10) -> list[ProfileOp]:
        return sorted(self.ops, key=lambda op: op.value, reverse=True)[:n]

    def event(self, name: str) -> ProfileEvent | None:
        for ev in self.events:
            if ev.name == name:
                return ev
        return None

    # ---- (de)serialization --------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "table"}
        d["ops"] = [asdict(op) for op in self.ops]
        d["events"] = [asdict(ev) for ev in self.events]
        d["stats"] = dict(self.stats)
        d["target"] = dict(self.target)
        for op in d["ops"]:
            op["onnx_nodes"] = list(op["onnx_nodes"])
            op["samples"] = list(op["samples"])
        for ev in d["events"]:
            ev["samples"] = list(ev["samples"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Profile:
        ops = [
            ProfileOp(
                **{
                    **o,
                    "onnx_nodes": tuple(o.get("onnx_nodes", ())),
                    "samples": tuple(o.get("samples", ())),
                }
            )
            for o in d.get("ops", [])
        ]
        events = [
            ProfileEvent(**{**e, "samples": tuple(e.get("samples", ()))})
            for e in d.get("events", [])
        ]
        known = {f.name for f in fields(cls)} - {"ops", "events", "table"}
        rest = {k: v for k, v in d.items() if k in known}
        return cls(ops=ops, events=events, **rest)


# A figure is called unreliable when the runs spread more than this around their median
# (median absolute deviation / median: one odd run does not count, a busy host does) ...
SPREAD_LIMIT = 0.10
# ... or when other processes kept more than this share of the host's CPUs busy.
LOAD_LIMIT = 0.25


def repeat_stats(totals: list[float], other_load: list[float], unit: str = "") -> dict:
    """Statistics of one figure profiled several times on the simulator.

    ``totals`` holds the figure of each run; ``other_load`` the share of the host's CPU time
    (0..1) other processes used during each run. Returns median, min, max, the spread
    (median absolute deviation / median), the range ((max - min) / median), the median load,
    ``reliable`` and the warnings to show.
    """
    if not totals:
        return {"runs": 0, "reliable": False, "warnings": ["no profiled runs"]}
    med = float(median(totals))
    mad = float(median(abs(t - med) for t in totals))
    spread = mad / med if med > 0 else 0.0
    rng = (max(totals) - min(totals)) / med if med > 0 else 0.0
    load = float(median(other_load)) if other_load else None
    warnings = []
    if len(totals) < 3:
        warnings.append(f"only {len(totals)} run(s): profile at least 3 to see the spread")
    if spread > SPREAD_LIMIT:
        warnings.append(
            f"runs deviate {spread:.0%} from their median (limit {SPREAD_LIMIT:.0%}; range "
            f"{rng:.0%}): the host was busy or noisy; compare shares, not totals, or profile "
            "again on a quiet host"
        )
    if load is not None and load > LOAD_LIMIT:
        warnings.append(
            f"other processes used {load:.0%} of the host CPUs while profiling (limit "
            f"{LOAD_LIMIT:.0%}): simulated cycles grow with host load; profile again when "
            "the host is idle"
        )
    return {
        "runs": len(totals), "unit": unit, "median": med, "min": float(min(totals)),
        "max": float(max(totals)), "spread": spread, "range": rng, "totals": [float(t) for t in totals],
        "other_load": [float(x) for x in other_load], "median_other_load": load,
        "reliable": not warnings, "warnings": warnings,
    }


def _sorted_totals(pairs: Iterable[tuple[str, float]]) -> dict[str, float]:
    acc: dict[str, float] = {}
    for k, v in pairs:
        acc[k] = acc.get(k, 0.0) + v
    return dict(sorted(acc.items(), key=lambda kv: kv[1], reverse=True))
