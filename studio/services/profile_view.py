"""What the Profiler page and the CLI read from a profile job: the profile, its event table,
breakdowns by block / op type / layer with the spread over the profiled runs, the seed's
layer x block table, and the comparison of two profiles."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from studio.core.errors import StudioError
from studio.core.events import BLOCKS, EventTable
from studio.core.events import EventTable as _T
from studio.core.jobs import Job
from studio.core.profile import Profile, ProfileOp, layer_label
from studio.services import history

GROUPS = {"block": "Seed table (block)", "op_type": "Op type", "layer": "Layer"}


@dataclass
class ProfileData:
    """One profile job, ready to draw."""

    job: Job | None
    profile: Profile
    table: EventTable
    samples: np.ndarray  # ops x runs (the value of each op in each profiled run)
    title: str = ""

    @property
    def metric(self) -> str:
        return "cycles" if self.table.has("cycles") else "dur"

    @property
    def unit(self) -> str:
        return self.profile.unit

    @property
    def source(self) -> str:
        return self.profile.source

    @property
    def stats(self) -> dict:
        return self.profile.stats or {}

    def total(self) -> float:
        return float(self.table.value(self.metric).sum())


@dataclass
class GroupRow:
    name: str
    value: float  # median over runs of the group's total
    share: float
    count: int  # ops in the group
    low: float = float("nan")  # min over runs
    high: float = float("nan")  # max over runs
    extra: dict = field(default_factory=dict)


def from_profile(profile: Profile, table: EventTable | None = None, job: Job | None = None,
                 title: str = "") -> ProfileData:
    if table is None:
        table = profile.table
    if table is None:
        metric = "cycles" if profile.unit == "cycles" else "dur"
        table = _T.from_rows(
            [{"op": op.qnn_name, "op_type": op.op_type, "onnx_node": op.onnx_node or "",
              "layer": op.layer if op.layer is not None else -1, metric: op.value}
             for op in profile.ops],
            time_unit=profile.unit if metric == "dur" else "us",
        )
    runs = max((len(op.samples) for op in profile.ops), default=0)
    samples = np.full((len(profile.ops), max(runs, 1)), np.nan)
    for i, op in enumerate(profile.ops):
        vals = op.samples or (op.value,)
        samples[i, : len(vals)] = vals
    if len(profile.ops) != len(table):  # an imported table with its own rows
        samples = table.value("cycles" if table.has("cycles") else "dur")[:, None]
    return ProfileData(job, profile, table, samples, title)


def load(studio, job: Job) -> ProfileData:
    """The stored profile of a profile job (``profile.json`` + ``events.npz``)."""
    folder = history.artifact_dir(studio, job)
    if folder is None or not (folder / "profile.json").exists():
        return from_result(job)
    return load_folder(folder, job)


def from_result(job: Job) -> ProfileData:
    """The summary a profile job left in the run history (its totals by block or op type),
    for when the stored profile is gone."""
    res = job.result or {}
    by = "block" if res.get("by_block") else "op_type"
    totals = res.get("by_block") or res.get("by_op_type") or {}
    if not totals:
        raise StudioError(
            f"the profile of job #{job.id} is no longer stored; run the profile stage again"
        )
    unit = str(res.get("unit", "cycles"))
    metric = "cycles" if unit == "cycles" else "dur"
    ops = [ProfileOp(qnn_name=name, op_type=name if by == "op_type" else "", value=float(v),
                     unit=unit) for name, v in totals.items()]
    table = EventTable.from_rows([{"op": name, by: name, metric: float(v)}
                                  for name, v in totals.items()],
                                 time_unit=unit if metric == "dur" else "us")
    prof = Profile(source=str(res.get("source", "simulated")), ops=ops, unit=unit,
                   stats=dict(res.get("stats") or {}),
                   note="the stored profile is gone: totals from the run history")
    return from_profile(prof, table, job, f"job #{job.id} · {job.target}")


#: the graphs a profile stage's folder holds a profile of: the decode step, and a
#: vision-language model's vision encoder (one image)
PROFILED_GRAPHS = {"decode": "", "vision": "encoder_"}


def load_folder(folder: Path, job: Job | None = None, graph: str = "decode") -> ProfileData:
    if graph not in PROFILED_GRAPHS:
        raise StudioError(f"a profile holds the graphs {', '.join(PROFILED_GRAPHS)}, not "
                          f"{graph!r}")
    stem = PROFILED_GRAPHS[graph]
    path = folder / f"{stem}profile.json"
    if graph != "decode" and not path.is_file():
        raise StudioError(f"this profile has no {graph} graph: only a vision-language model's "
                          "profile holds its vision encoder's")
    try:
        prof = Profile.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise StudioError(f"{path} is damaged ({e}); profile again") from None
    events = folder / f"{stem}events.npz"
    table = EventTable.load(events) if events.exists() else None
    title = f"job #{job.id} · {job.target}" if job is not None else folder.name
    if graph != "decode":
        title += f" · {graph} encoder"
    return from_profile(prof, table, job, title)


def breakdown(data: ProfileData, by: str = "block") -> list[GroupRow]:
    """The profile grouped ``by`` block / op_type / layer: the median over runs of each
    group's total, its share, op count and the min / max over runs. Blocks follow the seed's
    table order; op types largest first; layers in order."""
    t = data.table
    if by not in ("block", "op_type", "layer"):
        raise StudioError(f"cannot group a profile by {by!r}; use block, op_type or layer")
    if by == "layer":
        keys = t.num["layer"]
        names = [layer_label(int(k) if k >= 0 else None) for k in keys]
    else:
        names = list(t[by])
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        groups.setdefault(n or "(unknown)", []).append(i)
    per_run = {g: np.nansum(data.samples[idx], axis=0) for g, idx in groups.items()}
    values = {g: float(np.median(v)) for g, v in per_run.items()}
    total = sum(values.values()) or 1.0
    rows = [GroupRow(g, values[g], values[g] / total, len(idx), float(per_run[g].min()),
                     float(per_run[g].max()), _extras(t, idx))
            for g, idx in groups.items()]
    if by == "block":
        order = {b: i for i, b in enumerate(BLOCKS)}
        rows.sort(key=lambda r: order.get(r.name, len(order)))
    elif by == "layer":
        rows.sort(key=lambda r: (r.name == "outside layers", _layer_num(r.name)))
    else:
        rows.sort(key=lambda r: -r.value)
    return rows


def _extras(t: EventTable, idx: list[int]) -> dict:
    out = {}
    for col in ("macs", "dram_read", "dram_write"):
        if t.has(col):
            out[col] = float(t.value(col)[idx].sum())
    return out


def _layer_num(name: str) -> int:
    try:
        return int(name.rsplit(" ", 1)[-1])
    except ValueError:
        return 1 << 30


def layer_block_table(data: ProfileData) -> tuple[list[str], list[str], np.ndarray]:
    """The seed's table: one row per layer, one column per block, values = share of the
    step's total (rows: layers in order, then 'outside layers')."""
    t = data.table
    vals = t.value(data.metric)
    total = vals.sum() or 1.0
    layers = sorted({int(x) for x in t.num["layer"]}, key=lambda k: (k < 0, k))
    present = set(t["block"])
    blocks = [b for b in BLOCKS if b in present]
    m = np.zeros((len(layers), len(blocks)))
    lidx = {k: i for i, k in enumerate(layers)}
    bidx = {b: j for j, b in enumerate(blocks)}
    for v, k, b in zip(vals, t.num["layer"], t["block"], strict=True):
        if b in bidx:
            m[lidx[int(k)], bidx[b]] += v / total
    return [layer_label(k if k >= 0 else None) for k in layers], blocks, m


@dataclass
class CompareRow:
    name: str
    a: float
    b: float
    share_a: float
    share_b: float

    @property
    def delta(self) -> float:
        return self.b - self.a

    @property
    def ratio(self) -> float | None:
        return self.b / self.a if self.a else None


def compare(a: ProfileData, b: ProfileData, by: str = "block") -> list[CompareRow]:
    """Group both profiles ``by`` and line the groups up (A's order, then B's new ones)."""
    ra = {r.name: r for r in breakdown(a, by)}
    rb = {r.name: r for r in breakdown(b, by)}
    names = list(ra) + [n for n in rb if n not in ra]
    return [CompareRow(n, ra[n].value if n in ra else 0.0, rb[n].value if n in rb else 0.0,
                       ra[n].share if n in ra else 0.0, rb[n].share if n in rb else 0.0)
            for n in names]


def comparable_jobs(studio, limit: int = 40) -> list[Job]:
    """Succeeded profile jobs of this project, newest first (other runs, chips, recipes)."""
    jobs = [j for j in studio.jobs.jobs()
            if history.plays_role(j, "profile") and j.state == "succeeded"]
    jobs.sort(key=lambda j: -j.id)
    return [j for j in jobs if history.artifact_dir(studio, j) is not None][:limit]


def job_graphs(studio, job: Job | None) -> dict[str, dict[str, Path]]:
    """The ONNX graphs a profile job profiled: ``{"quantize": {"prefill": path, "decode":
    path}, "export": {...}}`` from its artifact's recorded inputs (empty when gone)."""
    out: dict[str, dict[str, Path]] = {}
    if job is None or not job.artifact_key:
        return out
    art = studio.store.get(job.artifact_key)
    key = (art.meta.get("inputs") or {}).get("quantize") if art is not None else None
    for stage in ("quantize", "export"):
        up = studio.store.get(key) if key else None
        if up is None:
            break
        files = {g: up.path / f"{g}.onnx" for g in ("prefill", "decode")}
        out[stage] = {g: f for g, f in files.items() if f.is_file()}
        key = (up.meta.get("inputs") or {}).get("export")
    return out


def compiler_bytes_by_layer(data: ProfileData) -> dict:
    """DRAM bytes (read + written) per layer (None: outside the layers) when the profile
    carries the compiler's own traffic (an optrace profile), else {}."""
    if data.stats.get("bytes_source") != "compiler (optrace)":
        return {}
    t = data.table
    moved = t.value("dram_read") + t.value("dram_write")
    out: dict = {}
    for layer, b in zip(t.num["layer"], moved, strict=True):
        key = int(layer) if layer >= 0 else None
        out[key] = out.get(key, 0.0) + float(b)
    return out


def host_timeline(studio, job: Job | None) -> EventTable | None:
    """The measured host-CPU timeline the profile stage recorded (host_events.npz)."""
    folder = history.artifact_dir(studio, job) if job is not None else None
    if folder is None or not (folder / "host_events.npz").exists():
        return None
    return EventTable.load(folder / "host_events.npz")
