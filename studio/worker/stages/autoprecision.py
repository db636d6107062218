"""Auto precision: the fewest layers raised that meet the project's target."""

from __future__ import annotations

import json
import time
from typing import Any

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.progress import Progress, SubProgress
from studio.worker.context import StageContext, host_metric


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """The fewest layers or key activations raised (greedy by the sensitivity ranking, each
    step measured) that meet the project's target; the override rules to copy into
    ``quantization.overrides``."""
    from studio.engine.sensitivity import VariantBench, auto_precision

    export_dir, sdir = ctx.input("export"), ctx.input("sensitivity")
    try:
        sens = json.loads((sdir / "sensitivity.json").read_text())
    except (OSError, ValueError):
        raise StudioError("the sensitivity result is missing or unreadable: re-run sensitivity") from None
    recipe = {"scheme": sens["scheme"], "weight_granularity": sens["weight_granularity"],
              "samples": sens["calibration_samples"]}
    metric = ctx.get("autoprecision.metric")
    t0 = time.perf_counter()
    with VariantBench(export_dir, recipe, sens["heldout"]["ids"], ctx.out,
                      ranges=sdir / "calibration_ranges.json",
                      progress=SubProgress(progress, 0.0, 0.1)) as bench:
        # weighted layers and key activations in one ranking, by what raising each alone
        # gained (a sensitivity result from before key activations were ranked has none)
        units = sens["layers"] + sens.get("points", [])
        gains = {e["name"]: -e["raise"]["delta"]["kl_divergence"] for e in units}
        order = {name: i for i, name in enumerate(
            sens["ranking"]["raise"] + sens["ranking"].get("raise_points", []))}
        ranking = sorted(gains, key=lambda n: (-gains[n], order[n]))
        res = auto_precision(bench, ranking, sens["high"], metric,
                             ctx.get("autoprecision.max_perplexity_change"),
                             ctx.get("autoprecision.min_logits_cosine"), gains,
                             SubProgress(progress, 0.1, 1.0))
    ctx.fact("autoprecision_seconds", time.perf_counter() - t0, "s",
             f"{res['variants']['measured']} variants measured")
    res["base_matches_sensitivity"] = all(
        abs(res["before"][k] - sens["base"][k]) <= 1e-9 * max(1.0, abs(sens["base"][k]))
        for k in ("perplexity", "logits_cosine", "kl_divergence"))
    atomic_write_json(ctx.out / "autoprecision.json", res)
    b, a = res["before"], res["after"]
    target = (f"perplexity within {ctx.get('autoprecision.max_perplexity_change'):.1%} of FP32"
              if metric == "perplexity"
              else f"logits cosine >= {ctx.get('autoprecision.min_logits_cosine')}")
    what = (f"{res['raised']} layer(s) raised to {res['high']}" if res["met"]
            else f"target not met with the {len(res['tried'])} layers that gained from "
                 f"{res['high']} raised")
    detail = f"{res['scheme']} + overrides, prefill graph, {sens['heldout']['tokens']} tokens"
    return {
        "summary": (f"{target}: {what}; perplexity {b['perplexity']:.3f} → {a['perplexity']:.3f} "
                    f"(FP32 {res['fp32']['perplexity']:.3f}), cosine {b['logits_cosine']:.5f} → "
                    f"{a['logits_cosine']:.5f}, weights {b['weight_bytes']:,} → "
                    f"{a['weight_bytes']:,} bytes"),
        "met": res["met"], "raised": res["raised"], "high": res["high"],
        "overrides": res["overrides"], "target": res["target"], "metric": metric,
        "before": b, "after": a,
        "curve": [{k: s[k] for k in ("step", "action", "perplexity", "logits_cosine",
                                     "kl_divergence", "weight_bytes",
                                     "activation_bytes_per_token", "meets_target")}
                  for s in res["steps"]],
        "base_matches_sensitivity": res["base_matches_sensitivity"],
        "files": ["autoprecision.json"],
        "metrics": [
            host_metric("layers_raised", res["raised"], "layers", f"to {res['high']}"),
            host_metric("perplexity_before", b["perplexity"], "", detail),
            host_metric("perplexity_after", a["perplexity"], "", detail),
            host_metric("logits_cosine_before", b["logits_cosine"], "", detail),
            host_metric("logits_cosine_after", a["logits_cosine"], "", detail),
            host_metric("weight_bytes_before", b["weight_bytes"], "B", "weighted layers"),
            host_metric("weight_bytes_after", a["weight_bytes"], "B", "weighted layers"),
        ],
    }
