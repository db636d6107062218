"""Calibration data for the static-KV graphs: token windows and realistic graph feeds.

Prefill feeds are the windows' first tokens (some full, some shorter and padded, as real
prompts are). Decode feeds carry KV caches produced by the FP32 graphs themselves, at
positions spread over the context, so the quantizer sees the cache ranges and attention
patterns of real decoding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.core.progress import NullProgress, Progress
from studio.engine.llm_runtime import StaticKVGenerator, cpu_generator, make_cpu_session
from studio.engine.part_runner import part_prefill_caches

tokenizers = lazy_module("tokenizers")


def load_tokenizer(tokenizer_dir: Path):
    """The ``tokenizers`` tokenizer in ``tokenizer_dir/tokenizer.json``."""
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise StudioError(
            f"{tokenizer_dir} has no tokenizer.json; point to the model's tokenizer folder"
        )
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the library raises bare Exceptions
        raise StudioError(f"cannot read {path}: {exc}") from None


def calibration_windows(
    text: str,
    tokenizer_dir: Path,
    length: int,
    count: int,
    min_length: int | None = None,
) -> list[list[int]]:
    """``count`` windows of ``length`` tokens, evenly spaced over the tokenized ``text``.

    Windows overlap when the text is short. When the text has fewer than ``length``
    tokens but at least ``min_length``, the windows are shortened to the whole text.
    """
    if count < 1:
        raise StudioError(f"the number of calibration samples must be at least 1 (got {count})")
    if length < 1:
        raise StudioError(f"the calibration window length must be at least 1 (got {length})")
    if not text or not text.strip():
        raise StudioError(
            "the calibration text is empty; give a text file like the model's real input"
        )
    ids = load_tokenizer(tokenizer_dir).encode(text, add_special_tokens=False).ids
    n = len(ids)
    if n < length:
        if min_length is not None and n >= min_length:
            length = n
        else:
            need = length if min_length is None else min_length
            raise StudioError(
                f"the calibration text has {n} tokens, fewer than the {need} one window needs; "
                "give a longer calibration text"
            )
    span = n - length
    starts = [0] if count == 1 else [round(i * span / (count - 1)) for i in range(count)]
    return [ids[s : s + length] for s in starts]


def _decode_positions(start: int, end: int, count: int, shift: int) -> list[int]:
    """Up to ``count`` positions in [start, end), spread out and shifted by ``shift``."""
    if end <= start or count <= 0:
        return []
    span = end - start
    if count >= span:
        return list(range(start, end))
    step = span / count
    return sorted({start + (int(i * step) + shift) % span for i in range(count)})


def window_plan(window: list[int], j: int, P: int, C: int, decode_per_window: int
                ) -> tuple[list[int], int, list[int]]:
    """What calibration window ``j`` gives: its tokens (at most C), its prefill length (P for
    even j, about half as many, padded, for odd j, as real prompts are) and the positions
    whose decode feeds are captured (spread over the rest of the window)."""
    w = window[:C]
    half = max(1, P // 2)
    k = P if j % 2 == 0 else half + (j // 2) % max(1, P - half)
    k = max(1, min(k, len(w)))
    return w, k, _decode_positions(k, len(w), decode_per_window, shift=j)


def build_calibration_feeds(
    graphs_dir: Path,
    spec: dict,
    windows: list[list[int]],
    progress: Progress = NullProgress(),
    decode_per_window: int = 2,
    verify_feeds: list[dict] | None = None,
) -> tuple[list[dict], list[dict]]:
    """Feeds for the prefill and decode graphs of ``graphs_dir`` (FP32, run on the CPU).

    Window j gives one prefill feed (its first P tokens for even j, about half as many,
    padded, for odd j) and ``decode_per_window`` decode feeds: the FP32 graphs prefill the
    window's head, then decode its true tokens, and the cache is captured at positions
    spread over the rest of the window. With ``verify_feeds`` (a list to fill) and a
    ``verify.onnx`` beside the graphs, each decode feed has a verify feed twin: the window's
    next N true tokens at the same position over the same cache.
    """
    graphs_dir = Path(graphs_dir)
    if not windows:
        raise StudioError("no calibration windows; give a calibration text and at least one sample")
    P, C, V = int(spec["prompt_length"]), int(spec["context_length"]), int(spec["vocab_size"])
    for w in windows:
        if not w:
            raise StudioError("a calibration window is empty; give a longer calibration text")
        if max(w) >= V or min(w) < 0:
            raise StudioError(
                f"the tokenizer gives ids up to {max(w)} but the model's vocabulary has {V}; "
                "use the model's own tokenizer"
            )
    with_verify = verify_feeds is not None and (graphs_dir / "verify.onnx").is_file()
    gen = StaticKVGenerator(
        make_cpu_session(graphs_dir / "prefill.onnx"),
        make_cpu_session(graphs_dir / "decode.onnx"),
        spec,
        make_cpu_session(graphs_dir / "verify.onnx") if with_verify else None,
    )
    prefill_feeds: list[dict] = []
    decode_feeds: list[dict] = []
    for j, window in enumerate(windows):
        progress.check()
        progress.update(j / len(windows), f"calibration window {j + 1}/{len(windows)}")
        w, k, targets = window_plan(window, j, P, C, decode_per_window)
        prefill_feeds.append(gen.prefill_feed(w[:k]))
        if not targets:
            continue
        gen.prefill(w[:k])
        want = set(targets)
        for pos in range(k, targets[-1] + 1):
            if pos in want:
                decode_feeds.append(gen.decode_feed(w[pos], pos, copy=True))
                if with_verify and verify_feeds is not None:
                    n = min(gen.verify_len, C - pos, len(w) - pos)
                    feed = gen.verify_feed(w[pos:pos + n], pos)
                    verify_feeds.append({k: v.copy() for k, v in feed.items()})
            if pos < targets[-1]:
                gen.step(w[pos], pos)
            if (pos - k) % 32 == 31:
                progress.check()
    progress.update(
        1.0, f"{len(prefill_feeds)} prefill and {len(decode_feeds)} decode calibration feeds"
    )
    return prefill_feeds, decode_feeds


def ar_calibration_feeds(
    graphs_dir: Path,
    spec: dict,
    windows: list[list[int]],
    new_tokens: int,
    cache_slots: int,
) -> list[dict]:
    """Feeds for an AR-N graph (``new_tokens`` per pass over ``cache_slots`` cache slots; FP32,
    CPU): the FP32 graphs of ``graphs_dir`` prefill each window's head, and the feed is the
    window's next N true tokens over that cache (slots past ``cache_slots`` dropped)."""
    graphs_dir = Path(graphs_dir)
    N, slots = int(new_tokens), int(cache_slots)
    P, mask_value = int(spec["prompt_length"]), float(spec["mask_value"])
    heads = {j: min(P, slots, len(w) - N, max(1, P // 2 + j))  # cached tokens before the pass
             for j, w in enumerate(windows)}
    heads = {j: k for j, k in heads.items() if k >= 1}
    cached: dict[int, list] = {}
    if len(spec.get("parts") or []) > 1:  # one part's FP32 graphs in memory at a time

        got = part_prefill_caches(graphs_dir, spec, [windows[j][:k] for j, k in heads.items()],
                                  make_cpu_session)
        cached.update(zip(heads, got, strict=True))
    else:
        gen = cpu_generator(graphs_dir, spec)
    feeds = []
    for j, w in enumerate(windows):
        if j not in heads:
            continue
        k = heads[j]
        if len(spec.get("parts") or []) <= 1:
            gen.prefill(w[:k])
            cached[j] = [(kc, vc) for kc, vc in gen.cache]
        m = np.full((N, slots + N), mask_value, dtype=np.float32)
        m[:, :k] = 0.0
        for r in range(N):
            m[r, slots:slots + r + 1] = 0.0
        feed = {"input_ids": np.asarray([w[k:k + N]], dtype=np.int64),
                "position_ids": np.arange(k, k + N, dtype=np.int64)[None],
                "attention_mask": m[None, None]}
        for i, (kc, vc) in enumerate(cached[j]):
            feed[f"past_key_{i}"] = np.ascontiguousarray(kc[:, :, :slots, :], dtype=np.float32)
            feed[f"past_value_{i}"] = np.ascontiguousarray(vc[:, :, :slots, :], dtype=np.float32)
        feeds.append(feed)
    if not feeds:
        raise StudioError(f"the calibration windows are shorter than the AR-{N} graph's "
                          f"{N} tokens: give a longer calibration text")
    return feeds
