"""One token table for a target and its draft, at run time.

:mod:`studio.core.drafttable` decides whether a draft may read its target's token table;
this module reads what the decision needs from the two checkpoints (their configs and, where
the vocabularies and widths match, the two tables compared byte for byte) and makes the
draft's host-CPU generator really read the target's table:

* :func:`shared_draft_graphs` rewrites the draft's exported graphs so that the table is a
  graph *input* (``model.embed_tokens.weight`` [V, H], the name its Gather already reads)
  instead of an initializer, and — where the draft's head is tied to its table (the export
  stores it again, transposed, as ``lm_head.weight``) — computes the logits from that same
  input (``FusedMatMul`` with ``transB``): the rewritten graphs hold no table at all.
* :func:`target_table` is the one array the generator feeds them: the target export's own
  table, read once per process (for a target whose weights are external data — every model
  past :data:`studio.engine.weightstore.SHARE_ABOVE` — a view of the very mapping its CPU
  sessions read, see :func:`studio.engine.llm_runtime.shared_weights`).

ONNX Runtime takes a CPU input's memory as it is (no copy, no prepacking of an input), so
every pass of the draft reads the target's array.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.drafttable import TableShare, table_share
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_folder, atomic_write_json, link_or_copy
from studio.core.lazyimport import lazy_module
from studio.engine import hf_import
from studio.engine.chain import part_dirs
from studio.engine.hf_import import safetensors_files, safetensors_layout
from studio.engine.llm_runtime import external_weights, shared_weights
from studio.engine.onnxio import load_spec

onnx = lazy_module("onnx")
helper = lazy_module("onnx.helper")
numpy_helper = lazy_module("onnx.numpy_helper")

#: the token table's name in an export (the Gather's data) and the tied head's copy
TABLE = "model.embed_tokens.weight"
HEAD = "lm_head.weight"
#: written last into a folder of rewritten draft graphs: what was done, and the bytes dropped
MARKER = "shared_table.json"
GRAPHS = ("prefill", "decode", "verify")
#: bytes compared at a time when two checkpoints' tables are compared
_CHUNK = 16 << 20


# ---- the decision from the two checkpoints -------------------------------------------------
def _table_location(folder: Path) -> tuple[Path, str, tuple[int, ...], int, int] | None:
    """(file, dtype, shape, first byte, end byte) of the checkpoint's token table in its
    safetensors files; None where it has none (a PyTorch .bin checkpoint)."""
    for f in safetensors_files(Path(folder)):
        tensors, length, _end = safetensors_layout(f)
        t = tensors.get(TABLE)
        if t is not None:
            start = 8 + length
            return f, t["dtype"], t["shape"], start + t["offsets"][0], start + t["offsets"][1]
    return None


def compare_tables(target: Path, draft: Path) -> tuple[bool | None, float | None]:
    """Whether the two checkpoints' token tables are equal, value for value (None: not
    compared — a table not in safetensors, or of another dtype or shape), and where they
    differ the largest difference (float dtypes numpy reads; else None)."""
    a, b = _table_location(target), _table_location(draft)
    if a is None or b is None or a[1:3] != b[1:3]:
        return None, None
    equal = True
    with open(a[0], "rb") as fa, open(b[0], "rb") as fb:
        fa.seek(a[3])
        fb.seek(b[3])
        left = a[4] - a[3]
        while left > 0:
            n = min(_CHUNK, left)
            if fa.read(n) != fb.read(n):
                equal = False
                break
            left -= n
    if equal:
        return True, None
    dtype = {"F32": np.float32, "F16": np.float16, "F64": np.float64}.get(a[1])
    if dtype is None:
        return False, None
    ta = np.memmap(a[0], dtype=dtype, mode="r", offset=a[3], shape=a[2])
    tb = np.memmap(b[0], dtype=dtype, mode="r", offset=b[3], shape=b[2])
    worst = 0.0
    for r in range(0, a[2][0], 4096):
        worst = max(worst, float(np.abs(ta[r:r + 4096].astype(np.float64)
                                        - tb[r:r + 4096]).max()))
    return False, worst


_CACHE: dict[tuple, TableShare] = {}
_CACHE_LOCK = threading.Lock()


def checkpoint_share(target: Path, draft: Path, mode: str = "auto") -> TableShare:
    """The verdict for the checkpoints ``target`` and ``draft`` (folders), from their configs
    and — where the vocabularies and widths match — their tables compared byte for byte
    (cached per file identity: the plan is asked for often)."""
    t, d = hf_import.open_checkpoint(target), hf_import.open_checkpoint(draft)
    files = [_table_location(Path(f)) for f in (target, draft)]
    key = (mode, str(Path(target).resolve()), str(Path(draft).resolve()),
           *((str(x[0]), x[0].stat().st_size, x[0].stat().st_mtime_ns) if x else None
             for x in files))
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    equal, diff = None, None
    if mode == "auto" and (t.vocab_size, t.hidden_size) == (d.vocab_size, d.hidden_size):
        equal, diff = compare_tables(target, draft)
    share = table_share(t.vocab_size, t.hidden_size, d.vocab_size, d.hidden_size,
                        d.tied_embeddings, equal, diff, mode)
    with _CACHE_LOCK:
        _CACHE[key] = share
    return share


# ---- the one array ----------------------------------------------------------------------------
_TABLES: dict[tuple, Any] = {}


def target_table(export_dir: Path):
    """The target export's token table [V, H] (float32), one array per process and file: a
    view of the process's mapping of the weights file where the export keeps its weights
    outside the graph, else the graph's own bytes decoded once."""
    export_dir = Path(export_dir)
    graph = part_dirs(load_spec(export_dir), export_dir)[0] / "prefill.onnx"
    stat = graph.stat()
    key = (str(graph.resolve()), stat.st_size, stat.st_mtime_ns)
    hit = _TABLES.get(key)
    if hit is not None:
        return hit
    model = onnx.load(str(graph), load_external_data=False)
    init = next((i for i in model.graph.initializer if i.name == TABLE), None)
    if init is None:
        raise StudioError(f"{graph} has no {TABLE}: not a first part's graph; export again")
    if external_weights(graph) and init.data_location == onnx.TensorProto.EXTERNAL:
        array = dict(shared_weights(graph, model))[TABLE]
    else:
        array = numpy_helper.to_array(init)
    array.flags.writeable = False
    _TABLES[key] = array
    return array


# ---- the draft's graphs, reading the table as an input ----------------------------------------
def _rewrite(model, tied_head: bool) -> tuple[int, bool]:
    """Make the table an input of ``model`` (and the tied head read it); returns (the
    initializer bytes dropped, whether the head now reads the table)."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    table = inits.get(TABLE)
    if table is None or len(table.dims) != 2 or table.data_type != onnx.TensorProto.FLOAT:
        raise StudioError(f"the draft's graph has no float32 {TABLE} [V, H]: export it again")
    V, H = (int(d) for d in table.dims)

    def size(init) -> int:
        return int(np.prod(init.dims)) * 4

    dropped = size(table)
    keep = [i for i in g.initializer if i.name != TABLE]
    head_shared = False
    head = inits.get(HEAD)
    users = [n for n in g.node if HEAD in n.input]
    if (tied_head and head is not None and list(head.dims) == [H, V] and len(users) == 1
            and users[0].op_type == "MatMul" and list(users[0].input) == [users[0].input[0], HEAD]):
        node = users[0]
        fused = helper.make_node("FusedMatMul", [node.input[0], TABLE], list(node.output),
                                 name=node.name + "_shared_table", domain="com.microsoft",
                                 transA=0, transB=1, alpha=1.0)
        nodes = [fused if n is node else n for n in g.node]
        del g.node[:]
        g.node.extend(nodes)
        keep = [i for i in keep if i.name != HEAD]
        dropped += size(head)
        head_shared = True
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    del g.initializer[:]
    g.initializer.extend(keep)
    g.input.append(helper.make_tensor_value_info(TABLE, onnx.TensorProto.FLOAT, [V, H]))
    return dropped, head_shared


def _head_is_table(graph: Path) -> bool:
    """Whether the export's ``lm_head.weight`` is its table transposed, value for value (a
    tied head, which the export stores again)."""
    model = onnx.load(str(graph), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    if TABLE not in inits or HEAD not in inits:
        return False
    t = numpy_helper.to_array(inits[TABLE], str(graph.parent))
    h = numpy_helper.to_array(inits[HEAD], str(graph.parent))
    return h.shape == t.shape[::-1] and bool(np.array_equal(h, t.T))


def shared_draft_graphs(draft_dir: Path, out: Path) -> dict[str, Any]:
    """The draft's exported graphs at ``draft_dir`` rewritten into ``out`` to read the token
    table (and a tied head) from the input :data:`TABLE` (made once: ``out``'s marker says
    what was done). Returns the marker's content: each graph and the bytes of the
    initializers it no longer holds (``graph_bytes_dropped``: measured on the files)."""
    draft_dir, out = Path(draft_dir), Path(out)
    marker = out / MARKER
    if marker.is_file():
        return json.loads(marker.read_text())
    spec = load_spec(draft_dir)
    if len(spec.get("parts") or []) > 1:
        raise StudioError("the draft model is exported in parts: its token table stays its "
                          "own (export the draft whole)")
    tied = _head_is_table(draft_dir / "prefill.onnx")
    done: dict[str, Any] = {"table": TABLE, "head": "the table (tied)" if tied else "its own",
                            "graphs": {}, "graph_bytes_dropped": 0}
    with atomic_folder(out) as tmp:
        for f in draft_dir.iterdir():
            if (f.suffix == ".onnx" and f.stem in GRAPHS) or f.name == "artifact.json":
                continue  # the graphs are rewritten; the store's record is not this folder's
            if f.is_dir():
                shutil.copytree(f, tmp / f.name)
            elif f.suffix in (".data",) or f.name.endswith(".onnx.data"):
                link_or_copy(f, tmp / f.name)  # its table's bytes stay in it, never read
            else:
                shutil.copy2(f, tmp / f.name)
        for name in GRAPHS:
            src = draft_dir / f"{name}.onnx"
            if not src.is_file():
                continue
            model = onnx.load(str(src), load_external_data=False)
            dropped, head = _rewrite(model, tied)
            onnx.save(model, str(tmp / src.name))
            done["graphs"][name] = {"bytes_dropped": dropped, "head_reads_table": head}
            done["graph_bytes_dropped"] += dropped
        atomic_write_json(tmp / MARKER, done)
    return done
