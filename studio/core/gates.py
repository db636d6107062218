"""Accuracy gates: the project's thresholds applied to a validation result."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def evaluate_gates(gates: Mapping[str, float], validation: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per gate: name, threshold, value, passed. ``validation`` is a validate result."""
    rows = []
    cos = validation.get("logits_cosine_mean")
    if cos is not None and "min_logits_cosine" in gates:
        rows.append(dict(gate="min_logits_cosine", threshold=gates["min_logits_cosine"],
                         value=cos, passed=cos >= gates["min_logits_cosine"]))
    fp, q = validation.get("perplexity_fp32"), validation.get("perplexity_quantized")
    if fp and q is not None and "max_perplexity_increase" in gates:
        inc = q / fp - 1.0
        rows.append(dict(gate="max_perplexity_increase", threshold=gates["max_perplexity_increase"],
                         value=inc, passed=inc <= gates["max_perplexity_increase"]))
    top1 = validation.get("top1_agreement")
    if top1 is not None and "min_top1_agreement" in gates:
        rows.append(dict(gate="min_top1_agreement", threshold=gates["min_top1_agreement"],
                         value=top1, passed=top1 >= gates["min_top1_agreement"]))
    for gate, key in (("min_output_cosine", "output_cosine_min"),
                      ("min_ranking_top1", "ranking_top1")):
        value = validation.get(key)
        if value is not None and gate in gates:
            rows.append(dict(gate=gate, threshold=gates[gate], value=value,
                             passed=value >= gates[gate]))
    return rows
