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

- **Overlap** (``overlap=True``, a draft model): while the target verifies a window, the
  draft drafts the next one in a thread of its own, from the optimistic continuation (every
  drafted token kept and the target's own next token the draft's guess). When the target
  keeps all of it the next window is ready; otherwise the drafted-ahead tokens are dropped
  and both caches roll back to the accepted prefix (the masks hide the rows past it). The
  tokens are the target's either way: greedy output stays plain greedy's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
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
    """A small causal LM on its own static cache (a :class:`StaticKVGenerator`).

    State: ``pos`` tokens of the agreed sequence are in the draft's cache, ``pending`` are
    agreed but not fed yet, and ``_drafted`` is the draft's own continuation after them (its
    rows in the cache but for the last token's). What the target keeps of that continuation
    stays drafted (:meth:`accepted`): the next window then starts from it (:meth:`extend`
    drafts further), which is what lets a thread draft ahead while the target verifies."""

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
        self._drafted: list[int] = []  # the draft's continuation after the agreed tokens
        self._qs: list[np.ndarray] = []  # its distribution at each of them
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
        self._drafted, self._qs = [], []
        self.seconds += time.perf_counter() - t0

    def _pick(self, logits: np.ndarray) -> tuple[int, np.ndarray]:
        q = probabilities(logits, self.cfg)
        return (int(np.argmax(q)) if self.cfg.greedy else self.sampler.draw(q)), q

    def propose(self, k: int) -> Proposal:
        """Up to ``k`` drafted tokens after the agreed sequence: the continuation kept from
        before (drafted ahead), extended by the draft where it is shorter."""
        t0 = time.perf_counter()
        if self.pending:  # catch the cache up with the tokens the target added
            logits = None
            for t in self.pending:
                logits = self.gen.step(t, self.pos)
                self.pos += 1
            self.pending = []
            assert logits is not None
            if k > 0 and self.pos < self.gen.context_len:
                tok, q = self._pick(logits)
                self._drafted, self._qs = [tok], [q]
            else:
                self._drafted, self._qs = [], []
        del self._drafted[max(0, k):], self._qs[max(0, k):]
        self.seconds += time.perf_counter() - t0
        if len(self._drafted) < k:
            self.extend(k - len(self._drafted))
        return Proposal(list(self._drafted), list(self._qs))

    def extend(self, more: int, stop: threading.Event | None = None) -> int:
        """Draft ``more`` tokens past the continuation (fewer at the end of the cache, or
        when ``stop`` is set between steps); returns how many it drafted."""
        t0 = time.perf_counter()
        C = self.gen.context_len
        done = 0
        if not self._drafted:
            self.seconds += time.perf_counter() - t0
            return 0
        pos = self.pos + len(self._drafted) - 1  # where the last drafted token goes
        while done < more and pos + 1 < C and not (stop is not None and stop.is_set()):
            tok, q = self._pick(self.gen.step(self._drafted[-1], pos))
            pos += 1
            self._drafted.append(tok)
            self._qs.append(q)
            done += 1
        self.seconds += time.perf_counter() - t0
        return done

    def accepted(self, kept: list[int]) -> int:
        """``kept``: the drafted tokens the target kept plus its own next token. The cache
        holds rows for the drafted tokens before the last one: those the target kept (a
        common prefix) stay, the rest are re-fed; a continuation the target followed all
        the way (its own token the draft's guess) stays drafted: returns how many of its
        tokens the next window starts from."""
        drafted = self._drafted
        agree = 0
        while agree < len(kept) and agree < len(drafted) and kept[agree] == drafted[agree]:
            agree += 1
        same = min(agree, len(drafted) - 1) if drafted else 0
        self.pos += same
        self.pending = kept[same:]
        if agree == len(kept) and not self.pending:  # the rest of the continuation holds
            self._drafted, self._qs = drafted[agree:], self._qs[agree:]
        else:
            self._drafted, self._qs = [], []
        return len(self._drafted)


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
    overlap: bool = False
    both_busy_s: float = 0.0  # the draft drafting ahead while the target verifies
    target_wait_s: float = 0.0  # the target idle: waiting for a window to verify
    draft_wait_s: float = 0.0  # the draft idle while the target verifies
    ahead_drafted: int = 0  # tokens drafted ahead during verify passes
    ahead_used: int = 0  # of them, tokens the next window took

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
            "overlap": self.overlap,
            # per the whole decode: what each side did and waited for (sequential: the
            # target waits for every draft, the draft for every verify pass)
            "busy_s": {"draft": self.draft_s, "target": self.verify_s,
                       "both": self.both_busy_s},
            "waiting_s": {"target": self.target_wait_s, "draft": self.draft_wait_s},
            "ahead": {"drafted": self.ahead_drafted, "used": self.ahead_used},
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
    overlap: bool = False,
) -> dict[str, Any]:
    """Generate like :meth:`StaticKVGenerator.generate`, checking drafted tokens in batches.

    ``target`` needs a verify graph (N new tokens per pass); ``k`` drafted tokens per pass
    at most N - 1. ``on_pass(drafted, kept)`` is called after every target pass. Returns
    the fields of ``generate`` (``step_s`` empty: tokens come in groups) plus
    ``speculative`` (:class:`SpecStats` as a dict) and ``wall_s`` (the whole decode after
    the first token, less the time spent in the caller's callbacks).

    ``overlap``: the proposer (a draft model: it needs ``extend``) drafts the next window in
    a thread of its own while the target verifies (see the module's notes).
    """
    k_max, prompt_ids = _check_request(target, proposer, k, prompt_ids, overlap)
    sampler = sampler or Sampler()
    eos = _eos_set(eos_id)
    stats = SpecStats(getattr(proposer, "name", type(proposer).__name__), k_max, adaptive,
                      overlap=overlap)
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
    run = _Decode(target, proposer, sampler, eos, max_new_tokens, stats, tokens,
                  tok, len(prompt_ids), k_max, adaptive, progress, on_pass)
    run.time_callbacks(on_step, stop)
    t_dec = time.perf_counter()
    t = time.perf_counter()
    proposer.start(prompt_ids + [tok])
    stats.draft_s += time.perf_counter() - t
    stopped = run.decode(overlap)
    wall = time.perf_counter() - t_dec - run.caller_s
    stats.host_s = max(0.0, wall - stats.draft_s - stats.verify_s + stats.both_busy_s)
    out["stopped"] = stopped
    out["wall_s"] = wall
    out["speculative"] = stats.to_dict()
    if progress is not None:
        progress.update(1.0, f"{len(tokens)} tokens")
    return out


def _check_request(target, proposer, k: int, prompt_ids: list[int], overlap: bool
                   ) -> tuple[int, list[int]]:
    """The drafted tokens per pass at most, and the prompt as ints; refuses a request the
    target or the proposer cannot serve."""
    if overlap and not hasattr(proposer, "extend"):
        raise StudioError("overlapped drafting needs a draft model (prompt lookup drafts "
                          "without one, at no cost): drop --overlap or give --draft")
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
    return k_max, prompt_ids


def _eos_set(eos_id: int | Iterable[int] | None) -> set[int]:
    return set() if eos_id is None else ({int(eos_id)} if isinstance(eos_id, int)
                                         else {int(e) for e in eos_id})


class _Decode:
    """One speculative decode after the first token: the tokens so far, the cache slot of
    the last one (``pos``: the cache does not hold it yet), the window size now, and the
    passes of drafting and verifying until it is finished."""

    def __init__(self, target, proposer, sampler: Sampler, eos: set[int],
                 max_new_tokens: int, stats: SpecStats, tokens: list[int], tok: int,
                 pos: int, k_max: int, adaptive: bool, progress: Progress | None,
                 on_pass: Callable[[int, int], None] | None) -> None:
        self.target, self.proposer, self.sampler = target, proposer, sampler
        self.greedy = sampler.cfg.greedy
        self.eos, self.max_new_tokens, self.stats = eos, max_new_tokens, stats
        self.tokens, self.tok, self.pos = tokens, tok, pos
        self.C = target.context_len
        self.k_max = self.k_now = k_max
        self.adaptive, self.progress, self.on_pass = adaptive, progress, on_pass
        self.on_step: Callable[[int, int], None] | None = None
        self.stop: Callable[[list[int]], bool] | None = None
        self.caller_s = 0.0  # time in the caller's callbacks: not the decoder's
        self.pool: ThreadPoolExecutor | None = None
        self.halt = threading.Event()

    def time_callbacks(self, on_step: Callable[[int, int], None] | None,
                       stop: Callable[[list[int]], bool] | None) -> None:
        """The caller's callbacks, their time kept apart in ``caller_s``."""
        if on_step is not None:
            user_step = on_step

            def timed_step(i: int, t: int) -> None:
                c = time.perf_counter()
                user_step(i, t)
                self.caller_s += time.perf_counter() - c
            self.on_step = timed_step
        if stop is not None:
            user_stop = stop

            def timed_stop(toks: list[int]) -> bool:
                c = time.perf_counter()
                try:
                    return user_stop(toks)
                finally:
                    self.caller_s += time.perf_counter() - c
            self.stop = timed_stop

    def finished(self) -> str | None:
        tokens = self.tokens
        if tokens[-1] in self.eos:
            return "eos"
        if self.stop is not None and self.stop(tokens):
            return "stop"
        if len(tokens) >= self.max_new_tokens:
            return "max_new_tokens"
        if self.pos >= self.C:
            return "context_full"
        return None

    def decode(self, overlap: bool) -> str:
        """Passes until the text is finished (``overlap``: the draft drafting ahead in a
        thread of its own while the target verifies); why it stopped."""
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="qstudio-draft") \
            if overlap else None
        why = self.finished()
        try:
            while why is None:
                self.one_pass()
                why = self.finished()
        finally:
            if self.pool is not None:
                self.halt.set()
                self.pool.shutdown(wait=True)
        return why

    def ahead(self, more: int) -> tuple[float, float, int]:  # in the draft's thread
        a0 = time.perf_counter()
        n_ahead = self.proposer.extend(more, self.halt)
        return a0, time.perf_counter(), n_ahead

    def one_pass(self) -> None:
        """Draft a window, verify it in one target pass, keep what the target accepts."""
        stats, tokens = self.stats, self.tokens
        if self.progress is not None:
            self.progress.check()
            self.progress.update(len(tokens) / self.max_new_tokens,
                                 f"token {len(tokens)}/{self.max_new_tokens}")
        room = max(0, min(self.k_now, self.max_new_tokens - len(tokens) - 1,
                          self.C - self.pos - 1))
        t = time.perf_counter()
        prop = self.proposer.propose(room)
        spent = time.perf_counter() - t
        stats.draft_s += spent
        stats.target_wait_s += spent  # the target has nothing to verify meanwhile
        drafts = prop.tokens[:room]
        job = None
        if self.pool is not None and drafts:
            # the optimistic continuation: the target's own next token (the draft's
            # guess), then the next window at the size it has if every draft is kept
            self.halt.clear()
            job = self.pool.submit(self.ahead, 1 + min(self.k_max, self.k_now + 1))
        kept, new_tok = self.verify(drafts, prop, job)
        self.emit(drafts, kept, new_tok, job is not None)

    def verify(self, drafts: list[int], prop: Proposal, job) -> tuple[list[int], int]:
        """The target's pass over the window: the drafts it keeps and its own next token;
        the time each side spent and waited (the draft's work ahead, where it drafts
        ahead)."""
        stats = self.stats
        v0 = time.perf_counter()
        rows = self.target.verify([self.tok, *drafts], self.pos)
        v1 = time.perf_counter()
        stats.verify_s += v1 - v0
        kept, new_tok = _judge(rows, drafts, prop, self.sampler, self.greedy)
        if job is None:
            stats.draft_wait_s += v1 - v0
        else:
            if len(kept) < len(drafts):
                self.halt.set()  # a rejection: what the draft drafts ahead is dropped
            a0, a1, n_ahead = job.result()
            w = time.perf_counter()
            both = max(0.0, min(a1, v1) - max(a0, v0))
            stats.draft_s += a1 - a0
            stats.both_busy_s += both
            stats.draft_wait_s += (v1 - v0) - both
            stats.target_wait_s += max(0.0, w - v1)
            stats.ahead_drafted += n_ahead
        return kept, new_tok

    def emit(self, drafts: list[int], kept: list[int], new_tok: int, ahead: bool) -> None:
        """The kept drafts and the target's token into the text (an EOS or a stop inside
        them ends it there), the proposer told, the window resized."""
        stats, tokens = self.stats, self.tokens
        stats.target_passes += 1
        stats.drafted += len(drafts)
        stats.accepted += len(kept)
        stats.accepted_lengths.append(len(kept))
        emitted = [*kept, new_tok]
        # an EOS or a stop inside the kept tokens ends the text there
        for e in emitted:
            tokens.append(e)
            stats.emitted += 1
            if self.on_step is not None:
                self.on_step(len(tokens) - 1, e)
            if e in self.eos or (self.stop is not None and self.stop(tokens)) or \
                    len(tokens) >= self.max_new_tokens:
                break
        self.pos += 1 + len(kept)
        self.tok = new_tok
        if self.on_pass is not None:
            self.on_pass(len(drafts), len(kept))
        t = time.perf_counter()
        carried = self.proposer.accepted(emitted) or 0
        spent = time.perf_counter() - t
        stats.draft_s += spent
        stats.target_wait_s += spent
        if ahead:
            stats.ahead_used += carried
        if self.adaptive and drafts:
            self.k_now = (min(self.k_max, self.k_now + 1) if len(kept) == len(drafts)
                          else max(1, len(kept) + 1))


def _judge(rows: np.ndarray, drafts: list[int], prop: Proposal, sampler: Sampler,
           greedy: bool) -> tuple[list[int], int]:
    """The drafted tokens the target keeps (a prefix) and its own next token."""
    kept: list[int] = []
    for j, d in enumerate(drafts):
        p = probabilities(rows[j], sampler.cfg)
        q = prop.q[j] if prop.q is not None else _one_hot(d, len(p))
        if sampler.accept(p, q, d):
            kept.append(d)
            continue
        return kept, (int(np.argmax(p)) if greedy else sampler.draw(Sampler.residual(p, q)))
    return kept, sampler.pick(rows[len(drafts)])


def _one_hot(token: int, size: int) -> np.ndarray:
    q = np.zeros(size, dtype=np.float64)
    q[token] = 1.0
    return q
