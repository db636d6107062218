"""Per-layer sensitivity: each layer, key activation and block raised (and lowered) alone."""

from __future__ import annotations

import shutil
import time
from typing import Any

from studio.core.catalog import get_chip
from studio.core.devices import htp_simulator
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.progress import Progress, SubProgress
from studio.core.stages.sensitivity import SensitivitySettings
from studio.engine.llm_runtime import load_tokenizer
from studio.engine.precision_search import analyze, confirm_on_htp
from studio.engine.sensitivity import VariantBench, resolve_choices
from studio.worker.context import StageContext, device_metric, host_metric, read_text


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """Each weighted layer, each key activation, then each block, raised (and lowered) alone
    over the base scheme, scored on the host QDQ prefill graph against FP32."""
    s = SensitivitySettings.of(ctx.config)
    high, low = resolve_choices(s.scheme, s.high, s.low)
    data = measure(ctx, s, high, low, progress)
    atomic_write_json(ctx.out / "sensitivity.json", data)
    metrics = sensitivity_metrics(data, s.scheme, high, low)
    return sensitivity_result(data, s.scheme, high, low, metrics)


def measure(ctx: StageContext, s: SensitivitySettings, high: str, low: str,
            progress: Progress) -> dict[str, Any]:
    """The variants measured on the held-out tokens (the top ones confirmed on the HTP
    simulator where asked); the calibration ranges kept, the time recorded."""
    scheme = s.scheme
    export_dir = ctx.input("export")
    calib = read_text(s.path(s.calibration_text), "calibration text")
    held = read_text(s.path(s.heldout_text), "held-out text")
    ids = load_tokenizer(export_dir)(held).input_ids[: s.heldout_tokens]
    if len(ids) < 16:
        raise StudioError("the held-out text gives fewer than 16 tokens: use a longer text")
    recipe = {"scheme": scheme, "weight_granularity": s.weight_granularity,
              "samples": s.calibration_samples}
    t0 = time.perf_counter()
    with VariantBench(export_dir, recipe, ids, ctx.out, calibration_text=calib,
                      tokenizer_dir=export_dir / "tokenizer",
                      progress=SubProgress(progress, 0.0, 0.1)) as bench:
        confirm = s.confirm_on_htp
        data = analyze(bench, high, low, SubProgress(progress, 0.1, 0.85 if confirm else 1.0))
        if confirm:
            data["htp"] = confirm_on_htp(bench, data, get_chip(confirm),
                                         s.confirm_top,
                                         SubProgress(progress, 0.85, 1.0))
        shutil.copy2(bench.ranges, ctx.out / "calibration_ranges.json")
    seconds = time.perf_counter() - t0
    v = data["variants"]
    ctx.fact("sensitivity_seconds", seconds, "s",
             f"{v['measured']} variants measured, {v['quantizer_runs']} quantizer runs")
    return data


def by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every layer, block and key activation of ``data`` by its name."""
    return {e["name"]: e for e in data["layers"] + data["blocks"] + data["points"]}


def sensitivity_metrics(data: dict[str, Any], scheme: str, high: str, low: str
                        ) -> list[dict[str, Any]]:
    """The stage's metrics: FP32's and the base scheme's figures, the top raise's (and the
    top lowering's) change, the HTP simulator's where it confirmed."""
    named = by_name(data)
    rk = data["ranking"]
    where = (f"prefill graph, {data['heldout']['tokens']} held-out tokens in windows of "
             f"{data['heldout']['window_tokens']}")
    base, fp32 = data["base"], data["fp32"]
    top = rk["raise"][0]
    metrics = [
        # its own name: validate owns perplexity_fp32 (its held-out text, its token count)
        host_metric("sensitivity_perplexity_fp32", fp32["perplexity"], "", where),
        host_metric("perplexity_base", base["perplexity"], "", f"{scheme}, {where}"),
        host_metric("logits_cosine_base", base["logits_cosine"], "", f"{scheme}, {where}"),
        host_metric("kl_divergence_base", base["kl_divergence"], "nats", f"{scheme}, {where}"),
        host_metric("top_raise_kl_change", named[top]["raise"]["delta"]["kl_divergence"],
                     "nats", f"{top} raised to {high}"),
        host_metric("top_raise_perplexity_change", named[top]["raise"]["delta"]["perplexity"],
                     "", f"{top} raised to {high}"),
    ]
    htp = data.get("htp")
    if htp:
        sim = htp_simulator(htp["chip"])
        metrics.append(device_metric(sim, "kl_divergence_base_htp", htp["base"]["kl_divergence"],
                                      "nats", f"{scheme}, {where}"))
        for e in htp["entries"][:1]:
            metrics.append(device_metric(sim, "top_raise_kl_change_htp",
                                          e["delta"]["kl_divergence"], "nats",
                                          f"{e['name']} raised to {high}"))
    if rk["raise_points"]:
        top_point = rk["raise_points"][0]
        metrics.append(host_metric(
            "top_point_raise_kl_change", named[top_point]["raise"]["delta"]["kl_divergence"],
            "nats", f"{top_point} raised to {high}"))
    if low:
        worst = rk["lower"][0]
        metrics.append(host_metric(
            "top_lower_perplexity_change", named[worst]["lower"]["delta"]["perplexity"], "",
            f"{worst} lowered to {low}"))
    return metrics


def sensitivity_result(data: dict[str, Any], scheme: str, high: str, low: str,
                       metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """The stage's result: the summary line, the top rows of each ranking, the HTP's."""
    named = by_name(data)

    def rows(names: list[str], direction: str) -> list[dict[str, Any]]:
        return [{"name": n, **named[n][direction]["delta"]} for n in names]

    rk = data["ranking"]
    htp = data.get("htp")
    return {
        "summary": (f"{len(data['layers'])} layers, {len(data['points'])} key activations and "
                    f"{len(data['blocks'])} blocks, one at a time over {scheme}: raised to {high}"
                    + (f", lowered to {low}" if low else "")
                    + f"; most to gain from {high}: {', '.join(rk['raise'][:3])}"
                    + (f"; of the key activations: {rk['raise_points'][0]}"
                       if rk["raise_points"] else "")
                    + (f"; on the HTP simulator ({htp['chip']}) {htp['host_gain_confirmed']} of "
                       f"the top {htp['tried']} gain too" if htp else "")),
        "scheme": scheme, "high": high, "low": low, "graph": data["graph"],
        "heldout_tokens": data["heldout"]["tokens"], "fp32": data["fp32"], "base": data["base"],
        "ranking": {k: names[:5] for k, names in rk.items()},
        "top_raise": rows(rk["raise"][:5], "raise"),
        "top_lower": rows(rk["lower"][:5], "lower") if low else [],
        "blocks_raise": rows(rk["raise_blocks"], "raise"),
        "points_raise": rows(rk["raise_points"][:5], "raise"),
        "htp": ({"chip": htp["chip"], "base": htp["base"],
                 "confirmed": f"{htp['host_gain_confirmed']} of {htp['tried']}",
                 "entries": [{"name": e["name"], "host": e["host_delta"], "htp": e["delta"]}
                             for e in htp["entries"]]} if htp else None),
        "variants": data["variants"], "files": ["sensitivity.json"], "metrics": metrics,
    }
