"""What the sensitivity stage and the auto-precision stage make of a
:class:`~studio.engine.sensitivity.VariantBench`: the ranking of every layer's and block's
raise and lower (:func:`analyze`), the top entries confirmed on the HTP simulator
(:func:`confirm_on_htp`) and the fewest raises that meet a target from the ranking
(:func:`auto_precision`). Figures are ``measured`` on the host CPU unless said otherwise."""

from __future__ import annotations

from typing import Any

from studio.core.devices import htp_simulator
from studio.core.errors import StudioError
from studio.core.progress import NullProgress, Progress, SubProgress
from studio.engine.sensitivity import (
    DEVICE,
    METRICS,
    SOURCE,
    VariantBench,
    rule_for,
    weights_only,
)


def _delta(variant: dict, base: dict) -> dict[str, float]:
    return {k: variant[k] - base[k] for k in METRICS}


def _rank_key(entry: dict, direction: str):
    """Most sensitive first: for raising, the largest drop of the KL divergence to FP32 (the
    perplexity gain breaks ties); for lowering, the largest rise."""
    d = entry[direction]["delta"]
    if direction == "raise":
        return (d["kl_divergence"], d["perplexity"])
    return (-d["kl_divergence"], -d["perplexity"])


def analyze(bench: VariantBench, high: str, low: str,
            progress: Progress = NullProgress()) -> dict[str, Any]:
    """Raise (and lower) each weighted layer, each key activation (attention scores, softmax
    output, residual stream) and each block, alone; everything else stays at the base scheme.
    A key activation has no weights: it is lowered only when ``low`` is an activation
    precision (INT8). Returns what ``sensitivity.json`` holds."""
    units = ([("layer", name) for name in bench.layers] + [("block", b) for b in bench.blocks]
             + [("point", name) for name in bench.points])
    directions = [("raise", high)] + ([("lower", low)] if low else [])
    scheme = bench.recipe["scheme"]
    progress.update(0.0, "scoring the base")
    base = bench.evaluate({})
    # a key activation has no weights: not lowered to 4-bit weights, not raised to 8-bit ones
    jobs = [(kind, name, direction, prec) for direction, prec in directions
            for kind, name in units
            if not (kind == "point" and (prec == "INT4" or weights_only(scheme, prec)))]
    scored = {name for _, name, _, _ in jobs}
    units = [(kind, name) for kind, name in units if kind != "point" or name in scored]
    scores = bench.evaluate_many([{rule_for(name, prec, scheme): prec}
                                  for _, name, _, prec in jobs],
                                 SubProgress(progress, 0.02, 1.0))
    entries: dict[str, dict[str, dict]] = {"layer": {}, "block": {}, "point": {}}
    for kind, name in units:
        entries[kind][name] = {"name": name, "kind": kind}
        if kind == "layer":
            entries[kind][name]["weight_numel"] = bench.weight_of[name][1]
    for (kind, name, direction, prec), v in zip(jobs, scores, strict=True):
        entries[kind][name][direction] = {
            "precision": prec, **{k: v[k] for k in METRICS},
            "weight_bytes": v["weight_bytes"],
            "activation_bytes_per_token": v["activation_bytes_per_token"],
            "delta": _delta(v, base)}
    listed: dict[str, list[dict]] = {k: list(v.values()) for k, v in entries.items()}
    out: dict[str, Any] = {
        "graph": "prefill",
        "source": SOURCE, "device": DEVICE,
        "scheme": bench.recipe["scheme"], "weight_granularity": bench.recipe["weight_granularity"],
        "calibration_samples": bench.recipe["samples"],
        "high": high, "low": low,
        "heldout": {"tokens": sum(len(w) for w in bench.windows), "windows": len(bench.windows),
                    "window_tokens": int(bench.spec["prompt_length"]),
                    "ids": [t for w in bench.windows for t in w]},
        "fp32": bench.fp32,
        "base": base,
        "layers": listed["layer"],
        "blocks": listed["block"],
        "points": listed["point"],
        "ranking": {
            "raise": [e["name"] for e in sorted(listed["layer"], key=lambda e: _rank_key(e, "raise"))],
            "raise_blocks": [e["name"] for e in sorted(listed["block"],
                                                       key=lambda e: _rank_key(e, "raise"))],
            "raise_points": [e["name"] for e in sorted(listed["point"],
                                                       key=lambda e: _rank_key(e, "raise"))],
        },
        "variants": {"measured": len(jobs) + 1, "quantizer_runs": bench.quantized,
                     "spliced": bench.spliced, "patched": bench.patched},
    }
    if low:
        out["ranking"]["lower"] = [e["name"] for e in sorted(listed["layer"],
                                                             key=lambda e: _rank_key(e, "lower"))]
        out["ranking"]["lower_blocks"] = [e["name"] for e in sorted(
            listed["block"], key=lambda e: _rank_key(e, "lower"))]
        lowered = [e for e in listed["point"] if "lower" in e]
        if lowered:
            out["ranking"]["lower_points"] = [e["name"] for e in sorted(
                lowered, key=lambda e: _rank_key(e, "lower"))]
    progress.update(1.0, "sensitivity ranked")
    return out


def confirm_on_htp(bench: VariantBench, data: dict[str, Any], chip, top: int,
                   progress: Progress = NullProgress()) -> dict[str, Any]:
    """Score the base and the ``top`` entries of the raise ranking (layers and key
    activations together, by their host KL gain) on the HTP simulator of ``chip``: does
    what the host QDQ model says a raise buys hold on the HTP's own kernels? Figures are
    ``simulated`` (the simulator's numerics, not a device)."""
    units = {e["name"]: e for e in data["layers"] + data.get("points", [])}
    names = sorted(units, key=lambda n: units[n]["raise"]["delta"]["kl_divergence"])[:top]
    high = data["high"]

    sim = htp_simulator(chip.key)
    progress.update(0.0, f"the base on the {sim.name}")
    base = bench.score_on_htp({}, chip)
    rows = []
    for i, name in enumerate(names):
        progress.update((i + 1) / (len(names) + 1), f"{name} = {high} on the {sim.name}")
        got = bench.score_on_htp({rule_for(name, high, bench.recipe["scheme"]): high}, chip)
        host = units[name]["raise"]
        rows.append({"name": name, "precision": high, **got, "delta": _delta(got, base),
                     "host_delta": host["delta"]})
    agree = [r["delta"]["kl_divergence"] < 0 for r in rows]
    return {"source": sim.source, "device": sim.id, "chip": chip.key,
            "base": base, "entries": rows,
            "host_gain_confirmed": sum(agree), "tried": len(rows)}


# ---------------------------------------------------------------------------- auto precision


#: what auto precision can aim at
TARGET_METRICS = ("perplexity", "cosine", "top1")


def target_met(scores: dict, fp32: dict, metric: str, max_ppl_change: float,
               min_cosine: float, min_top1: float = 0.95) -> bool:
    """``perplexity``: within ``max_ppl_change`` (relative) of FP32's, either way (a quantized
    model that scores better than FP32 on a slice is off by chance, not better);
    ``cosine``: mean logits cosine against FP32 at least ``min_cosine``; ``top1``: the
    teacher-forced top-1 agreement with FP32 at least ``min_top1``."""
    if metric == "perplexity":
        return abs(scores["perplexity"] / fp32["perplexity"] - 1.0) <= max_ppl_change
    if metric == "top1":
        return scores["top1_agreement"] >= min_top1
    return scores["logits_cosine"] >= min_cosine


def _measured_where(chip) -> dict[str, str]:
    """The source and device of auto precision's figures: the host QDQ model, or a chip's
    HTP simulator."""
    if chip is None:
        return {"source": SOURCE, "device": DEVICE}

    sim = htp_simulator(chip.key)
    return {"source": sim.source, "device": sim.id}


def auto_precision(bench: VariantBench, ranking: list[str], high: str, metric: str,
                   max_ppl_change: float, min_cosine: float,
                   gains: dict[str, float] | None = None,
                   progress: Progress = NullProgress(), min_top1: float = 0.95,
                   chip=None) -> dict[str, Any]:
    """Raise layers to ``high`` in ``ranking`` order, one more per step, measuring each step,
    until the target holds; then drop every raised layer the target does not need (least
    sensitive first). ``gains`` (layer -> what raising it alone gained, larger is better)
    leaves out the layers that gained nothing. ``chip``: each step is measured on that
    chip's HTP simulator (figures ``simulated``), not on the host QDQ model — the host's
    rounding is not the HTP's (on the sample the host's W8A16 top-1 is 93 %, the
    simulator's 97.7 %), so a target the published numbers are judged by is checked where
    the graph runs. Returns the steps (the accuracy-vs-bytes curve) and the override
    rules."""
    if metric not in TARGET_METRICS:
        raise StudioError(f"autoprecision.metric = {metric!r}: use "
                          + ", ".join(TARGET_METRICS))
    unknown = [name for name in ranking if name not in bench.weight_of
               and name not in bench.points]
    if unknown:
        raise StudioError(
            f"the sensitivity ranking names {unknown[0]!r}, which is not a layer or key "
            "activation of this export: re-run the sensitivity stage"
        )
    search = _Search(bench, high, metric, max_ppl_change, min_cosine, min_top1, chip)
    if gains is not None:  # a layer whose raise alone measured no gain is not tried
        ranking = [name for name in ranking if gains.get(name, 0.0) > 0.0]
    steps = [search.row(0, [], search.measure({}), "base")]
    raised: list[str] = []
    n = len(ranking)
    while not steps[-1]["meets_target"] and len(raised) < n:
        progress.check()
        raised.append(ranking[len(raised)])
        progress.update(len(raised) / (n + 1), f"raising {len(raised)} layer(s): {raised[-1]}")
        steps.append(search.row(len(raised), raised, search.measure(search.rules_of(raised)),
                                f"raise {raised[-1]}"))
    met = steps[-1]["meets_target"]
    final = dict(steps[-1])
    pruned: list[dict] = []
    if met and len(raised) > 1:
        raised, final, pruned = search.prune(raised, final, progress)
    rules = search.rules_of([layer for layer in ranking if layer in raised])
    progress.update(1.0, "auto precision done")
    return {
        "graph": "prefill", **_measured_where(chip),
        "metric": metric,
        "target": ({"max_perplexity_change": max_ppl_change,
                    "perplexity_range": [bench.fp32["perplexity"] * (1 - max_ppl_change),
                                         bench.fp32["perplexity"] * (1 + max_ppl_change)]}
                   if metric == "perplexity" else {"min_top1_agreement": min_top1}
                   if metric == "top1" else {"min_logits_cosine": min_cosine}),
        "tried": list(ranking),
        "high": high, "scheme": bench.recipe["scheme"],
        "fp32": bench.fp32, "met": met,
        "raised": len(rules), "overrides": rules,
        "before": steps[0], "after": final,
        "steps": steps, "pruning": pruned,
        "variants": {"measured": len(steps) + len(pruned), "quantizer_runs": bench.quantized,
                     "spliced": bench.spliced, "patched": bench.patched},
    }


class _Search:
    """:func:`auto_precision`'s measure of a set of raised layers: their override rules,
    their figures (host QDQ, or a chip's HTP simulator), and whether they meet the target."""

    def __init__(self, bench: VariantBench, high: str, metric: str, max_ppl_change: float,
                 min_cosine: float, min_top1: float, chip) -> None:
        self.bench, self.high, self.metric, self.chip = bench, high, metric, chip
        self.max_ppl_change, self.min_cosine, self.min_top1 = (max_ppl_change, min_cosine,
                                                               min_top1)
        self.scheme = bench.recipe["scheme"]

    def ok(self, s: dict) -> bool:
        return target_met(s, self.bench.fp32, self.metric, self.max_ppl_change,
                          self.min_cosine, self.min_top1)

    def rules_of(self, layers: list[str]) -> dict[str, str]:
        return {rule_for(r, self.high, self.scheme): self.high for r in layers}

    def measure(self, rules: dict[str, str]) -> dict[str, Any]:
        if self.chip is None:
            return self.bench.evaluate(rules)
        return {**self.bench.score_on_htp(rules, self.chip), **self.bench.footprint(rules)}

    def row(self, step: int, raised: list[str], s: dict, action: str) -> dict:
        return {"step": step, "action": action, "raised": list(raised),
                **{k: s[k] for k in (*METRICS, "weight_bytes", "activation_bytes_per_token")},
                "meets_target": self.ok(s)}

    def prune(self, raised: list[str], final: dict, progress: Progress
              ) -> tuple[list[str], dict, list[dict]]:
        """Every raised layer but the last dropped in turn (least sensitive first) where the
        target holds without it: the layers kept, the final step, the trials."""
        pruned: list[dict] = []
        for layer in reversed(raised[:-1]):  # the last one raised was needed to get there
            progress.check()
            progress.update(0.9, f"is {layer} needed?")
            trial = [r for r in raised if r != layer]
            s = self.row(len(trial), trial, self.measure(self.rules_of(trial)), f"drop {layer}")
            pruned.append(s)
            if s["meets_target"]:
                raised, final = trial, s
        return raised, final, pruned
