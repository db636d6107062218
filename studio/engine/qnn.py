"""Adapter to the Qualcomm HTP backend through ONNX Runtime's QNN execution provider.

``onnxruntime-qnn`` is a *plugin* EP: :func:`register` loads it once per process; sessions
then pick its device with ``SessionOptions.add_provider_for_devices``. On x86 its HTP
backend is Qualcomm's HTP **simulator**: the numerics are the real HTP kernels', the
timings are not device timings (they follow the host CPU).

Everything here is strict by default: a node that the HTP cannot run is an error naming
the node, never a silent CPU fallback. Heavy libraries (onnxruntime, onnx) are imported
inside the functions.

The QNN EP writes its diagnostics from C++ to file descriptor 2; the functions that need
them redirect fd 2 into a temporary file around session creation (under a lock, so two
threads do not interleave their captures) and read the EP's ``qnn_op_trace.json``, which
names every node the HTP rejected and why.
"""

from __future__ import annotations

import contextlib
import functools
import json
import mmap
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from studio.core.catalog import Chip, get_chip
from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.engine.onnx_import import open_onnx
from studio.engine.threads import HOST_THREADS

onnx = lazy_module("onnx")
helper = lazy_module("onnx.helper")

EP_NAME = "QNNExecutionProvider"
PROFILING_LEVELS = ("basic", "detailed", "optrace")
OP_TRACE_FILE = "qnn_op_trace.json"

_REGISTER_LOCK = threading.Lock()
_STDERR_LOCK = threading.Lock()
_MAX_NAMED = 12  # nodes named in one error line


# ---------------------------------------------------------------------------------------
# registration and versions
# ---------------------------------------------------------------------------------------
def _import_qnn():
    try:  # optional: no onnxruntime-qnn wheel exists for macOS; the doctor says so
        import onnxruntime as ort
        import onnxruntime_qnn as oq
    except ImportError as e:
        raise StudioError(
            f"the QNN execution provider is not installed ({e}); "
            "pip install 'onnxruntime>=1.24.2' 'onnxruntime-qnn>=2.7'"
        ) from None
    return ort, oq


def register() -> None:
    """Register the QNN plugin EP with ONNX Runtime (idempotent, thread-safe)."""
    ort, oq = _import_qnn()
    name = oq.get_ep_name()
    with _REGISTER_LOCK:
        if any(d.ep_name == name for d in ort.get_ep_devices()):
            return
        try:
            ort.register_execution_provider_library(name, oq.get_library_path())
        except Exception as e:  # ORT raises its own Fail type
            if "already registered" not in str(e):
                raise StudioError(
                    f"could not load the QNN execution provider {oq.get_library_path()}: "
                    f"{first_line(str(e))}; reinstall onnxruntime-qnn"
                ) from None


def _ep_devices() -> list:
    ort, oq = _import_qnn()
    register()
    devices = [d for d in ort.get_ep_devices() if d.ep_name == oq.get_ep_name()]
    if not devices:
        raise StudioError(
            "the QNN execution provider registered but offers no device; reinstall onnxruntime-qnn"
        )
    return devices


def versions() -> dict[str, str | None]:
    """Versions of the runtime stack (read once per process).

    ``qnn_sdk`` is the QAIRT/QNN SDK the wheel carries (e.g. "2.51.0");
    ``qnn_sdk_build`` is the backend's full build id, the same string a compiled context
    records in its EPContext node's ``ep_sdk_version`` (e.g. "v2.51.0.260929181845").
    """
    return dict(_versions())


@functools.lru_cache(maxsize=1)
def _versions() -> dict[str, str | None]:
    ort, oq = _import_qnn()
    try:  # a wheel's build facts; older onnxruntime-qnn wheels have none
        from onnxruntime_qnn import build_and_package_info as info

        sdk = getattr(info, "qnn_version", None)
    except ImportError:
        sdk = None
    build = _sdk_build_id(oq.get_qnn_htp_path(), sdk)
    if sdk is None and build:
        sdk = build.lstrip("v").rsplit(".", 1)[0]
    return {
        "onnxruntime": ort.__version__,
        "onnxruntime_qnn": getattr(oq, "__version__", None),
        "qnn_sdk": sdk,
        "qnn_sdk_build": build,
    }


def _sdk_build_id(library: str, sdk: str | None) -> str | None:
    """The 'v2.51.0.260929181845' build id embedded in libQnnHtp.so (read via mmap)."""
    prefix = re.escape(sdk).encode() if sdk else rb"\d+\.\d+\.\d+"
    pattern = re.compile(rb"v(" + prefix + rb"\.\d{6,})")
    try:
        with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            m = pattern.search(mm)
            found = bytes(m.group(1)).decode() if m else None
    except (OSError, ValueError):
        return None
    return "v" + found if found else None


def timing_source() -> str:
    """The honesty label of HTP timings on this host: the x86 backend is a simulator."""
    machine = platform.machine().lower()
    return "measured" if machine in ("aarch64", "arm64") else "simulated"


# ---------------------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------------------
def _chip(chip: Chip | str) -> Chip:
    return chip if isinstance(chip, Chip) else get_chip(chip)


def provider_options(
    chip: Chip | str,
    fp16: bool = False,
    profiling_level: str | None = None,
    profiling_path: str | os.PathLike | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """QNN EP provider options for a target chip (all values are strings)."""
    _, oq = _import_qnn()
    chip = _chip(chip)
    opts = {
        "backend_path": oq.get_qnn_htp_path(),
        "htp_arch": str(chip.htp_arch),
        "soc_model": str(chip.soc_model),
        "vtcm_mb": str(chip.vtcm_mb),
    }
    if fp16:
        if not chip.fp16:
            raise StudioError(
                f"{chip.name} ({chip.key}) does not run float graphs on its HTP; "
                "quantize the model (e.g. W8A16) or pick another target"
            )
        # Both are needed: the EP refuses FP16 without a soc_model.
        opts["enable_htp_fp16_precision"] = "1"
    if profiling_level is not None:
        if profiling_level not in PROFILING_LEVELS:
            raise StudioError(
                f"unknown profiling level '{profiling_level}'; use one of {', '.join(PROFILING_LEVELS)}"
            )
        if profiling_path is None:
            raise StudioError("profiling needs a CSV path to write to; pass profiling_path")
        opts["profiling_level"] = profiling_level
        opts["profiling_file_path"] = os.path.abspath(os.fspath(profiling_path))
    for k, v in (extra or {}).items():
        opts[str(k)] = ("1" if v else "0") if isinstance(v, bool) else str(v)
    return opts


def _session_options(
    chip: Chip,
    *,
    strict: bool,
    fp16: bool,
    threads: int,
    log_level: int,
    profiling_level: str | None = None,
    profiling_path: str | os.PathLike | None = None,
    extra: Mapping[str, Any] | None = None,
    config: Mapping[str, str] | None = None,
):
    ort, _ = _import_qnn()
    so = ort.SessionOptions()
    so.log_severity_level = log_level
    so.intra_op_num_threads = max(1, int(threads))
    so.inter_op_num_threads = 1
    if strict:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    opts = provider_options(chip, fp16, profiling_level, profiling_path, extra)
    so.add_provider_for_devices(_ep_devices(), opts)
    return so


# ---------------------------------------------------------------------------------------
# native stderr capture and failure diagnosis
# ---------------------------------------------------------------------------------------
class _Captured:
    text = ""


@contextlib.contextmanager
def capture_native_stderr() -> Iterator[_Captured]:
    """Redirect file descriptor 2 (where ORT/QNN log from C++) into a temp file."""
    box = _Captured()
    with _STDERR_LOCK, tempfile.TemporaryFile() as f:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no fd 2 (e.g. a windowed app): nothing to capture
            yield box
            return
        os.dup2(f.fileno(), 2)
        try:
            yield box
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            box.text = f.read().decode("utf-8", "replace")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(text: str) -> str:
    for line in _ANSI.sub("", text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def _read_op_trace(trace_dir: str | os.PathLike | None) -> dict | None:
    if not trace_dir:
        return None
    p = Path(trace_dir) / OP_TRACE_FILE
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


_UNSUPPORTED_LOG = re.compile(r"\{ name: (.*?), type: (\w+) \}")


def _unsupported_nodes(trace: dict | None, log: str) -> list[dict]:
    """[{name, op_type, reason}] of the nodes the QNN EP rejected (deduplicated)."""
    out: dict[str, dict] = {}
    for n in (trace or {}).get("unsupported_nodes", []) or []:
        name = str(n.get("node_name", ""))
        out.setdefault(
            name,
            {
                "name": name,
                "op_type": str(n.get("op_type", "")),
                "reason": str(n.get("reason", "")).strip() or "rejected by the QNN EP",
            },
        )
    for line in log.splitlines():
        if "Unsupported nodes in QNN EP" in line:
            for name, op_type in _UNSUPPORTED_LOG.findall(line):
                out.setdefault(
                    name, {"name": name, "op_type": op_type, "reason": "rejected by the QNN EP"}
                )
    return list(out.values())


_DEVICE_FAIL = re.compile(r"(QNN SetupBackend failed[^\n\x1b]*)")


def _backend_failure(log: str) -> str | None:
    m = _DEVICE_FAIL.search(_ANSI.sub("", log))
    return m.group(1).strip() if m else None


def _name_nodes(nodes: list[dict]) -> str:
    parts = [f"{n['name']} ({n['op_type']}: {n['reason']})" for n in nodes[:_MAX_NAMED]]
    if len(nodes) > _MAX_NAMED:
        parts.append(f"and {len(nodes) - _MAX_NAMED} more")
    return "; ".join(parts)


def _diagnose(
    err: BaseException, log: str, trace: dict | None, path: Path, chip: Chip
) -> StudioError:
    msg = first_line(str(err))
    device = _backend_failure(log)
    if device:
        return StudioError(
            f"the QNN HTP backend refused target {chip.key} (htp_arch {chip.htp_arch}, "
            f"soc_model {chip.soc_model}): {device}; fix this target in the chip catalog"
        )
    bad = _unsupported_nodes(trace, log)
    if bad:
        return StudioError(
            f"{len(bad)} node(s) of {path.name} cannot run on the NPU of {chip.name} "
            f"(HTP v{chip.htp_arch}): {_name_nodes(bad)}; replace these ops (or quantize the "
            "model), or allow CPU fallback with strict=False"
        )
    if "INVALID_PROTOBUF" in msg or "No graph was found" in msg or "Protobuf parsing" in msg:
        return StudioError(f"{path} is not an ONNX model ({msg}); export the model to ONNX first")
    if "ep_cache_context" in msg:
        return StudioError(
            f"{path.name} is a compiled context model whose context binary is missing ({msg}); "
            "keep the _qnn.bin file next to it or compile again"
        )
    if "contextCreateFromBinary" in msg and "MEM_ALLOC" in (msg + log):
        # a compiled context that does not fit beside what is loaded already (the parts of
        # a large model chained at once): measured with the 3 B shape's 18 binaries
        return SimulatorFull(
            f"the QNN HTP has no memory left to load {path.parent.name}/{path.name} for "
            f"{chip.name} ({msg}); load fewer context binaries at once (a model in parts is "
            "scored one part at a time) or split it into smaller parts"
        )
    if "MEM_ALLOC" in log or "finaliz" in (msg + log).lower():
        return StudioError(
            f"the QNN HTP could not finalize {path.name} for {chip.name} ({msg}); for a float model "
            "pass fp16=True, or quantize it"
        )
    return StudioError(f"QNN HTP session for {path.name} on {chip.key} failed: {msg}")


class SimulatorFull(StudioError):
    """The HTP has no memory left for one more context binary beside those loaded: a model
    in parts is then checked one part at a time."""


def _check_model_file(onnx_path: str | os.PathLike) -> Path:
    p = Path(onnx_path)
    if not p.is_file():
        raise StudioError(f"model file {p} not found; check the path")
    if p.stat().st_size == 0:
        raise StudioError(f"{p} is empty, not an ONNX model; export the model to ONNX first")
    return p


def _create_session(path: Path, so):
    ort, _ = _import_qnn()
    # enable_fallback=0: the Python wrapper would otherwise retry on CPU when QNN fails.
    sess = ort.InferenceSession(str(path), sess_options=so, enable_fallback=0)
    sess.disable_fallback()
    return sess


# ---------------------------------------------------------------------------------------
# sessions
# ---------------------------------------------------------------------------------------
def make_session(
    onnx_path: str | os.PathLike,
    chip: Chip | str,
    strict: bool = True,
    fp16: bool = False,
    profiling_level: str | None = None,
    profiling_path: str | os.PathLike | None = None,
    threads: int = HOST_THREADS,
    *,
    extra_options: Mapping[str, Any] | None = None,
    session_config: Mapping[str, str] | None = None,
    op_trace_dir: str | os.PathLike | None = None,
    log_level: int = 3,
):
    """An ``onnxruntime.InferenceSession`` on the QNN HTP for ``chip``.

    ``strict`` (default): every node must run on the HTP; otherwise a :class:`StudioError`
    names the rejected nodes and why. ``op_trace_dir`` keeps the EP's
    ``qnn_op_trace.json`` (QNN op -> ONNX nodes) there.
    """
    path = _check_model_file(onnx_path)
    chip = _chip(chip)
    with contextlib.ExitStack() as stack:
        trace_dir = op_trace_dir
        if trace_dir is None and strict:
            trace_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="qnn-trace-"))
        extra = dict(extra_options or {})
        if trace_dir is not None:
            os.makedirs(trace_dir, exist_ok=True)
            extra.setdefault("enable_framework_op_trace", "1")
            extra.setdefault("framework_op_trace_dir", os.path.abspath(os.fspath(trace_dir)))
        so = _session_options(
            chip,
            strict=strict,
            fp16=fp16,
            threads=threads,
            log_level=log_level,
            profiling_level=profiling_level,
            profiling_path=profiling_path,
            extra=extra,
            config=session_config,
        )
        with capture_native_stderr() as cap:
            try:
                sess = _create_session(path, so)
                err = None
            except Exception as e:  # ORT raises its own exception types
                sess, err = None, e
        if err is not None:
            raise _diagnose(err, cap.text, _read_op_trace(trace_dir), path, chip) from None
        if cap.text.strip():
            # Nothing is lost: what the EP said goes on to the real stderr.
            sys.stderr.write(cap.text)
    return sess


def export_dlc(onnx_path: str | os.PathLike, chip: Chip | str, out_file: str | os.PathLike,
               fp16: bool = False) -> dict[str, Any]:
    """Write the QNN graph of ``onnx_path`` for ``chip`` as a DLC file (the QNN EP's
    ``dump_qnn_ir_dlc`` at session creation). A DLC is for Qualcomm's on-device tools: this
    host cannot run it back. Returns ``{"file", "bytes", "entries"}`` (the DLC is a ZIP)."""
    out = Path(out_file).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".dlc-", dir=out.parent))
    try:
        sess = make_session(onnx_path, chip, strict=False, fp16=fp16,
                            extra_options={"dump_qnn_ir_dlc": "1",
                                           "dump_qnn_ir_dlc_dir": str(tmp)})
        del sess
        found = sorted(tmp.glob("*.dlc"))
        if len(found) != 1:
            raise StudioError(f"the QNN EP wrote {len(found)} DLC files for {Path(onnx_path).name}"
                              ", not one: the graph was split between the HTP and the CPU")
        os.replace(found[0], out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        with zipfile.ZipFile(out) as z:
            entries = sorted(z.namelist())
    except zipfile.BadZipFile:
        entries = []
    return {"file": out.name, "bytes": out.stat().st_size, "entries": entries}


def placement_report(
    onnx_path: str | os.PathLike,
    chip: Chip | str,
    fp16: bool = False,
    threads: int = HOST_THREADS,
    *,
    offload_io_quantization: bool = False,
    extra_options: Mapping[str, Any] | None = None,
) -> dict:
    """Which nodes would leave the NPU for ``chip``, and why.

    Builds a non-strict session (the QNN EP claims what it can, the rest goes to the CPU)
    and reads the EP's op trace. Node counts are ONNX Runtime's view of the graph (after
    its basic rewrites). Graph-edge Q/DQ nodes stay on the HTP as in a strict session,
    unless ``offload_io_quantization`` (the EP's ``offload_graph_io_quantization``, which
    moves them to the CPU on purpose). Returns ``{"all_on_npu", "total_nodes", "qnn_nodes", "cpu_nodes":
    [{"name", "op_type", "reason"}], "qnn_subgraphs", "chip", "error"}``.
    """
    path = _check_model_file(onnx_path)
    chip = _chip(chip)
    with tempfile.TemporaryDirectory(prefix="qnn-placement-") as trace_dir:
        so = _session_options(
            chip,
            strict=False,
            fp16=fp16,
            threads=threads,
            log_level=3,
            extra={
                **dict(extra_options or {}),
                "enable_framework_op_trace": "1",
                "framework_op_trace_dir": trace_dir,
                "offload_graph_io_quantization": "1" if offload_io_quantization else "0",
            },
        )
        error = None
        with capture_native_stderr() as cap:
            try:
                sess = _create_session(path, so)
                del sess
            except Exception as e:
                error = e
        trace = _read_op_trace(trace_dir)
    return _placement(path, chip, trace, cap.text, error)


def _placement(path: Path, chip: Chip, trace: dict | None, log: str,
               error: Exception | None) -> dict:
    """The placement report (:func:`placement_report`'s form) from a session's op trace, the
    EP's log and the session's error (None: it was created)."""
    device = _backend_failure(log)
    if error is not None and trace is None and not device:
        raise _diagnose(error, log, None, path, chip)  # e.g. not an ONNX model
    summary = (trace or {}).get("summary", {})
    if device or trace is None:
        # The backend could not be set up: every node would run on the CPU.
        nodes = _model_nodes(path)
        reason = device or "the QNN EP wrote no op trace"
        cpu_nodes = [{"name": n, "op_type": t, "reason": reason} for n, t in nodes]
        total, qnn_nodes = len(nodes), 0
    else:
        cpu_nodes = _unsupported_nodes(trace, log)
        total = summary.get("total_onnx_nodes")
        if total is None:
            total = len(_model_nodes(path))
        qnn_nodes = summary.get("supported_nodes", max(0, int(total) - len(cpu_nodes)))
    return {
        "all_on_npu": not cpu_nodes and error is None,
        "total_nodes": int(total),
        "qnn_nodes": int(qnn_nodes),
        "cpu_nodes": cpu_nodes,
        "qnn_subgraphs": int(summary.get("qnn_subgraphs", 0)),
        "chip": chip.key,
        "error": (
            str(_diagnose(error or RuntimeError(device), log, trace, path, chip))
            if error is not None or device
            else None
        ),
    }


def _model_nodes(path: Path) -> list[tuple[str, str]]:
    model = open_onnx(path, check=False)
    return [(n.name or f"{n.op_type}_{i}", n.op_type) for i, n in enumerate(model.graph.node)]


# ---------------------------------------------------------------------------------------
# compile (context binaries)
# ---------------------------------------------------------------------------------------
def read_context_info(ctx_path: str | os.PathLike) -> dict:
    """What a compiled ``_ctx.onnx`` records: SDK version, embed mode, its binary files."""
    p = Path(ctx_path)
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:
        raise StudioError(
            f"{p} is not an ONNX model ({first_line(str(e))}); compile it again"
        ) from None
    nodes = [n for n in model.graph.node if n.op_type == "EPContext"]
    if not nodes:
        raise StudioError(f"{p} holds no EPContext node; it is not a compiled QNN context model")
    info: dict[str, Any] = {"sdk_version": None, "embed": None, "bin_files": [], "nodes": []}
    for n in nodes:
        attrs = {a.name: a for a in n.attribute}

        def get(name: str, attrs=attrs):
            a = attrs.get(name)
            if a is None:
                return None
            v = helper.get_attribute_value(a)
            return (
                v.decode("utf-8", "replace")
                if isinstance(v, bytes) and name != "ep_cache_context"
                else v
            )

        embed = get("embed_mode")
        sdk = get("ep_sdk_version")
        info["nodes"].append({"name": n.name, "ep_sdk_version": sdk, "embed_mode": embed})
        info["sdk_version"] = info["sdk_version"] or sdk
        info["embed"] = bool(embed) if embed is not None else info["embed"]
        if embed == 0:
            ref = get("ep_cache_context")
            if isinstance(ref, bytes):
                ref = ref.decode("utf-8", "replace")
            if ref and ref not in info["bin_files"]:
                info["bin_files"].append(ref)
    return info


def compile_context(
    onnx_path: str | os.PathLike,
    out_path: str | os.PathLike,
    chip: Chip | str,
    fp16: bool = False,
    embed: bool = False,
    *,
    strict: bool = True,
    prepare_only: bool = True,
    extra_options: Mapping[str, Any] | None = None,
    session_config: Mapping[str, str] | None = None,
    op_trace_dir: str | os.PathLike | None = None,
) -> dict:
    """Compile ``onnx_path`` into a QNN context model ``out_path`` (``…_ctx.onnx``).

    ``embed=False`` writes the context binary beside it (``…_ctx_qnn.bin``), ``True``
    embeds it in the model. The files appear atomically (written in a temp folder next to
    ``out_path``, then moved). ``op_trace_dir`` keeps the compile's op trace there
    (:func:`make_session`). Returns ``{"ctx_path", "bin_files", "sdk_version",
    "seconds", "embed", "chip", "size_bytes"}``; load the result with :func:`make_session`.
    """
    path = _check_model_file(onnx_path)
    chip = _chip(chip)
    out = Path(out_path).resolve()
    if out.suffix != ".onnx":
        raise StudioError(f"compiled model path {out} must end in .onnx (e.g. model_ctx.onnx)")
    if out == path.resolve():
        raise StudioError(f"compiling {path} would overwrite it; choose another output path")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".qnn-compile-", dir=out.parent))
    try:
        staged = tmp / out.name
        extra = dict(extra_options or {})
        if prepare_only:
            extra.setdefault("enable_htp_prepare_only", "1")
        config = {
            "ep.context_enable": "1",
            "ep.context_file_path": str(staged),
            "ep.context_embed_mode": "1" if embed else "0",
            **dict(session_config or {}),
        }
        t0 = time.perf_counter()
        sess = make_session(
            path, chip, strict=strict, fp16=fp16, extra_options=extra, session_config=config,
            op_trace_dir=op_trace_dir,
        )
        del sess
        seconds = time.perf_counter() - t0
        if not staged.is_file():
            raise StudioError(
                f"the QNN EP wrote no context model for {path.name}; check that it is not "
                "already a compiled model"
            )
        info = read_context_info(staged)
        # Move the binaries first, the model last: a reader never sees a model without its bins.
        moved = []
        for f in sorted(tmp.iterdir()):
            if f != staged:
                os.replace(f, out.parent / f.name)
                moved.append(f.name)
        os.replace(staged, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bins = [str(out.parent / b) for b in info["bin_files"]]
    missing = [b for b in bins if not os.path.isfile(b)]
    if missing:
        raise StudioError(
            f"compiled model {out} refers to missing binaries {missing}; compile again"
        )
    return {
        "ctx_path": str(out),
        "bin_files": bins,
        "sdk_version": info["sdk_version"],
        "seconds": seconds,
        "embed": bool(embed),
        "chip": chip.key,
        "size_bytes": out.stat().st_size + sum(os.path.getsize(b) for b in bins),
    }


def compile_placed(
    onnx_path: str | os.PathLike,
    out_path: str | os.PathLike,
    chip: Chip | str,
    fp16: bool = False,
    embed: bool = False,
    *,
    extra_options: Mapping[str, Any] | None = None,
) -> tuple[dict, dict | None]:
    """Compile ``onnx_path`` (:func:`compile_context`, strict) and report its placement in
    the form of :func:`placement_report`, from the one compile: a strict compile that
    finishes placed every node on the HTP, and its op trace gives the counts. Where the
    strict compile fails, a non-strict session names the nodes the NPU refuses: returns
    that report and None for the compile (a compile that fails with every node placed
    raises its own error). Returns (placement report, compile result).

    One compile instead of two: the non-strict session of :func:`placement_report`
    finalizes the whole graph for the simulator, which took as long as the compile itself
    (0.43-0.85 s against 0.45 s for the sample's decode and prefill graphs)."""
    chip = _chip(chip)
    with tempfile.TemporaryDirectory(prefix="qnn-placement-") as trace_dir:
        try:
            comp = compile_context(onnx_path, out_path, chip, fp16=fp16, embed=embed,
                                   extra_options=extra_options, op_trace_dir=trace_dir)
        except StudioError:
            rep = placement_report(onnx_path, chip, fp16=fp16, extra_options=extra_options)
            if not rep["all_on_npu"]:
                return rep, None
            raise
        trace = _read_op_trace(trace_dir)
    if trace is None:  # no trace written: the report from a session of its own
        return placement_report(onnx_path, chip, fp16=fp16, extra_options=extra_options), comp
    return _placement(Path(onnx_path), chip, trace, "", None), comp
