"""How byte sizes are written: binary units (1 KiB = 1024 B), named as such."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: int) -> str:
    """``13_700_000`` -> ``"13.1 MiB"``; whole bytes below 1 KiB (``"512 B"``), one decimal
    above, in the largest unit that keeps the rounded figure under 1024."""
    sign = "-" if n < 0 else ""
    size = abs(n)
    if size < 1024:
        return f"{sign}{int(size)} B"
    for power, unit in enumerate(_UNITS[1:], start=1):
        value = size / 1024**power
        if round(value, 1) < 1024 or unit == _UNITS[-1]:
            return f"{sign}{value:.1f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover
