"""Devices: where a job runs, and therefore what its figures are.

A :class:`Device` has a kind (the host CPU, the QNN HTP simulator for one chip, a remote
agent, a phone over adb), an id that names it in jobs and the run history, the chip
it runs (for the HTP kinds) and the source label of what it produces: ``measured`` on real
hardware, ``simulated`` on the simulator. Stages label their figures from the device that
ran them, never by hand.

The project file lists device *kinds* in ``run.devices`` (``cpu``, ``htp-sim``); the plan
turns each kind into devices (one simulator per target chip) with :func:`project_devices`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from studio.core.errors import StudioError

# kind -> the source label of its figures (an agent's depends on its backend, see Device)
KINDS: dict[str, str] = {"host-cpu": "measured", "htp-sim": "simulated", "agent": "measured",
                         "adb": "measured"}
AGENT_ID = re.compile(r"^agent:([A-Za-z0-9][A-Za-z0-9._-]{0,63})(?:@(cpu|htp-sim:[a-z0-9-]+|"
                      r"htp:[a-z0-9-]+))?$")
ADB_ID = re.compile(r"^adb:([A-Za-z0-9._:-]{1,64}?)(?:@([a-z0-9-]+))?$")
# The names ``run.devices`` accepts, and the kind each stands for.
PROJECT_KINDS: dict[str, str] = {"cpu": "host-cpu", "htp-sim": "htp-sim"}


@dataclass(frozen=True)
class Device:
    kind: str  # host-cpu | htp-sim | agent | adb
    id: str  # "cpu", "htp-sim:snapdragon-8-gen-3", "agent:lab@htp-sim:snapdragon-8-gen-3",
    # "adb:SERIAL@snapdragon-8-gen-3"
    chip: str = ""  # catalog key for HTP devices
    name: str = ""

    @property
    def backend(self) -> str:
        """An agent's backend (``cpu``, ``htp-sim:CHIP``, ``htp:CHIP``); "" otherwise."""
        return self.id.partition("@")[2] if self.kind == "agent" else ""

    @property
    def source(self) -> str:
        """The label of every figure this device produces (timings and numerics): an agent's
        HTP simulator backend is ``simulated``, its CPU and a real NPU ``measured``."""
        if self.kind == "agent" and self.backend.startswith("htp-sim:"):
            return "simulated"
        return KINDS[self.kind]

    @property
    def on_npu(self) -> bool:
        return self.kind in ("htp-sim", "adb") or (self.kind == "agent" and self.backend != "cpu")

    @property
    def serial(self) -> str:
        """An adb phone's serial; "" otherwise."""
        return self.id[len("adb:"):].partition("@")[0] if self.kind == "adb" else ""

    @property
    def timing_note(self) -> str:
        if self.kind == "htp-sim":
            return "simulator time: follows the host CPU, not device latency"
        if self.kind == "agent":
            return "timed on the agent's machine" + (
                "; simulator time: follows its CPU, not device latency"
                if self.source == "simulated" else "")
        if self.kind == "adb":
            return ("timed on the phone by qnn-net-run's profiling (this adb path is unverified "
                    "on hardware here)")
        return ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


HOST_CPU = Device("host-cpu", "cpu", "", "host CPU")


def htp_simulator(chip_key: str) -> Device:
    from studio.core.catalog import get_chip

    chip = get_chip(chip_key)
    return Device("htp-sim", f"htp-sim:{chip.key}", chip.key, f"HTP simulator ({chip.name})")


def agent_device(device_id: str) -> Device:
    """``agent:NAME[@BACKEND]`` (BACKEND ``cpu`` by default, ``htp-sim:CHIP`` or
    ``htp:CHIP``) as a Device."""
    m = AGENT_ID.match(device_id or "")
    if not m:
        raise StudioError(f"device {device_id!r}: an agent device is agent:NAME, "
                          "agent:NAME@htp-sim:CHIP or agent:NAME@htp:CHIP")
    name, backend = m.group(1), m.group(2) or "cpu"
    chip = ""
    if backend != "cpu":
        from studio.core.catalog import get_chip

        chip = get_chip(backend.partition(":")[2]).key
        backend = f"{backend.partition(':')[0]}:{chip}"
    where = "host CPU" if backend == "cpu" else (
        f"HTP simulator {chip}" if backend.startswith("htp-sim") else f"HTP {chip}")
    return Device("agent", f"agent:{name}@{backend}", chip, f"{where} on agent {name}")


def adb_device(device_id: str, chips: list[str] | None = None) -> Device:
    """``adb:SERIAL[@CHIP]`` as a Device: a phone over adb running the compiled context of
    CHIP (a catalog chip; without one, the project's only target in ``chips``)."""
    m = ADB_ID.match(device_id or "")
    if not m:
        raise StudioError(f"device {device_id!r}: a phone is adb:SERIAL or adb:SERIAL@CHIP "
                          "(the serial adb devices lists)")
    serial, chip_key = m.group(1), m.group(2)
    if not chip_key:
        if not chips or len(chips) != 1:
            raise StudioError(f"device {device_id!r}: name the phone's chip, e.g. "
                              f"adb:{serial}@snapdragon-8-gen-3 (the project has "
                              f"{len(chips or [])} targets)")
        chip_key = chips[0]
    from studio.core.catalog import get_chip

    chip = get_chip(chip_key)
    return Device("adb", f"adb:{serial}@{chip.key}", chip.key, f"phone {serial} ({chip.name})")


def device(device_id: str, chips: list[str] | None = None) -> Device:
    """The device a job's id names (``cpu``, ``htp-sim:CHIP``, ``agent:NAME[@BACKEND]``;
    ``adb:SERIAL[@CHIP]``; ``htp-sim/CHIP`` from older run histories). ``chips``: the
    project's targets, which name an adb phone's chip when the id does not."""
    if device_id in ("cpu", "host-cpu"):
        return HOST_CPU
    if device_id.startswith("agent:"):
        return agent_device(device_id)
    if device_id.startswith("adb:"):
        return adb_device(device_id, chips)
    for sep in (":", "/"):
        kind, _, chip = device_id.partition(sep)
        if kind == "htp-sim" and chip:
            return htp_simulator(chip)
    raise StudioError(f"unknown device {device_id!r}: use cpu, htp-sim:<chip>, "
                      "agent:<name>[@backend] or adb:<serial>[@chip]")


def check_kinds(kinds: list[str]) -> None:
    for k in kinds:
        if isinstance(k, str) and k.startswith("agent:"):
            agent_device(k)
        elif isinstance(k, str) and k.startswith("adb:"):
            if not ADB_ID.match(k):
                adb_device(k)  # raises with the form to use
        elif k not in PROJECT_KINDS:
            raise StudioError(
                f"run.devices: unknown device {k!r}; known: {', '.join(PROJECT_KINDS)}, "
                "agent:NAME[@BACKEND] for a registered agent and adb:SERIAL[@CHIP] for a phone"
            )


def project_devices(kinds: list[str], chips: list[str]) -> list[Device]:
    """The devices a project's ``run.devices`` names, the simulator once per target chip."""
    check_kinds(kinds)
    out: list[Device] = []
    for k in kinds:
        if k.startswith("agent:"):
            dev = agent_device(k)
            if dev.chip and dev.chip not in chips:
                continue  # an HTP backend runs a target's compiled context only
            out.append(dev)
        elif k.startswith("adb:"):
            dev = adb_device(k, chips)
            if dev.chip in chips:  # a phone runs a target's compiled context only
                out.append(dev)
        elif PROJECT_KINDS[k] == "host-cpu":
            out.append(HOST_CPU)
        else:
            out.extend(htp_simulator(c) for c in chips)
    return out
