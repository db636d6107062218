"""A layered drawing of a dataflow graph (an ONNX graph's nodes), for the graph view.

Each node goes on the row after the deepest node it reads from (the longest path from the
graph's inputs), so data flows down the page — a node that reads only weights and inputs
sits just above its first reader; within a row nodes are ordered by the mean
column of the nodes they read from (one barycentre pass, which untangles the parallel
branches of attention — Q, K, V — enough to read) and the row is centred. Linear in the
nodes and edges: a decoder part of a few thousand nodes lays out in milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class GraphLayout:
    #: per node: (column, row); columns are centred on 0 (half-steps for even rows)
    pos: list[tuple[float, int]]
    #: (producer, consumer) node indices, one per tensor a node reads from another
    edges: list[tuple[int, int]]
    rows: int
    width: int  # nodes in the widest row

    def row_of(self, i: int) -> int:
        return self.pos[i][1]


def layered_layout(nodes: Sequence[tuple[Sequence[str], Sequence[str]]]) -> GraphLayout:
    """``nodes``: (input tensor names, output tensor names) per node. Tensors no node makes
    (graph inputs, weights) add no edge. Nodes out of topological order are placed after
    what they read all the same (a cycle, which ONNX forbids, is broken where it closes)."""
    n = len(nodes)
    producer: dict[str, int] = {}
    for i, (_ins, outs) in enumerate(nodes):
        for t in outs:
            if t:
                producer.setdefault(t, i)
    preds: list[list[int]] = []
    for i, (ins, _outs) in enumerate(nodes):
        ps = sorted({producer[t] for t in ins if t in producer and producer[t] != i})
        preds.append(ps)
    # Kahn's order (stable: the file's order where it is already topological)
    succs: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
            indeg[i] += 1
    order: list[int] = []
    ready = [i for i in range(n) if indeg[i] == 0]
    ready.reverse()
    seen = [False] * n
    while len(order) < n:
        if not ready:  # a cycle: take the first node not placed yet
            ready.append(next(i for i in range(n) if not seen[i]))
        i = ready.pop()
        if seen[i]:
            continue
        seen[i] = True
        order.append(i)
        for s in reversed(succs[i]):
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    row = [0] * n
    placed = [False] * n
    for i in order:
        row[i] = 1 + max((row[p] for p in preds[i] if placed[p]), default=-1)
        placed[i] = True
    # a node that reads nothing another makes (a weight's DequantizeLinear, a constant) sits
    # just above its first reader, not in the first row with every other weight
    for i in range(n):
        if not preds[i] and succs[i]:
            row[i] = max(0, min(row[s] for s in succs[i]) - 1)
    rows = (max(row) + 1) if n else 0
    by_row: list[list[int]] = [[] for _ in range(rows)]
    for i in order:
        by_row[row[i]].append(i)
    col = [0.0] * n
    for members in by_row:
        def centre(i: int) -> float:
            ps = preds[i]
            return sum(col[p] for p in ps) / len(ps) if ps else 0.0

        members.sort(key=centre)
        k = len(members)
        for j, i in enumerate(members):
            col[i] = j - (k - 1) / 2
    edges = [(p, i) for i in range(n) for p in preds[i]]
    width = max((len(m) for m in by_row), default=0)
    return GraphLayout([(col[i], row[i]) for i in range(n)], edges, rows, width)
