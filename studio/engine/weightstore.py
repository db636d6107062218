"""One external-data file for the graphs of a part: their weights stored once.

The prefill, decode and verify graphs of a decoder (or of one of its parts) hold the same
weights; a graph past :data:`SHARE_ABOVE` bytes keeps them as ONNX external data, and all
the graphs of one folder point into one file, ``weights.data``, where each distinct tensor
(by its bytes) is written once. A 3 B model's three FP32 graphs then take 12 GB of disk
instead of 37, and a part's quantized prefill and decode graphs one copy of their integer
weights instead of two. ONNX Runtime, the QNN EP and ``onnx.checker`` read such graphs as
any other with external data (location, offset, length per tensor).

Tensors start on 4 KiB boundaries, so ONNX Runtime can map them instead of copying.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module

onnx = lazy_module("onnx")
numpy_helper = lazy_module("onnx.numpy_helper")

#: the shared external-data file of a folder's graphs
WEIGHTS_FILE = "weights.data"
#: a graph with more weight bytes than this keeps them in the folder's shared file (or its
#: own ``<graph>.onnx.data``); a smaller one embeds them
SHARE_ABOVE = 256 << 20
#: tensors start on this boundary in the file
ALIGN = 4096
#: an initializer smaller than this stays in the graph file
_INLINE_BELOW = 1024
_COPY_CHUNK = 64 << 20


class WeightStore:
    """An external-data file being written: :meth:`add` appends a tensor's bytes unless the
    same bytes are already there, and says where they are."""

    def __init__(self, folder: Path, name: str = WEIGHTS_FILE):
        self.path = Path(folder) / name
        self._f = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        self._size = 0
        self._index: dict[tuple[bytes, int], int] = {}
        self.written = 0
        self.shared = 0

    def add(self, chunks: Iterable[bytes | memoryview]) -> tuple[int, int]:
        """Store the bytes ``chunks`` give; returns their (offset, length). Bytes stored
        before are not written again."""
        start = -(-self._size // ALIGN) * ALIGN
        self._f.seek(start)
        digest = hashlib.blake2b(digest_size=20)
        length = 0
        for chunk in chunks:
            digest.update(chunk)
            self._f.write(chunk)
            length += len(chunk)
        key = (digest.digest(), length)
        if key in self._index:  # the same tensor another graph stored: take those bytes back
            self._f.truncate(self._size)
            self.shared += length
            return self._index[key], length
        self._index[key] = start
        self._size = start + length
        self.written += length
        return start, length

    def refer(self, tensor: Any, chunks: Iterable[bytes | memoryview]) -> None:
        """Store ``chunks`` as ``tensor``'s data and make ``tensor`` point at them."""
        offset, length = self.add(chunks)
        del tensor.external_data[:]
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", self.path.name), ("offset", str(offset)),
                     ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = k, v

    def close(self) -> None:
        self._f.truncate(self._size)
        self._f.close()

    def __enter__(self) -> WeightStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy_slices(src, offset: int, length: int, name: str, where: str):
    src.seek(offset)
    left = length
    while left:
        chunk = src.read(min(left, _COPY_CHUNK))
        if not chunk:
            raise StudioError(f"{where} ends before initializer {name}: export the model again")
        yield chunk
        left -= len(chunk)


def save_streamed(model: Any, src_dir: Path, path: Path, store: WeightStore | None = None
                  ) -> list[Path]:
    """Write ``model``, whose initializers are external data in files of ``src_dir``, as
    ``path``, its weights copied a slice of at most 64 MiB at a time into ``store`` (the
    folder's shared file) or, without one, into ``path.name + '.data'``. Returns the files
    written (the graph, and its own data file if it has one)."""
    own = store is None
    target = WeightStore(path.parent, path.name + ".data") if store is None else store
    sources: dict[str, Any] = {}
    try:
        for t in model.graph.initializer:
            if t.data_location != onnx.TensorProto.EXTERNAL:
                continue
            ref = {e.key: e.value for e in t.external_data}
            src = sources.get(ref["location"])
            if src is None:
                src = sources[ref["location"]] = open(Path(src_dir) / ref["location"], "rb")
            target.refer(t, _copy_slices(src, int(ref.get("offset", 0)), int(ref["length"]),
                                         t.name, ref["location"]))
    finally:
        for f in sources.values():
            f.close()
        if own:
            target.close()
    onnx.save(model, str(path))
    return [path, target.path] if own else [path]


def save_shared(model: Any, path: Path, store: WeightStore) -> Path:
    """Save the in-memory ``model`` as ``path`` (via a temp name in its folder), its
    initializers of 1 KiB or more stored in ``store`` (which must lie in ``path``'s folder).
    Returns ``path``."""
    path = Path(path)
    if store.path.parent != path.parent:
        raise ValueError(f"{store.path} is not beside {path}")
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            continue
        if t.HasField("raw_data"):
            if len(t.raw_data) < _INLINE_BELOW:
                continue
            store.refer(t, [t.raw_data])
        else:
            arr = numpy_helper.to_array(t)
            if arr.nbytes < _INLINE_BELOW:
                continue
            fresh = numpy_helper.from_array(arr, t.name)
            store.refer(t, [fresh.raw_data])
            t.data_type = fresh.data_type
            for field in ("float_data", "int32_data", "int64_data", "double_data",
                          "uint64_data", "string_data"):
                t.ClearField(field)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        onnx.save(model, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def graph_bytes(path: Path) -> int:
    """The bytes of a graph: its file plus the external data it refers to (each stored
    range once; a range other graphs share counts for each graph)."""
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    ranges: set[tuple[str, int, int]] = set()
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        ref = {e.key: e.value for e in t.external_data}
        length = ref.get("length")
        if length is None:
            length = str(os.path.getsize(path.parent / ref["location"]))
        ranges.add((ref["location"], int(ref.get("offset", 0)), int(length)))
    return path.stat().st_size + sum(n for _, _, n in ranges)


@contextlib.contextmanager
def shared_store(folder: Path) -> Iterator[WeightStore]:
    """The shared file of ``folder`` while its graphs are written; removed if none of them
    used it (graphs small enough to embed their weights)."""
    store = WeightStore(folder)
    try:
        yield store
    finally:
        store.close()
        if store.written == 0:
            store.path.unlink(missing_ok=True)
