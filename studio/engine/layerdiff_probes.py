"""The tensors a layer diff compares in an exported FP32 graph (:mod:`studio.engine.layerdiff`,
whose docstring says which): the boundaries of the decoder blocks and, by ``tensors``, every
module's output and the attention's and the MLP's own arithmetic, or every computed tensor;
each with the nearest probes it is computed from."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.core.recipe import module_of_node

onnx = lazy_module("onnx")

_SHAPE_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity",
                        "Cast", "Shape", "Constant", "ConstantOfShape", "Slice", "Concat",
                        "Gather", "Expand", "Equal", "Where", "Neg"})
_SKIP_MODULES = frozenset({"rope"})  # the export's rotary tables (position only)
_BLOCK = re.compile(r"^(.*?layers\.(\d+))(?:\.|$)")


@dataclass(frozen=True)
class Probe:
    name: str  # model.layers.0 (boundary), model.layers.0.self_attn.scores, lm_head
    tensor: str  # the FP32 graph's tensor
    kind: str  # "boundary" | "module"
    block: int  # -1 before the first decoder block, num_layers after the last
    module: str  # the module path it belongs to
    op: str  # the op that computes it
    inputs: tuple[str, ...] = ()  # nearest probes upstream (names)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["inputs"] = list(self.inputs)
        return d


def _block(module: str) -> tuple[str, int] | None:
    m = _BLOCK.match(module)
    return (m.group(1), int(m.group(2))) if m else None


def find_probes(model, mode: str = "modules") -> list[Probe]:
    """The tensors to compare in an exported FP32 graph (see the module docstring), in graph
    order."""
    ix = _GraphIndex.of(model)
    chosen: dict[int, tuple[str, str]] = {}  # node index -> (name, kind)
    for bname, _ in sorted(ix.blocks, key=lambda b: b[1]):  # the last node of each block
        last = max(i for m in ix.modules if m == bname or m.startswith(bname + ".")
                   for i in ix.by_module[m])
        chosen[last] = (bname, "boundary")
    for m in ix.modules:
        kids = ix.children(m)
        blk = _block(m)
        if blk and blk[0] == m and not kids:
            continue
        if not kids:  # a leaf module: its output
            _choose_leaf(ix, m, mode, chosen)
        elif mode != "blocks":
            _choose_inner(ix, m, kids, chosen)
    if mode == "all":  # every computed tensor but shape bookkeeping
        _choose_all(ix, chosen)
    return _probes_of(ix, chosen)


@dataclass
class _GraphIndex:
    """An FP32 graph's computing nodes (in graph order) by module, its modules and decoder
    blocks, which nodes compute a float tensor and which tensors are constants."""

    nodes: list
    by_module: dict[str, list[int]]
    modules: list[str]
    blocks: set[tuple[str, int]]
    n_layers: int
    computes: set[int]
    inits: set[str]

    @classmethod
    def of(cls, model) -> _GraphIndex:
        floats = _float_tensors(model)
        g = model.graph
        inits = {t.name for t in g.initializer} | {n.output[0] for n in g.node
                                                    if n.op_type == "Constant"}
        nodes = [n for n in g.node if n.op_type != "Constant" and n.output]
        computes = {i for i, n in enumerate(nodes) if n.output[0] in floats}
        by_module: dict[str, list[int]] = {}
        for i, n in enumerate(nodes):
            by_module.setdefault(module_of_node(n.name), []).append(i)
        modules = [m for m in by_module if m and m not in _SKIP_MODULES]
        blocks = {b for m in modules if (b := _block(m))}
        if not blocks:
            raise StudioError("the graph names no decoder blocks (model.layers.N); layerdiff "
                              "reads graphs exported by the studio")
        n_layers = max(i for _, i in blocks) + 1
        return cls(nodes, by_module, modules, blocks, n_layers, computes, inits)

    def children(self, m: str) -> list[str]:
        return [c for c in self.modules if c.startswith(m + ".")]

    def where(self, m: str) -> int:
        """The decoder block a module is in: -1 before the first, n_layers after the last."""
        b = _block(m)
        if b:
            return b[1]
        return -1 if "embed" in m else self.n_layers


def _choose_leaf(ix: _GraphIndex, m: str, mode: str, chosen: dict[int, tuple[str, str]]
                 ) -> None:
    """A leaf module's output: a boundary (the embedding, the final norm, the logits), or
    with ``mode`` other than "blocks" a module probe."""
    last = ix.by_module[m][-1]
    if last in chosen:
        return
    if last not in ix.computes:
        return
    boundary = ("embed" in m or (m.endswith("norm") and ix.where(m) == ix.n_layers)
                or ix.nodes[last].output[0] == "logits")
    if boundary or mode != "blocks":
        chosen[last] = (m, "boundary" if boundary else "module")


def _choose_inner(ix: _GraphIndex, m: str, kids: list[str],
                  chosen: dict[int, tuple[str, str]]) -> None:
    """A container module's own arithmetic: the activation x activation MatMuls (scores,
    context), the softmax, and the nodes that feed a child module (the MLP's product, the
    block's residual add)."""
    kid_inputs = {t for k in kids for i in ix.by_module[k] for t in ix.nodes[i].input}
    mm = 0
    for i in ix.by_module[m]:
        n = ix.nodes[i]
        if i in chosen or i not in ix.computes or n.op_type in _SHAPE_OPS:
            continue
        if n.op_type == "MatMul" and not any(t in ix.inits for t in n.input):
            role = ("scores", "context")[mm] if mm < 2 else f"matmul_{mm}"
            mm += 1
        elif n.op_type == "Softmax":
            role = "softmax"
        elif n.output[0] in kid_inputs:
            role = {"Mul": "product", "Add": "residual"}.get(n.op_type, n.op_type.lower())
        else:
            continue
        name = f"{m}.{role}"
        k = 1
        while any(v[0] == name for v in chosen.values()):
            name, k = f"{m}.{role}_{k}", k + 1
        chosen[i] = (name, "module")


def _choose_all(ix: _GraphIndex, chosen: dict[int, tuple[str, str]]) -> None:
    """Every other computed tensor but shape bookkeeping (``tensors = "all"``)."""
    for i, n in enumerate(ix.nodes):
        m = module_of_node(n.name)
        if (i in chosen or i not in ix.computes or n.op_type in _SHAPE_OPS or not m
                or m in _SKIP_MODULES):
            continue
        chosen[i] = (f"{m}.{n.name.rsplit('/', 1)[-1]}", "op")


def _probes_of(ix: _GraphIndex, chosen: dict[int, tuple[str, str]]) -> list[Probe]:
    """The chosen nodes' probes in graph order, each with the nearest probes it is computed
    from."""
    order = sorted(chosen)
    tensor_of = {ix.nodes[i].output[0]: chosen[i][0] for i in order}
    rank = {name: k for k, name in enumerate(tensor_of.values())}
    # the nearest probes each tensor is computed from (the graph is in topological order)
    near: dict[str, frozenset[str]] = {}
    out = []
    for i, n in enumerate(ix.nodes):
        found: set[str] = set()
        for x in n.input:
            if x in tensor_of:
                found.add(tensor_of[x])
            else:
                found |= near.get(x, frozenset())
        for o in n.output:
            near[o] = frozenset(found)
        if i in chosen:
            name, kind = chosen[i]
            mod = module_of_node(n.name)
            out.append(Probe(name, n.output[0], kind, ix.where(mod), mod, n.op_type,
                             tuple(sorted(found, key=rank.__getitem__))))
    return out


def _float_tensors(model) -> set[str]:
    """The float tensors of a graph (by shape inference on its structure; weights are not
    needed)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference is best effort: fall back to the declared ones
        inferred = model
    g = inferred.graph
    want = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    return {v.name for v in (*g.value_info, *g.output)
            if v.type.tensor_type.elem_type in want}
