"""A device kind made for the tests, to show what adding one takes: this module (its
backend) and one DeviceKind registration. It is the host CPU running the export with one
ONNX Runtime thread (``cpu1:NAME``), measured like the host CPU."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core.devices import Device, DeviceKind
from studio.engine.devices.host_cpu import Backend as HostCpu


def one_thread_cpu(device_id: str, chips: list[str] | None = None) -> Device:
    return Device("host-cpu-1", device_id, "", f"host CPU, one thread ({device_id[5:]})")


KIND = DeviceKind("host-cpu-1", "measured", "tests.engine.one_thread_backend", "cpu1:",
                  one_thread_cpu, form="cpu1:<name>")


class Backend(HostCpu):
    def describe(self, scheme: str) -> str:
        return "FP32 on one host CPU thread"

    def open_generator(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                       fp16: bool, log: Callable[[str], None] | None = None) -> Any:
        from studio.engine.llm_runtime import cpu_generator

        return cpu_generator(export, spec, threads=1)
