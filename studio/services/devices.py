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


def adb_devices() -> list[dict[str, Any]]:
    """Phones adb sees (``adb devices -l``), each marked unverified on hardware; one row saying
    adb is missing when it is."""
    from studio.core.errors import StudioError
    from studio.engine.adb import UNVERIFIED, Adb

    runner = Adb()
    if not runner.available:
        return [{"id": "adb", "kind": "adb", "source": "",
                 "status": "adb not installed (Android platform-tools): phones are not listed"}]
    try:
        devs = runner.devices()
    except StudioError as exc:
        return [{"id": "adb", "kind": "adb", "source": "", "status": exc.message}]
    return [{"id": f"adb:{d.serial}", "kind": "adb", "source": "measured", "serial": d.serial,
             "ready": d.ready, "model": d.model,
             "status": f"{d.state} {d.model}".strip() + f" ({UNVERIFIED})"} for d in devs]
