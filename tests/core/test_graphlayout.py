"""The graph view's layered layout on small hand-made graphs and a real exported one."""

from __future__ import annotations

from studio.core.graphlayout import layered_layout


def test_rows_follow_the_longest_path_and_sources_sit_above_their_reader():
    # x -> a -> b -> d ; a -> c -> d ; w (reads only a weight) -> d
    nodes = [(["x"], ["a"]), (["a"], ["b"]), (["a"], ["c"]), (["weight"], ["w"]),
             (["b", "c", "w"], ["d"])]
    lay = layered_layout(nodes)
    assert [r for _, r in lay.pos] == [0, 1, 1, 1, 2]  # w: just above d, not in row 0
    assert sorted(lay.edges) == [(0, 1), (0, 2), (1, 4), (2, 4), (3, 4)]
    assert lay.rows == 3 and lay.width == 3
    row1 = sorted(lay.pos[i][0] for i in (1, 2, 3))
    assert row1 == [-1.0, 0.0, 1.0]  # centred


def test_out_of_order_nodes_and_a_cycle_still_lay_out():
    nodes = [(["b"], ["c"]), (["x"], ["b"])]  # the reader comes first in the file
    lay = layered_layout(nodes)
    assert lay.pos[1][1] == 0 and lay.pos[0][1] == 1
    cyc = layered_layout([(["q"], ["p"]), (["p"], ["q"])])
    assert sorted(r for _, r in cyc.pos) == [0, 1] and len(cyc.edges) == 2
    assert layered_layout([]).rows == 0
