"""The model as a tree: blocks → modules → ONNX nodes, with shapes and parameter counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QAbstractItemModel, QModelIndex, QPersistentModelIndex, Qt

from studio.core.profile import layer_of

COLUMNS = ("Name", "Kind", "Shape", "Parameters")
NodeRole = Qt.ItemDataRole.UserRole + 1
Index = QModelIndex | QPersistentModelIndex


@dataclass(eq=False)
class TreeNode:
    name: str
    kind: str = ""
    shape: str = ""
    params: int | None = None
    tip: str = ""
    full_name: str = ""
    level: str = "group"  # group | module | node
    children: list[TreeNode] = field(default_factory=list)
    parent: TreeNode | None = field(default=None, repr=False)

    def add(self, child: TreeNode) -> TreeNode:
        child.parent = self
        self.children.append(child)
        return child

    def row(self) -> int:
        return self.parent.children.index(self) if self.parent else 0

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()


def _fmt_shape(shape) -> str:
    return "×".join(str(d) for d in shape) if shape else "scalar"


def _params_text(n: int | None) -> str:
    return "" if n is None else f"{n:,}"


def _node_item(node) -> TreeNode:
    outs = [s for _, s in node.outputs if s]
    shape = ", ".join(f"[{_fmt_shape(s)}]" for s in outs[:2]) + (" …" if len(outs) > 2 else "")
    short = node.name.rsplit("/", 1)[-1] or node.name
    tip = f"{node.name}\nop: {node.op_type}\noutputs: " + ", ".join(
        f"{n} [{_fmt_shape(s)}]" for n, s in node.outputs
    )
    return TreeNode(short, node.op_type, shape, node.params or None, tip, node.name, "node")


def build_tree(info=None, graph=None) -> TreeNode:
    """A tree from a ModelInfo (HF checkpoint), optionally with the ONNX nodes of an export,
    or from an ONNX graph alone."""
    root = TreeNode("root")
    if info is None and graph is not None:
        return _onnx_only(root, graph)
    if info is None:
        return root
    embed = TreeNode("Embedding", "group")
    blocks: dict[int, TreeNode] = {}
    tail = TreeNode("Final norm and head", "group")
    # a vision-language model's tower: its own group, after the language model
    tower = TreeNode("Vision encoder", "group",
                     tip="the vision tower (exported as vision.onnx for the project's image size)")
    modules: dict[str, TreeNode] = {}
    for b in range(info.num_layers):
        blocks[b] = TreeNode(f"Block {b}", "transformer block")
    for lay in info.layers:
        if lay.block is not None:
            parent = blocks.setdefault(
                lay.block, TreeNode(f"Block {lay.block}", "transformer block")
            )
            prefix = f"layers.{lay.block}."
            short = lay.name.split(prefix, 1)[-1]
        else:
            parent = {"embedding": embed, "vision": tower}.get(lay.kind, tail)
            short = lay.name
        shapes = ", ".join(f"{k} {_fmt_shape(v)}" for k, v in lay.shapes.items())
        tip = lay.name + (f"\ntied to {lay.tied_to} (stored once)" if lay.tied_to else "")
        item = TreeNode(short, lay.kind, shapes, lay.params, tip, lay.name, "module")
        modules[lay.name] = parent.add(item)
    loose = TreeNode(
        "Graph-level nodes",
        "group",
        tip="ONNX nodes outside the transformer blocks without a weight module (I/O, RoPE tables)",
    )
    if graph is not None:
        op_groups: dict[str, TreeNode] = {}
        for node in graph.nodes:
            item = _node_item(node)
            if node.module in modules:
                modules[node.module].add(item)
                continue
            b = layer_of(node.name)
            if b is not None and b in blocks:
                rel = node.module.split(f"layers.{b}", 1)[-1].strip("./") or "residual adds"
                key = f"{b}:{rel}"
                group = op_groups.get(key)
                if group is None:
                    group = blocks[b].add(
                        TreeNode(f"{rel} (ops)", "ops without weights", full_name=node.module)
                    )
                    op_groups[key] = group
                group.add(item)
            else:
                mod = modules.get(node.module.replace("/", "."))
                (mod or loose).add(item)
    for group in (embed, *[blocks[k] for k in sorted(blocks)], tail, tower):
        if group.children:
            root.add(group)
    if loose.children:
        root.add(loose)
    _sum_params(root)
    return root


def _onnx_only(root: TreeNode, graph) -> TreeNode:
    blocks: dict[int, TreeNode] = {}
    other = TreeNode("Outside blocks", "group")
    subgroups: dict[str, TreeNode] = {}
    for node in graph.nodes:
        b = layer_of(node.name)
        parent = other
        if b is not None:
            parent = blocks.get(b) or blocks.setdefault(b, TreeNode(f"Block {b}", "block"))
        rel = node.module.split(f"layers.{b}", 1)[-1].strip("./") if b is not None else node.module
        if rel:
            key = f"{b}:{rel}"
            sub = subgroups.get(key)
            if sub is None:
                sub = parent.add(TreeNode(rel, "module", full_name=node.module, level="module"))
                subgroups[key] = sub
            parent = sub
        parent.add(_node_item(node))
    for b in sorted(blocks):
        root.add(blocks[b])
    if other.children:
        root.add(other)
    _sum_params(root)
    return root


def _sum_params(node: TreeNode) -> int:
    if not node.children:
        return node.params or 0
    total = sum(_sum_params(c) for c in node.children)
    if node.level == "group":
        node.params = total
    elif node.params is None:
        node.params = total or None
    return node.params or 0


class ModelTreeModel(QAbstractItemModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.root = TreeNode("root")

    def set_root(self, root: TreeNode) -> None:
        self.beginResetModel()
        self.root = root
        self.endResetModel()

    def node(self, index: Index) -> TreeNode:
        if index.isValid():
            ptr = index.internalPointer()
            if isinstance(ptr, TreeNode):
                return ptr
        return self.root

    def index(self, row: int, column: int, parent: Index = QModelIndex()) -> QModelIndex:  # noqa: B008
        if column < 0 or column >= len(COLUMNS) or row < 0:
            return QModelIndex()
        p = self.node(parent)
        if row >= len(p.children):
            return QModelIndex()
        return self.createIndex(row, column, p.children[row])

    def parent(self, index: Index = QModelIndex()):  # type: ignore[override]  # noqa: B008
        if not index.isValid():
            return QModelIndex()
        n = self.node(index)
        p = n.parent
        if p is None or p is self.root:
            return QModelIndex()
        return self.createIndex(p.row(), 0, p)

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        if parent.isValid() and parent.column() != 0:
            return 0
        return len(self.node(parent).children)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return len(COLUMNS)

    def hasChildren(self, parent: Index = QModelIndex()) -> bool:  # noqa: B008
        return self.rowCount(parent) > 0

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section] if 0 <= section < len(COLUMNS) else None
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        n = self.node(index)
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return (n.name, n.kind, n.shape, _params_text(n.params))[col]
        if role == Qt.ItemDataRole.ToolTipRole:
            return n.tip or n.full_name or None
        if role == Qt.ItemDataRole.TextAlignmentRole and col == 3:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == NodeRole:
            return n
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
