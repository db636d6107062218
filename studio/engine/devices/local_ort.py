"""ONNX Runtime's CPU provider on the quantized graphs (``local-ort``): the quantize stage's
QDQ prefill and decode graphs run as they are on this machine, without QNN — what the host
sees of the quantized model's numerics (the validate stage's ``host_qdq``), timed on the host
(``measured``). The kind is declared by its ``register_kind`` line in
``studio/core/devices/__init__.py``."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from studio.core.devices import DeviceKind
from studio.core.errors import StudioError
from studio.engine.devices._base import Backend as _Base
from studio.engine.llm_runtime import cpu_generator


class Backend(_Base):
    @classmethod
    def listed(cls, decl: DeviceKind, registry: Any, health: bool = False
               ) -> list[dict[str, Any]]:
        ort = _ort_version()
        if not ort:
            return []
        return [{"id": decl.shorthand, "kind": decl.kind, "source": decl.source,
                 "label": decl.title,
                 "status": f"ok (the quantized QDQ graphs on onnxruntime {ort}'s CPU provider)"}]

    def versions(self) -> dict[str, str]:
        ort = _ort_version()
        return {"onnxruntime": ort} if ort else {}

    def describe(self, scheme: str) -> str:
        return f"{scheme} QDQ graphs on ONNX Runtime's CPU provider"

    def open_generator(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                       fp16: bool, log: Callable[[str], None] | None = None) -> Any:
        """The quantized graphs (``compiled``: the quantize stage's folder) on the host's
        ONNX Runtime, as the validate stage scores them."""
        if compiled is None:
            raise StudioError(f"the {self.device.name} runs the quantized graphs: run the "
                              "quantize stage")
        return cpu_generator(compiled, spec)


def _ort_version() -> str:
    try:
        return version("onnxruntime")
    except PackageNotFoundError:
        return ""
