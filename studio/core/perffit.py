"""The performance model's fit: the published device speeds it is fitted to
(``resources/perf/anchors.toml``), the ones held out from the fit (``heldout.toml``) and the
deterministic grid search (:func:`calibrate`) whose result ships in
``resources/perf/model.toml`` (:func:`fit_toml`; :func:`studio.core.perfmodel.load_fit` reads
it). Pure Python + numpy; every figure is ``estimated``."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.archs import Arch, Scheme, get_scheme, load_arch
from studio.core.catalog import get_chip, load_catalog
from studio.core.errors import StudioError
from studio.core.perfmodel import (
    ANCHORS_PATH,
    MODEL_VERSION,
    SOURCE,
    ChipPerf,
    Efficiency,
    estimate,
    estimate_ops,
    load_fit,
    transformer_ops,
)
from studio.core.resources import resources_dir


@dataclass(frozen=True)
class Anchor:
    model: str
    config: str
    scheme: str
    chip: str
    context: int
    decode_tokens_per_s: float
    source: str
    prefill_tokens_per_s: float | None = None
    prompt_tokens: int | None = None


def load_anchors(path: str | Path | None = None) -> list[Anchor]:
    return _load_rows(Path(path) if path is not None else ANCHORS_PATH, "anchor", "anchor",
                      Anchor)


def _load_rows(p: Path, table: str, what: str, row_type: Any) -> list[Any]:
    """The ``[[table]]`` rows of the TOML file ``p`` as ``row_type`` records, each with its
    source; a missing, malformed or unsourced file is one line naming it."""
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StudioError(f"{what} table {p} not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise StudioError(f"{what} table {p} is not valid TOML ({e}); fix the file") from None
    rows = data.get(table)
    if not isinstance(rows, list) or not rows:
        raise StudioError(f"{what} table {p} has no [[{table}]] rows; fix the file")
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(row_type(**row))
        except TypeError as e:
            raise StudioError(f"{what} table {p}: row {i + 1} is malformed ({e})") from None
        if not out[-1].source:
            raise StudioError(f"{what} table {p}: row {i + 1} has no source")
    return out


HELDOUT_PATH = resources_dir() / "perf" / "heldout.toml"


@dataclass(frozen=True)
class Published:
    """One published decode speed held out from the fit (``resources/perf/heldout.toml``)."""

    model: str
    config: str  # "" where the architecture's sizes are not public
    scheme: str
    chip: str  # a catalog key, or the device as published
    context: int
    decode_tokens_per_s: float
    runtime: str
    dates: str
    doubt: str
    source: str


def load_heldout(path: str | Path | None = None) -> list[Published]:
    return _load_rows(Path(path) if path is not None else HELDOUT_PATH, "published",
                      "held-out", Published)


def heldout_report(rows: Sequence[Published] | None = None,
                   eff: Efficiency | None = None) -> dict[str, Any]:
    """The model against the published speeds it was not fitted to: each row's estimate and
    error (estimated / published - 1), the rows it cannot estimate (a chip the catalog lacks,
    sizes not public) with the reason, and the median absolute errors overall, per chip, per
    runtime and per model size — without the doubtful rows, and with them."""
    rows = list(rows) if rows is not None else load_heldout()
    if eff is None:
        eff = load_fit()[0]
    catalog = load_catalog()
    done: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for r in rows:
        try:
            if not r.config:
                raise StudioError("the architecture's sizes are not public")
            if r.chip not in catalog:
                raise StudioError("the chip catalog has no such chip")
            arch = load_arch(r.config)
            est = estimate(arch, catalog[r.chip], r.scheme, int(r.context), eff=eff)
        except StudioError as e:
            skipped.append({**asdict(r), "reason": e.message})
            continue
        done.append({**asdict(r), "params_b": round(arch.params / 1e9, 2),
                     "estimated_decode_tokens_per_s": round(est.decode_tokens_per_s, 3),
                     "error": round(est.decode_tokens_per_s / r.decode_tokens_per_s - 1, 4)})

    def summary(sel: list[dict[str, Any]]) -> dict[str, Any]:
        errs = [d["error"] for d in sel]
        return {"rows": len(errs),
                "mdape": round(100 * float(np.median(np.abs(errs))), 2) if errs else None,
                "median_error": round(100 * float(np.median(errs)), 2) if errs else None}

    clean = [d for d in done if not d["doubt"]]

    def by(key) -> dict[str, Any]:
        groups: dict[str, list[dict[str, Any]]] = {}
        for d in clean:
            groups.setdefault(key(d), []).append(d)
        return {k: summary(v) for k, v in sorted(groups.items())}

    def size(d: dict[str, Any]) -> str:
        b = d["params_b"]
        return "< 2 B" if b < 2 else "2-5 B" if b < 5 else ">= 5 B"

    return {"source": SOURCE, "model_version": MODEL_VERSION, "rows": done, "skipped": skipped,
            "clean": summary(clean), "all": summary(done), "by_chip": by(lambda d: d["chip"]),
            "by_runtime": by(lambda d: d["runtime"]), "by_size": by(size)}


BW_GRID = np.round(np.arange(0.30, 1.0000001, 0.01), 2)
OVERHEAD_GRID = np.round(np.arange(0.0, 30.0000001, 0.2), 1)
FLOAT_GRID = np.round(np.geomspace(0.0005, 0.05, 81), 6)
COMPUTE_GRID = np.round(np.arange(0.010, 1.0000001, 0.005), 3)
_START = Efficiency(0.8, 0.0, 0.25, 0.005)


def _ape(pred: float, pub: float) -> float:
    return abs(pred - pub) / pub * 100


def _median(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return float(np.median(xs)) if xs else None


@dataclass
class _Prepared:
    anchor: Anchor
    arch: Arch
    perf: ChipPerf
    scheme: Scheme

    def decode_times(self, cf: float) -> np.ndarray:
        """Decode seconds per token (no overhead) on the grids: (bw,) or (bw, float fraction).

        The decode graph is a chain, so its schedule is the sum of its ops on any number of
        cores; this is :func:`estimate_ops` vectorised over the grids.
        """
        g = transformer_ops(self.arch, self.scheme, 1, self.anchor.context)
        assert np.array_equal(g.edges[:, 1] - g.edges[:, 0], np.ones(len(g) - 1))
        c1 = 2 * g.macs / (self.perf.htp_tops * 1e12 / self.perf.htp_cores)
        m1 = g.dram_bytes / (self.perf.ddr_gbps * 1e9)
        mem = m1[:, None] / BW_GRID[None, :]  # (ops, bw)
        if not self.scheme.float_acts:
            return np.maximum(c1[:, None] / cf, mem).sum(axis=0)
        comp = c1[:, None] / FLOAT_GRID[None, :]  # (ops, ff)
        return np.maximum(comp[:, None, :], mem[:, :, None]).sum(axis=0)


def _fit_decode(times: list[np.ndarray], published: np.ndarray, rows: Iterable[int],
                default_ff: float) -> tuple[float, float, float]:
    """(bw_fraction, overhead_ms, float_decode_fraction) minimising the mean |log error|."""
    rows = list(rows)
    oh = OVERHEAD_GRID[None, :, None] / 1000
    err = np.zeros((len(BW_GRID), len(OVERHEAD_GRID), len(FLOAT_GRID)))
    any_float = False
    for i in rows:
        t = times[i]
        if t.ndim == 1:
            t = t[:, None, None]
        else:
            any_float = True
            t = t[:, None, :]
        err += np.abs(np.log(published[i] * (t + oh)))
    if not any_float:  # the float fraction is free: keep the default
        err = err[:, :, :1]
    b, o, f = np.unravel_index(int(np.argmin(err)), err.shape)
    ff = float(FLOAT_GRID[f]) if any_float else default_ff
    return float(BW_GRID[b]), float(OVERHEAD_GRID[o]), ff


def _predict(times: np.ndarray, bw: float, oh: float, ff: float) -> float:
    b = int(np.argmin(np.abs(BW_GRID - bw)))
    t = times[b] if times.ndim == 1 else times[b, int(np.argmin(np.abs(FLOAT_GRID - ff)))]
    return 1.0 / (float(t) + oh / 1000)


def calibrate(anchors: Sequence[Anchor] | None = None,
              catalog_path: str | Path | None = None) -> dict[str, Any]:
    """Fit the efficiency parameters to the anchors; median and leave-one-out errors.

    A deterministic grid search, minimising the mean |log(estimated / published)|:
    ``compute_fraction`` on the prefill anchors; then ``bw_fraction``, ``overhead_ms`` and
    ``float_decode_fraction`` jointly on the decode anchors; then both once more. The
    leave-one-out figure refits the decode parameters without each anchor and predicts it.
    """
    anchors = list(anchors) if anchors is not None else load_anchors()
    prepared, skipped = _prepare(anchors, catalog_path)
    if len(prepared) < 3:
        raise StudioError("fewer than 3 anchors can be estimated; cannot calibrate")
    published = np.array([p.anchor.decode_tokens_per_s for p in prepared])
    pre_rows = [i for i, p in enumerate(prepared) if p.anchor.prefill_tokens_per_s]
    every = range(len(prepared))
    eff = _START
    for _ in range(2):
        cf = _fit_compute(prepared, pre_rows, eff)
        times = [p.decode_times(cf) for p in prepared]
        bw, oh, ff = _fit_decode(times, published, every, _START.float_decode_fraction)
        eff = Efficiency(bw, oh, cf, ff)
    rows = []
    for i, p in enumerate(prepared):
        loo = _predict(times[i], *_fit_decode(times, published, (k for k in every if k != i),
                                              _START.float_decode_fraction))
        rows.append(_anchor_row(p, times[i], eff, loo))
    prefill_apes = [r["prefill_ape"] for r in rows if "prefill_ape" in r]
    return {
        "source": SOURCE,
        "model_version": MODEL_VERSION,
        "params": asdict(eff),
        "anchors_used": len(prepared),
        "decode_mdape": round(_median(r["ape"] for r in rows) or 0.0, 2),
        "decode_loo_mdape": round(_median(r["loo_ape"] for r in rows) or 0.0, 2),
        "prefill_mdape": round(m, 2) if (m := _median(prefill_apes)) is not None else None,
        "prefill_anchors": len(prefill_apes),
        "rows": rows,
        "skipped": skipped,
    }


def _prepare(anchors: list[Anchor], catalog_path: str | Path | None
             ) -> tuple[list[_Prepared], list[dict[str, Any]]]:
    """The anchors that can be estimated (their chip, architecture and scheme read), and
    those that cannot, each with its reason."""
    catalog = load_catalog(catalog_path)
    prepared: list[_Prepared] = []
    skipped: list[dict[str, Any]] = []
    for a in anchors:
        try:
            chip = catalog.get(a.chip) or get_chip(a.chip, catalog_path)
            prepared.append(_Prepared(a, load_arch(a.config), ChipPerf.of(chip),
                                      get_scheme(a.scheme)))
        except StudioError as e:
            skipped.append({**asdict(a), "reason": e.message})
    return prepared, skipped


def _prompt_of(p: _Prepared) -> int:
    return p.anchor.prompt_tokens or min(p.anchor.context, 1024)


def _fit_compute(prepared: list[_Prepared], pre_rows: list[int], eff: Efficiency) -> float:
    """``compute_fraction`` on the grid that best fits the prefill anchors (``eff``'s as it
    is without one)."""
    if not pre_rows:
        return eff.compute_fraction
    errs = np.zeros(len(COMPUTE_GRID))
    for i in pre_rows:
        p = prepared[i]
        published_prefill = float(p.anchor.prefill_tokens_per_s or 0.0)
        g = transformer_ops(p.arch, p.scheme, _prompt_of(p), p.anchor.context, prefill=True)
        for j, cf in enumerate(COMPUTE_GRID):
            e = Efficiency(eff.bw_fraction, eff.overhead_ms, float(cf),
                           eff.float_decode_fraction)
            t = estimate_ops(g, p.perf, e, e.compute_for(p.scheme, prefill=True)).total_s
            errs[j] += abs(math.log(_prompt_of(p) / t / published_prefill))
    return float(COMPUTE_GRID[int(np.argmin(errs))])


def _anchor_row(p: _Prepared, times, eff: Efficiency, loo: float) -> dict[str, Any]:
    """An anchor's row: its estimate with the fitted parameters and left out of the fit,
    their errors, what bounds its decode, and its prefill estimate."""
    pred = _predict(times, eff.bw_fraction, eff.overhead_ms, eff.float_decode_fraction)
    row: dict[str, Any] = {
        **asdict(p.anchor),
        "estimated_decode_tokens_per_s": round(pred, 3),
        "ape": round(_ape(pred, p.anchor.decode_tokens_per_s), 2),
        "loo_estimated_decode_tokens_per_s": round(loo, 3),
        "loo_ape": round(_ape(loo, p.anchor.decode_tokens_per_s), 2),
    }
    est = estimate(p.arch, p.perf, p.scheme, p.anchor.context, _prompt_of(p), eff)
    row["bound"] = est.decode.bound
    if p.anchor.prefill_tokens_per_s:
        row["estimated_prefill_tokens_per_s"] = round(est.prefill_tokens_per_s, 3)
        row["prefill_ape"] = round(_ape(est.prefill_tokens_per_s,
                                        p.anchor.prefill_tokens_per_s), 2)
    return row


def fit_toml(cal: Mapping[str, Any]) -> str:
    """The shipped fit file's text for a :func:`calibrate` result."""
    p = cal["params"]
    lines = [
        "# Fitted efficiency parameters of the performance model (studio/core/perfmodel.py).",
        "# Written by `studio estimate --calibration --write-fit` from studio/resources/perf/anchors.toml;",
        "# tests/core/test_perfmodel.py recomputes the fit and checks it equals this file.",
        "",
        f'model_version = "{cal["model_version"]}"',
        f"bw_fraction = {p['bw_fraction']!r}",
        f"overhead_ms = {p['overhead_ms']!r}",
        f"compute_fraction = {p['compute_fraction']!r}",
        f"float_decode_fraction = {p['float_decode_fraction']!r}",
        f"anchors_used = {cal['anchors_used']}",
        f"decode_mdape = {cal['decode_mdape']!r}",
        f"decode_loo_mdape = {cal['decode_loo_mdape']!r}",
    ]
    if cal.get("prefill_mdape") is not None:
        lines.append(f"prefill_mdape = {cal['prefill_mdape']!r}")
    return "\n".join(lines) + "\n"
