"""ONNX external data that the artifact store hard-links.

The part cache (:mod:`studio.core.partcache`) keeps a finished part's files as hard links to
the artifact that wrote them, and a later artifact that reuses the part links them again:
one copy on disk however many runs share it. A part past
:data:`studio.engine.weightstore.SHARE_ABOVE` keeps its weights in ``weights.data``, so that
file has several links. ``onnx`` (1.19 and later) refuses to read external data from a file
with more than one link (its guard against a link that points a model at a file its author
should not read), so every ``onnx.load`` of such a part — the Genie bundle's graph surgery,
the encodings export, ONNX Runtime's quantization tools — failed with "it has multiple hard
links", while ONNX Runtime itself reads it. The failure never shows on small models, whose
weights stay inside the graph file.

:func:`install` replaces onnx's opener of external data files with one that keeps its other
guards for reading (the location must be relative, inside the model's folder, a regular
file) and accepts a link count above one; writing goes through onnx's own opener, which
still refuses a linked file. It is installed when :mod:`studio.engine` is imported and
takes effect when ``onnx.external_data_helper`` is (it is patched then, or at once if it
already was), so nothing imports onnx before it is needed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import PurePath
from types import ModuleType
from typing import Any

from studio.core.lazyimport import lazy_module

checker = lazy_module("onnx.checker")

TARGET = "onnx.external_data_helper"
_MARK = "_studio_accepts_linked_data"


_original = None  # onnx's own opener: it still writes (a linked file is never written into)


def open_external_data(base_dir: str, location: str, tensor_name: str, read_only: bool) -> int:
    """A file descriptor of ``location`` under ``base_dir`` (what onnx's own opener returns):
    for reading, refusing what onnx refuses but a link count above one; for writing, onnx's
    own (which refuses a linked file: writing into it would change every artifact that
    shares it)."""
    if not read_only and _original is not None:
        return _original(base_dir, location, tensor_name, read_only)

    loc = PurePath(location)
    if not location or loc.is_absolute() or ".." in loc.parts:
        raise checker.ValidationError(f"Data of TensorProto ( tensor name: {tensor_name}) names "
                              f"{location!r}, which is not a path inside the model's folder")
    path = os.path.join(base_dir, location)
    if not os.path.isfile(path):
        raise checker.ValidationError(f"Data of TensorProto ( tensor name: {tensor_name}) should be "
                              f"stored in {path}, but it doesn't exist or is not accessible.")
    return os.open(path, os.O_RDONLY)


def patch(module: Any) -> None:
    """Give ``onnx.external_data_helper`` the opener above (once; a version of onnx without
    that function is left as it is)."""
    global _original
    if hasattr(module, "_open_external_data_fd") and not getattr(module, _MARK, False):
        _original = module._open_external_data_fd
        module._open_external_data_fd = open_external_data
        setattr(module, _MARK, True)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the module as it is imported."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Patch onnx's opener now if onnx is imported, else when it is (idempotent)."""
    module = sys.modules.get(TARGET)
    if module is not None:
        patch(module)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
