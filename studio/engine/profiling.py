"""Profiling runs: a graph run on the QNN HTP simulator with QNN profiling (its CSV, and the
op trace at ``optrace``; :mod:`studio.engine.qnn_profile` reads them), the decode step of a
compiled model, and the host CPU under ONNX Runtime's profiler. The simulator's times are
``simulated``: real HTP kernels, not a device's clock."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.catalog import Chip
from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.engine.ort_types import ORT_TO_NUMPY
from studio.engine.qnn import (
    OP_TRACE_FILE,
    PROFILING_LEVELS,
    first_line,
    make_session,
    timing_source,
)
from studio.engine.threads import HOST_THREADS

ort = lazy_module("onnxruntime")

_ORT_DTYPES = ORT_TO_NUMPY


def synthetic_feeds(session, fill: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Zero-filled inputs matching a session's static input shapes and dtypes.

    ``fill`` sets a constant for named inputs (e.g. ``{"position_ids": 16}``). For
    profiling: the HTP's dense kernels take the same path whatever the values.
    """
    feeds = {}
    for inp in session.get_inputs():
        dtype = _ORT_DTYPES.get(inp.type)
        if dtype is None:
            raise StudioError(
                f"input {inp.name} has type {inp.type}, which cannot be synthesized; pass feeds"
            )
        if not all(isinstance(d, int) and d >= 0 for d in inp.shape):
            raise StudioError(
                f"input {inp.name} has a dynamic shape {inp.shape}; export with fixed shapes or pass feeds"
            )
        feeds[inp.name] = np.full(inp.shape, (fill or {}).get(inp.name, 0), dtype=dtype)
    return feeds


def profile_decode_step(
    ctx_onnx: str | os.PathLike,
    chip: Chip | str,
    spec: Mapping[str, Any] | None,
    out_csv: str | os.PathLike,
    fp16: bool = False,
    runs: int = 1,
    level: str = "detailed",
    extra_options: Mapping[str, Any] | None = None,
) -> dict:
    """Profile one step of a (compiled) decode graph with synthetic inputs.
    ``extra_options``: more QNN EP options (the recipe's HTP options, as the compile had).

    Inputs are zeros of the graph's static shapes, except ``position_ids`` (set to the
    spec's ``prompt_length``, a realistic first decode position). See :func:`profile_run`.
    """
    pos = int((spec or {}).get("prompt_length", 0))
    return profile_run(
        ctx_onnx,
        chip,
        lambda sess: synthetic_feeds(sess, {"position_ids": pos}),
        out_csv,
        level=level,
        fp16=fp16,
        runs=runs,
        extra_options=extra_options,
    )


def profile_run(
    onnx_path: str | os.PathLike,
    chip: Chip | str,
    feeds: Mapping[str, Any] | Callable[[Any], Mapping[str, Any]] | None,
    out_csv: str | os.PathLike,
    level: str = "detailed",
    fp16: bool = False,
    runs: int = 1,
    *,
    strict: bool = True,
    threads: int = HOST_THREADS,
    op_trace: bool = True,
    extra_options: Mapping[str, Any] | None = None,
) -> dict:
    """Run ``onnx_path`` ``runs`` times on the HTP with QNN profiling and keep the CSV.

    ``feeds`` is a mapping of inputs, a function ``session -> inputs``, or None for
    :func:`synthetic_feeds`. Writes ``out_csv`` (one block of rows per run; parse it with
    :func:`studio.engine.qnn_profile.parse_profile_csv`), the EP's op trace
    (``<stem>_op_trace.json``, QNN op -> ONNX nodes) and, for ``optrace``, the compiler's
    ``…_schematic.bin`` files beside it. On this machine the numbers are *simulated*.
    Returns ``{"csv", "op_trace", "schematic", "qnn_log", "level", "runs", "wall_s",
    "outputs", "source"}``.
    """
    if level not in PROFILING_LEVELS:
        raise StudioError(
            f"unknown profiling level '{level}'; use one of {', '.join(PROFILING_LEVELS)}"
        )
    if runs < 1:
        raise StudioError("profile at least one run (runs >= 1)")
    out = Path(out_csv).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".qnn-profile-", dir=out.parent))
    cwd = Path.cwd()
    before = set(glob.glob(str(cwd / "*_schematic.bin")))
    t_start = time.time()
    try:
        csv_tmp = tmp / out.name
        wall, outputs = _profiled_runs(
            onnx_path, chip, feeds, runs, strict=strict, fp16=fp16, profiling_level=level,
            profiling_path=csv_tmp, threads=threads,
            op_trace_dir=tmp if op_trace else None, extra_options=extra_options)
        if not csv_tmp.is_file():
            raise StudioError("the QNN EP wrote no profiling CSV; check the profiling level")
        results = _keep_profile_files(tmp, out, csv_tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # optrace writes its schematic into the current directory: move it next to the CSV.
    for f in sorted(set(glob.glob(str(cwd / "*_schematic.bin"))) - before):
        if os.path.getmtime(f) >= t_start - 1:
            dest = out.parent / f"{out.stem}_{Path(f).name}"
            shutil.move(f, dest)
            results["schematic"].append(str(dest))
    results.update(
        {
            "level": level,
            "runs": runs,
            "wall_s": wall,
            "outputs": outputs,
            "source": timing_source(),
        }
    )
    return results


def _profiled_runs(onnx_path: str | os.PathLike, chip: Chip | str,
                   feeds: Mapping[str, Any] | Callable[[Any], Mapping[str, Any]] | None,
                   runs: int, **session: Any) -> tuple[list[float], Any]:
    """A profiling session of the graph run ``runs`` times: each run's wall time and the
    last run's outputs. The session is released before this returns (the EP writes its
    profile then)."""
    sess = make_session(onnx_path, chip, **session)
    wall = []
    outputs = None
    try:
        if feeds is None:
            inputs = synthetic_feeds(sess)
        elif callable(feeds):
            inputs = dict(feeds(sess))
        else:
            inputs = dict(feeds)
        for _ in range(runs):
            t0 = time.perf_counter()
            outputs = sess.run(None, inputs)
            wall.append(time.perf_counter() - t0)
    except StudioError:
        raise
    except Exception as e:
        raise StudioError(
            f"profiling run of {Path(onnx_path).name} failed: {first_line(str(e))}; "
            "check the inputs' names, shapes and dtypes"
        ) from None
    finally:
        del sess
    return wall, outputs


def _keep_profile_files(tmp: Path, out: Path, csv_tmp: Path) -> dict[str, Any]:
    """The profile's CSV, the EP's op trace and the binary QNN log moved from ``tmp`` to
    beside ``out``; their paths."""
    stem = out.stem
    results: dict[str, Any] = {
        "csv": str(out),
        "op_trace": None,
        "qnn_log": None,
        "schematic": [],
    }
    trace = tmp / OP_TRACE_FILE
    if trace.is_file():
        os.replace(trace, out.parent / f"{stem}_op_trace.json")
        results["op_trace"] = str(out.parent / f"{stem}_op_trace.json")
    qnn_log = tmp / f"{stem}_qnn.log"  # the binary log qnn-profile-viewer reads
    if qnn_log.is_file():
        os.replace(qnn_log, out.parent / qnn_log.name)
        results["qnn_log"] = str(out.parent / qnn_log.name)
    os.replace(csv_tmp, out)
    return results


def profile_host_cpu(
    onnx_path: str | os.PathLike,
    out_json: str | os.PathLike,
    position: int = 0,
    runs: int = 3,
    threads: int = HOST_THREADS,
) -> dict:
    """Run ``onnx_path`` ``runs`` times on the host CPU with ONNX Runtime's profiler and keep
    its JSON (per-node start / duration, thread, provider): a *measured* host timeline.
    Inputs as :func:`synthetic_feeds` (``position_ids`` = ``position``).
    Returns ``{"json", "runs", "wall_s"}``."""
    out = Path(out_json).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".ort-profile-", dir=out.parent))
    try:
        opts = ort.SessionOptions()
        opts.enable_profiling = True
        opts.profile_file_prefix = str(tmp / "ort")
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        try:
            sess = ort.InferenceSession(str(onnx_path), sess_options=opts,
                                        providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - ORT raises its own types
            raise StudioError(
                f"cannot load {Path(onnx_path).name} on the CPU: {first_line(str(e))}"
            ) from None
        feeds = synthetic_feeds(sess, {"position_ids": position})
        wall = []
        for _ in range(runs):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            wall.append(time.perf_counter() - t0)
        written = Path(sess.end_profiling())
        os.replace(written, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"json": str(out), "runs": runs, "wall_s": wall}
