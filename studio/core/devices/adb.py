"""The phone kind: ``adb:SERIAL[@CHIP]``, a phone over adb running the compiled context of
CHIP (a catalog chip; without one, the project's only target) with ``qnn-net-run``."""

from __future__ import annotations

import re

from studio.core.catalog import get_chip
from studio.core.devices.base import Device, DeviceKind
from studio.core.errors import StudioError

ADB_ID = re.compile(r"^adb:([A-Za-z0-9._:-]{1,64}?)(?:@([a-z0-9-]+))?$")


def serial_of(dev: Device) -> str:
    """A phone's serial (what ``adb devices`` lists)."""
    return dev.id[len("adb:"):].partition("@")[0]


class AdbKind(DeviceKind):
    def make(self, device_id: str, chips: list[str] | None = None) -> Device:
        m = ADB_ID.match(device_id or "")
        if not m:
            raise StudioError(f"device {device_id!r}: a phone is adb:SERIAL or "
                              "adb:SERIAL@CHIP (the serial adb devices lists)")
        serial, chip_key = m.group(1), m.group(2)
        if not chip_key:
            if not chips or len(chips) != 1:
                raise StudioError(f"device {device_id!r}: name the phone's chip, e.g. "
                                  f"adb:{serial}@snapdragon-8-gen-3 (the project has "
                                  f"{len(chips or [])} targets)")
            chip_key = chips[0]
        chip = get_chip(chip_key)
        return Device(self.kind, f"adb:{serial}@{chip.key}", chip.key,
                      f"phone {serial} ({chip.name})")

    def check_form(self, device_id: str) -> None:
        """The form alone: the phone's chip may be the project's only target."""
        if not ADB_ID.match(device_id):
            self.make(device_id)  # raises with the form to use


KIND = AdbKind("adb", "measured", "adb", "adb:", on_npu=True,
               timing_note=("timed on the phone by qnn-net-run's profiling (this adb path is "
                            "unverified on hardware here)"), form="adb:<serial>[@chip]",
               title="phone", stages=("run", "profile"), project_ids=True, elsewhere=True)
