"""Putting variants quantized together apart again (:mod:`studio.engine.sensitivity`):
variants whose tensors and nodes do not meet are quantized in one quantizer run, and each
one's part of the result — the quantize-dequantize nodes made for its tensors, their scales
and the nodes that read them — is taken out (:func:`split_variants`) and put on the base graph
(:func:`apply_part`). A result whose change belongs to no member or to two is not split: the
caller then quantizes variant by variant. Pure ONNX graph editing."""

from __future__ import annotations

import json

from studio.core.lazyimport import lazy_module

onnx_model = lazy_module("onnxruntime.quantization.onnx_model")

# ops whose outputs the quantizer gives their first input's scale (ONNX Runtime's QDQ
# registry: the "direct 8-bit" ops, pooling, resize, pad, split, gather)
SHARED_SCALE_OPS = frozenset({
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "AveragePool", "Slice", "TopK",
    "MaxPool", "Resize", "Pad", "Split", "Gather", "GatherElements",
})
# what the quantizer appends to a tensor's name for the nodes and tensors it makes for it
_QDQ_SUFFIXES = ("QuantizeLinear", "DequantizeLinear", "scale", "zero_point", "convert",
                 "quantized")


def canonical(value) -> str:
    """A tensor override as comparable text (quant types by name, sets sorted)."""
    def plain(v):
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, (set, frozenset)):
            return sorted(plain(x) for x in v)
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if hasattr(v, "tolist"):
            return v.tolist()
        if isinstance(v, (str, int, float, bool)) or v is None:
            return v
        return getattr(v, "name", str(v))

    return json.dumps(plain(value), sort_keys=True)


def node_key(node) -> str:
    """A node's identity across quantizer runs: its name, or its outputs when it has none."""
    return node.name or "|".join(node.output)


def _owner(name: str, owners: dict[str, int]) -> set[int]:
    """The variants whose changed tensor ``name`` is, or was made for."""
    out = set()
    if name in owners:
        out.add(owners[name])
    cut = name.find("_")
    while cut != -1:
        head, tail = name[:cut], name[cut + 1:]
        if head in owners and tail.startswith(_QDQ_SUFFIXES):
            out.add(owners[head])
        cut = name.find("_", cut + 1)
    return out


def _changed_names(old, new) -> list[str]:
    """The names that differ between two lists of a node's inputs (or outputs), both sides."""
    names = [n for a, b in zip(old, new, strict=False) if a != b for n in (a, b)]
    return names + list(old[len(new):]) + list(new[len(old):])


def split_variants(base, joint, owners: dict[str, int]) -> dict[int, dict] | None:
    """Cut ``joint`` (one quantizer run of several variants) into each variant's changes to
    ``base``; None when a change belongs to no variant or to more than one."""
    if (list(joint.opset_import) != list(base.opset_import)
            or list(joint.graph.input) != list(base.graph.input)
            or list(joint.graph.output) != list(base.graph.output)):
        return None
    bn = {node_key(n): n for n in base.graph.node}
    jn = {node_key(n): n for n in joint.graph.node}
    bi = {t.name: t for t in base.graph.initializer}
    ji = {t.name: t for t in joint.graph.initializer}
    parts: dict[int, dict] = {i: {"nodes": {}, "drop_nodes": set(), "inits": {},
                                  "drop_inits": set()} for i in set(owners.values())}

    def claim(names) -> int | None:
        found = set().union(*(_owner(n, owners) for n in names)) if names else set()
        return found.pop() if len(found) == 1 else None

    for key, node in jn.items():
        old = bn.get(key)
        if old is None:
            names = [*node.input, *node.output]
        elif old == node:
            continue
        elif (old.op_type, old.domain, list(old.attribute)) == (
                node.op_type, node.domain, list(node.attribute)):
            names = _changed_names(old.input, node.input) + _changed_names(old.output,
                                                                          node.output)
        else:
            return None
        who = claim(names)
        if who is None:
            return None
        parts[who]["nodes"][key] = node
    for key in bn.keys() - jn.keys():
        who = claim([*bn[key].input, *bn[key].output])
        if who is None:
            return None
        parts[who]["drop_nodes"].add(key)
    for name, t in ji.items():
        if name in bi and bi[name] == t:
            continue
        who = claim([name])
        if who is None:
            return None
        parts[who]["inits"][name] = t
    for name in bi.keys() - ji.keys():
        who = claim([name])
        if who is None:
            return None
        parts[who]["drop_inits"].add(name)
    return parts


def apply_part(model, part: dict) -> None:
    """Put one variant's part of a joint quantizer run on (a copy of) the base model."""
    graph = model.graph
    keep = [n for n in graph.node if node_key(n) not in part["drop_nodes"]]
    replaced = []
    seen = set()
    for n in keep:
        key = node_key(n)
        replaced.append(part["nodes"].get(key, n))
        seen.add(key)
    replaced += [n for k, n in part["nodes"].items() if k not in seen]
    del graph.node[:]
    graph.node.extend(replaced)
    inits = [t for t in graph.initializer if t.name not in part["drop_inits"]]
    have = {t.name for t in inits}
    inits = [part["inits"].get(t.name, t) for t in inits]
    inits += [t for name, t in part["inits"].items() if name not in have]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    onnx_model.ONNXModel(model).topological_sort()
