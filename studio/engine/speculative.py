"""Speculative decoding over the static-KV graphs: a proposer drafts k tokens, the target
checks them in one pass of its verify graph, the longest agreeing prefix is kept.

- **Greedy** (temperature 0): a drafted token is kept when it is the target's argmax at its
  position, so the output is exactly plain greedy's.
- **Sampling**: each drafted token ``x`` is kept with probability min(1, p(x) / q(x)), and
  on a rejection the replacement is drawn from norm(max(0, p - q)) (Leviathan et al.,
  2023): the emitted tokens follow the target's distribution ``p`` whatever the draft's
  ``q``. A prompt-lookup draft is deterministic: its ``q`` is one-hot.
- **Rollback** is free: the verify pass writes the KV rows of every drafted token, but
  every mask hides the slots at and after the next write position, so rejected rows are
  invisible and later overwritten. The draft model's cache rolls back the same way.
- **Adaptive k**: after a pass that kept every drafted token k grows by one (up to the
  verify graph's N - 1); after a rejection it shrinks to the accepted length plus one.

Proposers: :class:`DraftModelProposer` (a small model on the host CPU with its own static
cache) and :class:`PromptLookupProposer` (an n-gram match in the tokens so far: no model;
good at code, which repeats names).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.progress import Progress
from studio.core.sampling import Sampler, SamplingConfig, probabilities


@dataclass
class Proposal:
    tokens: list[int]
    q: list[np.ndarray] | None  # the draft's distributions; None: deterministic (one-hot)


class PromptLookupProposer:
    """Drafts by finding the longest recent n-gram (``max_ngram`` down to ``min_ngram``
    tokens) that ends the sequence and occurred before, and proposing what followed it."""

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.seq: list[int] = []

    def start(self, context: list[int]) -> None:
        self.seq = list(context)

    def propose(self, k: int) -> Proposal:
        if k <= 0:
            return Proposal([], None)
        seq = self.seq
        n = len(seq)
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            tail = seq[n - size:]
            # the most recent earlier occurrence wins
            for start in range(n - size - 1, -1, -1):
                if seq[start:start + size] == tail:
                    follow = seq[start + size:start + size + k]
                    if follow:
                        return Proposal(follow, None)
        return Proposal([], None)

    def accepted(self, kept: list[int]) -> None:
        """``kept``: the drafted tokens the target kept plus its own next token."""
        self.seq.extend(kept)


class DraftModelProposer:
    """A small causal LM on its own static cache (a :class:`StaticKVGenerator`)."""

    name = "draft-model"

    def __init__(self, generator, sampling: SamplingConfig | None = None):
        self.gen = generator
        self.cfg = sampling or SamplingConfig()
        self.sampler = Sampler(SamplingConfig(self.cfg.temperature, self.cfg.top_k,
                                              self.cfg.top_p,
                                              None if self.cfg.seed is None
                                              else self.cfg.seed + 7919))
        self.pos = 0  # tokens of the sequence held in the draft's cache
        self.pending: list[int] = []  # tokens of the sequence not yet in the cache
        self.seconds = 0.0

    def start(self, context: list[int]) -> None:
        t0 = time.perf_counter()
        *head, last = context
        if head:
            self.gen.prefill_prompt(head)
        else:
            self.gen.reset()
        self.pos = len(head)
        self.pending = [last]
        self.seconds += time.perf_counter() - t0

    def propose(self, k: int) -> Proposal:
        t0 = time.perf_counter()
        C = self.gen.context_len
        toks: list[int] = []
        qs: list[np.ndarray] = []
        feed = list(self.pending)
        pos = self.pos
        logits = None
        for t in feed:  # catch the cache up with the tokens the target added
            logits = self.gen.step(t, pos)
            pos += 1
        self.pos, self.pending = pos, []
        while len(toks) < k and pos < C:
            assert logits is not None
            q = probabilities(logits, self.cfg)
            tok = int(np.argmax(q)) if self.cfg.greedy else self.sampler.draw(q)
            toks.append(tok)
            qs.append(q)
            if len(toks) == k or pos + 1 >= C:
                break
            logits = self.gen.step(tok, pos)
            pos += 1
        self._drafted = toks
        self.seconds += time.perf_counter() - t0
        return Proposal(toks, qs)

    def accepted(self, kept: list[int]) -> None:
        # the cache holds rows for the drafted tokens before the last one; keep those the
        # target kept (a common prefix of kept and drafted), re-feed the rest
        drafted = self._drafted
        same = 0
        while same < len(kept) and same < len(drafted) - 1 and kept[same] == drafted[same]:
            same += 1
        self.pos += same
        self.pending = kept[same:]


@dataclass
class SpecStats:
    proposer: str
    k_max: int
    adaptive: bool
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    host_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        passes = max(1, self.target_passes)
        return {
            "proposer": self.proposer, "k": self.k_max, "adaptive": self.adaptive,
            "target_passes": self.target_passes, "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "mean_accepted_length": (float(np.mean(self.accepted_lengths))
                                     if self.accepted_lengths else 0.0),
            "tokens_per_target_pass": self.emitted / passes,
            "time_split_s": {"draft": self.draft_s, "verify": self.verify_s,
                             "host": self.host_s},
        }


def speculative_generate(
    target,
    proposer,
    prompt_ids: list[int],
    max_new_tokens: int,
    sampler: Sampler | None = None,
    k: int = 4,
    adaptive: bool = True,
    eos_id: int | Iterable[int] | None = None,
    stop: Callable[[list[int]], bool] | None = None,
    on_step: Callable[[int, int], None] | None = None,
    on_pass: Callable[[int, int], None] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Generate like :meth:`StaticKVGenerator.generate`, checking drafted tokens in batches.

    ``target`` needs a verify graph (N new tokens per pass); ``k`` drafted tokens per pass
    at most N - 1. ``on_pass(drafted, kept)`` is called after every target pass. Returns
    the fields of ``generate`` (``step_s`` empty: tokens come in groups) plus
    ``speculative`` (:class:`SpecStats` as a dict) and ``wall_s`` (the whole decode after
    the first token, less the time spent in the caller's callbacks).
    """
    if not target.verify_len:
        raise StudioError("speculative decoding needs the model's verify graph: re-run the "
                          "export stage")
    k_max = min(int(k), target.verify_len - 1)
    if k_max < 1:
        raise StudioError(f"k must be at least 1 (got {k})")
    prompt_ids = [int(t) for t in prompt_ids]
    n = len(prompt_ids)
    if n == 0:
        raise StudioError("the prompt is empty; give at least one token")
    C = target.context_len
    if n >= C:
        raise StudioError(f"the prompt has {n} tokens but the KV cache holds {C}: shorten the "
                          "prompt or re-export with a longer context")
    sampler = sampler or Sampler()
    greedy = sampler.cfg.greedy
    eos = set() if eos_id is None else ({int(eos_id)} if isinstance(eos_id, int)
                                        else {int(e) for e in eos_id})
    stats = SpecStats(getattr(proposer, "name", type(proposer).__name__), k_max, adaptive)
    tokens: list[int] = []
    out: dict[str, Any] = {"tokens": tokens, "ttft_s": 0.0, "prefill_s": 0.0,
                           "prompt_chunks": 0, "step_s": [], "stopped": "max_new_tokens"}
    if max_new_tokens <= 0:
        out["speculative"] = stats.to_dict()
        return out
    t0 = time.perf_counter()
    logits, out["prompt_chunks"] = target.prefill_prompt(prompt_ids, progress)
    tok = sampler.pick(logits)
    out["ttft_s"] = out["prefill_s"] = time.perf_counter() - t0
    tokens.append(tok)
    if on_step is not None:
        on_step(0, tok)
    caller = [0.0]  # time in the caller's callbacks: not the decoder's
    if on_step is not None:
        user_step = on_step

        def on_step(i: int, t: int) -> None:
            c = time.perf_counter()
            user_step(i, t)
            caller[0] += time.perf_counter() - c
    if stop is not None:
        user_stop = stop

        def stop(toks: list[int]) -> bool:
            c = time.perf_counter()
            try:
                return user_stop(toks)
            finally:
                caller[0] += time.perf_counter() - c
    t_dec = time.perf_counter()
    t = time.perf_counter()
    proposer.start(prompt_ids + [tok])
    stats.draft_s += time.perf_counter() - t
    pos = n  # the cache slot of ``tok``, which the cache does not hold yet
    k_now = k_max
    stopped = "max_new_tokens"

    def finished() -> str | None:
        if tokens[-1] in eos:
            return "eos"
        if stop is not None and stop(tokens):
            return "stop"
        if len(tokens) >= max_new_tokens:
            return "max_new_tokens"
        if pos >= C:
            return "context_full"
        return None

    while (why := finished()) is None:
        if progress is not None:
            progress.check()
            progress.update(len(tokens) / max_new_tokens, f"token {len(tokens)}/{max_new_tokens}")
        room = min(k_now, max_new_tokens - len(tokens) - 1, C - pos - 1)
        t = time.perf_counter()
        prop = proposer.propose(max(0, room))
        stats.draft_s += time.perf_counter() - t
        drafts = prop.tokens[:max(0, room)]
        t = time.perf_counter()
        rows = target.verify([tok, *drafts], pos)
        stats.verify_s += time.perf_counter() - t
        stats.target_passes += 1
        stats.drafted += len(drafts)
        kept: list[int] = []
        new_tok = None
        for j, d in enumerate(drafts):
            p = probabilities(rows[j], sampler.cfg)
            q = prop.q[j] if prop.q is not None else _one_hot(d, len(p))
            if sampler.accept(p, q, d):
                kept.append(d)
                continue
            new_tok = (int(np.argmax(p)) if greedy
                       else sampler.draw(Sampler.residual(p, q)))
            break
        if new_tok is None:  # every draft kept: the target's own next token comes free
            new_tok = sampler.pick(rows[len(drafts)])
        stats.accepted += len(kept)
        stats.accepted_lengths.append(len(kept))
        emitted = [*kept, new_tok]
        # an EOS or a stop inside the kept tokens ends the text there
        for e in emitted:
            tokens.append(e)
            stats.emitted += 1
            if on_step is not None:
                on_step(len(tokens) - 1, e)
            if e in eos or (stop is not None and stop(tokens)) or len(tokens) >= max_new_tokens:
                break
        pos += 1 + len(kept)
        tok = new_tok
        if on_pass is not None:
            on_pass(len(drafts), len(kept))
        t = time.perf_counter()
        proposer.accepted(emitted)
        stats.draft_s += time.perf_counter() - t
        if adaptive and drafts:
            k_now = min(k_max, k_now + 1) if len(kept) == len(drafts) else max(1, len(kept) + 1)
    stopped = why
    wall = time.perf_counter() - t_dec - caller[0]
    stats.host_s = max(0.0, wall - stats.draft_s - stats.verify_s)
    out["stopped"] = stopped
    out["wall_s"] = wall
    out["speculative"] = stats.to_dict()
    if progress is not None:
        progress.update(1.0, f"{len(tokens)} tokens")
    return out


def _one_hot(token: int, size: int) -> np.ndarray:
    q = np.zeros(size, dtype=np.float64)
    q[token] = 1.0
    return q
