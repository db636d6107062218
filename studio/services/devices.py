"""Devices: what can run jobs on this machine (the host CPU, the QNN HTP simulator)."""

from __future__ import annotations

import os
import platform
from typing import Any


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def device_state() -> dict[str, Any]:
    """What can run jobs on this machine: the host CPU and the QNN HTP simulator."""
    qnn = package_version("onnxruntime-qnn")
    ort = package_version("onnxruntime")
    return {
        "host": {
            "name": platform.node() or "this machine",
            "cpus": os.cpu_count() or 1,
            "machine": platform.machine(),
            "system": platform.system(),
            "python": platform.python_version(),
            "onnxruntime": ort,
        },
        "htp_sim": {"available": qnn is not None, "version": qnn},
    }
