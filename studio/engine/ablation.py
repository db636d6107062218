"""Pruning by ablation: drop one decoder block at a time and measure the perplexity on
held-out text, then write a checkpoint without the blocks that matter least.

A dropped block is skipped in the residual stream (its input passes through unchanged), which
is exactly what a checkpoint without that block computes. The measurement runs the
checkpoint in ``transformers`` on the host CPU (FP32).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import torch

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_folder
from studio.core.progress import NullProgress, Progress
from studio.engine.checkpoint_load import load_causal_lm


def heldout_nll(model, ids: list[int], window: int) -> tuple[float, int]:
    """Summed negative log-likelihood of ``ids`` in windows of ``window`` tokens, and the
    number of predicted tokens."""
    total, count = 0.0, 0
    for start in range(0, max(1, len(ids) - 1), window):
        chunk = ids[start:start + window + 1]
        if len(chunk) < 2:
            break
        x = torch.tensor([chunk])
        with torch.no_grad():
            logits = model(x, use_cache=False).logits[0, :-1].double()
        logp = torch.log_softmax(logits, -1)
        total += float(-logp[torch.arange(len(chunk) - 1), x[0, 1:]].sum())
        count += len(chunk) - 1
    return total, count


def ablate_blocks(checkpoint_dir: Path, ids: list[int], window: int = 128,
                  progress: Progress | None = None) -> dict[str, Any]:
    """Perplexity of the checkpoint, then with each block dropped in turn.

    Returns ``{"baseline_ppl", "tokens", "window", "blocks": [{"block", "ppl", "delta"}]}``
    with ``blocks`` ranked from the least important (smallest perplexity increase)."""
    progress = progress or NullProgress()
    if len(ids) < 2:
        raise StudioError("ablation needs at least 2 tokens of held-out text")
    model = load_causal_lm(checkpoint_dir)
    model.eval()
    torch.set_grad_enabled(False)
    layers = model.model.layers
    n = len(layers)
    if n < 2:
        raise StudioError(f"the model has {n} block; there is nothing to prune")
    progress.update(0.0, "perplexity of the whole model")
    nll, count = heldout_nll(model, ids, window)
    base = math.exp(nll / count)
    rows = []
    for i in range(n):
        progress.check()
        progress.update((i + 1) / (n + 1), f"perplexity without block {i}")
        kept = torch.nn.ModuleList([b for j, b in enumerate(layers) if j != i])
        model.model.layers = kept
        saved = _set_layers(model.config, n - 1, i)
        try:
            a, c = heldout_nll(model, ids, window)
        finally:
            model.model.layers = layers
            _restore(model.config, saved)
        ppl = math.exp(a / c)
        rows.append({"block": i, "ppl": ppl, "delta": ppl / base - 1.0})
    rows.sort(key=lambda r: r["delta"])
    progress.update(1.0, f"{n} blocks ablated")
    return {"baseline_ppl": base, "tokens": count, "window": window, "blocks": rows,
            "num_blocks": n}


def _set_layers(config, n: int, dropped: int) -> dict[str, Any]:
    saved = {"num_hidden_layers": config.num_hidden_layers,
             "layer_types": getattr(config, "layer_types", None)}
    config.num_hidden_layers = n
    if saved["layer_types"] is not None:
        config.layer_types = [t for j, t in enumerate(saved["layer_types"]) if j != dropped]
    return saved


def _restore(config, saved: dict[str, Any]) -> None:
    config.num_hidden_layers = saved["num_hidden_layers"]
    if saved["layer_types"] is not None:
        config.layer_types = saved["layer_types"]


def write_pruned_checkpoint(checkpoint_dir: Path, drop: list[int], out_dir: Path) -> Path:
    """A Hugging Face checkpoint of ``checkpoint_dir`` without the blocks ``drop`` (its
    tokenizer files copied), written in a temp folder and moved into place."""
    model = load_causal_lm(checkpoint_dir)
    n = len(model.model.layers)
    drop = sorted(set(int(d) for d in drop))
    if not drop or any(not 0 <= d < n for d in drop) or len(drop) >= n:
        raise StudioError(f"choose blocks to drop among 0..{n - 1}, keeping at least one "
                          f"(got {drop})")
    keep = [j for j in range(n) if j not in drop]
    model.model.layers = torch.nn.ModuleList([model.model.layers[j] for j in keep])
    for new, layer in enumerate(model.model.layers):
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "layer_idx"):
            attn.layer_idx = new
    cfg = model.config
    cfg.num_hidden_layers = len(keep)
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = [cfg.layer_types[j] for j in keep]
    out_dir = Path(out_dir)
    with atomic_folder(out_dir) as tmp:
        model.save_pretrained(str(tmp))
        for f in Path(checkpoint_dir).iterdir():
            if f.is_file() and ("token" in f.name or f.name in ("vocab.json", "merges.txt")):
                shutil.copy2(f, tmp / f.name)
    return out_dir
