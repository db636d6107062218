"""The static-KV graphs' additive attention masks (:mod:`studio.engine.llm_runtime` feeds
them): the prefill mask over a padded prompt, the decode mask over the cache slots, and the
sliding windows a graph's layers need a mask for."""

from __future__ import annotations

import numpy as np

from studio.core.errors import StudioError

#: the graph input that carries the windowed mask of the sliding-attention layers
SLIDING_MASK = "sliding_attention_mask"
#: the additive attention mask's value at a masked place (a graph's spec may name its own)
DEFAULT_MASK_VALUE = -100.0


def prefill_mask(n: int, prompt_len: int, mask_value: float, window: int | None = None):
    """Additive prefill mask [P, P] (float32) for a prompt of ``n`` real tokens.

    Causal over the ``n`` tokens; padding columns are masked and each padding row sees only
    itself (no empty softmax rows). With ``window`` W, a query also loses every key at
    distance >= W.
    """
    P = prompt_len
    mask = np.triu(np.full((P, P), mask_value, dtype=np.float32), k=1)
    mask[:, n:] = mask_value
    if window is not None:
        mask[np.tril(np.ones((P, P), dtype=bool), k=-int(window))] = mask_value
    mask[np.arange(n, P), np.arange(n, P)] = 0.0  # padding rows see themselves: no empty rows
    return mask


def decode_mask(pos: int, context_len: int, mask_value: float, window: int | None = None):
    """Additive decode mask [C + 1] (float32) for the token at position ``pos``.

    Cache slots ``0..pos-1`` are visible, then the new token (index C). With ``window`` W,
    only the slots ``pos-W+1..pos-1`` stay visible: W tokens including the new one.
    """
    C = context_len
    mask = np.full((C + 1,), mask_value, dtype=np.float32)
    first = 0 if window is None else max(0, pos - int(window) + 1)
    mask[first:pos] = 0.0
    mask[C] = 0.0
    return mask


def sliding_window_of(spec: dict) -> int | None:
    """The window the graphs' sliding layers need a mask for: the spec's ``sliding_window``
    when some layer in ``layer_types`` is a sliding one and the window is shorter than the
    cache (a longer window never masks anything there), else None."""
    window = spec.get("sliding_window")
    types = spec.get("layer_types") or []
    if window is None or "sliding_attention" not in types:
        return None
    window = int(window)
    if window < 1:
        raise StudioError(f"graph.json declares a sliding window of {window}; re-export the model")
    return window if window < int(spec["context_length"]) else None


def mask_windows(spec: dict) -> tuple[int | None, int | None]:
    """The windows of the graphs' two masks: ``(attention_mask, sliding_attention_mask)``.

    With a window W shorter than the cache and both kinds of layers (Gemma 2), the full
    layers read ``attention_mask`` and the sliding ones ``sliding_attention_mask``:
    ``(None, W)``. When every layer slides (Mistral, Phi-3), ``attention_mask`` itself is
    windowed and there is no second input: ``(W, None)``. Otherwise ``(None, None)``.
    """
    window = sliding_window_of(spec)
    if window is None:
        return None, None
    if all(t == "sliding_attention" for t in spec["layer_types"]):
        return window, None
    return None, window
