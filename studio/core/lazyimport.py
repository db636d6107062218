"""Heavy third-party libraries, declared at a module's top and loaded on first use.

A module that runs ONNX, ONNX Runtime or torch names them where a reader looks for its
dependencies, beside its other imports::

    onnx = lazy_module("onnx")
    ort = lazy_module("onnxruntime")
    numpy_helper = lazy_module("onnx.numpy_helper")

and the library is imported the first time one of its attributes is read (``onnx.load``).
So ``studio --help``, the window's start and the service modules stay light (rule 2 of the
architecture: the heavy libraries load lazily) without an ``import`` statement inside each
function that uses them — the shape of PEP 810's ``lazy import``, which Python 3.11 lacks.

Only for the heavy third-party libraries: the studio's own modules import each other at the
top, so a circle among them shows (``tests/services/test_import_graph.py``).

Pure: the standard library only; nothing is imported until an attribute is read.
"""

from __future__ import annotations

import importlib
import types
from typing import Any


class LazyModule(types.ModuleType):
    """A stand-in for the module ``name`` until an attribute is read; then every attribute
    read goes to the real module (imported once: it is in ``sys.modules`` after)."""

    def __init__(self, name: str, also: tuple[str, ...] = ()) -> None:
        super().__init__(name)
        self.__dict__["__lazy_also__"] = also
        self.__dict__["__lazy_real__"] = None

    def __lazy_load__(self) -> types.ModuleType:
        real = self.__dict__["__lazy_real__"]
        if real is None:
            real = importlib.import_module(self.__name__)
            for sub in self.__dict__["__lazy_also__"]:
                importlib.import_module(sub)
            self.__dict__["__lazy_real__"] = real
        return real

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__lazy_"):
            raise AttributeError(attr)
        return getattr(self.__lazy_load__(), attr)

    def __dir__(self) -> list[str]:
        return dir(self.__lazy_load__())

    def __repr__(self) -> str:
        state = "loaded" if self.__dict__["__lazy_real__"] is not None else "not loaded yet"
        return f"<lazy module {self.__name__!r} ({state})>"


def lazy_module(name: str, *also: str) -> Any:
    """The module ``name``, imported when one of its attributes is first read; ``also``: its
    submodules to import with it (``lazy_module("onnx", "onnx.reference")``, for code that
    reads ``onnx.reference`` and finds it only once imported). Typed ``Any``: a checker
    reads the real module's attributes through it as it would through ``import name``'s
    result in a function."""
    return LazyModule(name, also)

