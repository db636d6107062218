"""A check's finding (``studio doctor``): PASS / WARN / FAIL / SKIP, what was found and the
fix in one line. Pure: the machine's and the project's checks live in
:mod:`studio.services.doctor`, a device's in its backend (``Backend.doctor_checks``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass
class Check:
    area: str  # machine | project | device
    name: str
    status: str  # PASS | WARN | FAIL | SKIP
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        return f"{self.status:4}  {self.name}: {self.detail}" + (
            f" — fix: {self.fix}" if self.fix and self.status != PASS else "")
