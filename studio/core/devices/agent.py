"""The agent kind: ``agent:NAME[@BACKEND]``, a machine running ``studio agent serve`` (from the
user's device registry) that runs the work on one of its own devices, its BACKEND: its host
CPU (``cpu``, the default), its HTP simulator (``htp-sim:CHIP``) or its NPU (``htp:CHIP``). Its
figures are labelled as that device labels them there."""

from __future__ import annotations

import re

from studio.core.devices.base import Device, DeviceKind, device
from studio.core.errors import StudioError

AGENT_ID = re.compile(r"^agent:([A-Za-z0-9][A-Za-z0-9._-]{0,63})(?:@(cpu|htp-sim:[a-z0-9-]+|"
                      r"htp:[a-z0-9-]+))?$")


def name_of(dev: Device) -> str:
    """An agent device's agent name (``lab`` of ``agent:lab@cpu``)."""
    return dev.id[len("agent:"):].partition("@")[0]


def backend_of(dev: Device) -> str:
    """An agent device's backend on the agent's machine (``cpu``, ``htp-sim:CHIP``,
    ``htp:CHIP``)."""
    return dev.id.partition("@")[2]


class AgentKind(DeviceKind):
    def make(self, device_id: str, chips: list[str] | None = None) -> Device:
        m = AGENT_ID.match(device_id or "")
        if not m:
            raise StudioError(f"device {device_id!r}: an agent device is agent:NAME, "
                              "agent:NAME@htp-sim:CHIP or agent:NAME@htp:CHIP")
        name, backend = m.group(1), m.group(2) or "cpu"
        there = device(backend)
        where = "host CPU" if not there.chip else (
            f"HTP simulator {there.chip}" if there.source == "simulated"
            else f"HTP {there.chip}")
        return Device(self.kind, f"agent:{name}@{there.id}", there.chip,
                      f"{where} on agent {name}")

    def remote_device(self, dev: Device) -> Device | None:
        """The device of the agent's machine that runs the work (its backend)."""
        return device(backend_of(dev))

    def device_timing_note(self, dev: Device) -> str:
        return "timed on the agent's machine" + (
            "; simulator time: follows its CPU, not device latency"
            if dev.source == "simulated" else "")


KIND = AgentKind("agent", "measured", "agent", "agent:", form="agent:<name>[@backend]",
                 title="agent", stages=("run", "profile"), project_ids=True, elsewhere=True)
