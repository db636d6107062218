"""Running the deployable binaries the compile stage recorded (:mod:`studio.engine.deploy`).

:class:`DeployedGenerator` is the studio's generator API (:class:`StaticKVGenerator`) over
those binaries, fed the way Genie feeds them (:class:`studio.engine.genie.BundleRunner`):
a prompt in AR-N chunks, then AR-1 steps; the AR-N graph doubles as the verify graph of
speculative decoding. :class:`PartScorer` runs a model in parts one part at a time (the
checks that scale)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.progress import Progress
from studio.engine import genie, qnn, qnn_system
from studio.engine.deploy import read
from studio.engine.llm_runtime import StaticKVGenerator


def graph_paths(compile_dir: Path, record: dict[str, Any]) -> dict[int, list[Path]]:
    """{AR: the compiled context models of that graph's parts, in order}."""
    out: dict[int, list[Path]] = {}
    for row in sorted(record["graphs"], key=lambda r: (r["ar"], r["part"])):
        out.setdefault(int(row["ar"]), []).append(Path(compile_dir) / row["ctx"])
    return out


def open_runner(compile_dir: Path, chip, spec: dict[str, Any],
                run_options: dict[str, str] | None = None, record: dict | None = None):
    """The studio's runtime over the deployable binaries of ``compile_dir`` on the QNN HTP
    (every part loaded): a :class:`studio.engine.genie.BundleRunner`."""

    record = record or read(compile_dir)
    if record is None:
        raise StudioError(f"{compile_dir} holds no deployable binaries: run the compile stage")
    sessions = {ar: [qnn.make_session(p, chip, strict=True, extra_options=run_options)
                     for p in paths]
                for ar, paths in graph_paths(compile_dir, record).items()}
    return genie.BundleRunner(sessions, spec, int(record["context_size"]),
                              cache_encodings(record))


def cache_encodings(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every cache tensor's encoding (``key_<layer>`` / ``value_<layer>``, all parts') of
    deployable binaries with quantized graph I/O; {} for float I/O."""
    out: dict[str, dict[str, Any]] = {}
    for part in record.get("kv_cache", {}).get("encodings") or []:
        out.update(part or {})
    return out


class DeployedGenerator:
    """The studio's generator API over a :class:`BundleRunner` — what ``studio generate``,
    validate and the run stage call on the HTP — so they run the binaries that ship, fed as
    Genie feeds them. Greedy text equals Genie's on the same binaries by construction."""

    def __init__(self, runner, spec: dict[str, Any]) -> None:
        self.runner = runner
        self.num_layers = int(spec["num_layers"])
        self.vocab_size = int(spec["vocab_size"])
        self.prompt_len = int(spec["prompt_length"])
        cl = runner.cl
        self.context_len = cl - 1
        self.rope_positions = self.context_len
        self.ring_window = None
        self.window = None
        self.vision = None
        self.rope_offset = 0
        ars = sorted(runner.graphs)
        self.verify_len = ars[-1] if ars[-1] > 1 else 0
        self.verify_session = True if self.verify_len else None

    # the StaticKVGenerator surface ------------------------------------------------------------
    @property
    def cache(self) -> list[list[Any]]:
        """The host-side cache as the binaries take it, per layer [keys, values] (keys
        transposed, as Genie keeps them)."""
        return [[self.runner.keys[i], self.runner.values[i]] for i in range(self.num_layers)]

    def reset(self) -> None:
        self.runner.reset()

    def set_window(self, window: int | None) -> None:
        if window is not None:
            raise StudioError("the deployable binaries keep a static cache (as Genie runs "
                              "them): a sliding window runs on the host CPU (--device cpu)")

    def set_image(self, embeds, grid=None) -> None:
        raise StudioError("this model takes no image: it is not a vision-language model")

    def prefill_prompt(self, ids: list[int], progress: Progress | None = None):
        """The prompt as Genie runs it: AR-N passes where the context allows, AR-1 passes for
        the rest. Returns (logits of the last prompt token [V], passes)."""
        if progress is not None:
            progress.check()
        self.runner.reset()
        passes = self.runner._prompt([int(t) for t in ids], rows=False)
        return np.asarray(passes[-1], dtype=np.float32), len(passes)

    def prefill(self, ids: list[int]):
        """Logits [n, V] of ``ids`` from position 0 (the cache holds them after)."""
        return self.runner.teacher_forced([int(t) for t in ids])

    def step(self, token: int, pos: int):
        if not 0 <= pos < self.context_len:
            raise StudioError(f"position {pos} is outside the KV cache of {self.context_len} "
                              "slots")
        return np.asarray(self.runner._pass([int(token)], pos, 1), dtype=np.float32)

    def verify(self, tokens: list[int], pos: int):
        """The AR-N graph as the verify graph: ``tokens`` (at most N) at ``pos``..; their
        logits [n, V]. Rejected rows stay in the cache, hidden by every later mask."""
        n = len(tokens)
        if not self.verify_len:
            raise StudioError("the deployable binaries have no AR-N graph (bundle."
                              "prefill_length = 1): speculative decoding needs one")
        if not 0 < n <= self.verify_len:
            raise StudioError(f"the AR-{self.verify_len} graph takes 1..{self.verify_len} "
                              f"tokens, not {n}")
        if pos + self.verify_len > self.runner.cl - 1 or pos > self.runner.cl - \
                self.verify_len:
            # too near the end for an AR-N pass: one token at a time, as Genie does
            rows = [self.runner._pass([int(t)], pos + k, 1) for k, t in enumerate(tokens)]
            return np.asarray(np.stack(rows), dtype=np.float32)
        return np.asarray(self.runner._pass([int(t) for t in tokens], pos, self.verify_len,
                                            rows=True), dtype=np.float32)

    def teacher_forced_logits(self, ids: list[int], progress: Progress | None = None):
        if progress is not None:
            progress.check()
        out = self.runner.teacher_forced([int(t) for t in ids])[:, :self.vocab_size]
        if progress is not None:
            progress.update(1.0, f"{len(ids)} tokens scored")
        return np.asarray(out, dtype=np.float32)

    def greedy(self, prompt_ids, max_new_tokens, eos_id=None, on_step=None, progress=None):
        return self.generate(prompt_ids, max_new_tokens, eos_id=eos_id, on_step=on_step,
                             progress=progress)

    def generate(self, prompt_ids, max_new_tokens, sampler=None, eos_id=None, stop=None,
                 on_step=None, progress=None):
        return StaticKVGenerator.generate(self, prompt_ids, max_new_tokens, sampler=sampler,
                                          eos_id=eos_id, stop=stop, on_step=on_step,
                                          progress=progress)


def generator(compile_dir: Path, chip, spec: dict[str, Any],
              run_options: dict[str, str] | None = None) -> DeployedGenerator:
    """A :class:`DeployedGenerator` over the deployable binaries of ``compile_dir``."""
    return DeployedGenerator(open_runner(compile_dir, chip, spec, run_options), spec)


def decode_context(compiled: Path) -> Path:
    """The compiled decode (AR-1) context model of ``compiled`` — a compile stage's output or
    one part's folder in it: the deployable set's where there is one, else the studio's own
    ``decode_ctx.onnx``."""
    compiled = Path(compiled)
    for root, part in ((compiled, None), (compiled.parent, compiled.name)):
        record = read(root)
        if record is None:
            continue
        names = record.get("part_names") or []
        index = names.index(part) + 1 if part in names else 1
        row = next(r for r in record["graphs"] if r["ar"] == 1 and r["part"] == index)
        return root / row["ctx"]
    return compiled / "decode_ctx.onnx"


def _handoff_encoding(ctx: Path) -> tuple[float, int] | None:
    """(scale, offset) of the hand-off a part's compiled graph gives, read from its context
    binary with the QNN system library (None where it has none)."""

    for g in qnn_system.context_info(ctx)["graphs"]:
        for t in g["outputs"]:
            enc = t.get("encoding") or {}
            if t["name"].startswith(genie.HANDOFF) and enc.get("kind") == "scale_offset":
                return float(enc["scale"]), int(enc["offset"])
    return None


class PartScorer:
    """The deployable binaries scored one part at a time: each part's compiled graphs loaded
    alone, run over every pass of a window as Genie would run it, fed the hand-off the part
    before recorded; the last part gives the logits. A model whose binaries the HTP cannot
    hold at once (the simulator: about 6.7 GB) is still scored on the binaries that ship.
    ``handoffs`` keeps, per part, the last window's hand-off rows (for the part checks)."""

    def __init__(self, compile_dir: Path, chip, spec: dict[str, Any],
                 run_options: dict[str, str] | None = None) -> None:
        self.dir, self.chip, self.spec = Path(compile_dir), chip, spec
        record = read(compile_dir)
        if record is None:
            raise StudioError(f"{compile_dir} holds no deployable binaries: run the compile "
                              "stage")
        self.record: dict[str, Any] = record
        self.options = run_options
        self.cl = int(self.record["context_size"])
        self.pad = int(spec.get("pad_token_id") or 0)
        self.vocab = int(spec["vocab_size"])
        # per part but the last, the last window's hand-off rows [n, hidden] as the binaries
        # hand them on (uint16) and their encoding (scale, offset: QNN's, offset = -zp)
        self.handoffs: list[Any] = []
        self.handoff_encodings: list[tuple[float, int] | None] = []

    def run(self, ids: list[int], progress: Progress | None = None) -> list[Any]:
        """Each pass's real rows of logits, part by part (see the class)."""

        paths = graph_paths(self.dir, self.record)
        schedule = genie.prompt_schedule(len(ids), max(paths), self.cl)
        carried: list[dict[str, Any]] = [{} for _ in schedule]  # hand-offs, per pass
        parts = len(paths[1])
        logits: list[Any] = []
        self.handoffs, self.handoff_encodings = [], []
        kvh, hd = int(self.spec["num_kv_heads"]), int(self.spec["head_dim"])
        for k in range(parts):
            if progress is not None:
                progress.check()
                progress.update(k / parts, f"part {k + 1}/{parts}: its binaries alone")
            sessions = {ar: qnn.make_session(paths[ar][k], self.chip, strict=True,
                                             extra_options=self.options)
                        for ar in {n for _, _, n in schedule}}
            names = {i.name: i.type for s in sessions.values() for i in s.get_inputs()}
            layers = sorted(int(n.split("_")[2]) for n in names
                            if n.startswith("past_key_") and n.endswith("_in"))
            dtype = np.uint16 if names.get(f"past_key_{layers[0]}_in") == "tensor(uint16)" \
                else np.float32
            zero = cache_encodings(self.record) if dtype == np.uint16 else {}
            keys = {i: np.full((1, kvh, hd, self.cl - 1),
                               zero.get(f"key_{i}", {}).get("zero_point", 0), dtype)
                    for i in layers}
            values = {i: np.full((1, kvh, self.cl - 1, hd),
                                 zero.get(f"value_{i}", {}).get("zero_point", 0), dtype)
                      for i in layers}
            for j, (pos, take, ar) in enumerate(schedule):
                sess, slots = sessions[ar], self.cl - ar
                feed = genie.pass_feeds(ids[pos:pos + take], pos, ar, self.cl, self.pad)
                feed.update(carried[j])
                for i in layers:
                    feed[f"past_key_{i}_in"] = keys[i][..., :slots]
                    feed[f"past_value_{i}_in"] = values[i][:, :, :slots]
                outs = [o.name for o in sess.get_outputs()]
                got = dict(zip(outs, sess.run(outs, {i.name: feed[i.name]
                                                     for i in sess.get_inputs()}), strict=True))
                for i in layers:
                    keys[i][..., pos:pos + take] = got[f"past_key_{i}_out"][..., :take]
                    values[i][:, :, pos:pos + take] = got[f"past_value_{i}_out"][:, :, :take]
                carried[j] = {n: v for n, v in got.items() if n.startswith(genie.HANDOFF)}
                if k == parts - 1:
                    logits.append(np.asarray(got["logits"]).reshape(ar, -1)[:take])
            if k < parts - 1:
                rows = [np.asarray(next(iter(c.values()))).reshape(n, -1)[:take]
                        for c, (_, take, n) in zip(carried, schedule, strict=True)]
                self.handoffs.append(np.concatenate(rows))
                self.handoff_encodings.append(_handoff_encoding(paths[1][k]))
            del sessions
        return logits

    def teacher_forced_logits(self, ids: list[int], progress: Progress | None = None):
        """Logits [len(ids), V] (float32) of the shipped binaries, part by part."""
        if len(ids) > self.cl - 1:
            raise StudioError(f"{len(ids)} tokens do not fit the context of {self.cl - 1}")
        rows = self.run([int(t) for t in ids], progress)
        return np.concatenate(rows).astype(np.float32)[:, :self.vocab]
