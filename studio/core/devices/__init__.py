"""Devices: where a job runs, and therefore what its figures are.

A :class:`Device` has a kind (the host CPU, the QNN HTP simulator for one chip, a remote
agent, a phone over adb, ONNX Runtime's CPU provider on the quantized graphs), an id that
names it in jobs and the run history, the chip it runs (for the HTP kinds) and the source
label of what it produces: ``measured`` on real hardware, ``simulated`` on the simulator.
Stages label their figures from the device that ran them, never by hand.

Each kind is declared once (:class:`DeviceKind`, in ``base``) and registered by one line
below: how its ids read, the source label and timing note of its figures, which device
stages its devices run, what they run beside the export, how ``run.devices`` and
``--device`` name it, and the engine module of its backend
(``studio/engine/devices/<module>.py``, which implements :class:`DeviceBackend` and lists
the kind's devices). A kind with an id grammar or behaviour of its own has a module here
(``agent``, ``adb``). What runs a job on a device is asked of its backend
(``studio.engine.devices.backend(device)``); nothing else branches on a kind. A device id is
parsed by :func:`device`, and a name a user gives (a kind's shorthand such as ``cpu`` or
``htp-sim``, or an id) by :func:`resolve`, and nowhere else.

The project file lists devices in ``run.devices`` (``cpu``, ``htp-sim``, ids such as
``agent:lab``); the plan turns each into devices (one simulator per target chip) with
:func:`project_devices`.
"""

from __future__ import annotations

from collections.abc import Sequence

from studio.core.devices import adb, agent
from studio.core.devices.adb import ADB_ID
from studio.core.devices.agent import AGENT_ID
from studio.core.devices.base import (
    DEVICE_KINDS,
    KINDS,
    Device,
    DeviceBackend,
    DeviceKind,
    backend_module,
    device,
    kind_decl,
    register_kind,
)
from studio.core.errors import StudioError

SIMULATOR_TIME = "simulator time: follows the host CPU, not device latency"

# Every device kind, one registration each (a kind's backend: studio/engine/devices/<module>).
register_kind(DeviceKind("host-cpu", "measured", "host_cpu", aliases=("cpu", "host-cpu"),
                         form="cpu", title="host CPU", stages=("run", "graph-run"),
                         shorthand="cpu", default=True))
register_kind(DeviceKind("htp-sim", "simulated", "htp_sim", "htp-sim:", on_npu=True,
                         timing_note=SIMULATOR_TIME, form="htp-sim:<chip>", runs_genie=True,
                         title="HTP simulator", per_chip=True, shorthand="htp-sim",
                         default=True,
                         stages=("run", "profile", "graph-run", "graph-profile")))
register_kind(DeviceKind("htp", "measured", "htp_sim", "htp:", on_npu=True, per_chip=True,
                         timing_note="timed on this machine's NPU", title="HTP"))
register_kind(agent.KIND)
register_kind(adb.KIND)
register_kind(DeviceKind("local-ort", "measured", "local_ort", aliases=("local-ort",),
                         form="local-ort", title="ONNX Runtime CPU (QDQ graphs)",
                         stages=("run",), runs="quantize", shorthand="local-ort"))

HOST_CPU = device("cpu")

__all__ = ["ADB_ID", "AGENT_ID", "DEVICE_KINDS", "HOST_CPU", "KINDS", "SIMULATOR_TIME",
           "Device", "DeviceBackend", "DeviceKind", "adb_device", "agent_device",
           "backend_module", "check_id", "check_kinds", "check_name", "default_devices",
           "device", "device_names", "htp_npu", "htp_simulator", "kind_decl", "local_device",
           "project_devices", "register_kind", "resolve", "shorthand_kind"]


def htp_simulator(chip_key: str) -> Device:
    """The HTP simulator of a chip (``htp-sim:CHIP``): what the per-target stages run on."""
    return device(f"htp-sim:{chip_key}")


def htp_npu(chip_key: str) -> Device:
    """The NPU of this machine (an Arm64 Snapdragon, as an agent runs on): ``htp:CHIP``."""
    return device(f"htp:{chip_key}")


def agent_device(device_id: str, chips: list[str] | None = None) -> Device:
    """``agent:NAME[@BACKEND]`` (BACKEND ``cpu`` by default, ``htp-sim:CHIP`` or
    ``htp:CHIP``) as a Device."""
    return agent.KIND.make(device_id, chips)


def adb_device(device_id: str, chips: list[str] | None = None) -> Device:
    """``adb:SERIAL[@CHIP]`` as a Device: a phone over adb running the compiled context of
    CHIP (a catalog chip; without one, the project's only target in ``chips``)."""
    return adb.KIND.make(device_id, chips)


def local_device(backend: str) -> Device:
    """What an agent's backend id (``cpu``, ``htp-sim:CHIP``, ``htp:CHIP``) is on the agent's
    own machine."""
    return device(backend)


def shorthand_kind(name: object) -> DeviceKind | None:
    """The kind whose shorthand ``name`` is (``cpu``, ``htp-sim``), None where it is none."""
    return next((k for k in DEVICE_KINDS.values() if k.shorthand and k.shorthand == name),
                None)


def device_names() -> list[str]:
    """How a user names a device, for help texts: each kind's shorthand, and the form of the
    ids a project or ``--device`` may give one by one."""
    out: list[str] = []
    for k in DEVICE_KINDS.values():
        for n in (k.shorthand, k.form if k.shorthand or k.project_ids else ""):
            if n and n not in out:
                out.append(n)
    return out


def default_devices() -> list[str]:
    """A new project's ``run.devices``: the shorthands of the kinds declared default."""
    return [k.shorthand for k in DEVICE_KINDS.values() if k.default and k.shorthand]


def resolve(name: str | None, targets: Sequence[str]) -> Device:
    """The device a user names for a project with ``targets``: a kind's shorthand (``cpu``;
    ``htp-sim``, a kind of one device per chip: the first target's) or an id (an adb phone's
    chip may be the project's only target); nothing names the host CPU. The one place a
    shorthand becomes a device."""
    if not name:
        return HOST_CPU
    decl = shorthand_kind(name)
    if decl is None:
        return device(name, list(targets))
    if not decl.per_chip:
        return decl.make(name)
    if not targets:
        raise StudioError(f"device {name} runs a target's compiled context, and the project "
                          "has no target chip: add one to targets")
    return decl.make(f"{decl.prefix}{targets[0]}")


def check_id(device_id: str) -> None:
    """Check a device id's form, where the project may complete it (an adb phone's chip
    may be the project's only target): StudioError with the form to use."""
    decl = next((k for k in DEVICE_KINDS.values() if k.matches(device_id)), None)
    if decl is None:
        device(device_id)  # raises with the forms to use
    else:
        decl.check_form(device_id)


def check_name(name: str) -> None:
    """Check what a user names a device by (a shorthand or an id) for its form."""
    if shorthand_kind(name) is None:
        check_id(name)


def check_kinds(kinds: list[str]) -> None:
    """Check ``run.devices``: shorthands, and the ids of kinds a project may name one by
    one (:attr:`DeviceKind.project_ids`)."""
    for k in kinds:
        if shorthand_kind(k) is not None:
            continue
        decl = next((d for d in DEVICE_KINDS.values() if d.project_ids
                     and isinstance(k, str) and d.matches(k)), None)
        if decl is not None:
            decl.check_form(k)
            continue
        names = [d.shorthand for d in DEVICE_KINDS.values() if d.shorthand]
        ids = [f"{d.form} for {'an' if d.title[:1] in 'aeiou' else 'a'} {d.title}"
               for d in DEVICE_KINDS.values() if d.project_ids]
        raise StudioError(f"run.devices: unknown device {k!r}; known: {', '.join(names)}"
                          + (f", {' and '.join(ids)}" if ids else ""))


def project_devices(kinds: list[str], chips: list[str]) -> list[Device]:
    """The devices a project's ``run.devices`` names, a kind of one device per chip once
    per target chip; a device with a chip of its own (an agent's HTP, a phone) runs a
    target's compiled context only."""
    check_kinds(kinds)
    out: list[Device] = []
    for k in kinds:
        decl = shorthand_kind(k)
        if decl is not None:
            out.extend([decl.make(f"{decl.prefix}{c}") for c in chips] if decl.per_chip
                       else [decl.make(k)])
            continue
        dev = device(k, chips)
        if not dev.chip or dev.chip in chips:
            out.append(dev)
    return out
