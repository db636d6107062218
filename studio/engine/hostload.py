"""How busy the host was while something was timed: the share of its CPUs used by *other*
processes.

The HTP simulator's cycles and times follow host CPU time, so each simulated figure is
recorded with the load it was measured under. Linux: total busy time from ``/proc/stat``
minus this process's own CPU time (``os.times``, all its threads); elsewhere the 1-minute
load average divided by the core count is the fallback (coarser: it includes us).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _busy_seconds() -> float | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            parts = f.readline().split()
    except OSError:
        return None
    if not parts or parts[0] != "cpu":
        return None
    vals = [int(x) for x in parts[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # guest time is already inside user / nice
    return (total - idle) / _TICK


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class LoadSample:
    wall_s: float
    other_load: float  # 0..1: share of all host CPUs used by other processes
    method: str  # "proc-stat" or "loadavg"


class HostLoadMeter:
    """``with HostLoadMeter() as m: work()`` then ``m.sample``."""

    def __init__(self) -> None:
        self.cpus = os.cpu_count() or 1
        self.sample: LoadSample | None = None

    def __enter__(self) -> HostLoadMeter:
        self._t0 = time.perf_counter()
        self._busy0 = _busy_seconds()
        self._own0 = _own_cpu_seconds()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._t0
        busy1 = _busy_seconds()
        own = _own_cpu_seconds() - self._own0
        if self._busy0 is not None and busy1 is not None and wall > 0:
            other = (busy1 - self._busy0 - own) / (wall * self.cpus)
            method = "proc-stat"
        else:
            try:
                other = os.getloadavg()[0] / self.cpus
            except OSError:
                other = 0.0
            method = "loadavg"
        self.sample = LoadSample(wall, min(1.0, max(0.0, other)), method)
