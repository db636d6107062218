"""Auto precision: the fewest layers raised that meet the project's target."""

from __future__ import annotations

import json
import time
from typing import Any

from studio.core.catalog import get_chip
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.progress import Progress, SubProgress
from studio.core.stages.autoprecision import AutoprecisionSettings
from studio.engine.precision_search import auto_precision
from studio.engine.sensitivity import VariantBench, raise_ranking
from studio.worker.context import StageContext, host_metric
from studio.worker.context import metric as labelled


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """The fewest layers or key activations raised (greedy by the sensitivity ranking, each
    step measured) that meet the project's target; the override rules to copy into
    ``quantization.overrides``."""
    export_dir, sdir = ctx.input("export"), ctx.input("sensitivity")
    try:
        sens = json.loads((sdir / "sensitivity.json").read_text())
    except (OSError, ValueError):
        raise StudioError("the sensitivity result is missing or unreadable: re-run sensitivity") from None
    recipe = {"scheme": sens["scheme"], "weight_granularity": sens["weight_granularity"],
              "samples": sens["calibration_samples"]}
    s = AutoprecisionSettings.of(ctx.config)
    metric = s.metric
    t0 = time.perf_counter()
    with VariantBench(export_dir, recipe, sens["heldout"]["ids"], ctx.out,
                      ranges=sdir / "calibration_ranges.json",
                      progress=SubProgress(progress, 0.0, 0.1)) as bench:
        ranking, gains = raise_ranking(sens)
        on_htp = s.on_htp
        # measured on the HTP, every layer is tried in the host's order: a layer the host's
        # rounding shows no gain for may still gain on the HTP's
        res = auto_precision(bench, ranking, sens["high"], metric,
                             s.max_perplexity_change, s.min_logits_cosine,
                             None if on_htp else gains, SubProgress(progress, 0.1, 1.0),
                             s.min_top1_agreement,
                             get_chip(on_htp) if on_htp else None)
    ctx.fact("autoprecision_seconds", time.perf_counter() - t0, "s",
             f"{res['variants']['measured']} variants measured")
    res["base_matches_sensitivity"] = all(
        abs(res["before"][k] - sens["base"][k]) <= 1e-9 * max(1.0, abs(sens["base"][k]))
        for k in ("perplexity", "logits_cosine", "kl_divergence"))
    atomic_write_json(ctx.out / "autoprecision.json", res)
    b, a = res["before"], res["after"]
    target = (f"perplexity within {s.max_perplexity_change:.1%} of FP32"
              if metric == "perplexity"
              else f"top-1 agreement >= {s.min_top1_agreement:.0%}"
              if metric == "top1"
              else f"logits cosine >= {s.min_logits_cosine}")
    what = (f"{res['raised']} layer(s) raised to {res['high']}" if res["met"]
            else f"target not met with the {len(res['tried'])} layers that gained from "
                 f"{res['high']} raised")
    where = (f"on the HTP simulator ({get_chip(on_htp).name})" if on_htp
             else "on the host QDQ model")
    detail = (f"{res['scheme']} + overrides, prefill graph, {sens['heldout']['tokens']} tokens, "
              + where)

    def figure(name: str, value: float) -> dict[str, Any]:  # labelled by where it ran
        return labelled(name, value, "", res["source"], res["device"], on_htp or "", detail)

    return {
        "summary": (f"{target}: {what}; perplexity {b['perplexity']:.3f} → {a['perplexity']:.3f} "
                    f"(FP32 {res['fp32']['perplexity']:.3f}), cosine {b['logits_cosine']:.5f} → "
                    f"{a['logits_cosine']:.5f}, top-1 {b['top1_agreement']:.1%} → "
                    f"{a['top1_agreement']:.1%}, weights {b['weight_bytes']:,} → "
                    f"{a['weight_bytes']:,} bytes"),
        "met": res["met"], "raised": res["raised"], "high": res["high"],
        "overrides": res["overrides"], "target": res["target"], "metric": metric,
        "before": b, "after": a,
        "curve": [{k: s[k] for k in ("step", "action", "perplexity", "logits_cosine",
                                     "top1_agreement", "kl_divergence", "weight_bytes",
                                     "activation_bytes_per_token", "meets_target")}
                  for s in res["steps"]],
        "base_matches_sensitivity": res["base_matches_sensitivity"],
        "files": ["autoprecision.json"],
        "metrics": [
            host_metric("layers_raised", res["raised"], "layers", f"to {res['high']}"),
            figure("perplexity_before", b["perplexity"]),
            figure("perplexity_after", a["perplexity"]),
            figure("logits_cosine_before", b["logits_cosine"]),
            figure("logits_cosine_after", a["logits_cosine"]),
            figure("top1_agreement_before", b["top1_agreement"]),
            figure("top1_agreement_after", a["top1_agreement"]),
            host_metric("weight_bytes_before", b["weight_bytes"], "B", "weighted layers"),
            host_metric("weight_bytes_after", a["weight_bytes"], "B", "weighted layers"),
        ],
    }
