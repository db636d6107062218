"""The graphs of a model's parts run one part at a time (a model whose graphs do not fit the
host's memory together): :class:`PartRunner` runs one part's prefill and decode graphs over
its own KV cache, :func:`run_part_graphs` teacher-forces positions through a part,
:class:`StreamedScorer` scores a window part after part and :func:`part_prefill_caches` gives
the KV caches after prefilling. (All parts at once, as one graph:
:class:`studio.engine.chain.ChainSession`.)"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.parts import Part
from studio.core.progress import Progress, SubProgress
from studio.engine.chain import part_dirs
from studio.engine.graphio import as_floats
from studio.engine.llm_runtime import SLIDING_MASK, decode_mask, mask_windows, prefill_mask


def iter_parts(spec: dict) -> Iterator[Part]:
    """The parts of an exported spec (one whole part when it has none)."""
    L = int(spec["num_layers"])
    rows = spec.get("parts") or [{"index": 0, "start": 0, "stop": L}]
    for r in rows:
        yield Part(int(r["index"]), len(rows), int(r["start"]), int(r["stop"]), L,
                   int(r.get("parameters") or 0))


class PartRunner:
    """One part's prefill and decode graphs over a host KV cache of its own blocks, fed its
    first input (token ids for the first part, the previous part's residual stream for the
    others) a pass at a time: what teacher forcing, calibration and the export check run on
    one part while the others are not in memory."""

    def __init__(self, folder: Path, part: Part, spec: dict, make, decode: bool = True):
        self.part, self.spec = part, spec
        self.P, self.C = int(spec["prompt_length"]), int(spec["context_length"])
        KV, D = int(spec["num_kv_heads"]), int(spec["head_dim"])
        self.full, self.sliding = mask_windows(spec)
        self.mask_value = float(spec["mask_value"])
        self.first = "input_ids" if part.embeds else str(part.hidden_in)
        self.kv = [(f"past_key_{i}", f"past_value_{i}") for i in part.layers]
        self.present = [m for i in part.layers for m in (f"present_key_{i}", f"present_value_{i}")]
        self.out_name = "logits" if part.heads else str(part.hidden_out)
        self.cache = [[np.zeros((1, KV, self.C, D), np.float32) for _ in range(2)]
                      for _ in self.kv]

        # the cache and the residual stream are float32 here: a graph with quantized I/O
        # gives them back as values
        self.folder, self.make = Path(folder), (lambda path: as_floats(make(path)))
        self.prefill_session = self.make(self.folder / "prefill.onnx")
        self.decode_session = self.make(self.folder / "decode.onnx") if decode else None

    def _first(self, rows):
        if self.part.embeds:
            return np.asarray(rows, dtype=np.int64).reshape(1, -1)
        return np.asarray(rows, dtype=np.float32)[None]

    def prefill_feed(self, rows, n: int) -> dict:
        """Feeds for the prefill graph: ``rows`` (P ids or [P, H] states; the first ``n``
        real, the rest padding, which sees only itself)."""
        P = self.P
        feeds = {self.first: self._first(rows), "position_ids": np.arange(P, dtype=np.int64)[None],
                 "attention_mask": prefill_mask(n, P, self.mask_value, self.full)[None, None]}
        if self.sliding is not None:
            feeds[SLIDING_MASK] = prefill_mask(n, P, self.mask_value, self.sliding)[None, None]
        return feeds

    def prefill(self, rows, n: int):
        """Run prefill; fills cache slots 0..n-1; returns the graph's first output [P, ...]
        (every row, padding included: the next part takes them all)."""
        outs = self.prefill_session.run([self.out_name, *self.present], self.prefill_feed(rows, n))
        for c in self.cache:
            for buf in c:
                buf[:] = 0
        for j in range(len(self.kv)):
            for t in range(2):
                self.cache[j][t][:, :, :n] = outs[1 + 2 * j + t][:, :, :n]
        return outs[0][0]

    def decode_feed(self, row, pos: int, copy: bool = False) -> dict:
        C = self.C
        feeds = {self.first: self._first([row] if self.part.embeds else row[None]),
                 "position_ids": np.array([[pos]], dtype=np.int64),
                 "attention_mask": decode_mask(pos, C, self.mask_value, self.full)[None, None, None]}
        if self.sliding is not None:
            feeds[SLIDING_MASK] = decode_mask(pos, C, self.mask_value, self.sliding)[None, None, None]
        for (kn, vn), (k, v) in zip(self.kv, self.cache, strict=True):
            feeds[kn], feeds[vn] = (k.copy(), v.copy()) if copy else (k, v)
        return feeds

    def step(self, row, pos: int):
        """One decode step at ``pos``; its KV row goes into slot ``pos``; returns the output
        row ([H] states or [V] logits)."""
        if self.decode_session is None:
            raise StudioError("this part runner has no decode graph")
        outs = self.decode_session.run([self.out_name, *self.present], self.decode_feed(row, pos))
        for j in range(len(self.kv)):
            for t in range(2):
                self.cache[j][t][:, :, pos:pos + 1] = outs[1 + 2 * j + t]
        return outs[0][0, -1]

    def close(self) -> None:
        self.prefill_session = self.decode_session = None


def run_part_graphs(folder: Path, part: Part, spec: dict, x, n: int, make, on_logits=None,
                     progress: Progress | None = None):
    """Teacher-force ``n`` positions through one part's prefill then decode graphs (the
    prefill session dropped before the decode one is made): the part's outputs [n, H], or
    for the last part ``on_logits(position, logits)`` for every position."""
    P = int(spec["prompt_length"])
    k = min(P, n)
    runner = PartRunner(folder, part, spec, make, decode=False)
    rows = np.asarray(x[:k])
    if k < P:  # pad the prompt to P (the prefill graph's static length)
        rows = np.concatenate([rows, np.zeros((P - k, *rows.shape[1:]), rows.dtype)])
    first = runner.prefill(rows, k)
    hidden = None if part.heads else np.zeros((n, int(spec["hidden_size"])), np.float32)
    if hidden is not None:
        hidden[:k] = first[:k]
    else:
        for p in range(k):
            on_logits(p, first[p])
    runner.prefill_session = None
    runner.decode_session = runner.make(Path(folder) / "decode.onnx")
    for p in range(k, n):
        if progress is not None and p % 16 == 0:
            progress.check()
            progress.update(p / n, f"part {part.index + 1}/{part.count}: position {p}/{n}")
        out = runner.step(x[p], p)
        if hidden is not None:
            hidden[p] = out
        else:
            on_logits(p, out)
    runner.close()
    return hidden


def part_prefill_caches(graphs_dir: Path, spec: dict, heads: list[list[int]], make
                        ) -> list[list[tuple[Any, Any]]]:
    """Every layer's KV cache after prefilling each of ``heads`` (at most P tokens each),
    computed part by part with one part's prefill graph in memory at a time (a model whose
    FP32 graphs do not fit the host's memory together: the 8 B shape's are 32 GB). Returns,
    per head, [(keys, values) per layer] of shape [1, kv_heads, C, head_dim]."""
    P = int(spec["prompt_length"])
    xs: list[Any] = [np.asarray(h, dtype=np.int64) for h in heads]
    caches: list[list[tuple[Any, Any]]] = [[] for _ in heads]
    for part, folder in zip(iter_parts(spec), part_dirs(spec, Path(graphs_dir)), strict=True):
        runner = PartRunner(folder, part, spec, make, decode=False)
        for j, x in enumerate(xs):
            k = len(heads[j])
            if not 0 < k <= P:
                raise StudioError(f"a prefill of {k} tokens does not fit the prefill graph's "
                                  f"{P}")
            rows = np.asarray(x[:k])
            if k < P:
                rows = np.concatenate([rows, np.zeros((P - k, *rows.shape[1:]), rows.dtype)])
            first = runner.prefill(rows, k)
            caches[j].extend((kc.copy(), vc.copy()) for kc, vc in runner.cache)
            if not part.heads:
                xs[j] = np.asarray(first[:k], dtype=np.float32)
        runner.close()
        gc.collect()
    return caches


class StreamedScorer:
    """Teacher-forced logits of a model in parts with one part's graphs in memory at a time:
    each part runs every position of the window (prefill, then decode steps over its own KV
    cache) and hands its residual stream to the next, whose graphs are loaded after the
    previous part's are dropped. The figures equal the chained graphs' (the same graphs, the
    same order of operations per part); the peak memory is one part's, whatever the depth.
    Progress names the part and the position."""

    def __init__(self, graphs_dir: Path, spec: dict, make):
        self.graphs_dir, self.spec, self.make = Path(graphs_dir), spec, make
        self.vocab_size = int(spec["vocab_size"])

    def teacher_forced_logits(self, ids: list[int], progress: Progress | None = None):
        """Logits [len(ids), V] (float32); row i predicts token i + 1 (as
        :meth:`studio.engine.llm_runtime.StaticKVGenerator.teacher_forced_logits`)."""
        n = len(ids)
        if n == 0:
            raise StudioError("no tokens to score; give at least one token")
        if n > int(self.spec["context_length"]):
            raise StudioError(f"{n} tokens do not fit the KV cache of C="
                              f"{self.spec['context_length']}; score windows of at most C tokens")
        out = np.empty((n, self.vocab_size), dtype=np.float32)

        def on_logits(p: int, logits) -> None:
            out[p] = np.asarray(logits, dtype=np.float32)[: self.vocab_size]

        x: Any = np.asarray(ids, dtype=np.int64)
        parts = list(iter_parts(self.spec))
        for part, folder in zip(parts, part_dirs(self.spec, self.graphs_dir), strict=True):
            sub = (SubProgress(progress, part.index / len(parts), (part.index + 1) / len(parts))
                   if progress is not None else None)
            if sub is not None:
                sub.check()
                sub.update(0.0, f"part {part.index + 1}/{len(parts)}: loading its graphs")
            x = run_part_graphs(folder, part, self.spec, x, n, self.make,
                                 on_logits if part.heads else None, sub)
            gc.collect()
        return out
