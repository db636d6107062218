"""The Model page's graph view on the sample's real exported graph, linked to the grid."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_the_exported_graph_is_drawn_searched_and_linked_to_the_layer_grid(
    exported_template, copy_project, tmp_path, make_window, qtbot
):
    win = make_window()
    assert win.open_project(copy_project(exported_template, tmp_path / "g"))
    page = win.show_page("model")
    qtbot.waitUntil(lambda: page.graph_combo.count() > 0, timeout=30_000)
    assert [page.graph_combo.itemText(i) for i in range(page.graph_combo.count())] == \
        ["prefill", "decode"]  # exported only: no quantized graph yet
    page.graph_combo.setCurrentText("decode")
    qtbot.waitUntil(lambda: "decode" in page._graphs, timeout=30_000)
    page.tabs.setCurrentWidget(page.graph_view)
    view = page.graph_view
    graph = page._graphs["decode"]
    assert view.graph is graph and len(view.boxes) == len(graph.nodes)
    assert f"{len(graph.nodes):,} nodes in" in view.legend.text()
    matmuls = sum(1 for n in graph.nodes if n.op_type == "MatMul")
    assert view.find("matmul") == matmuls > 20
    i = view.step(1)
    assert graph.nodes[i].op_type == "MatMul" and view.selected == i
    # from the grid to the graph: the window opens the layer's node
    win.show_in_graph("model.layers.2.mlp.down_proj")
    node = graph.nodes[view.selected]
    assert node.module == "model.layers.2.mlp.down_proj" and node.op_type == "MatMul"
    assert "layer model.layers.2.mlp.down_proj" in view.details.text()
    # and back: the node's layer in the Precision page's grid
    assert view.layer_button.isEnabled()
    view.layer_button.click()
    prec = win.page("precision")
    assert win.current_page() == "Precision"
    qtbot.waitUntil(lambda: prec.grid.selected_layers() == ["model.layers.2.mlp.down_proj"],
                    timeout=30_000)
    # a compile's placement colours the boxes by where each node runs
    view.set_graph(graph, {"chip": "snapdragon-8-gen-3", "cpu_nodes": [graph.nodes[0].name]},
                   page.graph_view.layers)
    assert "on the CPU (1)" in view.legend.text()
    assert "CPU (refused by the HTP)" in view.describe(0)
