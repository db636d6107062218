"""The seed's op-table rows for the nodes of a real exported decoder graph."""

from collections import Counter

import onnx

from studio.core.events import BLOCKS
from studio.engine.opblocks import node_blocks, op_block


def test_sample_decode_graph_nodes_fall_in_the_seed_table(tiny_coder_graphs):
    folder, _ = tiny_coder_graphs
    model = onnx.load(str(folder / "decode.onnx"), load_external_data=False)
    blocks = node_blocks(model)
    assert set(blocks.values()) <= set(BLOCKS)
    counts = Counter(blocks.values())
    layers = 4
    kinds = {n.name: n.op_type for n in model.graph.node}
    per_layer = Counter((b, kinds[n]) for n, b in blocks.items() if "layers.0/" in n)
    # one QK MatMul, one Softmax, one AV MatMul per layer; three projections; gate + up; down
    assert per_layer[("attention: QK", "MatMul")] == 1
    assert per_layer[("attention: softmax", "Softmax")] == 1
    assert per_layer[("attention: AV", "MatMul")] == 1
    assert per_layer[("QKV projection", "MatMul")] == 3
    assert per_layer[("gate/up", "MatMul")] == 2
    assert per_layer[("down_proj", "MatMul")] == 1
    assert per_layer[("o_proj", "MatMul")] == 1
    assert counts["attention: softmax"] == layers
    # RoPE: rotate_half (Slice, Neg, Concat) and the cos / sin products for q and k
    rope = Counter(kinds[n] for n, b in blocks.items() if b == "RoPE" and "layers.0/" in n)
    assert rope["Neg"] == 2 and rope["Slice"] == 4 and rope["Mul"] >= 4 and rope["Add"] == 2
    # the cache concat is data movement, not RoPE; the final norm and the head are placed
    cache_concats = [n.name for n in model.graph.node if n.op_type == "Concat"
                     and any(i.startswith("past_") for i in n.input)]
    assert all(blocks[c] == "data movement / Q-DQ" for c in cache_concats)
    assert blocks["/lm_head/MatMul"] == "embedding / lm_head"
    assert all(blocks[n.name] == "RMSNorm" for n in model.graph.node if "/model/norm/" in n.name)
    assert counts["other"] <= 2 * layers + 2  # residual adds and little else


def test_profiled_ops_without_a_node_are_placed_by_type():
    assert op_block("QuantizeLinear", None, {}) == "data movement / Q-DQ"
    assert op_block("Input", None, {}) == "data movement / Q-DQ"
    assert op_block("MatMul", "/x/MatMul", {"/x/MatMul": "o_proj"}) == "o_proj"
    assert op_block("Tanh", None, {}) == "other"
