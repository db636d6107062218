"""Parts: a decoder split into runs of consecutive blocks, each exported, quantized and
compiled on its own (the first part also embeds the tokens, the last also norms and projects
to logits).

A part's graphs take the residual stream ``hidden_states_after_{k}`` of the previous part
(``k`` its last block) and hand theirs to the next, with the position ids, the masks and
the KV cache of their own blocks; one part is the whole graph of today.

The plan is computed from the checkpoint's layout (the parameter count of each block, the
embedding and the head, read from the weight files' headers) before any work:
:func:`plan_parts` with ``"auto"`` is the smallest number of parts whose every compiled
binary fits ``max_part_bytes`` at the scheme's weight width — and no fewer than the target
NPUs need (:mod:`studio.core.deviceplan`) — blocks spread so the parts are as even as they
can be. Pure Python: no torch, no ONNX.
"""

from __future__ import annotations

from dataclasses import dataclass

from studio.core.errors import StudioError

#: the default budget of one part's compiled binary: one HTP graph must stay under about
#: 2 GiB (a compile fails at "estimated allocation of 2347229 KB, limit is 2097152 KB"),
#: with room for the activations and the graph's own tables
DEFAULT_MAX_PART_BYTES = 1_500_000_000
#: the most parts a project may ask for (a part holds at least one block)
MAX_PARTS = 256
#: ``export.parts = "auto"`` sizes the parts for weights of this width: the export comes
#: before the scheme is chosen, so its key cannot hash it; 8-bit parts fit W8 and W4 schemes,
#: a 16-bit-weight scheme over them is refused before compile (see ``check_fits``)
AUTO_WEIGHT_BITS = 8


@dataclass(frozen=True)
class Layout:
    """Parameter counts of a decoder checkpoint: per block, the token embedding, the final
    norm and the output head (0 when it is tied to the embedding: the graph still holds it
    in the last part, so :meth:`head_in_graph` counts it)."""

    blocks: tuple[int, ...]
    embedding: int
    norm: int
    head: int
    tied: bool

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def parameters(self) -> int:
        return sum(self.blocks) + self.embedding + self.norm + self.head

    def head_in_graph(self) -> int:
        """Parameters of the last part's norm and head as its graph stores them (a tied head
        is a second copy of the embedding there)."""
        return self.norm + (self.embedding if self.tied else self.head)


@dataclass(frozen=True)
class Part:
    """Blocks ``start`` .. ``stop - 1`` of a ``num_layers``-block decoder."""

    index: int
    count: int
    start: int
    stop: int
    num_layers: int
    parameters: int = 0

    @property
    def embeds(self) -> bool:
        return self.start == 0

    @property
    def heads(self) -> bool:
        return self.stop == self.num_layers

    @property
    def layers(self) -> range:
        return range(self.start, self.stop)

    @property
    def name(self) -> str:
        """``part1_of_3`` (``whole`` for a single part)."""
        return "whole" if self.count == 1 else f"part{self.index + 1}_of_{self.count}"

    @property
    def hidden_in(self) -> str | None:
        return None if self.embeds else hidden_name(self.start - 1)

    @property
    def hidden_out(self) -> str | None:
        return None if self.heads else hidden_name(self.stop - 1)

    def as_dict(self) -> dict:
        return {"index": self.index, "start": self.start, "stop": self.stop,
                "parameters": self.parameters, "name": self.name}


def hidden_name(last_block: int) -> str:
    """The residual stream after block ``last_block``: what a part hands the next."""
    return f"hidden_states_after_{last_block}"


def whole(num_layers: int, parameters: int = 0) -> Part:
    return Part(0, 1, 0, int(num_layers), int(num_layers), parameters)


def part_parameters(layout: Layout, start: int, stop: int) -> int:
    n = sum(layout.blocks[start:stop])
    if start == 0:
        n += layout.embedding
    if stop == layout.num_layers:
        n += layout.head_in_graph()
    return n


def split(layout: Layout, count: int) -> list[Part]:
    """``count`` parts of consecutive blocks, as even in parameters as a contiguous split
    allows (the first carries the embedding, the last the head)."""
    L = layout.num_layers
    count = int(count)
    if not 1 <= count <= L:
        raise StudioError(f"a {L}-block model splits into 1..{L} parts, not {count}")
    # the smallest bound on a part's parameters that `count` contiguous parts can meet
    weights = list(layout.blocks)
    weights[0] += layout.embedding
    weights[-1] += layout.head_in_graph()

    def cuts(bound: int) -> list[int] | None:
        stops, acc = [], 0
        for i, w in enumerate(weights):
            if w > bound:
                return None
            if acc + w > bound:
                stops.append(i)
                acc = 0
            acc += w
        stops.append(L)
        return stops if len(stops) <= count else None

    lo, hi = max(weights), sum(weights)
    while lo < hi:
        mid = (lo + hi) // 2
        if cuts(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    stops = cuts(lo) or [L]
    # fewer cuts than asked (a bound met with fewer parts): split the largest parts further
    while len(stops) < count:
        starts = [0, *stops[:-1]]
        sizes = [(sum(weights[a:b]), a, b) for a, b in zip(starts, stops, strict=True)
                 if b - a > 1]
        _, a, b = max(sizes)
        stops = sorted({*stops, (a + b) // 2})
    starts = [0, *stops[:-1]]
    return [Part(i, count, a, b, L, part_parameters(layout, a, b))
            for i, (a, b) in enumerate(zip(starts, stops, strict=True))]


def compiled_bytes(parameters: int, weight_bits: int) -> int:
    """The weight bytes of a compiled part at ``weight_bits`` per weight."""
    return -(-int(parameters) * int(weight_bits) // 8)


def part_bytes(layout: Layout, part: Part, weight_bits: int, table_bits: int) -> int:
    """The weight bytes of a compiled ``part``: its weights at ``weight_bits`` each, the
    embedding table (the first part's Gather data) at ``table_bits`` per entry."""
    table = layout.embedding if part.embeds else 0
    return compiled_bytes(part.parameters - table, weight_bits) + compiled_bytes(table,
                                                                                table_bits)


def plan_parts(layout: Layout, parts: int | str = "auto", weight_bits: int = 8,
               max_part_bytes: int = DEFAULT_MAX_PART_BYTES, at_least: int = 1) -> list[Part]:
    """The parts of ``layout``: ``parts`` of them, or with ``"auto"`` the fewest, and at least
    ``at_least`` (the target NPUs' own count, :func:`studio.core.deviceplan.device_part_count`),
    whose every compiled binary (``weight_bits`` per weight) fits ``max_part_bytes``: the
    tighter of the host compiler's limit and the device's."""
    if parts != "auto":
        return split(layout, int(parts))
    for count in range(max(1, min(int(at_least), layout.num_layers)), layout.num_layers + 1):
        plan = split(layout, count)
        if all(compiled_bytes(p.parameters, weight_bits) <= max_part_bytes for p in plan):
            return plan
    largest = max(layout.blocks[0] + layout.embedding, layout.blocks[-1] + layout.head_in_graph())
    raise StudioError(
        f"no split of this {layout.num_layers}-block model keeps every part under "
        f"{max_part_bytes / 1e9:.2f} GB at {weight_bits}-bit weights (one block with the "
        f"embedding or the head is {compiled_bytes(largest, weight_bits) / 1e9:.2f} GB); "
        "raise export.max_part_mb or quantize the weights narrower")
