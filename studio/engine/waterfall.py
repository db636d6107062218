"""The optimization waterfall: FP32 -> W8A16 -> quantized graph I/O -> W4A16 -> INT8 KV ->
window -> speculative -> pruned, each step on top of the last, each with its decode speed and its accuracy measured on
the host CPU (ONNX Runtime running the step's own graphs), plus the inputs the performance
model needs to estimate the same steps for a catalog chip.

On the host CPU the quantized steps run as QDQ graphs that ONNX Runtime computes in float, so
they are *slower* there than FP32: their speed gain belongs to the NPU (the estimate); their
accuracy is what the host measures.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from studio.core import archs
from studio.core import perfmodel as pm
from studio.core.catalog import get_chip
from studio.core.errors import StudioError
from studio.engine.speculative import PromptLookupProposer, speculative_generate

STEPS: tuple[str, ...] = ("fp32", "w8a16", "quantized_io", "w4a16", "int8_kv", "window",
                          "speculative", "pruned")

LABELS: dict[str, str] = {
    "fp32": "FP32", "w8a16": "W8A16", "quantized_io": "+ quantized I/O", "w4a16": "W4A16",
    "int8_kv": "+ INT8 KV",
    "window": "+ window", "speculative": "+ speculative", "pruned": "+ pruned",
}


def perplexity(gen, ids: Sequence[int], window: int | None = None) -> float:
    """Perplexity of ``ids`` teacher-forced in windows of C tokens (``window``: attention to
    the last W tokens only, through the ring buffer)."""
    gen.set_window(window)
    C = gen.context_len
    nll, count = 0.0, 0
    try:
        for start in range(0, len(ids) - 1, C):
            chunk = [int(t) for t in ids[start:start + C]]
            if len(chunk) < 2:
                break
            logits = gen.teacher_forced_logits(chunk).astype(np.float64)[:-1]
            logits -= logits.max(-1, keepdims=True)
            logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            nll -= float(logp[np.arange(len(chunk) - 1), chunk[1:]].sum())
            count += len(chunk) - 1
    finally:
        gen.set_window(None)
    if not count:
        raise StudioError("the held-out text is too short to score: give at least 2 tokens")
    return math.exp(nll / count)


def decode_rate(gen, prompt: Sequence[int], new_tokens: int, window: int | None = None,
                repeats: int = 3) -> dict[str, Any]:
    """Greedy decode speed on ``gen``: the median step time over ``repeats`` runs."""
    gen.set_window(window)
    try:
        steps: list[float] = []
        tokens: list[int] = []
        for _ in range(repeats):
            out = gen.generate(list(prompt), new_tokens)
            steps += out["step_s"]
            tokens = out["tokens"]
    finally:
        gen.set_window(None)
    if not steps:
        raise StudioError("no decode steps were timed: raise waterfall.new_tokens")
    med = statistics.median(steps)
    return {"tokens_per_s": 1.0 / med, "ms_per_token": med * 1e3, "tokens": tokens,
            "source": "measured"}


def speculative_rate(gen, prompt: Sequence[int], new_tokens: int, k: int,
                     repeats: int = 3) -> dict[str, Any]:
    """Greedy speculative decoding with prompt lookup on ``gen`` (which needs a verify graph):
    the median rate over ``repeats`` runs and the measured acceptance."""
    if not gen.verify_len:
        raise StudioError("the graphs have no verify graph for speculative decoding")
    rates, stats, tokens = [], {}, []
    for _ in range(repeats):
        out = speculative_generate(gen, PromptLookupProposer(), list(prompt), new_tokens, k=k)
        decoded = len(out["tokens"]) - 1
        rates.append(decoded / out["wall_s"] if out["wall_s"] > 0 and decoded > 0 else 0.0)
        stats, tokens = out["speculative"], out["tokens"]
    return {"tokens_per_s": statistics.median(rates), "speculative": stats, "tokens": tokens,
            "source": "measured"}


def same_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many greedy tokens two outputs share before they first differ."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def with_estimate(data: dict[str, Any], chip: str) -> dict[str, Any]:
    """``data`` (the stage's waterfall.json) with each step's estimate for ``chip``."""
    c = get_chip(chip)
    arch = archs.Arch.from_config(data["config"])
    est = pm.waterfall_estimate(arch, c.key, int(data["context"]), int(data["window"]),
                                data.get("scheme", "W4A16"), data.get("tokens_per_pass"),
                                int(data["k"]), len(data.get("dropped_blocks") or []),
                                data.get("pruned_tokens_per_pass"))
    by_step = {e["step"]: e["tokens_per_s"] for e in est}
    steps = []
    for row in data["steps"]:
        r = dict(row)
        r["estimated_tokens_per_s"] = by_step.get(row["step"])
        steps.append(r)
    out = dict(data)
    out.update({"steps": steps, "chip": c.key, "chip_name": c.name,
                "estimate_note": "estimated by the performance model for the chip; the first "
                                 "step is FP16 there (the HTP runs no FP32)"})
    return out
