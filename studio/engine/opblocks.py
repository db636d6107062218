"""Which row of the seed's op table (:data:`studio.core.events.BLOCKS`) each ONNX node is.

Decoder LMs exported from Hugging Face modules name their nodes after the modules
(``/model/layers.3/self_attn/q_proj/MatMul``), which places projections, norms, the MLP,
the embedding and the head. Inside attention the names say little (``self_attn/MatMul``,
``self_attn/Mul_3``), so the graph's structure decides:

- the **QK** MatMul is the attention MatMul with no Softmax upstream; the **AV** MatMul has
  one; the scale / mask / soft-cap ops between QK and the Softmax count as QK;
- **RoPE** is everything between the Q/K projections (or the cos/sin tables) and the adds
  that combine ``x·cos + rotate_half(x)·sin``, i.e. the elementwise ops and rotate-half
  slices upstream of the QK MatMul or of the cache output;
- Quantize/Dequantize, casts and pure data movement (Reshape, Transpose, Concat, Gather of
  a cache ...) are "data movement / Q-DQ" wherever they are.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from typing import TYPE_CHECKING

from studio.core.lazyimport import lazy_module

if TYPE_CHECKING:  # a checker reads the module itself
    import onnx
else:
    onnx = lazy_module("onnx")


QDQ_TYPES = {"QuantizeLinear", "DequantizeLinear", "Cast", "Convert"}
MOVE_TYPES = {
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Expand", "Identity", "Flatten",
    "Gather", "GatherElements", "ScatterND", "ScatterElements", "Tile", "Pad", "Split",
    "Shape", "ConstantOfShape", "Constant",
}
ROPE_TYPES = {"Mul", "Add", "Sub", "Neg", "Slice", "Concat", "Split", "Unsqueeze", "Gather"}

_PATTERNS = (
    (re.compile(r"(?:^|[/._])(?:q_proj|k_proj|v_proj|qkv_proj|query_key_value|c_attn|"
                r"query|key|value)(?:[/._]|$)"), "QKV projection"),
    (re.compile(r"(?:^|[/._])(?:o_proj|out_proj|c_proj_attn|dense)(?:[/._]|$)"), "o_proj"),
    (re.compile(r"(?:^|[/._])(?:gate_proj|up_proj|gate_up_proj|w1|w3|fc1|c_fc)(?:[/._]|$)"),
     "gate/up"),
    (re.compile(r"(?:^|[/._])(?:down_proj|w2|fc2|c_proj)(?:[/._]|$)"), "down_proj"),
    (re.compile(r"(?:layernorm|layer_norm|_norm|/norm/|^norm|rmsnorm|ln_f|ln_\d)", re.I),
     "RMSNorm"),
    (re.compile(r"(?:embed_tokens|wte|embed|lm_head)"), "embedding / lm_head"),
)
_ATTN = re.compile(r"(?:self_attn|attention|/attn/)")
_ROPE_NAME = re.compile(r"(?:rope|rotary)", re.I)


def _name_block(name: str, op_type: str) -> str | None:
    if op_type in QDQ_TYPES:
        return "data movement / Q-DQ"
    for pat, block in _PATTERNS:
        if pat.search(name):
            return block
    return None


def node_blocks(model: onnx.ModelProto | str | os.PathLike) -> dict[str, str]:
    """ONNX node name -> block, for every named node of ``model``."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    g = _NodeGraph(list(model.graph.node))
    nodes = g.nodes
    blocks: dict[int, str] = {}
    for i, n in enumerate(nodes):
        b = _name_block(n.name, n.op_type)
        if b is not None:
            blocks[i] = b

    # attention, per scope (one self_attn per layer)
    scopes: dict[str, list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        m = _ATTN.search(n.name)
        if m and i not in blocks:
            scopes[n.name[: m.end()]].append(i)
    graph_outputs = {o.name for o in model.graph.output}
    rope_src = {i for i, n in enumerate(nodes) if _ROPE_NAME.search(n.name)} | {
        i for i, n in enumerate(nodes)
        if any("cos" in x or "sin" in x for x in n.input if x not in g.producer)
    }
    for members in scopes.values():
        _attention_scope(g, set(members), blocks, graph_outputs, rope_src)
    # the MLP's activation and gating belong with gate/up
    for i, n in enumerate(nodes):
        if i not in blocks and re.search(r"(?:^|[/._])mlp[/._]", n.name):
            blocks[i] = "gate/up"

    out: dict[str, str] = {}
    for i, n in enumerate(nodes):
        if not n.name:
            continue
        b = blocks.get(i)
        if b is None:
            if _ROPE_NAME.search(n.name):
                b = "RoPE"
            elif n.op_type in MOVE_TYPES or n.op_type in QDQ_TYPES:
                b = "data movement / Q-DQ"
            else:
                b = "other"
        out[n.name] = b
    return out


class _NodeGraph:
    """A graph's nodes by index with who makes and who reads each tensor."""

    def __init__(self, nodes: list) -> None:
        self.nodes = nodes
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for i, n in enumerate(nodes):
            for o in n.output:
                self.producer[o] = i
            for x in n.input:
                if x:
                    self.consumers[x].append(i)

    def parents(self, i: int) -> list[int]:
        return [self.producer[x] for x in self.nodes[i].input if x in self.producer]

    def real_parents(self, i: int) -> list[int]:
        """Parents, looking through Quantize / Dequantize pairs."""
        out = []
        for p in self.parents(i):
            out.extend(self.real_parents(p) if self.nodes[p].op_type in QDQ_TYPES else [p])
        return out

    def children(self, i: int) -> list[int]:
        return [c for o in self.nodes[i].output for c in self.consumers.get(o, ())]

    @staticmethod
    def closure(start: set[int], step) -> set[int]:
        seen, todo = set(start), list(start)
        while todo:
            for j in step(todo.pop()):
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        return seen


def _attention_scope(g: _NodeGraph, inside: set[int], blocks: dict[int, str],
                     graph_outputs: set[str], rope_src: set[int]) -> None:
    """One attention's nodes into blocks: softmax, QK (with the scale / mask / soft-cap
    before the softmax), AV, RoPE, and the rest (the static cache's writes) data movement."""
    nodes, closure = g.nodes, g.closure
    softmax = {i for i in inside if nodes[i].op_type == "Softmax"}
    after_softmax = closure(softmax, g.children) - softmax
    matmuls = [i for i in inside if nodes[i].op_type == "MatMul"]
    qk = [i for i in matmuls if i not in after_softmax]
    av = [i for i in matmuls if i in after_softmax]
    for i in softmax:
        blocks[i] = "attention: softmax"
    for i in av:
        blocks[i] = "attention: AV"
    for i in qk:
        blocks[i] = "attention: QK"
    # scale / mask / soft-cap between QK and Softmax
    between = (closure(set(qk), g.children) & closure(softmax, g.parents)) - set(qk) - softmax
    for i in between & inside:
        if nodes[i].op_type not in MOVE_TYPES and nodes[i].op_type not in QDQ_TYPES:
            blocks[i] = "attention: QK"
    _rope_in_scope(g, inside, qk, blocks, graph_outputs, rope_src)
    # what is left in attention writes the static cache (masks, Where): data movement
    for i in inside - set(blocks):
        blocks[i] = "data movement / Q-DQ"


def _rope_in_scope(g: _NodeGraph, inside: set[int], qk: list[int], blocks: dict[int, str],
                   graph_outputs: set[str], rope_src: set[int]) -> None:
    """RoPE: upstream of QK (or of a cache output), downstream of the projections / tables."""
    nodes, closure = g.nodes, g.closure
    sinks = set(qk) | {i for i in inside if set(nodes[i].output) & graph_outputs}
    up = closure(sinks, g.parents)
    proj = {i for i, b in blocks.items() if b == "QKV projection"}
    down = closure(proj | rope_src, g.children)
    for i in (up & down) & inside:
        if i in blocks or nodes[i].op_type not in ROPE_TYPES:
            continue
        t = nodes[i].op_type
        if t == "Concat" and not any(nodes[p].op_type == "Neg" for p in g.real_parents(i)):
            continue  # a cache concat, not rotate_half
        if t in {"Unsqueeze", "Gather"} and (closure({i}, g.parents) & proj
                                             or not closure({i}, g.parents) & rope_src):
            continue  # a reshape of q / k, not of the cos / sin tables
        blocks[i] = "RoPE"


def op_block(qnn_op_type: str | None, onnx_node: str | None, blocks: dict[str, str]) -> str:
    """The block of one profiled op: from its ONNX node, else from its type."""
    if onnx_node and onnx_node in blocks:
        return blocks[onnx_node]
    t = qnn_op_type or ""
    named = _name_block(onnx_node or "", t)
    if named is not None:
        return named
    if t in QDQ_TYPES or t in MOVE_TYPES or t in ("Input", "Output"):
        return "data movement / Q-DQ"
    return "other"
