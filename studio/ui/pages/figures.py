"""How the run pages write figures: titles, values at a precision that shows a recipe change
(a logits cosine of 0.99998 is not "1"), deltas, and run labels."""

from __future__ import annotations

import time

from studio.core import figures
from studio.core.units import signed


def metric_title(name: str) -> str:
    """What a recorded figure is called on every page: its catalogue title."""
    return figures.title(name)


def metric_tip(name: str) -> str:
    """What it counts and how it differs from its nearest neighbour (the catalogue's)."""
    return figures.tip(name)


#: what ``services.history.validation_table``'s figures are called on screen
FIGURE_TITLES = {
    "perplexity": "perplexity",
    "logits_cosine_mean": "logits cosine, mean",
    "logits_cosine_min": "logits cosine, min",
    "logits_max_abs_error": "max abs logit error",
    "top1_agreement": "top-1 agreement",
    "greedy_agreement": "greedy agreement",
    "greedy_prefix_agreement": "greedy prefix agreement",
}
FIGURE_TIPS = {
    "perplexity": "Perplexity on the project's held-out text (lower is better).",
    "logits_cosine_mean": "Mean cosine similarity of each token's logits with FP32's "
    "(higher is better).",
    "logits_cosine_min": "The worst token's logits cosine with FP32 (higher is better).",
    "logits_max_abs_error": "The largest absolute difference of any logit from FP32 "
    "(lower is better).",
    "top1_agreement": "Tokens whose most likely next token is FP32's (higher is better).",
    "greedy_agreement": "Greedy-decoded tokens identical to FP32's, position by position.",
    "greedy_prefix_agreement": "Greedy tokens identical to FP32's before the first divergence.",
}
#: the catalogue's figure behind each cell of the validation table (figure, column)
VALIDATION_KEYS = {
    ("perplexity", "fp32"): "perplexity_fp32",
    ("perplexity", "host_qdq"): "perplexity_host_qdq",
    ("perplexity", "htp"): "perplexity_quantized",
    ("logits_cosine_mean", "host_qdq"): "logits_cosine_host_qdq",
    ("logits_cosine_mean", "htp"): "logits_cosine_mean",
    ("top1_agreement", "host_qdq"): "top1_agreement_host_qdq",
    ("top1_agreement", "htp"): "top1_agreement",
    ("logits_max_abs_error", "htp"): "logits_max_abs_error",
    ("greedy_agreement", "htp"): "greedy_agreement",
    ("greedy_prefix_agreement", "htp"): "greedy_prefix_agreement",
}
#: the columns of the validation table
COLUMN_TITLES = {"fp32": "FP32", "host_qdq": "host QDQ", "htp": "HTP"}
DEVICE_TITLES = {"host-cpu": "CPU", "htp-sim": "simulator"}
FRACTIONS = {"top1_agreement", "greedy_agreement", "greedy_prefix_agreement"}
BETTER_COLOR, WORSE_COLOR, SAME_COLOR = "#1b8a3f", "#c62828", "#7a7f87"


def column_title(column: str, device: str) -> str:
    """``"HTP · simulator"``: the column and where its figures were taken."""
    where = DEVICE_TITLES.get(device.split(":", 1)[0], device)
    return f"{COLUMN_TITLES.get(column, column)} · {where}"


def _minus(text: str) -> str:
    return text.replace("-", "−")


def fmt_figure(name: str, value: float | None, unit: str = "") -> str:
    """A figure of the validation table (``perplexity``, ``logits_cosine_mean``…) as the
    catalogue writes it."""
    if value is None:
        return "—"
    if "perplexity" in name:
        return figures.fmt_unit(value, "ppl")
    if name in FRACTIONS:
        return figures.fmt_unit(value, "fraction")
    return figures.fmt(name, value, unit)


def fmt_delta(name: str, delta: float | None, relative: float | None = None) -> str:
    """The change from the earlier run: ``+0.224 (+0.18%)``, ``−1.4 pp``, ``unchanged``."""
    if delta is None:
        return "—"
    if delta == 0:
        return "unchanged"
    if "cosine" in name:
        return signed(delta, ".6f", "−")
    if name in FRACTIONS:
        return signed(delta * 100, ".1f", "−") + " pp"
    text = signed(delta, ".3f" if abs(delta) >= 1e-3 else ".2e", "−")
    if relative is not None:
        text += f" ({signed(relative, '.2%', '−')})"
    return _minus(text)


def delta_color(better: bool | None) -> str:
    return SAME_COLOR if better is None else (BETTER_COLOR if better else WORSE_COLOR)


def when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def recipe_text(settings: dict | None) -> str:
    """``W8A16, per-channel weights`` from a run's recorded settings."""
    if not settings:
        return "settings not recorded"
    q = settings.get("quantization") or {}
    parts = [str(q.get("scheme", "?"))]
    if q.get("weight_granularity"):
        parts.append(f"{str(q['weight_granularity']).replace('_', '-')} weights")
    if q.get("overrides"):
        parts.append(f"{len(q['overrides'])} override(s)")
    return ", ".join(parts)


def run_label(info) -> str:
    """``run 7 — 2026-12-01 14:03 — succeeded — W8A16, per-channel weights`` (a sweep's point
    says so: ``run 9 — sweep seed-grid p3 — …``)."""
    sweep = getattr(info, "sweep", None)
    point = f" — sweep {sweep.get('name')} {sweep.get('label')}" if sweep else ""
    return (f"run {info.id}{point} — {when(info.created)} — {info.state} — "
            f"{recipe_text(info.settings)}")


def setting_value(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "none"
    if value is None:
        return "unset"
    return str(value)


def fmt_metric(name: str, value: float, unit: str = "") -> str:
    """A recorded metric as every card, list and table writes it: the catalogue's unit and
    digits (a cosine keeps the digits where quantization shows: 0.999977, not 1)."""
    return figures.fmt(name, value, unit)


def fmt_card(name: str, value: float, unit: str = "") -> str:
    """A figure on an Overview card: as :func:`fmt_metric` (one way of writing a figure)."""
    return figures.fmt(name, value, unit)
