"""Train the shipped sample models: ``tiny-coder`` and its draft ``tiny-coder-draft``.

Reproducible (fixed seeds, fixed module lists, CPU only, two threads) and offline: the
corpus is the Python source of the installed standard library (PSF licence).

    python -m studio.samples.train --out resources

writes ``resources/models/tiny-coder``, ``resources/models/tiny-coder-draft`` (Hugging
Face checkpoint folders with model cards) and ``resources/data/{heldout,calibration}.py.txt``.
The figures in the model cards are measured by this script at the end of training.

    python -m studio.samples.train --out resources --reuse-target

distils the draft again from the tiny-coder already there (its checkpoint and tokenizer are
read, not written). The draft's token table (tied to its LM head) is the target's, frozen
while it is distilled (``--draft-embedding frozen``, the default): the two models then hold
the same table, value for value, and a runtime can keep one copy of it for both
(:mod:`studio.engine.shared_table`). ``--draft-embedding trained`` lets it drift as the
first shipped draft did (its table moved up to 0.115 from the target's, and reading the
target's table instead cost it 19 points of greedy agreement: 65.1 % -> 46.1 %).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sysconfig
import time
from pathlib import Path

from studio.core.lazyimport import lazy_module

tokenizers = lazy_module("tokenizers")
decoders = lazy_module("tokenizers.decoders")
models = lazy_module("tokenizers.models")
normalizers = lazy_module("tokenizers.normalizers")
pre_tokenizers = lazy_module("tokenizers.pre_tokenizers")
trainers = lazy_module("tokenizers.trainers")
torch = lazy_module("torch")
F = lazy_module("torch.nn.functional")
transformers = lazy_module("transformers")
tokenization_qwen2 = lazy_module("transformers.models.qwen2.tokenization_qwen2")

# Modules never seen in training: evaluation text and calibration text.
HELDOUT_MODULES = [
    "textwrap", "shlex", "heapq", "bisect", "csv",
    "fractions", "statistics", "graphlib", "queue", "sched",
]
CALIBRATION_MODULES = ["colorsys", "fnmatch", "glob", "numbers", "string", "cmd"]
# Excluded from training: obfuscated text (this), generated tables, and the two sets above.
EXCLUDED_MODULES = {"this", "__phello__", "_aix_support", "antigravity"}

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>"]
SEQ_LEN = 256

TARGET_CONFIG = dict(
    hidden_size=256, intermediate_size=688, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
)
# The draft is a "layer-skip" sibling: the target's embedding (tied LM head), its first block
# and final norm, then distilled on the target's logits (the embedding kept frozen: see
# --draft-embedding). A separately trained 2-layer
# hidden-128 draft reached only ~42 % greedy agreement; this one starts from the target's
# own representation and gets well past 55 % with the same budget.
DRAFT_LAYERS = 1
PROMPTS = ["def __init__(self", "import os\n\ndef read_file(path):\n", "for i in range("]


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def training_modules() -> list[str]:
    held = set(HELDOUT_MODULES) | set(CALIBRATION_MODULES) | EXCLUDED_MODULES
    return sorted(p.stem for p in stdlib_dir().glob("*.py") if p.stem not in held)


def read_modules(names: list[str]) -> str:
    parts = []
    for name in names:
        text = (stdlib_dir() / f"{name}.py").read_text(encoding="utf-8", errors="replace")
        parts.append(f"# module: {name}\n{text}")
    return "\n<|endoftext|>\n".join(parts)


def train_tokenizer(text: str, out: Path):
    """Byte-level BPE with Qwen2's normaliser and split regex, so that ``AutoTokenizer``
    (which turns every ``qwen2`` checkpoint into ``Qwen2Tokenizer``) gives the same ids."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(tokenization_qwen2.PRETOKENIZE_REGEX),
                             behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator([text[i:i + 100_000] for i in range(0, len(text), 100_000)], trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return tok


def hf_tokenizer(path: Path):
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(path / "tokenizer.json"),
        eos_token="<|endoftext|>", pad_token="<|pad|>", bos_token=None,
        clean_up_tokenization_spaces=False,
    )


def encode(tok, text: str) -> list[int]:
    # The raw tokenizer: documents are joined by the literal special token.
    return tok.encode(text).ids


def build_model(cfg: dict, vocab: int, seed: int):
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=vocab, tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-6,
        bos_token_id=None, eos_token_id=0, pad_token_id=1, attn_implementation="sdpa",
        use_sliding_window=False, **cfg,
    )
    return transformers.Qwen2ForCausalLM(config)


def draft_from_target(target):
    """A 1-block model initialised from the target's embedding, block 0 and final norm."""
    cfg = target.config.to_dict()
    for k in ("architectures", "transformers_version", "_name_or_path", "layer_types"):
        cfg.pop(k, None)
    cfg["num_hidden_layers"] = DRAFT_LAYERS
    draft = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**cfg))
    keep = tuple(f"model.layers.{i}." for i in range(DRAFT_LAYERS))
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.") or k.startswith(keep)}
    draft.load_state_dict(state, strict=True)
    return draft


def batches(ids, steps: int, batch: int, seed: int):
    data = torch.tensor(ids, dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - SEQ_LEN - 1, (batch,), generator=gen)
        yield torch.stack([data[s:s + SEQ_LEN + 1] for s in starts.tolist()])


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(model, ids, steps, batch, lr, seed, teacher=None, log_every=50, label="model"):
    params = [prm for prm in model.parameters() if prm.requires_grad]  # a frozen table stays
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    losses = []
    t0 = time.time()
    for step, chunk in enumerate(batches(ids, steps, batch, seed)):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup=max(1, steps // 20))
        x, y = chunk[:, :-1], chunk[:, 1:]
        logits = model(input_ids=x).logits
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss = ce
        if teacher is not None:
            with torch.no_grad():
                t_logits = teacher(input_ids=x).logits
            kl = F.kl_div(
                F.log_softmax(logits, -1).reshape(-1, logits.shape[-1]),
                F.log_softmax(t_logits, -1).reshape(-1, logits.shape[-1]),
                log_target=True, reduction="batchmean",
            )
            loss = 0.1 * ce + 0.9 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(ce.item())
        if step % log_every == 0 or step == steps - 1:
            print(f"[{label}] step {step}/{steps} ce {ce.item():.3f} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    return sum(losses[-20:]) / min(20, len(losses))


def perplexity(model, ids, window: int = SEQ_LEN) -> float:
    nll, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, window):
            chunk = torch.tensor(ids[s:s + window + 1])[None]
            if chunk.shape[1] < 2:
                break
            logits = model(input_ids=chunk[:, :-1]).logits
            nll += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
            count += chunk.shape[1] - 1
    return math.exp(nll / count)


def unigram_perplexity(train_ids, eval_ids, vocab: int) -> float:
    counts = [1] * vocab  # add-one smoothing
    for t in train_ids:
        counts[t] += 1
    total = sum(counts)
    nll = -sum(math.log(counts[t] / total) for t in eval_ids)
    return math.exp(nll / len(eval_ids))


def agreement(draft, target, ids, window: int = SEQ_LEN) -> float:
    same, count = 0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, window):
            chunk = torch.tensor(ids[s:s + window])[None]
            a = draft(input_ids=chunk).logits.argmax(-1)
            b = target(input_ids=chunk).logits.argmax(-1)
            same += int((a == b).sum())
            count += a.numel()
    return same / count


def completions(model, tokenizer, max_new_tokens: int = 40) -> dict[str, str]:
    out = {}
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=1)
        out[prompt] = tokenizer.decode(gen[0, ids.shape[1]:])
    return out


MODEL_CARD = """---
license: psf-2.0
library_name: transformers
pipeline_tag: text-generation
---
# {name}

{summary}

| | |
|---|---|
| architecture | `Qwen2ForCausalLM`, {layers} transformer block(s), hidden {hidden}, {heads} query heads / {kv} KV heads, tied embeddings |
| parameters | {params:,} |
| tokenizer | byte-level BPE, vocabulary {vocab} (`tokenizer.json`) |
| training data | Python standard library source of CPython {pyver}: {n_train} modules (`training_modules.json`) |
| held-out data | {heldout} (`resources/data/heldout.py.txt`) |
| steps | {steps} × batch {batch} × {seq} tokens |
| final training loss | {loss:.3f} (mean of the last 20 steps) |
| held-out perplexity | {ppl:.2f} (token level, windows of {seq}; unigram baseline {uni:.1f}) |
{extra}
Data licence: the Python standard library is distributed under the PSF License Agreement.
Trained on the CPU by {how}; every figure above was measured by that script at the end of
training. Load the tokenizer with `AutoTokenizer` or `PreTrainedTokenizerFast`: both give
the ids used in training.
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("resources"))
    p.add_argument("--steps", type=int, default=700)
    p.add_argument("--draft-steps", type=int, default=800)
    p.add_argument("--reuse-target", action="store_true",
                   help="load the tiny-coder already in --out (checkpoint and tokenizer) "
                        "instead of training it again; only the draft is written")
    p.add_argument("--draft-embedding", choices=("frozen", "trained"), default="frozen",
                   help="frozen (default): the draft keeps the target's token table (tied to "
                        "its head) unchanged, so both share one table; trained: distilled "
                        "with the rest")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=1234)
    return p


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    torch.set_num_threads(2)
    random.seed(a.seed)
    t_start = time.time()
    models_dir, data_dir = a.out / "models", a.out / "data"
    train_names, train_text, heldout_text = _write_corpus(data_dir)

    tok_dir = models_dir / "tiny-coder"
    if a.reuse_target:  # the target's own tokenizer, as shipped

        tok = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    else:
        tok = train_tokenizer(train_text, tok_dir)
    train_ids = encode(tok, train_text)
    heldout_ids = encode(tok, heldout_text)
    print(f"tokens: train {len(train_ids):,}, held-out {len(heldout_ids):,}", flush=True)
    uni = unigram_perplexity(train_ids, heldout_ids, VOCAB_SIZE)
    target, t_loss, t_ppl = _target(a, models_dir, train_ids, heldout_ids, uni)
    draft, d_loss, d_ppl, agree = _distill_draft(a, target, train_ids, heldout_ids)

    hf_tok = hf_tokenizer(tok_dir)
    samples = completions(target, hf_tok)
    pyver = platform.python_version()
    stats = {}
    same_table = bool(torch.equal(draft.model.embed_tokens.weight, target.model.embed_tokens.weight))
    print(f"draft's token table equal to the target's: {same_table}", flush=True)
    prev_stats = (json.loads((models_dir / "training_stats.json").read_text())
                  if a.reuse_target else {})
    card = dict(vocab=VOCAB_SIZE, pyver=pyver, n_train=len(train_names),
                heldout=", ".join(HELDOUT_MODULES), batch=a.batch, seq=SEQ_LEN, uni=uni,
                how=("`python -m studio.samples.train --out resources --reuse-target` (fixed "
                     "seeds, default settings: the draft distilled again from the tiny-coder in "
                     "resources)" if a.reuse_target else "`python -m studio.samples.train --out "
                     "resources` (fixed seeds, default settings; both models in one run)"))
    for name, model, loss, ppl, steps, cfg in (
        ("tiny-coder", target, t_loss, t_ppl, a.steps, TARGET_CONFIG),
        ("tiny-coder-draft", draft, d_loss, d_ppl, a.draft_steps,
         dict(TARGET_CONFIG, num_hidden_layers=DRAFT_LAYERS)),
    ):
        if name == "tiny-coder" and a.reuse_target:  # read, not written: its files stay
            stats[name] = prev_stats[name]
            continue
        summary, extra = _card_text(name, samples, same_table, agree)
        stats[name] = _save_model(models_dir / name, name, model, hf_tok, cfg, steps, loss,
                                  ppl, train_names, dict(card, summary=summary, extra=extra))
    stats.update(unigram_perplexity=round(uni, 2), draft_agreement=round(agree, 4),
                 draft_embedding="tiny-coder's, frozen" if same_table else "trained",
                 completions=samples, python=pyver, torch=torch.__version__,
                 heldout_tokens=len(heldout_ids), seconds=round(time.time() - t_start))
    (models_dir / "training_stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    print(json.dumps(stats, indent=1))
    return 0


def _write_corpus(data_dir: Path) -> tuple[list[str], str, str]:
    """The training modules and their text, the held-out text; the held-out and calibration
    texts written under ``data_dir``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    train_names = training_modules()
    train_text = read_modules(train_names)
    heldout_text = read_modules(HELDOUT_MODULES)
    calib_text = read_modules(CALIBRATION_MODULES)
    (data_dir / "heldout.py.txt").write_text(heldout_text, encoding="utf-8")
    (data_dir / "calibration.py.txt").write_text(calib_text, encoding="utf-8")
    print(f"corpus: {len(train_names)} modules, {len(train_text):,} chars", flush=True)
    return train_names, train_text, heldout_text


def _target(a: argparse.Namespace, models_dir: Path, train_ids, heldout_ids, uni: float):
    """The tiny-coder trained (or with ``--reuse-target`` read from ``--out``), its final
    loss and held-out perplexity."""
    if a.reuse_target:
        target = transformers.Qwen2ForCausalLM.from_pretrained(models_dir / "tiny-coder").eval()
        prev = json.loads((models_dir / "training_stats.json").read_text())["tiny-coder"]
        t_loss = prev["final_loss"]
    else:
        target = build_model(TARGET_CONFIG, VOCAB_SIZE, a.seed)
        t_loss = train(target, train_ids, a.steps, a.batch, 3e-3, a.seed, label="tiny-coder")
    t_ppl = perplexity(target, heldout_ids)
    print(f"tiny-coder held-out ppl {t_ppl:.2f} (unigram {uni:.1f})", flush=True)
    return target, t_loss, t_ppl


def _distill_draft(a: argparse.Namespace, target, train_ids, heldout_ids):
    """The draft distilled from the (frozen) target; its loss, held-out perplexity and
    greedy agreement with the target."""
    for prm in target.parameters():
        prm.requires_grad_(False)
    draft = draft_from_target(target)
    if a.draft_embedding == "frozen":  # the target's table (and the tied head) as it is
        draft.model.embed_tokens.weight.requires_grad_(False)
    d_loss = train(draft, train_ids, a.draft_steps, a.batch, 2e-3, a.seed + 1,
                   teacher=target, label="tiny-coder-draft")
    d_ppl = perplexity(draft, heldout_ids)
    agree = agreement(draft, target, heldout_ids)
    print(f"draft held-out ppl {d_ppl:.2f}, greedy agreement {agree:.3f}", flush=True)
    return draft, d_loss, d_ppl, agree


def _card_text(name: str, samples: dict[str, str], same_table: bool, agree: float
               ) -> tuple[str, str]:
    """A model card's summary and its extra lines."""
    if name == "tiny-coder":
        summary = "A tiny Python code model, the studio's sample language model."
        extra = "\nGreedy completions (40 new tokens):\n\n" + "\n".join(
            f"- `{pr!r}` → `{c!r}`" for pr, c in samples.items()) + "\n"
    else:
        summary = ("Draft model for speculative decoding with `tiny-coder` (same tokenizer): "
                   "initialised from tiny-coder's embedding, first block and final norm, "
                   "then distilled on its logits (0.1 × cross-entropy + 0.9 × KL)"
                   + (" with the embedding (tied to the LM head) frozen: its token table "
                      "is tiny-coder's, value for value, so a runtime can hold one table "
                      "for both." if same_table else "."))
        extra = (f"| greedy next-token agreement with tiny-coder (held-out) | {agree:.1%} |\n"
                 f"| token table | {'tiny-coder' + chr(39) + 's (frozen)' if same_table else 'its own (trained)'} |\n")
    return summary, extra


def _save_model(out: Path, name: str, model, hf_tok, cfg: dict, steps: int, loss: float,
                ppl: float, train_names: list[str], card: dict) -> dict:
    """A checkpoint folder: the model (greedy generation settings), the tokenizer, its
    model card and training modules; its row of training_stats.json."""
    model.generation_config.pad_token_id = 1
    model.generation_config.eos_token_id = 0
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    hf_tok.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    (out / "README.md").write_text(MODEL_CARD.format(
        name=name, layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"],
        heads=cfg["num_attention_heads"], kv=cfg["num_key_value_heads"], params=params,
        steps=steps, loss=loss, ppl=ppl, **card,
    ), encoding="utf-8")
    (out / "training_modules.json").write_text(json.dumps(train_names, indent=1) + "\n")
    return dict(parameters=params, final_loss=round(loss, 4),
                heldout_perplexity=round(ppl, 3), steps=steps)


if __name__ == "__main__":
    raise SystemExit(main())
