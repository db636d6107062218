"""Pruning by ablation: each block dropped in turn, ranked, and a checkpoint without the
least important ones."""

from __future__ import annotations

import math
from typing import Any

from transformers import PreTrainedTokenizerFast

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.progress import Progress, SubProgress
from studio.core.stages.ablation import AblationSettings
from studio.core.units import signed
from studio.engine.ablation import ablate_blocks, heldout_nll, write_pruned_checkpoint
from studio.engine.checkpoint_load import load_causal_lm
from studio.worker.context import StageContext, host_metric, read_text


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """Pruning by ablation: held-out perplexity with each block dropped in turn, ranked, and
    a checkpoint without the ``pruning.drop_blocks`` least important blocks (``pruned/``)."""

    s = AblationSettings.of(ctx.config)
    ckpt = s.path(s.source)
    n_drop = int(s.drop_blocks)
    text = read_text(s.path(s.heldout_text), "held-out text")
    try:
        tok = PreTrainedTokenizerFast.from_pretrained(str(ckpt))
    except Exception as exc:  # noqa: BLE001 - a checkpoint without a fast tokenizer
        raise StudioError(f"the checkpoint {ckpt} has no tokenizer.json to read the held-out "
                          f"text with ({type(exc).__name__})") from None
    ids = tok(text).input_ids[: s.heldout_tokens]
    table = ablate_blocks(ckpt, ids, window=int(s.context_length),
                          progress=SubProgress(progress, 0.0, 0.9))
    if not 1 <= n_drop < table["num_blocks"]:
        raise StudioError(f"pruning.drop_blocks is {n_drop}: drop 1..{table['num_blocks'] - 1} "
                          f"of the model's {table['num_blocks']} blocks")
    drop = sorted(r["block"] for r in table["blocks"][:n_drop])
    progress.update(0.92, f"writing the checkpoint without block(s) {drop}")
    write_pruned_checkpoint(ckpt, drop, ctx.out / "pruned")
    progress.update(0.95, "perplexity of the pruned checkpoint")

    nll, count = heldout_nll(load_causal_lm(ctx.out / "pruned"), ids, table["window"])

    pruned_ppl = math.exp(nll / count)
    table.update({"dropped": drop, "pruned_ppl": pruned_ppl,
                  "pruned_delta": pruned_ppl / table["baseline_ppl"] - 1.0})
    atomic_write_json(ctx.out / "ablation.json", table)
    best = table["blocks"][0]
    return {
        "summary": (f"{table['num_blocks']} blocks ablated over {table['tokens']} held-out "
                    f"tokens (ppl {table['baseline_ppl']:.2f}); least important block "
                    f"{best['block']} ({signed(best['delta'], '.1%')}); pruned checkpoint without "
                    f"{drop}: ppl {pruned_ppl:.2f} ({signed(table['pruned_delta'], '.1%')})"),
        "ablation": table,
        "metrics": [host_metric("pruned_perplexity", pruned_ppl, "ppl")],
    }
