"""The error decoder: what the QNN / QAIRT backend, Genie and ONNX Runtime's QNN execution
provider say when they fail, mapped to a cause and a fix (pure: no engine, no I/O).

Raw errors reach the user as codes ("Failed to create context from binary with err 0x1388",
"Genie ... (status -7)", "err 1002"); every stage failure, ``studio generate``, the agent and
the bundle check pass their message through :func:`explain`, which appends the entry's
cause and fix to the one line, so nobody is left with a bare code.

Each entry names where it comes from: the public QNN / Genie SDK headers (the numeric codes
and their names), ONNX Runtime's own messages, and what was provoked and read on this
machine's HTP simulator. ``docs/errors.md`` is this table as a document
(``python -m studio.core.errorcodes > docs/errors.md``; a test keeps them equal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Known:
    key: str  # "QNN 5004", "Genie -7", "ORT input shape", ...
    name: str  # the SDK's name, or a short title for a message
    component: str
    cause: str
    fix: str
    source: str
    patterns: tuple[str, ...] = ()  # message regexes (case-insensitive) beside the code

    @property
    def code(self) -> int | None:
        head, _, num = self.key.partition(" ")
        return int(num) if head in ("QNN", "Genie") and re.fullmatch(r"-?\d+", num) else None

    @property
    def family(self) -> str:
        return self.key.split(" ", 1)[0]

    def line(self) -> str:
        return f"{self.key} {self.name}: {self.cause}; {self.fix}"


_H_COMMON = "QnnCommon.h (QNN SDK API headers, QnnCommon_Error_t)"
_H_CONTEXT = "QnnContext.h (QNN SDK API headers, QnnContext_Error_t)"
_H_GRAPH = "QnnGraph.h (QNN SDK API headers, QnnGraph_Error_t)"
_H_GENIE = "GenieCommon.h (QAIRT SDK Genie headers, Genie_Status_t)"
_ORT = "ONNX Runtime's own messages (onnxruntime InferenceSession.run / the QNN EP)"
_HERE = "provoked and read on this machine's HTP simulator (onnxruntime-qnn)"
_FASTRPC = "Hexagon SDK FastRPC / Android loader messages (public issue threads of QNN users)"

TABLE: tuple[Known, ...] = (
    # ---- QNN common codes (1000..1999) ----
    Known("QNN 1000", "QNN_COMMON_ERROR_NOT_SUPPORTED", "QNN",
          "the backend does not implement the feature or option asked for",
          "drop the option, or use an SDK / chip that has it (studio doctor lists both)",
          _H_COMMON),
    Known("QNN 1002", "QNN_COMMON_ERROR_MEM_ALLOC", "QNN",
          "the HTP could not allocate memory: the context binaries loaded at once do not fit "
          "(measured here: the third of a 3 B shape's part binaries under Genie)",
          "load fewer binaries at once: split the model into smaller parts "
          "(export.max_part_mb), lower export.context_length, or free device memory",
          f"{_H_COMMON}; {_HERE}", (r"\bMEM_ALLOC\b",)),
    Known("QNN 1003", "QNN_COMMON_ERROR_SYSTEM", "QNN",
          "a platform / OS service failed under the backend",
          "check the device's free memory and its logs (adb logcat), then retry",
          _H_COMMON),
    Known("QNN 1004", "QNN_COMMON_ERROR_INVALID_ARGUMENT", "QNN",
          "the backend refused an argument (often a config or a tensor that does not match "
          "the compiled graph)", "compile again with this studio for this target",
          _H_COMMON),
    Known("QNN 1005", "QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED", "QNN",
          "an operation the backend does not allow in this order or this process "
          "(for example an unsigned protection domain)",
          "on a phone run with the signed PD the SDK documents, or from an app process",
          _H_COMMON),
    Known("QNN 1006", "QNN_COMMON_ERROR_PLATFORM_NOT_SUPPORTED", "QNN",
          "this backend library does not run on this platform / SoC",
          "use the HTP libraries built for the device's architecture (studio doctor "
          "--device D compares them)", _H_COMMON),
    Known("QNN 1007", "QNN_COMMON_ERROR_SYSTEM_COMMUNICATION", "QNN",
          "the host lost the DSP (FastRPC): a subsystem restart, usually a graph over the "
          "protection domain's memory or a driver older than the SDK",
          "check the device's SDK build against the compile's (studio doctor --device D), "
          "split the model into smaller parts, then retry", _H_COMMON),
    Known("QNN 1008", "QNN_COMMON_ERROR_INCOMPATIBLE_BINARIES", "QNN",
          "the QNN libraries loaded are of different SDK versions (stub, skel, backend)",
          "push one SDK's libraries together and put their folder first in "
          "ADSP_LIBRARY_PATH / LD_LIBRARY_PATH (ahead of /vendor/lib64)", _H_COMMON),
    Known("QNN 1009", "QNN_COMMON_ERROR_LOADING_BINARIES", "QNN",
          "a QNN library is already loaded in this process (another version)",
          "run one SDK per process; restart the app / agent", _H_COMMON),
    Known("QNN 1010", "QNN_COMMON_ERROR_RESOURCE_UNAVAILABLE", "QNN",
          "the HTP is busy or out of a resource (sessions of other apps, VTCM)",
          "close other NPU sessions, load fewer contexts, retry", _H_COMMON),
    Known("QNN 1100", "QNN_COMMON_ERROR_GENERAL", "QNN",
          "a backend error of no other kind", "read the backend's log lines above it "
          "(studio doctor checks the common causes: SDK build, Hexagon architecture, paths)",
          _H_COMMON),
    # ---- QNN context codes (5000..5999) ----
    Known("QNN 5000", "QNN_CONTEXT_ERROR_INVALID_ARGUMENT", "QNN context",
          "the runtime could not read the context binary: most often it was compiled by a "
          "newer SDK than the one that loads it ('Using newer context binary on old SDK')",
          "compile with the device's SDK version, or install the compile's SDK on the "
          "device (studio doctor --device D)", _H_CONTEXT,
          (r"newer context binary on old SDK", r"Can't read future blob")),
    Known("QNN 5001", "QNN_CONTEXT_ERROR_CTX_DOES_NOT_EXIST", "QNN context",
          "no context was created before use", "compile the context again", _H_CONTEXT),
    Known("QNN 5003", "QNN_CONTEXT_ERROR_NOT_FINALIZED", "QNN context",
          "a graph of the context was not finalized", "compile the context again",
          _H_CONTEXT),
    Known("QNN 5004", "QNN_CONTEXT_ERROR_BINARY_VERSION", "QNN context",
          "the context binary's version does not match the runtime's SDK",
          "compile with the SDK the device runs (studio doctor --device D shows both)",
          _H_CONTEXT),
    Known("QNN 5005", "QNN_CONTEXT_ERROR_CREATE_FROM_BINARY", "QNN context",
          "the context binary could not be loaded: truncated or damaged, built for another "
          "Hexagon architecture, or too large for the device's memory",
          "copy the _qnn.bin again (its size must match), check the target chip, or split "
          "the model into parts", _H_CONTEXT,
          (r"Failed to create context from binary",)),
    Known("QNN 5008", "QNN_CONTEXT_ERROR_BINARY_CONFIGURATION", "QNN context",
          "the binary was compiled for another configuration (SoC / Hexagon architecture)",
          "compile for the device's chip (studio doctor --device D compares them)",
          _H_CONTEXT),
    Known("QNN 5010", "QNN_CONTEXT_ERROR_INVALID_CONFIG", "QNN context",
          "a context option the runtime does not accept", "compile without the option",
          _H_CONTEXT),
    Known("QNN 5011", "QNN_CONTEXT_ERROR_BINARY_SUBOPTIMAL", "QNN context",
          "the binary was built for an older chip of the family: it runs, slower",
          "compile for the device's own chip", _H_CONTEXT),
    # ---- QNN graph codes (6000..6999) ----
    Known("QNN 6004", "QNN_GRAPH_ERROR_INVALID_TENSOR", "QNN graph",
          "a tensor of the graph is invalid (type, rank or quantization the HTP refuses)",
          "quantize again; check studio info for the graph's I/O", _H_GRAPH),
    Known("QNN 6005", "QNN_GRAPH_ERROR_INVALID_OP_CONFIG", "QNN graph",
          "an op's configuration is refused by the HTP (for example 4-bit weights on an op "
          "that has no 4-bit kernel)",
          "give that layer another precision (Precision page), or let studio place it",
          _H_GRAPH),
    Known("QNN 6020", "QNN_GRAPH_ERROR_CREATE_FAILED", "QNN graph",
          "the graph could not be created with these options", "compile without the "
          "non-default HTP options", _H_GRAPH),
    Known("QNN 6021", "QNN_GRAPH_ERROR_OPTIMIZATION_FAILED", "QNN graph",
          "the HTP compiler could not optimize the graph (op or option combination)",
          "compile at the default optimization level; bisect with studio bisect", _H_GRAPH),
    Known("QNN 6022", "QNN_GRAPH_ERROR_FINALIZE_FAILED", "QNN graph",
          "the HTP compiler could not finalize the graph: an op it cannot place, a float "
          "graph on a chip without FP16, or not enough memory for a large graph",
          "quantize the model (or enable FP16), or split it into parts",
          _H_GRAPH, (r"graphFinalize",)),
    Known("QNN 6023", "QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED", "QNN graph",
          "a graph was run before it was finalized", "compile the context again", _H_GRAPH),
    # ---- Genie status codes ----
    Known("Genie 4", "GENIE_STATUS_WARNING_CONTEXT_EXCEEDED", "Genie",
          "the prompt and the new tokens filled the bundle's context: Genie stopped there "
          "(a warning; the studio returns the text so far)",
          "ask for fewer new tokens, shorten the prompt, or export with a longer "
          "export.context_length and bundle again", f"{_H_GENIE}; {_HERE}",
          (r"Context Size was exceeded",)),
    Known("Genie -1", "GENIE_STATUS_ERROR_GENERAL", "Genie",
          "Genie failed without a code of its own; the QNN line before it (err NNNN) is "
          "the cause", "read the QNN code in the same message (decoded here too)", _H_GENIE),
    Known("Genie -2", "GENIE_STATUS_ERROR_INVALID_ARGUMENT", "Genie",
          "an argument to the Genie API is invalid", "rebuild the bundle with studio bundle",
          _H_GENIE),
    Known("Genie -3", "GENIE_STATUS_ERROR_MEM_ALLOC", "Genie",
          "Genie ran out of memory", "lower the context length or split the model",
          _H_GENIE),
    Known("Genie -4", "GENIE_STATUS_ERROR_INVALID_CONFIG", "Genie",
          "genie_config.json names something Genie cannot use (a file, a backend option)",
          "rebuild the bundle with studio bundle; keep its files together", _H_GENIE),
    Known("Genie -5", "GENIE_STATUS_ERROR_INVALID_HANDLE", "Genie",
          "a dialog was used after it was freed", "restart the app / the query", _H_GENIE),
    Known("Genie -6", "GENIE_STATUS_ERROR_QUERY_FAILED", "Genie",
          "the query failed while running the graphs (a QNN error underneath)",
          "read the QNN code in the same message; run studio doctor", _H_GENIE),
    Known("Genie -7", "GENIE_STATUS_ERROR_JSON_FORMAT", "Genie",
          "genie_config.json is not valid JSON (or a path was passed for its content)",
          "rebuild the bundle with studio bundle; do not edit genie_config.json by hand",
          f"{_H_GENIE}; {_HERE}"),
    Known("Genie -8", "GENIE_STATUS_ERROR_JSON_SCHEMA", "Genie",
          "genie_config.json does not follow this Genie's schema: a key it does not know or a "
          "value of the wrong type (a config of another Genie version, or edited by hand)",
          "build the bundle with the Genie version the device runs; do not edit the config",
          f"{_H_GENIE}; {_HERE}"),
    Known("Genie -9", "GENIE_STATUS_ERROR_JSON_VALUE", "Genie",
          "a value in genie_config.json is out of range for this Genie",
          "rebuild the bundle with studio bundle", _H_GENIE),
    Known("Genie -10", "GENIE_STATUS_ERROR_GENERATE_FAILED", "Genie",
          "token generation failed", "read the QNN code in the same message", _H_GENIE),
    # ---- messages without a code ----
    Known("ORT input shape", "invalid input dimensions", "ONNX Runtime",
          "the inputs fed do not have the shapes the graph was exported with (inputs not "
          "bound as the graph expects)",
          "feed the graph's own shapes (studio info lists them) or export with the lengths "
          "you feed (export.prompt_length / --shape)", _ORT,
          (r"Got invalid dimensions for input", r"invalid dimensions for input")),
    Known("ORT input name", "unknown or missing input", "ONNX Runtime",
          "an input was fed under a name the graph does not have, or one is missing",
          "feed every input by the graph's own names (studio info lists them)", _ORT,
          (r"Invalid input name", r"Invalid Feed Input Name", r"are missing from input feed")),
    Known("ORT input type", "wrong input type", "ONNX Runtime",
          "an input has another element type than the graph's (float64 for float32, int32 "
          "for int64)", "convert the input to the graph's type (studio info lists them)",
          _ORT, (r"Unexpected input data type",)),
    Known("ORT protobuf", "not an ONNX model", "ONNX Runtime",
          "the file is not a readable ONNX model (truncated, another format)",
          "export the model again", _ORT, (r"INVALID_PROTOBUF", r"Protobuf parsing failed")),
    Known("ORT external data", "external weights missing", "ONNX Runtime",
          "the model's external weights file is missing or shorter than the graph says",
          "keep the .onnx and its .data / _qnn.bin files together, or export again",
          f"{_ORT}; {_HERE}",
          (r"External data", r"ep_cache_context", r"exceeds file size")),
    Known("ORT context binary", "unreadable context binary", "ONNX Runtime QNN EP",
          "the compiled model's context binary cannot be read: truncated or damaged in a copy, "
          "or written by an SDK this runtime cannot read",
          "copy the compiled files again (their sizes must match), or compile again",
          _HERE, (r"Failed to get context binary info", r"Failed to load from EpContext")),
    Known("FastRPC skel", "HTP skel library not found", "FastRPC",
          "the DSP could not load libQnnHtpV##Skel.so: ADSP_LIBRARY_PATH does not name its "
          "folder, or /vendor's older copy is found first",
          "push the SDK's hexagon-v## skel and set ADSP_LIBRARY_PATH to that folder first",
          _FASTRPC, (r"Skel\.so", r"remote_handle(64)?_open", r"AEE_EBADCLASS",
                     r"0x8000040e")),
    Known("QNN HTP arch", "backend refused the target", "QNN",
          "the HTP backend refused the chip's htp_arch / soc_model", "fix this target in the "
          "chip catalog, or pick another target (studio targets)", _HERE,
          (r"Failed to create device", r"backendValidateOpConfig failed")),
)

_BY_KEY = {k.key: k for k in TABLE}
_QNN_CODE = re.compile(r"\b(?:err(?:or)?(?:\s*code)?|status|code)\s*[:=]?\s*"
                       r"(0x[0-9a-fA-F]{3,16}|\d{4,5})\b", re.IGNORECASE)
_GENIE_CODE = re.compile(r"(?:Genie\b[^()]*\(status\s*|Genie_Status_t\s*=\s*)(-?\d+)")
_GENIE_NAME = re.compile(r"GENIE_STATUS_(?:ERROR|WARNING)_[A-Z_]+")
_QNN_NAME = re.compile(r"QNN_(?:COMMON|CONTEXT|GRAPH)_ERROR_[A-Z_]+")


def _qnn(code: int) -> Known | None:
    code &= 0xFFFF  # QNN_GET_ERROR_CODE: the low 16 bits are the code
    return _BY_KEY.get(f"QNN {code}")


def decode_all(text: str) -> list[Known]:
    """Every known entry the text names, most specific first: named codes, numeric codes
    (QNN ``err NNNN`` / ``0xNNNN``, Genie ``(status N)``), then known messages."""
    found: list[Known] = []

    def add(k: Known | None) -> None:
        if k is not None and k not in found:
            found.append(k)

    for m in _QNN_NAME.finditer(text):
        add(next((k for k in TABLE if k.name == m.group(0)), None))
    for m in _GENIE_NAME.finditer(text):
        add(next((k for k in TABLE if k.name == m.group(0)), None))
    qnn: list[Known] = []
    for m in _QNN_CODE.finditer(text):
        raw = m.group(1)
        k = _qnn(int(raw, 16) if raw.lower().startswith("0x") else int(raw))
        if k is not None and k not in qnn:
            qnn.append(k)
    genie = [_BY_KEY.get(f"Genie {m.group(1)}") for m in _GENIE_CODE.finditer(text)]
    # a QNN code under a general Genie status is the cause: it goes first
    for k in qnn:
        add(k)
    for g in genie:
        add(g)
    for k in TABLE:
        if any(re.search(p, text, re.IGNORECASE) for p in k.patterns):
            add(k)
    return found


def decode(text: str) -> Known | None:
    """The most specific known entry the text names, or None."""
    got = decode_all(text)
    return got[0] if got else None


def explain(message: str) -> str:
    """``message`` with the decoded cause and fix appended (one line), unless nothing in it
    is known or it already carries the decoding."""
    k = decode(message)
    if k is None or f"[{k.key} " in message:
        return message
    return f"{message.rstrip()} [{k.key} {k.name}: {k.cause}; fix: {k.fix}]"


def markdown() -> str:
    """The table as docs/errors.md."""
    out = ["# Error decoder", "",
           "What the QNN / QAIRT backend, Genie and ONNX Runtime's QNN execution provider say "
           "when they fail, the likely cause and the fix. Every stage failure, `studio "
           "generate`, the device agent and the bundle check append the matching entry to "
           "their one-line error. Generated from `studio/core/errorcodes.py` "
           "(`python -m studio.core.errorcodes > docs/errors.md`).", "",
           f"{len(TABLE)} entries.", "",
           "| code | name | component | cause | fix | source |",
           "|---|---|---|---|---|---|"]
    for k in TABLE:
        cells = [k.key, f"`{k.name}`" if k.name.isupper() else k.name, k.component, k.cause,
                 k.fix, k.source]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
