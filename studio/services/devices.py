"""Devices: what can run jobs on this machine and what it can reach, listed kind by kind from
the device registry (``studio.core.devices``): each kind's backend lists its own devices."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from studio.core.devices import DEVICE_KINDS, kind_decl
from studio.engine.devices import backend_class
from studio.engine.devices.agent import health_line


def package_version(name: str) -> str | None:
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


def device_rows(registry: Any = None, health: bool = False, probe: bool | None = None,
                elsewhere: bool | None = None) -> list[dict[str, Any]]:
    """Every kind's devices, in the registry's order, each kind listed by its backend: rows
    with ``id``, ``kind``, ``source``, ``status`` (a row with ``note`` says why a kind lists
    none). ``registry``: the user's device registry and settings (None: the user's own).
    ``health``: ask each device how it is (an agent over the network). ``probe``: only the
    kinds whose listing runs a program (adb; True) or only the others (False). ``elsewhere``:
    only the kinds whose devices are other machines (True) or only this machine's
    (False)."""
    rows: list[dict[str, Any]] = []
    for decl in list(DEVICE_KINDS.values()):
        if elsewhere is not None and decl.elsewhere != elsewhere:
            continue
        cls = backend_class(decl.kind)
        if probe is not None and cls.probes != probe:
            continue
        rows += cls.listed(decl, registry, health)
    return rows


def run_choices(rows: list[dict[str, Any]], targets: list[str]) -> list[tuple[str, str]]:
    """(label, device id) of what a project with ``targets`` can run on through the listed
    ``rows`` (each row's kind says what)."""
    return [c for r in rows for c in backend_class(r["kind"]).choices(r, list(targets))]


def group(kind: str) -> str:
    """What a list of ``kind``'s devices is called ("Phones over adb")."""
    return backend_class(kind).group or kind_decl(kind).title


def probed_kinds() -> list[str]:
    """The kinds whose listing runs a program (adb): listed off a window's thread."""
    return [k for k in DEVICE_KINDS if backend_class(k).probes]


def agent_health(registry: Any, name: str) -> str:
    """One line on a registered agent: reachable (round trip, machine, backends) or why not."""
    return health_line(registry, name)
