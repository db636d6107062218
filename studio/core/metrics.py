"""Every number the studio shows carries its source.

- ``measured``: timed on a named device (the host CPU, a remote Snapdragon, adb).
- ``simulated``: the QNN HTP simulator on x86 — real HTP numerics; its timings follow the
  host CPU and are *not* device latency.
- ``estimated``: the studio's performance model for a named SoC.
- ``imported``: read from a file the user brought.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SOURCES = ("measured", "simulated", "estimated", "imported")


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    unit: str
    source: str
    device: str
    target: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"metric source must be one of {SOURCES}, not {self.source!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Metric:
        return cls(**{k: d[k] for k in ("name", "value", "unit", "source", "device")},
                   target=d.get("target", ""), detail=d.get("detail", ""))

    def label(self) -> str:
        where = f"{self.device}" + (f" / {self.target}" if self.target else "")
        return f"{self.value:.4g} {self.unit} ({self.source}, {where})"
