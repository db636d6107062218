"""The sensitivity result of a project, as the Precision page's heat map reads it.

The ``sensitivity`` stage (:mod:`studio.engine.sensitivity`) writes ``sensitivity.json``:
every weighted layer and key activation raised (and lowered) alone over the base scheme,
scored against FP32 on the host CPU (and, with ``sensitivity.confirm_on_htp``, the top ones
again on a chip's HTP simulator). Its key covers the scheme, the weight granularity, the calibration and the
held-out text, not the overrides: editing per-layer precision keeps the result current.
"""

from __future__ import annotations

import json
from typing import Any

from studio.core.errors import StudioError
from studio.engine.sensitivity import raise_ranking, rule_for
from studio.services import history

STAGE = "sensitivity"
#: the figures a layer can be coloured by: (key of the ``delta``, title, unit, sign) where
#: ``sign`` turns the change into a gain (positive: raising the layer helps)
HEAT_METRICS: dict[str, tuple[str, str, str, float]] = {
    "kl_divergence": ("kl_divergence", "KL drop", "nats", -1.0),
    "perplexity": ("perplexity", "perplexity drop", "", -1.0),
    "logits_cosine": ("logits_cosine", "logits cosine gain", "", 1.0),
}
#: the least change the heat map paints in full colour, per figure: the colour scales to the
#: largest value or to this, whichever is larger — a model whose layers all move the KL by
#: 2e-5 nats stays pale instead of deep red (a relative scale reddens the largest of any set).
#: For scale: the sample's W4A16 graph is 0.011 nats from FP32, and raising one of its layers
#: at W8A8 moves the KL by up to about 5e-4 nats
HEAT_FLOOR: dict[str, float] = {"kl_divergence": 1e-4, "perplexity": 0.005,
                                "logits_cosine": 1e-5}
#: what each figure is, in a sentence
HEAT_HELP = {
    "kl_divergence": "how much the KL divergence of the logits to FP32 drops when the layer "
                     "alone is raised (nats; larger: more sensitive)",
    "perplexity": "how much the held-out perplexity drops when the layer alone is raised",
    "logits_cosine": "how much the logits cosine to FP32 rises when the layer alone is raised",
}
#: the settings the result depends on, for saying why an older result is stale
_KEYS = (("scheme", "quantization", "scheme"),
         ("weight_granularity", "quantization", "weight_granularity"),
         ("calibration_samples", "quantization", "calibration_samples"))


def how_to_run(project_path) -> str:
    """Where the user gets a sensitivity result (the empty state says it)."""
    return (f"Run ▸ Run Stage ▸ sensitivity (or on the command line: studio --batch "
            f"{project_path} --stages sensitivity)")


def sensitivity_result(project, jobs, store) -> dict[str, Any] | None:
    """The project's sensitivity result: ``{"data": sensitivity.json, "job": id, "run": id,
    "current": bool, "stale_because": str}``; the one for the current settings when stored,
    else the newest one in the run history (``current`` False, with why), else None.
    ``jobs`` / ``store``: the session's run history and artifact store. Hashes the input
    files: call it off the UI thread (with a copy of the project)."""
    try:
        key = history.current_keys(project, [STAGE]).get(STAGE)
    except StudioError:
        key = None
    job = None
    for j in jobs.jobs(limit=2000):  # newest first
        if j.stage == STAGE and j.state == "succeeded" and j.artifact_key:
            if key is not None and j.artifact_key == key:
                job = j
                break
            if job is None:
                job = j
    if job is None:
        return None
    art = store.get(job.artifact_key)
    if art is None or not (art.path / "sensitivity.json").is_file():
        return None
    folder = art.path
    try:
        data = json.loads((folder / "sensitivity.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    current = key is not None and job.artifact_key == key
    why = ""
    if not current:
        diffs = [f"{name} {data.get(name)!r} → {project_value!r}"
                 for name, section, k in _KEYS
                 if (project_value := getattr(project, section)[k]) != data.get(name)]
        why = ("computed for other settings: " + ", ".join(diffs)) if diffs else (
            "computed for other inputs (calibration or held-out text, or the studio's code)")
    return {"data": data, "job": job.id, "run": job.run_id, "current": current,
            "stale_because": why}


def entries(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The analysed layers and key activations (attention scores, softmax output, residual
    stream), each raised (and lowered) alone."""
    return list(data.get("layers", [])) + list(data.get("points", []))


def heat(data: dict[str, Any], metric: str = "kl_divergence") -> dict[str, float]:
    """Layer (or key activation) -> how much raising it alone improves ``metric`` over the
    base scheme (the heat map's value; larger: more sensitive)."""
    key, _, _, sign = HEAT_METRICS[metric]
    out = {}
    for e in entries(data):
        delta = (e.get("raise") or {}).get("delta") or {}
        if key in delta:
            out[e["name"]] = sign * float(delta[key])
    return out


def ranked(data: dict[str, Any], metric: str = "kl_divergence", top: int = 15
           ) -> list[tuple[str, float]]:
    """The ``top`` layers by :func:`heat`, most sensitive first."""
    values = heat(data, metric)
    names = sorted(values, key=lambda n: -values[n])
    return [(n, values[n]) for n in names[:top]]


def layer_figures(data: dict[str, Any], layer: str) -> dict[str, Any] | None:
    """One layer's entry (``raise`` / ``lower`` with precision, figures and deltas)."""
    return next((e for e in entries(data) if e.get("name") == layer), None)


def htp_figures(data: dict[str, Any], layer: str) -> dict[str, Any] | None:
    """The HTP simulator's figures for raising ``layer`` (``sensitivity.confirm_on_htp``),
    with the chip and device, when the stage scored it there."""
    htp = data.get("htp") or {}
    entry = next((e for e in htp.get("entries", []) if e.get("name") == layer), None)
    if entry is None:
        return None
    return {**entry, "source": htp.get("source", "simulated"), "device": htp.get("device", ""),
            "chip": htp.get("chip", "")}


def ladder(project, jobs, store, rungs: int) -> list[dict[str, Any]]:
    """The points of a precision ladder: rung 0 is the recipe as it is; rung k raises the k
    layers (or key activations) the current sensitivity result ranks first, to its ``high``
    precision, over the project's own overrides (over W4A16: their weights to INT8, as
    published W4A16 models keep a few layers at 8 bits). A sweep then measures every rung
    with the real stages — both graphs quantized with the recipe's rounding, compiled,
    validated on the target's HTP simulator over the held-out context — which the
    sensitivity slice (prefill windows, host QDQ, nearest rounding) only ranks. Layers whose raise alone gained nothing are left out.
    One line when there is no current result or nothing to raise."""
    if rungs < 1:
        raise StudioError(f"a ladder needs at least one rung, not {rungs}")
    found = sensitivity_result(project, jobs, store)
    run = f"studio --batch {project.path} --stages sensitivity"
    if found is None:
        raise StudioError(f"the project has no sensitivity result to build a ladder from: run "
                          f"{run} first")
    if not found["current"]:
        raise StudioError(f"the stored sensitivity result was {found['stale_because']}: run "
                          f"{run} again first")
    data = found["data"]
    ranking, gains = raise_ranking(data)
    ranking = [n for n in ranking if gains[n] > 0.0]
    if not ranking:
        raise StudioError(f"no layer gained from {data['high']} over {data['scheme']} in the "
                          "sensitivity result: there is nothing to raise")
    own = dict(project.quantization["overrides"])
    points = [{"quantization.overrides": own}]  # rung 0: the recipe as it is, to compare
    for k in range(1, min(rungs, len(ranking)) + 1):
        rules = {rule_for(n, data["high"], data["scheme"]): data["high"] for n in ranking[:k]}
        # the rung's rules last: the last matching pattern wins
        merged = {**{p: v for p, v in own.items() if p not in rules}, **rules}
        points.append({"quantization.overrides": merged})
    return points
