"""Activation memory planning on hand-made tensor lists whose peaks are worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from studio.core.errors import StudioError
from studio.core.memplan import (
    GraphMemory,
    MemoryPlan,
    Tensor,
    greedy_by_size,
    live_curve,
    overlaps,
    plan_memory,
)

# x -> [0] -> a -> [1] -> b -> [2] -> c -> [3] -> y
CHAIN = [
    Tensor("x", 10, 0, 0, "", "input", "input"),
    Tensor("a", 100, 0, 1, "n0", "MatMul"),
    Tensor("b", 200, 1, 2, "n1", "Gelu"),
    Tensor("c", 50, 2, 3, "n2", "MatMul"),
    Tensor("y", 40, 3, 3, "n3", "Add", "output"),
]
LABELS = [("n0", "MatMul"), ("n1", "Gelu"), ("n2", "MatMul"), ("n3", "Add")]


def test_chain_naive_bound_and_arena_by_hand():
    p = plan_memory(CHAIN, 4, LABELS, alignment=1)
    # alive per step: x+a, a+b, b+c, c+y
    assert p.live_bytes.tolist() == [110, 300, 250, 90]
    assert p.naive_bytes == p.raw_bytes == 400
    assert p.lower_bound_bytes == 300 and p.arena_bytes == 300
    assert p.reuse_saving == pytest.approx(0.25)  # reuse saves 100 of 400 bytes
    assert (p.peak_step, p.peak_node, p.peak_op_type) == (1, "n1", "Gelu")
    assert [(t.name, t.nbytes, t.op_type) for t in p.peak_tensors] == [
        ("b", 200, "Gelu"), ("a", 100, "MatMul")]
    assert p.bytes_by_kind == {"input": 10, "intermediate": 350, "output": 40}
    at = {q.name: q.offset for q in p.placements}
    # b (largest) at 0; a overlaps b -> above it; c only overlaps b -> above it;
    # y only overlaps c -> the free 200 bytes under it; x only overlaps a -> under it
    assert at == {"b": 0, "a": 200, "c": 200, "y": 0, "x": 0}
    assert overlaps(p.placements) == []


def test_lifetime_reuse_saves_a_known_amount():
    # two branches that never live together: 1000 + 1000 naive, 1000 + 8 shared bytes reused
    ts = [
        Tensor("in", 8, 0, 3, kind="input"),
        Tensor("big1", 1000, 0, 1, "n0", "Conv"),
        Tensor("s1", 8, 1, 2, "n1", "Reduce"),
        Tensor("big2", 1000, 2, 3, "n2", "Conv"),
        Tensor("out", 8, 3, 3, "n3", "Add", "output"),
    ]
    p = plan_memory(ts, 4, alignment=1)
    assert p.naive_bytes == 2024
    assert p.live_bytes.tolist() == [1008, 1016, 1016, 1016]
    assert p.lower_bound_bytes == 1016 == p.arena_bytes
    assert p.naive_bytes - p.arena_bytes == 1008
    assert overlaps(p.placements) == []


def test_alignment_rounds_every_buffer_up():
    ts = [Tensor("a", 1, 0, 0), Tensor("b", 65, 0, 1), Tensor("c", 64, 1, 1)]
    p = plan_memory(ts, 2, alignment=64)
    assert p.raw_bytes == 130
    assert p.naive_bytes == 64 + 128 + 64
    assert p.live_bytes.tolist() == [192, 192]
    assert p.arena_bytes == 192
    assert all(q.offset % 64 == 0 and q.size % 64 == 0 for q in p.placements)


def test_best_fit_prefers_the_tighter_hole():
    # long-lived blocks L0..L2 with two short ones H1, H2 between them; t arrives when the
    # short ones are dead and sees two holes
    ts = [
        Tensor("L0", 300, 0, 3), Tensor("H1", 100, 0, 0), Tensor("L1", 99, 0, 3),
        Tensor("H2", 40, 0, 0), Tensor("L2", 39, 0, 3), Tensor("t", 35, 1, 3),
    ]
    # order by size: L0 0..300, H1 300..400, L1 400..499, H2 499..539, L2 539..578
    placed = {q.name: q for q in greedy_by_size(ts, alignment=1)}
    assert [placed[n].offset for n in ("L0", "H1", "L1", "H2", "L2")] == [0, 300, 400, 499, 539]
    # t lives with L0, L1, L2: gaps [300, 400) (100) and [499, 539) (40): best fit is 499
    assert placed["t"].offset == 499
    assert overlaps(list(placed.values())) == []


def test_random_lists_never_overlap_and_stay_between_bound_and_naive():
    rng = np.random.default_rng(7)
    for trial in range(20):
        steps = int(rng.integers(1, 60))
        ts = []
        for i in range(int(rng.integers(1, 150))):
            s = int(rng.integers(0, steps))
            e = int(min(steps - 1, s + rng.geometric(0.3) - 1))
            ts.append(Tensor(f"t{i}", int(rng.integers(0, 5000)), s, e))
        p = plan_memory(ts, steps, alignment=int(rng.choice([1, 16, 64])))
        assert overlaps(p.placements) == [], trial
        assert p.lower_bound_bytes <= p.arena_bytes <= p.naive_bytes
        # the curve agrees with a direct count
        for step in range(steps):
            direct = sum(-(-t.nbytes // p.alignment) * p.alignment for t in ts
                         if t.start <= step <= t.end)
            assert p.live_bytes[step] == direct


def test_round_trip_through_json():
    p = plan_memory(CHAIN, 4, LABELS, alignment=1, top=2)
    d = json.loads(json.dumps(p.to_dict()))
    q = MemoryPlan.from_dict(d)
    assert q.to_dict() == p.to_dict()
    assert isinstance(q.live_bytes, np.ndarray) and q.live_bytes.dtype == np.int64
    assert len(q.peak_tensors) == 2
    g = GraphMemory("decode", "/x/decode.onnx", p, weight_bytes=10, weight_bytes_fp32=40,
                    weight_bytes_by_dtype={"int8": 10}, folded_bytes=0, kv_cache_bytes=64,
                    kv_output_bytes=8, input_bytes=10, output_bytes=40, nodes=4)
    g2 = GraphMemory.from_dict(json.loads(json.dumps(g.to_dict())))
    assert g2.to_dict() == g.to_dict() and g2.source == "estimated"


def test_empty_and_zero_sized():
    p = plan_memory([], 0)
    assert (p.naive_bytes, p.arena_bytes, p.lower_bound_bytes, p.peak_step) == (0, 0, 0, -1)
    p = plan_memory([Tensor("z", 0, 0, 1), Tensor("a", 8, 0, 1)], 2, alignment=1)
    assert p.arena_bytes == 8 and overlaps(p.placements) == []
    assert live_curve([Tensor("a", 8, 1, 1)], 3, alignment=1).tolist() == [0, 8, 0]


@pytest.mark.parametrize("ts, steps, needle", [
    ([Tensor("a", 1, 0, 0), Tensor("a", 1, 0, 0)], 1, "twice"),
    ([Tensor("a", -1, 0, 0)], 1, "negative"),
    ([Tensor("a", 1, 0, 5)], 3, "outside"),
    ([Tensor("a", 1, 2, 1)], 3, "outside"),
    ([Tensor("a", 1, 0, 0, kind="weight")], 1, "kind"),
])
def test_bad_lists_give_one_line(ts, steps, needle):
    with pytest.raises(StudioError, match=needle):
        plan_memory(ts, steps)
