"""One token table for a target and its draft: whether the draft model of speculative
decoding can read its target's token-embedding table instead of holding its own, why (or why
not), and the bytes that saves.

Pure Python: the decision is made from numbers — the two models' vocabularies and embedding
widths (their configs), whether the draft's LM head is tied to its table, and, where the two
tables were compared value for value, whether they are equal. Reading the tables and making
the runtime share one is :mod:`studio.engine.shared_table`'s.

The rule (``model.draft_embedding``):

* ``auto`` (the default): shared when the vocabularies and widths match and the draft's
  table equals the target's, value for value (a draft distilled with the target's table
  frozen, as the shipped ``tiny-coder-draft``). A draft whose table drifted in training is
  not: reading the target's table changes what it drafts (the first shipped draft, whose
  table moved up to 0.115 from its target's, fell from 65.1 % to 46.1 % greedy agreement).
* ``target``: the draft is declared distilled on the target's table (its own copy may be
  stored another way): shared whenever the vocabularies and widths match.
* ``own``: never shared.

The bytes saved are the draft's own table, ``V x H`` at 32 bits — the precision the draft
runs at on the host CPU — (``estimated``: arithmetic on the configs): what its generator no
longer holds, since it reads the target's. With a tied head the draft's head reads the same
table, so nothing of the draft's table is left. Where the tables cannot be shared, 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from studio.core.errors import StudioError
from studio.core.units import format_bytes

#: model.draft_embedding: how the draft's token table is chosen
DRAFT_TABLE_MODES = ("auto", "target", "own")
#: bytes of one element of the draft's table on the host CPU (its FP32 export)
HOST_TABLE_BYTES = 4


@dataclass(frozen=True)
class TableShare:
    """The verdict for one target / draft pair."""

    shareable: bool
    why: str  # one phrase: why it is shared, or why not
    target_vocab: int
    target_width: int
    draft_vocab: int
    draft_width: int
    draft_tied: bool
    values: str  # "equal", "differ", "not compared", "declared" or "" (not reached)
    table_bytes: int  # the draft's own table on the host (V x H x 4)
    saved_bytes: int  # what sharing saves: table_bytes, or 0
    source: str = "estimated"
    max_abs_diff: float | None = None  # where the values were compared and differ

    def line(self) -> str:
        """One line for the CLI and the pages."""
        if self.shareable:
            return (f"draft's token table: the target's ({self.why}): "
                    f"{format_bytes(self.saved_bytes)} saved on the host CPU ({self.source}: "
                    f"its own {self.draft_vocab:,} x {self.draft_width} table at 32 bits not "
                    "held)")
        return (f"draft's token table: its own, not the target's ({self.why}): 0 B saved "
                f"({self.source})")

    def to_dict(self) -> dict[str, Any]:
        return {"shareable": self.shareable, "why": self.why,
                "target": {"vocab": self.target_vocab, "width": self.target_width},
                "draft": {"vocab": self.draft_vocab, "width": self.draft_width,
                          "tied_head": self.draft_tied},
                "values": self.values, "max_abs_diff": self.max_abs_diff,
                "table_bytes": self.table_bytes, "saved_bytes": self.saved_bytes,
                "source": self.source, "line": self.line()}


def table_share(target_vocab: int, target_width: int, draft_vocab: int, draft_width: int,
                draft_tied: bool, values_equal: bool | None = None,
                max_abs_diff: float | None = None, mode: str = "auto") -> TableShare:
    """The verdict for a target's (vocabulary, width) and its draft's. ``values_equal``:
    whether the two tables were compared and found equal (None: not compared);
    ``max_abs_diff``: the largest difference where they differ; ``mode``:
    ``model.draft_embedding`` (:data:`DRAFT_TABLE_MODES`)."""
    if mode not in DRAFT_TABLE_MODES:
        raise ValueError(f"draft_embedding must be one of {DRAFT_TABLE_MODES}, not {mode!r}")
    table = int(draft_vocab) * int(draft_width) * HOST_TABLE_BYTES

    def verdict(ok: bool, why: str, values: str) -> TableShare:
        return TableShare(ok, why, int(target_vocab), int(target_width), int(draft_vocab),
                          int(draft_width), bool(draft_tied), values, table,
                          table if ok else 0,
                          max_abs_diff=None if values_equal is not False else max_abs_diff)

    if mode == "own":
        return verdict(False, "model.draft_embedding = \"own\"", "")
    if target_vocab != draft_vocab and target_width != draft_width:
        return verdict(False, f"vocabularies differ ({target_vocab:,} vs {draft_vocab:,}) and "
                              f"widths differ ({target_width} vs {draft_width})", "")
    if target_vocab != draft_vocab:
        return verdict(False, f"vocabularies differ: {target_vocab:,} rows vs "
                              f"{draft_vocab:,}", "")
    if target_width != draft_width:
        return verdict(False, f"widths differ: the target's rows are {target_width} wide, the "
                              f"draft's {draft_width} (vocabulary {target_vocab:,} both): the "
                              "draft's blocks read vectors of its own width", "")
    same = f"vocabulary {target_vocab:,} and width {target_width} match"
    if mode == "target":
        return verdict(True, f"{same}; declared distilled on the target's table "
                             "(model.draft_embedding = \"target\")", "declared")
    if values_equal is None:
        return verdict(False, f"{same}, but the tables were not compared", "not compared")
    if values_equal:
        return verdict(True, f"{same}, values equal", "equal")
    diff = f" (max |difference| {max_abs_diff:.3g})" if max_abs_diff is not None else ""
    return verdict(False, f"{same}, but the draft's values differ from the target's{diff}: "
                          "distil the draft with the target's table frozen, or set "
                          "model.draft_embedding = \"target\" if it was distilled on it",
                   "differ")


def config_share(target_cfg: dict[str, Any], draft_cfg: dict[str, Any],
                 mode: str = "auto") -> TableShare:
    """The verdict from two Hugging Face configs alone (no weights: the values are not
    compared, so a pair whose vocabulary and width match is "not compared" under ``auto``)."""
    def num(cfg: dict[str, Any], key: str) -> int:
        text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
        value = text.get(key, cfg.get(key))
        if not isinstance(value, int) or value < 1:
            raise StudioError(f"the config has no {key} (a whole number): not a decoder's config")
        return value

    return table_share(num(target_cfg, "vocab_size"), num(target_cfg, "hidden_size"),
                       num(draft_cfg, "vocab_size"), num(draft_cfg, "hidden_size"),
                       bool(draft_cfg.get("tie_word_embeddings", False)), None, None, mode)
