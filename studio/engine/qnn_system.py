"""What a QNN context binary holds, read through the QNN System library without loading it.

The ``onnxruntime-qnn`` wheel carries ``libQnnSystem.so``: its system-context API parses a
context binary's metadata (backend, SDK build, the graphs and their input / output tensors
with names, shapes, data types and quantization encodings) on any host. A binary the HTP
simulator cannot load (a weight-shared binary of several graphs) can still be described
here, which is how :mod:`studio.engine.weightshare` checks one by its structure.

The structures follow the public QNN headers (``QnnTypes.h``, ``System/QnnSystemContext.h``,
``System/QnnSystemInterface.h``); each is versioned, and a version this module does not know
is an error naming it, never a guess. ``ctypes`` is all it needs: no compiler, no SDK.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import os
import sys
import threading
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module

onnx = lazy_module("onnx")

_LOCK = threading.Lock()

# ---------------------------------------------------------------------------------------
# QnnTypes.h
# ---------------------------------------------------------------------------------------
_u32, _i32, _f32, _u8 = ctypes.c_uint32, ctypes.c_int32, ctypes.c_float, ctypes.c_uint8
_ptr = ctypes.c_void_p


class _Version(ctypes.Structure):
    _fields_ = [("major", _u32), ("minor", _u32), ("patch", _u32)]


class _ScaleOffset(ctypes.Structure):
    _fields_ = [("scale", _f32), ("offset", _i32)]


class _BwScaleOffset(ctypes.Structure):
    _fields_ = [("bitwidth", _u32), ("scale", _f32), ("offset", _i32)]


class _AxisScaleOffset(ctypes.Structure):
    _fields_ = [("axis", _i32), ("numScaleOffsets", _u32),
                ("scaleOffset", ctypes.POINTER(_ScaleOffset))]


class _BwAxisScaleOffset(ctypes.Structure):
    _fields_ = [("bitwidth", _u32), ("axis", _i32), ("numElements", _u32),
                ("scales", ctypes.POINTER(_f32)), ("offsets", ctypes.POINTER(_i32))]


class _BlockEncoding(ctypes.Structure):
    _fields_ = [("blockSize", ctypes.POINTER(_u32)),
                ("scaleOffset", ctypes.POINTER(_ScaleOffset))]


class _BlockwiseExpansion(ctypes.Structure):
    _fields_ = [("axis", _i32), ("scaleOffsets", ctypes.POINTER(_ScaleOffset)),
                ("numBlocksPerAxis", _u32), ("blockScaleBitwidth", _u32),
                ("blockScaleStorageType", _u32), ("blocksScale", _ptr)]


class _BwFloatBlock(ctypes.Structure):
    _fields_ = [("bitwidth", _u32), ("blockSize", _ptr), ("floatScaleOffset", _ptr)]


class _EncodingUnion(ctypes.Union):
    # Every member of the header's union that fixes its size and alignment (the largest is
    # the bit-width per-axis encoding, 32 bytes); pointer members are read as void*.
    _fields_ = [("scaleOffset", _ScaleOffset), ("axisScaleOffset", _AxisScaleOffset),
                ("bwScaleOffset", _BwScaleOffset), ("bwAxisScaleOffset", _BwAxisScaleOffset),
                ("block", _BlockEncoding),
                ("blockwiseExpansion", ctypes.POINTER(_BlockwiseExpansion)),
                ("bwFloatBlock", _BwFloatBlock), ("pointer", _ptr)]


class _QuantizeParams(ctypes.Structure):
    _fields_ = [("encodingDefinition", _u32), ("quantizationEncoding", _u32),
                ("u", _EncodingUnion)]


class _ClientBuffer(ctypes.Structure):
    _fields_ = [("data", _ptr), ("dataSize", _u32)]


class _MemUnion(ctypes.Union):
    _fields_ = [("clientBuf", _ClientBuffer), ("memHandle", _ptr), ("retrieveRaw", _ptr)]


class _TensorV1(ctypes.Structure):
    _fields_ = [("id", _u32), ("name", ctypes.c_char_p), ("type", _u32), ("dataFormat", _u32),
                ("dataType", _u32), ("quantizeParams", _QuantizeParams), ("rank", _u32),
                ("dimensions", ctypes.POINTER(_u32)), ("memType", _u32), ("mem", _MemUnion)]


class _SparseParams(ctypes.Structure):
    _fields_ = [("type", _u32), ("numSpecifiedElements", _u32), ("numSparseDimensions", _u32)]


class _TensorV2(ctypes.Structure):
    _fields_ = _TensorV1._fields_ + [("isDynamicDimensions", ctypes.POINTER(_u8)),
                                     ("sparseParams", _SparseParams), ("isProduced", _u8)]


class _TensorUnion(ctypes.Union):
    _fields_ = [("v1", _TensorV1), ("v2", _TensorV2)]


class _Tensor(ctypes.Structure):
    _fields_ = [("version", _u32), ("u", _TensorUnion)]


# ---------------------------------------------------------------------------------------
# System/QnnSystemContext.h
# ---------------------------------------------------------------------------------------
class _GraphInfoV1(ctypes.Structure):
    _fields_ = [("graphName", ctypes.c_char_p),
                ("numGraphInputs", _u32), ("graphInputs", ctypes.POINTER(_Tensor)),
                ("numGraphOutputs", _u32), ("graphOutputs", ctypes.POINTER(_Tensor))]


class _GraphInfoV2(ctypes.Structure):
    _fields_ = _GraphInfoV1._fields_ + [("numUpdateableTensors", _u32),
                                        ("updateableTensors", ctypes.POINTER(_Tensor))]


class _GraphInfoV3(ctypes.Structure):
    _fields_ = _GraphInfoV2._fields_ + [("graphBlobInfoSize", _u32), ("graphBlobInfo", _ptr),
                                        ("startOpIndex", _u32), ("endOpIndex", _u32)]


class _GraphInfoUnion(ctypes.Union):
    _fields_ = [("v1", _GraphInfoV1), ("v2", _GraphInfoV2), ("v3", _GraphInfoV3)]


class _GraphInfo(ctypes.Structure):
    _fields_ = [("version", _u32), ("u", _GraphInfoUnion)]


_BINARY_INFO_HEAD: list[tuple[str, Any]] = [("backendId", _u32), ("buildId", ctypes.c_char_p),
                     ("coreApiVersion", _Version), ("backendApiVersion", _Version),
                     ("socVersion", ctypes.c_char_p)]
_BINARY_INFO_GRAPHS: list[tuple[str, Any]] = [("contextBlobSize", ctypes.c_uint64),
                       ("numContextTensors", _u32), ("contextTensors", ctypes.POINTER(_Tensor)),
                       ("numGraphs", _u32), ("graphs", ctypes.POINTER(_GraphInfo))]


class _BinaryInfoV1(ctypes.Structure):
    _fields_ = _BINARY_INFO_HEAD + [("hwInfoBlobVersion", _Version),
                                    ("contextBlobVersion", _Version),
                                    ("hwInfoBlobSize", _u32), ("hwInfoBlob", _ptr)] \
        + _BINARY_INFO_GRAPHS


class _BinaryInfoV2(ctypes.Structure):
    _fields_ = _BinaryInfoV1._fields_ + [("platformInfo", _ptr)]


class _BinaryInfoV3(ctypes.Structure):
    _fields_ = _BINARY_INFO_HEAD + [("contextBlobVersion", _Version)] + _BINARY_INFO_GRAPHS \
        + [("platformInfo", _ptr), ("contextMetadataSize", _u32), ("contextMetadata", _ptr),
           ("socModel", _u32)]


class _BinaryInfoUnion(ctypes.Union):
    _fields_ = [("v1", _BinaryInfoV1), ("v2", _BinaryInfoV2), ("v3", _BinaryInfoV3)]


class _BinaryInfo(ctypes.Structure):
    _fields_ = [("version", _u32), ("u", _BinaryInfoUnion)]


# ---------------------------------------------------------------------------------------
# System/QnnSystemInterface.h
# ---------------------------------------------------------------------------------------
_Err = ctypes.c_uint64  # Qnn_ErrorHandle_t
_CreateFn = ctypes.CFUNCTYPE(_Err, ctypes.POINTER(_ptr))
_GetBinaryInfoFn = ctypes.CFUNCTYPE(_Err, _ptr, _ptr, ctypes.c_uint64,
                                    ctypes.POINTER(ctypes.POINTER(_BinaryInfo)),
                                    ctypes.POINTER(ctypes.c_uint64))
_GetMetadataFn = ctypes.CFUNCTYPE(_Err, _ptr, _ptr, ctypes.c_uint64,
                                  ctypes.POINTER(ctypes.POINTER(_BinaryInfo)))
_FreeFn = ctypes.CFUNCTYPE(_Err, _ptr)


class _SystemApi(ctypes.Structure):
    # The first entries of the version's function table, in the header's order.
    _fields_ = [("systemContextCreate", _ptr), ("systemContextGetBinaryInfo", _ptr),
                ("systemContextGetMetaData", _ptr), ("systemContextFree", _ptr)]


class _SystemInterface(ctypes.Structure):
    _fields_ = [("backendId", _u32), ("providerName", ctypes.c_char_p),
                ("systemApiVersion", _Version), ("api", _SystemApi)]


# ---------------------------------------------------------------------------------------
# vocabularies
# ---------------------------------------------------------------------------------------
DTYPES = {
    0x0008: "int8", 0x0016: "int16", 0x0032: "int32", 0x0064: "int64",
    0x0108: "uint8", 0x0116: "uint16", 0x0132: "uint32", 0x0164: "uint64",
    0x0216: "float16", 0x0226: "bfloat16", 0x0232: "float32", 0x0264: "float64",
    0x0304: "sfixed_point_4", 0x0308: "sfixed_point_8", 0x0316: "sfixed_point_16",
    0x0332: "sfixed_point_32",
    0x0404: "ufixed_point_4", 0x0408: "ufixed_point_8", 0x0416: "ufixed_point_16",
    0x0432: "ufixed_point_32",
    0x0508: "bool8", 0x0608: "string",
}
ENCODINGS = {
    0: "scale_offset", 1: "axis_scale_offset", 2: "bw_scale_offset",
    3: "bw_axis_scale_offset", 4: "block", 5: "blockwise_expansion", 6: "vector",
    7: "float_block", 8: "bw_axis_scale_offset_mapped", 9: "bw_block_mapped",
    10: "bw_blockwise_expansion_mapped", 11: "bw_float_block",
}
TENSOR_TYPES = {
    0: "app_write", 1: "app_read", 2: "app_readwrite", 3: "native", 4: "static", 5: "null",
    6: "updateable_static", 7: "updateable_native", 8: "updateable_app_write",
    9: "updateable_app_read", 10: "updateable_app_readwrite", 11: "optional_app_write",
    12: "optional_app_read", 13: "optional_app_readwrite",
}
BACKENDS = {6: "HTP", 11: "HTP_MCP", 13: "HTP_QEMU"}
_UNDEFINED = 0x7FFFFFFF


# ---------------------------------------------------------------------------------------
# the library
# ---------------------------------------------------------------------------------------
def library_path() -> Path:
    """``libQnnSystem.so`` (``QnnSystem.dll`` on Windows) beside the QNN EP in the wheel."""
    try:  # optional: no onnxruntime-qnn wheel exists for macOS
        import onnxruntime_qnn
    except ImportError:
        raise StudioError("onnxruntime-qnn is not installed, so there is no QNN System "
                          "library to read context binaries with; pip install "
                          "'onnxruntime-qnn>=2.7'") from None
    name = "QnnSystem.dll" if sys.platform == "win32" else "libQnnSystem.so"
    p = Path(onnxruntime_qnn.__file__).parent / name
    if not p.is_file():
        raise StudioError(f"this onnxruntime-qnn has no {name} ({p.parent}); reinstall it")
    return p


@functools.lru_cache(maxsize=1)
def _interface() -> tuple[ctypes.CDLL, dict[str, Any]]:
    lib = ctypes.CDLL(str(library_path()))
    get = lib.QnnSystemInterface_getProviders
    get.restype = _Err
    get.argtypes = [ctypes.POINTER(ctypes.POINTER(ctypes.POINTER(_SystemInterface))),
                    ctypes.POINTER(_u32)]
    providers = ctypes.POINTER(ctypes.POINTER(_SystemInterface))()
    n = _u32(0)
    err = get(ctypes.byref(providers), ctypes.byref(n))
    if err or not n.value:
        raise StudioError(f"the QNN System library {library_path().name} offers no interface "
                          f"(error {err & 0xFFFF}); reinstall onnxruntime-qnn")
    iface = providers[0].contents
    api = iface.api
    if not (api.systemContextCreate and api.systemContextFree
            and (api.systemContextGetMetaData or api.systemContextGetBinaryInfo)):
        raise StudioError(f"the QNN System library {library_path().name} cannot read context "
                          "binaries (its system-context functions are missing)")
    v = iface.systemApiVersion
    fns = {
        "create": _CreateFn(api.systemContextCreate),
        "free": _FreeFn(api.systemContextFree),
        "metadata": _GetMetadataFn(api.systemContextGetMetaData)
        if api.systemContextGetMetaData else None,
        "binary_info": _GetBinaryInfoFn(api.systemContextGetBinaryInfo)
        if api.systemContextGetBinaryInfo else None,
        "api_version": f"{v.major}.{v.minor}.{v.patch}",
    }
    return lib, fns


def system_api_version() -> str:
    """The QNN System API version of the library in the wheel (e.g. "1.6.0")."""
    return _interface()[1]["api_version"]


# ---------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------
def _floats(p, n: int) -> list[float]:
    return [float(p[i]) for i in range(n)] if p and n else []


def _ints(p, n: int) -> list[int]:
    return [int(p[i]) for i in range(n)] if p and n else []


def _encoding(q: _QuantizeParams, dims: list[int]) -> dict[str, Any] | None:
    kind = q.quantizationEncoding
    if q.encodingDefinition == _UNDEFINED or kind == _UNDEFINED:
        return None
    name = ENCODINGS.get(kind, f"encoding_{kind}")
    u = q.u
    if kind == 0:
        return {"kind": name, "scale": float(u.scaleOffset.scale),
                "offset": int(u.scaleOffset.offset)}
    if kind == 2:
        e = u.bwScaleOffset
        return {"kind": name, "bitwidth": int(e.bitwidth), "scale": float(e.scale),
                "offset": int(e.offset)}
    if kind == 1:
        e = u.axisScaleOffset
        pairs = [e.scaleOffset[i] for i in range(e.numScaleOffsets)] if e.scaleOffset else []
        return {"kind": name, "axis": int(e.axis), "scales": [float(s.scale) for s in pairs],
                "offsets": [int(s.offset) for s in pairs]}
    if kind == 3:
        e = u.bwAxisScaleOffset
        n = int(e.numElements)
        return {"kind": name, "bitwidth": int(e.bitwidth), "axis": int(e.axis),
                "scales": _floats(e.scales, n),
                "offsets": _ints(e.offsets, n) if e.offsets else [0] * n}
    if kind == 4:
        e = u.block
        block = _ints(e.blockSize, len(dims))
        n = math.prod(-(-d // b) for d, b in zip(dims, block, strict=True)) if block and all(block) else 0
        pairs = [e.scaleOffset[i] for i in range(n)] if e.scaleOffset else []
        return {"kind": name, "block_size": block, "scales": [float(s.scale) for s in pairs],
                "offsets": [int(s.offset) for s in pairs]}
    if kind == 5 and u.blockwiseExpansion:
        e = u.blockwiseExpansion.contents
        n = dims[e.axis] if 0 <= e.axis < len(dims) else 0
        pairs = [e.scaleOffsets[i] for i in range(n)] if e.scaleOffsets else []
        blocks = n * int(e.numBlocksPerAxis)
        if e.blocksScale and blocks:
            ctype = ctypes.c_uint8 if e.blockScaleStorageType == 0 else ctypes.c_uint16
            block_scales = list(ctypes.cast(e.blocksScale, ctypes.POINTER(ctype))[:blocks])
        else:
            block_scales = []
        return {"kind": name, "axis": int(e.axis), "scales": [float(s.scale) for s in pairs],
                "offsets": [int(s.offset) for s in pairs],
                "blocks_per_axis": int(e.numBlocksPerAxis),
                "block_scale_bitwidth": int(e.blockScaleBitwidth),
                "block_scales": [int(b) for b in block_scales]}
    # An encoding this reader does not unpack is still named, so a comparison sees it.
    return {"kind": name}


def _tensor(t: _Tensor) -> dict[str, Any]:
    if t.version not in (1, 2):
        raise StudioError(f"this context binary has a version-{t.version} tensor, which this "
                          f"QNN System reader does not know (it reads versions 1 and 2)")
    v = t.u.v1  # version 2 begins with version 1's fields
    dims = _ints(v.dimensions, int(v.rank))
    return {
        "name": (v.name or b"").decode("utf-8", "replace"),
        "shape": dims,
        "dtype": DTYPES.get(int(v.dataType), f"dtype_{v.dataType:#x}"),
        "type": TENSOR_TYPES.get(int(v.type), str(int(v.type))),
        "encoding": _encoding(v.quantizeParams, dims),
    }


def _graph(g: _GraphInfo) -> dict[str, Any]:
    if g.version == 1:
        v = g.u.v1
    elif g.version == 2:
        v = g.u.v2
    elif g.version == 3:
        v = g.u.v3
    else:
        raise StudioError(f"this context binary has version-{g.version} graph info, which this "
                          f"QNN System reader does not know (it reads versions 1-3)")
    out = {
        "name": (v.graphName or b"").decode("utf-8", "replace"),
        "inputs": [_tensor(v.graphInputs[i]) for i in range(v.numGraphInputs)],
        "outputs": [_tensor(v.graphOutputs[i]) for i in range(v.numGraphOutputs)],
    }
    if g.version >= 2:
        out["updateable_tensors"] = int(v.numUpdateableTensors)
    return out


def _binary_info(info: _BinaryInfo) -> dict[str, Any]:
    versions = {1: "v1", 2: "v2", 3: "v3"}
    if info.version not in versions:
        raise StudioError(f"this context binary has version-{info.version} binary info, which "
                          f"this QNN System reader does not know (it reads versions 1-3)")
    v = getattr(info.u, versions[info.version])
    backend = int(v.backendId)
    out: dict[str, Any] = {
        "backend": BACKENDS.get(backend, f"backend {backend}"),
        "backend_id": backend,
        "sdk_build": (v.buildId or b"").decode("utf-8", "replace") or None,
        "core_api_version": f"{v.coreApiVersion.major}.{v.coreApiVersion.minor}."
                            f"{v.coreApiVersion.patch}",
        "backend_api_version": f"{v.backendApiVersion.major}.{v.backendApiVersion.minor}."
                               f"{v.backendApiVersion.patch}",
        "soc_version": (v.socVersion or b"").decode("utf-8", "replace") or None,
        "info_version": int(info.version),
        "context_blob_bytes": int(v.contextBlobSize),
        "context_tensors": int(v.numContextTensors),
        "graphs": [_graph(v.graphs[i]) for i in range(v.numGraphs)],
    }
    if info.version == 3:
        out["soc_model"] = int(v.socModel)
    return out


def _read(address: int, size: int, label: str) -> dict[str, Any]:
    """Parse the context binary of ``size`` bytes at ``address`` (kept alive by the caller)."""
    _, fns = _interface()
    handle = _ptr()
    with _LOCK:
        err = fns["create"](ctypes.byref(handle))
        if err:
            raise StudioError(f"the QNN System library could not start (error {err & 0xFFFF})")
        try:
            info = ctypes.POINTER(_BinaryInfo)()
            if fns["metadata"] is not None:
                err = fns["metadata"](handle, address, size, ctypes.byref(info))
            else:
                got = ctypes.c_uint64(0)
                err = fns["binary_info"](handle, address, size, ctypes.byref(info),
                                         ctypes.byref(got))
            if err or not info:
                raise StudioError(
                    f"{label} is not a QNN context binary or is corrupt (the QNN System library "
                    f"could not read its metadata: error {err & 0xFFFF}); compile it again")
            return _binary_info(info.contents)
        finally:
            fns["free"](handle)


def parse_binary(data: bytes, label: str = "the context binary") -> dict[str, Any]:
    """The info of a context binary held in memory (see :func:`context_info`)."""
    if not data:
        raise StudioError(f"{label} is empty, not a QNN context binary; compile it again")
    buf = (ctypes.c_char * len(data)).from_buffer_copy(data)
    return _read(ctypes.addressof(buf), len(data), label)


def embedded_or_named(ctx_onnx: Path) -> tuple[bytes, str]:
    """A compiled ``…_ctx.onnx``'s context binary: (its bytes, where they are) when embedded
    in its EPContext node, else (b"", the path of the ``.bin`` file it names)."""
    try:
        model = onnx.load(str(ctx_onnx), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError and others
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StudioError(f"{ctx_onnx} is not an ONNX model ({first})") from None
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        attrs = {a.name: a for a in node.attribute}
        embed = attrs["embed_mode"].i if "embed_mode" in attrs else 1
        data = attrs["ep_cache_context"].s if "ep_cache_context" in attrs else b""
        if embed:
            return bytes(data), f"the context binary embedded in {ctx_onnx.name}"
        path = ctx_onnx.parent / data.decode("utf-8", "replace")
        if not path.is_file():
            raise StudioError(f"the context binary {path} that {ctx_onnx.name} names is missing")
        return b"", str(path)
    raise StudioError(f"{ctx_onnx} has no EPContext node: it is not a compiled context model")


def context_binary(ctx_onnx: Path) -> bytes:
    """The QNN context binary a compiled ``…_ctx.onnx`` holds (embedded in its EPContext node,
    or in the ``.bin`` file beside it that the node names)."""
    data, where = embedded_or_named(Path(ctx_onnx))
    return data if data else Path(where).read_bytes()


def context_info(binary: str | os.PathLike) -> dict[str, Any]:
    """What a QNN context binary holds, read without loading it on a backend.

    ``binary`` is a context binary file (``…_qnn.bin``, embed mode 0) or a compiled
    ``…_ctx.onnx`` (its EPContext node's embedded binary, or the ``.bin`` file it names).
    Returns ``{"file", "bytes", "backend", "sdk_build", "soc_version", "soc_model"?,
    "core_api_version", "backend_api_version", "context_blob_bytes", "context_tensors",
    "graphs": [{"name", "inputs": [tensor], "outputs": [tensor]}]}``, each tensor
    ``{"name", "shape", "dtype", "type", "encoding"}``; ``dtype`` is QNN's ("ufixed_point_16",
    "uint16", "float32", ...); ``encoding`` is None for a float tensor, else
    ``{"kind": "scale_offset", "scale", "offset"}`` (per tensor),
    ``{"kind": "axis_scale_offset", "axis", "scales", "offsets"}`` (per channel), the
    bit-width forms with ``bitwidth``, or ``block`` / ``blockwise_expansion`` with their
    block sizes and scales. QNN's offset is the negated zero point:
    ``real = (q + offset) * scale``.
    """
    p = Path(binary)
    if not p.is_file():
        raise StudioError(f"context binary {p} not found")
    if p.suffix == ".onnx":
        data, label = embedded_or_named(p)
        if not data:
            p = Path(label)
        else:
            out = parse_binary(data, label)
            return {"file": str(binary), "bytes": len(data), **out}
    size = p.stat().st_size
    if size == 0:
        raise StudioError(f"{p} is empty, not a QNN context binary; compile it again")
    # A copy-on-write map: the library gets a writable buffer without the file being read
    # into memory first (a part's binary can be gigabytes).
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as mm:
        buf = (ctypes.c_char * size).from_buffer(mm)
        try:
            out = _read(ctypes.addressof(buf), size, str(p))
        finally:
            del buf
    return {"file": str(p), "bytes": size, **out}
