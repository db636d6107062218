"""Device backends: one module per device kind, each a class implementing
:class:`studio.core.devices.DeviceBackend` (open an LLM generator or a graph session, profile,
upload what it needs, report its runtime's versions, label its figures from its device) and
listing the kind's devices (``Backend.listed`` / ``Backend.choices``). The tools a backend
drives live beside it (``adb_phone``: adb and qnn-net-run; ``agent_client``: the agent
protocol).

``core/devices`` declares each kind with the module of its backend; :func:`backend` imports
that module when a device is first used (``torch`` / ``onnxruntime`` stay unloaded until
then). Stages and services ask the backend; nothing outside the backends branches on a kind.
"""

from __future__ import annotations

import importlib
from typing import Any

from studio.core.devices import Device, DeviceBackend, backend_module


def backend_class(kind: str) -> Any:
    """The backend class of a device kind (its module imported now)."""
    return importlib.import_module(backend_module(kind)).Backend


def backend(device: Device, registry: Any = None,
            run_options: dict[str, str] | None = None) -> DeviceBackend:
    """The backend that runs work on ``device``. ``registry``: the user's device registry
    and settings (:class:`studio.engine.device_registry.Registry`; None: the user's own),
    where agents and the QAIRT SDK of adb runs are found. ``run_options``: the QNN HTP
    backend's run-time options (:func:`run_options`)."""
    return backend_class(device.kind)(device, registry, run_options)


def run_options(performance_mode: str) -> dict[str, str]:
    """The run-time options of the project's ``[htp]`` settings: ``htp_performance_mode``
    when one is chosen (the keys and values the QNN EP takes)."""
    return {"htp_performance_mode": performance_mode} if performance_mode else {}


__all__ = ["backend", "backend_class", "run_options"]
