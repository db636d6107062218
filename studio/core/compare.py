"""Run comparison: this run against that one, setting by setting and metric by metric.

Pure functions over the run history (:class:`~studio.core.jobs.JobStore`): the services,
the CLI's ``studio compare``, the GUI and the report's "compared with the previous run"
section all call these.
"""

from __future__ import annotations

from typing import Any

from studio.core import figures
from studio.core.errors import StudioError
from studio.core.jobs import JobStore
from studio.core.metrics import Metric


def better_of(name: str, delta: float | None) -> bool | None:
    """Whether a change of ``name`` by ``delta`` is an improvement: the catalogue of figures
    says which way each figure is better (``None``: neither — more HTP ops after optimization
    can be the better graph); a figure not in it counts higher as better."""
    if not delta:
        return None
    fig = figures.get(name)
    way = fig.better if fig is not None else "higher"
    if not way:
        return None
    return (delta < 0) == (way == "lower")


def flatten(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"quantization": {"scheme": "W8A8"}}`` -> ``{"quantization.scheme": "W8A8"}``;
    the overrides table stays one value."""
    out: dict[str, Any] = {}
    for k, v in settings.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key != "quantization.overrides":
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def settings_diff(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The settings that differ between two runs' recorded project settings."""
    if not a or not b:
        return []
    fa, fb = flatten(a), flatten(b)
    return [
        {"key": k, "a": fa.get(k), "b": fb.get(k)}
        for k in sorted(set(fa) | set(fb))
        if fa.get(k) != fb.get(k)
    ]


def metric_key(m: Metric) -> tuple[str, str, str]:
    return (m.name, m.device, m.target)


def _metrics(store: JobStore, run_id: int) -> dict[tuple[str, str, str], Metric]:
    out: dict[tuple[str, str, str], Metric] = {}
    for m in store.metrics(run_id=run_id):
        out[metric_key(m)] = m  # a later job of the same run wins
    return out


def compare_runs(store: JobStore, run_a: int, run_b: int) -> dict[str, Any]:
    """Run ``run_b`` against ``run_a`` (the earlier one, usually): which settings differ,
    and every metric of either run with its value in both, the delta and the relative
    change. A metric in only one run has ``None`` on the other side."""
    ra, rb = store.run(run_a), store.run(run_b)
    if ra is None or rb is None:
        missing = run_a if ra is None else run_b
        raise StudioError(f"run {missing} is not in this project's history: see studio info")
    ma, mb = _metrics(store, run_a), _metrics(store, run_b)
    rows = []
    for key in sorted(set(ma) | set(mb), key=lambda k: (k[1], k[2], k[0])):
        a, b = ma.get(key), mb.get(key)
        ref = b or a
        assert ref is not None
        delta = rel = None
        if a is not None and b is not None:
            delta = b.value - a.value
            rel = delta / abs(a.value) if a.value else None
        better = better_of(key[0], delta)
        rows.append({
            "name": key[0], "device": key[1], "target": key[2], "unit": ref.unit,
            "source": ref.source, "a": None if a is None else a.value,
            "b": None if b is None else b.value, "delta": delta, "relative": rel,
            "better": better,
        })
    sa = (ra.get("config") or {}).get("settings")
    sb = (rb.get("config") or {}).get("settings")
    return {
        "run_a": {"id": run_a, "state": ra["state"], "created": ra["created"]},
        "run_b": {"id": run_b, "state": rb["state"], "created": rb["created"]},
        "settings_recorded": bool(sa and sb),
        "settings": settings_diff(sa, sb),
        "metrics": rows,
    }


def runs_with_results(store: JobStore, limit: int = 200, sweeps: bool = False) -> list[int]:
    """Ids of runs that recorded at least one metric, newest first; the points of sweeps
    only with ``sweeps`` (they are variants of the project, not its runs)."""
    rows = store._query(
        "SELECT DISTINCT j.run_id AS id FROM metrics m JOIN jobs j ON j.id = m.job_id "
        "ORDER BY j.run_id DESC LIMIT ?", (limit,))
    skip = set() if sweeps else store.sweep_run_ids()
    return [int(r["id"]) for r in rows if int(r["id"]) not in skip]


def previous_run(store: JobStore, run_id: int) -> int | None:
    """The newest run before ``run_id`` that has results."""
    return next((r for r in runs_with_results(store) if r < run_id), None)


def compare_with_previous(store: JobStore, run_id: int) -> dict[str, Any] | None:
    prev = previous_run(store, run_id)
    return None if prev is None else compare_runs(store, prev, run_id)
