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

A library's package whose ``__init__`` imports far more than the module wanted can be left
bare (``bare=``): ONNX Runtime's ``onnxruntime.tools`` imports torch (2 s and about 300 MB
in a quantize worker that has no other use for it), and so does
``onnxruntime.quantization.execution_providers.qnn``, whose ``__init__`` imports the QNN
preprocessing through it. The bare package is registered without running its ``__init__``;
its submodules import as usual, and the first read of a name only the ``__init__`` gives
runs it then.

Only for the heavy third-party libraries: the studio's own modules import each other at the
top, so a circle among them shows (``tests/services/test_import_graph.py``).

Pure: the standard library only; nothing is imported until an attribute is read.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

#: ONNX Runtime's tools package: its ``__init__`` imports torch (``pytorch_export_helpers``);
#: the QNN preprocessing and the shape inference the studio uses from it do not need it
ORT_TOOLS = "onnxruntime.tools"


class LazyModule(types.ModuleType):
    """A stand-in for the module ``name`` until an attribute is read; then every attribute
    read goes to the real module (imported once: it is in ``sys.modules`` after)."""

    def __init__(self, name: str, also: tuple[str, ...] = (), bare: str | None = None) -> None:
        super().__init__(name)
        self.__dict__["__lazy_also__"] = also
        self.__dict__["__lazy_bare__"] = bare
        self.__dict__["__lazy_real__"] = None

    def __lazy_load__(self) -> types.ModuleType:
        real = self.__dict__["__lazy_real__"]
        if real is None:
            if self.__dict__["__lazy_bare__"]:
                bare_package(self.__dict__["__lazy_bare__"])
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


def lazy_module(name: str, *also: str, bare: str | None = None) -> Any:
    """The module ``name``, imported when one of its attributes is first read; ``also``: its
    submodules to import with it (``lazy_module("onnx", "onnx.reference")``, for code that
    reads ``onnx.reference`` and finds it only once imported); ``bare``: a package above
    ``name`` whose ``__init__`` is not run for it (:func:`bare_package`). Typed ``Any``: a
    checker reads the real module's attributes through it as it would through
    ``import name``'s result in a function."""
    return LazyModule(name, also, bare)


def bare_package(name: str) -> types.ModuleType:
    """The package ``name``, registered without running its ``__init__`` unless it is
    imported already: its submodules import as usual (their parents are imported first, as
    always); reading a name that only its ``__init__`` gives runs the ``__init__`` then, in
    the same module, so the package ends as it would have been."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ModuleNotFoundError(f"no package named {name!r}", name=name)
    module = importlib.util.module_from_spec(spec)
    ran = False

    def init_on_demand(attr: str) -> Any:
        nonlocal ran
        if ran or attr.startswith("__"):
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        ran = True
        del module.__dict__["__getattr__"]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return getattr(module, attr)

    module.__dict__["__getattr__"] = init_on_demand
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module

