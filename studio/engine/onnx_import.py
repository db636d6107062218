"""ONNX files: open them with a clear error for files that are not valid ONNX models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studio.core.errors import StudioError


def match(path: Path) -> bool:
    return Path(path).is_file() and Path(path).suffix.lower() == ".onnx"


def open_onnx(path: Path) -> Any:
    """Load and check an ONNX model (without external data); StudioError if it is corrupt."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise StudioError(f"{path} does not exist: give the path of an .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=False)
        onnx.checker.check_model(model)
    except Exception as exc:  # protobuf DecodeError, ValidationError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StudioError(f"{path.name} is not a valid ONNX model ({first[:160]}): re-export it") from None
    return model
