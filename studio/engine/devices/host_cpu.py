"""The host CPU: ONNX Runtime runs the FP32 export (``measured``)."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from studio.core.devices import DeviceKind
from studio.engine.devices._base import Backend as _Base
from studio.engine.graphpipe import cpu_session
from studio.engine.llm_runtime import cpu_generator
from studio.engine.vision import encoder_session


class Backend(_Base):
    @classmethod
    def listed(cls, decl: DeviceKind, registry: Any, health: bool = False
               ) -> list[dict[str, Any]]:
        return [{"id": decl.shorthand, "kind": decl.kind, "source": decl.source,
                 "label": decl.title, "status": "ok"}]

    def versions(self) -> dict[str, str]:
        try:
            return {"onnxruntime": version("onnxruntime")}
        except PackageNotFoundError:
            return {}

    def describe(self, scheme: str) -> str:
        return "FP32 on the host CPU"

    def open_generator(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                       fp16: bool, log: Callable[[str], None] | None = None) -> Any:
        return cpu_generator(export, spec)

    def open_encoder(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                     fp16: bool) -> Any:
        return encoder_session(export)

    def open_session(self, graph: Path, compiled: Path | None, strict: bool) -> Any:
        return cpu_session(graph)
