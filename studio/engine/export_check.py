"""The export check: the exported graphs teacher-forced over the whole context against the
transformers model, position by position (:func:`check_export`, :class:`PositionCheck`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from studio.core.lazyimport import lazy_module
from studio.core.progress import Progress

torch = lazy_module("torch")

#: Relative tolerance of the export check: |ONNX - transformers| per position may reach
#: EXPORT_CHECK_RTOL x max(1, max |logit| at that position). FP32 ONNX Runtime and eager torch
#: differ by reordered sums only. Measured over the whole context (P=16, C=128): 5e-6 to
#: 1.6e-5 on the tiny random families at logit scales of 7-8 (about 2e-6 relative), 1.7e-5
#: on the trained sample (tiny-coder, 4 layers, scale 16.6, also at C=512). A window one
#: token off or ignored moves the logits by 1.8-8.4 (tests/engine/test_families.py). 1e-3
#: sits >400x above that noise and >200x below those errors, with room for the larger
#: reordering noise of deeper, wider checkpoints.
EXPORT_CHECK_RTOL = 1e-3
#: logits of at most this many floats are computed by one transformers forward
_CHECK_CHUNK_FLOATS = 1 << 26


class PositionCheck:
    """The export check's rule for one position: its max |diff| within rtol x max(1, max
    |logit|), and its top-1 token the reference's or a near-tie (the two tokens' reference
    logits at most that tolerance apart); the figures over all positions added."""

    def __init__(self, rtol: float = EXPORT_CHECK_RTOL):
        self.rtol = rtol
        self.n = self.agree = self.ties = 0
        self.max_diff = self.max_logit = self.max_tol = 0.0
        self.first_bad: int | None = None

    def add(self, p: int, got, want) -> None:
        scale = float(np.max(np.abs(want)))
        tol = self.rtol * max(1.0, scale)
        diff = float(np.max(np.abs(got - want)))
        top_want, top_got = int(want.argmax()), int(got.argmax())
        bad = diff > tol
        if top_want == top_got:
            self.agree += 1
        elif want[top_want] - want[top_got] <= tol:
            self.ties += 1
        else:
            bad = True
        if bad and self.first_bad is None:
            self.first_bad = p
        self.n += 1
        self.max_diff, self.max_logit = max(self.max_diff, diff), max(self.max_logit, scale)
        self.max_tol = max(self.max_tol, tol)

    def figures(self, prefill_positions: int) -> dict:
        return {
            "positions": self.n,
            "prefill_positions": prefill_positions,
            "max_abs_logit_diff": self.max_diff,
            "max_abs_logit": self.max_logit,
            "rtol": self.rtol,
            "tolerance": self.max_tol,
            "top1_agreement": self.agree / max(self.n, 1),
            "top1_near_ties": self.ties,
            "first_bad_position": self.first_bad,
        }


def check_export(
    model,
    gen,
    ids: list[int],
    keep: int = 0,
    progress: Progress | None = None,
    rtol: float = EXPORT_CHECK_RTOL,
) -> tuple[dict, Any]:
    """Teacher-force ``ids`` (at most C: the first P through prefill, then one decode step per
    position) through the graphs of ``gen`` and compare each position's logits with the
    transformers ``model`` run on the same ids.

    A position is bad when its max |diff| exceeds ``rtol`` x max(1, max |logit|) there, or
    when its top-1 token differs from transformers' by more than a near-tie (the two tokens'
    reference logits further apart than that tolerance). Returns the figures
    (``positions``, ``max_abs_logit_diff``, ``max_abs_logit``, ``tolerance`` (the largest
    per-position one), ``rtol``, ``top1_agreement`` (strict), ``top1_near_ties``,
    ``first_bad_position`` or None) and the reference logits of the first ``keep`` positions.
    """
    ids = [int(t) for t in ids]
    n, V = len(ids), gen.vocab_size
    chunk = max(1, min(n, _CHECK_CHUNK_FLOATS // max(V, 1)))
    x = torch.tensor([ids])
    P = min(gen.prompt_len, n)
    compare = PositionCheck(rtol)
    kept = []
    onnx_rows = None
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        with torch.no_grad():
            to_keep = 0 if (a == 0 and b == n) else torch.arange(a, b)
            ref = model(input_ids=x, use_cache=False, logits_to_keep=to_keep).logits[0]
        ref = ref.float().numpy()[:, :V]
        for p in range(a, b):
            if progress is not None:
                progress.check()
                if p % 16 == 0:
                    progress.update(p / n, f"position {p}/{n}")
            if p < P:
                if onnx_rows is None:
                    onnx_rows = gen.prefill(ids[:P])[:, :V]
                got = onnx_rows[p]
            else:
                got = gen.step(ids[p], p)[:V]
            want = ref[p - a]
            compare.add(p, got, want)
            if p < keep:
                kept.append(want)
    if progress is not None:
        progress.update(1.0, f"{n} positions checked")
    check = compare.figures(P)
    return check, np.asarray(kept, dtype=np.float32).reshape(len(kept), V)
