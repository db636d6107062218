"""Any ONNX network's data: its inputs with static shapes (or shapes the user fixes), the
calibration / validation samples a user gives as ``.npz`` / ``.npy`` files checked against
those inputs, and the per-output comparison of two runs of the graph."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_bytes
from studio.core.lazyimport import lazy_module
from studio.engine.onnx_import import open_onnx

onnx = lazy_module("onnx")


@dataclass(frozen=True)
class GraphInput:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple[int | str, ...]  # a str is a symbolic (dynamic) dimension

    @property
    def static(self) -> bool:
        return all(isinstance(d, int) and d > 0 for d in self.shape)


def graph_inputs(model) -> list[GraphInput]:
    """The graph's real inputs (initializers listed as inputs left out)."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for v in model.graph.input:
        if v.name in inits:
            continue
        t = v.type.tensor_type
        dims: list[int | str] = []
        for d in t.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                        else (d.dim_param or "?"))
        out.append(GraphInput(v.name, onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name,
                              tuple(dims)))
    return out


def _fmt(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def make_static(src: Path, dst: Path, shapes: dict[str, list[int]] | None = None) -> list[GraphInput]:
    """Write ``src`` with every input's shape fixed — the ones it declares, the dynamic ones
    from ``shapes`` (name -> dims) — and the shapes inferred through the graph. A dynamic
    input without a shape, a shape of the wrong rank or one contradicting a fixed dimension
    is a one-line error naming the input."""
    open_onnx(Path(src))
    model = onnx.load(str(src))
    shapes = dict(shapes or {})
    inputs = graph_inputs(model)
    names = {i.name for i in inputs}
    unknown = [n for n in shapes if n not in names]
    if unknown:
        raise StudioError(f"{Path(src).name} has no input {unknown[0]!r} (its inputs: "
                          f"{', '.join(sorted(names))})")
    by_name = {v.name: v for v in model.graph.input}
    for i in inputs:
        want = shapes.get(i.name)
        if want is None:
            if not i.static:
                raise StudioError(f"input {i.name!r} of {Path(src).name} has the dynamic shape "
                                  f"{_fmt(i.shape)}: give it a fixed shape (the HTP compiles "
                                  "static shapes only)")
            continue
        if len(want) != len(i.shape) or any(w < 1 for w in want) or any(
                isinstance(d, int) and d > 0 and d != w for d, w in zip(i.shape, want, strict=True)):
            raise StudioError(f"input {i.name!r} is {_fmt(i.shape)}: the shape {_fmt(want)} does "
                              "not fit it (same rank, the fixed dimensions kept, all >= 1)")
        for d, w in zip(by_name[i.name].type.tensor_type.shape.dim, want, strict=True):
            d.Clear()
            d.dim_value = int(w)
    del model.graph.value_info[:]
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:  # noqa: BLE001 - the shapes then stay the inputs' only
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise StudioError(f"the shapes do not propagate through {Path(src).name} ({first}): "
                          "check the input shapes") from None
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(Path(dst), model.SerializeToString())
    return graph_inputs(model)


def load_samples(path: Path, inputs: list[GraphInput], what: str = "calibration data",
                 ) -> list[dict[str, Any]]:
    """Feeds from a ``.npz`` (one array per input, named as the input) or a ``.npy`` (a
    one-input graph): each array holds one sample of the input's shape, or several stacked
    along a new first axis. Missing inputs, wrong dtypes and wrong shapes are one-line
    errors that say what the file should hold."""
    path = Path(path)
    if not path.is_file():
        raise StudioError(f"{what} {path} does not exist: give a .npz with one array per "
                          "model input")
    try:
        if path.suffix.lower() == ".npy":
            if len(inputs) != 1:
                raise StudioError(f"{path.name} is one array but the model has {len(inputs)} "
                                  f"inputs ({', '.join(i.name for i in inputs)}): give a .npz "
                                  "with an array per input")
            arrays = {inputs[0].name: np.load(path, allow_pickle=False)}
        else:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
    except StudioError:
        raise
    except Exception as exc:  # noqa: BLE001 - zip / format / pickle errors
        raise StudioError(f"{what} {path.name} cannot be read as NumPy data "
                          f"({type(exc).__name__}): save it with numpy.savez") from None
    counts = set()
    for i in inputs:
        if i.name not in arrays:
            raise StudioError(f"{what} {path.name} has no array {i.name!r} (the model's "
                              f"inputs: {', '.join(x.name for x in inputs)}; the file has: "
                              f"{', '.join(sorted(arrays)) or 'nothing'})")
        a = arrays[i.name]
        if a.dtype.name != i.dtype:
            raise StudioError(f"{what} {path.name}: {i.name!r} is {a.dtype.name}, the model "
                              f"wants {i.dtype}: convert it (astype)")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            bad = int(a.size - np.isfinite(a).sum())
            raise StudioError(f"{what} {path.name}: {i.name!r} holds {bad:,} NaN or infinite "
                              f"value(s) of {a.size:,}: calibrate on real, finite samples")
        shape = tuple(int(d) for d in i.shape)  # static by now
        if a.shape == shape:
            counts.add(1)
        elif a.ndim == len(shape) + 1 and a.shape[1:] == shape and a.shape[0] >= 1:
            counts.add(a.shape[0])
        else:
            raise StudioError(f"{what} {path.name}: {i.name!r} is {_fmt(a.shape)}, the model "
                              f"wants {_fmt(shape)} per sample (or [N, ...] of them)")
    if len(counts) > 1:
        raise StudioError(f"{what} {path.name}: the arrays hold different numbers of samples "
                          f"({', '.join(str(c) for c in sorted(counts))}): give the same N")
    n = counts.pop() if counts else 0
    out = []
    for k in range(n):
        feed = {}
        for i in inputs:
            a = arrays[i.name]
            feed[i.name] = np.ascontiguousarray(a if a.shape == tuple(i.shape) else a[k])
        out.append(feed)
    return out


def compare_outputs(reference, other, feeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Two sessions of the same graph (say FP32 on the CPU and the quantized graph on the
    HTP) over ``feeds``: per output the worst cosine and the max |error|, and the same over
    all outputs."""
    if not feeds:
        raise StudioError("the comparison needs at least one sample input")
    names = [o.name for o in reference.get_outputs()]
    out: dict[str, dict[str, float]] = {}
    for feed in feeds:
        ref = reference.run(names, feed)
        got = other.run(names, feed)
        for name, x, y in zip(names, ref, got, strict=True):
            a = np.asarray(x, np.float64).ravel()
            b = np.asarray(y, np.float64).ravel()
            na, nb = np.linalg.norm(a), np.linalg.norm(b)
            cos = 1.0 if na == nb == 0 else float(a @ b / (na * nb + 1e-30))
            o = out.setdefault(name, {"cosine": 1.0, "max_abs_error": 0.0})
            o["cosine"] = min(o["cosine"], cos)
            o["max_abs_error"] = max(o["max_abs_error"], float(np.abs(a - b).max(initial=0.0)))
    return {"outputs": out, "samples": len(feeds),
            "worst_cosine": min(o["cosine"] for o in out.values()),
            "max_abs_error": max(o["max_abs_error"] for o in out.values())}
