"""Devices: where a job runs, and therefore what its figures are.

A :class:`Device` has a kind (the host CPU, the QNN HTP simulator for one chip; later a
remote agent or a phone over adb), an id that names it in jobs and the run history, the chip
it runs (for the HTP kinds) and the source label of what it produces: ``measured`` on real
hardware, ``simulated`` on the simulator. Stages label their figures from the device that
ran them, never by hand.

The project file lists device *kinds* in ``run.devices`` (``cpu``, ``htp-sim``); the plan
turns each kind into devices (one simulator per target chip) with :func:`project_devices`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from studio.core.errors import StudioError

# kind -> (source label of its figures, the kind as the project file names it)
KINDS: dict[str, str] = {"host-cpu": "measured", "htp-sim": "simulated"}
# The names ``run.devices`` accepts, and the kind each stands for.
PROJECT_KINDS: dict[str, str] = {"cpu": "host-cpu", "htp-sim": "htp-sim"}


@dataclass(frozen=True)
class Device:
    kind: str  # host-cpu | htp-sim
    id: str  # "cpu", "htp-sim:snapdragon-8-gen-3"
    chip: str = ""  # catalog key for HTP devices
    name: str = ""

    @property
    def source(self) -> str:
        """The label of every figure this device produces (timings and numerics)."""
        return KINDS[self.kind]

    @property
    def on_npu(self) -> bool:
        return self.kind != "host-cpu"

    @property
    def timing_note(self) -> str:
        if self.kind == "htp-sim":
            return "simulator time: follows the host CPU, not device latency"
        return ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


HOST_CPU = Device("host-cpu", "cpu", "", "host CPU")


def htp_simulator(chip_key: str) -> Device:
    from studio.core.catalog import get_chip

    chip = get_chip(chip_key)
    return Device("htp-sim", f"htp-sim:{chip.key}", chip.key, f"HTP simulator ({chip.name})")


def device(device_id: str) -> Device:
    """The device a job's id names (``cpu``, ``htp-sim:CHIP``; ``htp-sim/CHIP`` from older
    run histories)."""
    if device_id in ("cpu", "host-cpu"):
        return HOST_CPU
    for sep in (":", "/"):
        kind, _, chip = device_id.partition(sep)
        if kind == "htp-sim" and chip:
            return htp_simulator(chip)
    raise StudioError(f"unknown device {device_id!r}: use cpu or htp-sim:<chip>")


def check_kinds(kinds: list[str]) -> None:
    for k in kinds:
        if k not in PROJECT_KINDS:
            raise StudioError(
                f"run.devices: unknown device {k!r}; known: {', '.join(PROJECT_KINDS)}"
            )


def project_devices(kinds: list[str], chips: list[str]) -> list[Device]:
    """The devices a project's ``run.devices`` names, the simulator once per target chip."""
    check_kinds(kinds)
    out: list[Device] = []
    for k in kinds:
        if PROJECT_KINDS[k] == "host-cpu":
            out.append(HOST_CPU)
        else:
            out.extend(htp_simulator(c) for c in chips)
    return out
