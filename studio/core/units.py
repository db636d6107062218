"""How byte sizes and changes are written: binary units (1 KiB = 1024 B), named as such; a
change with its sign, and none (never ``-0``) when it rounds to zero."""

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


def signed(value: float, spec: str = ".3g", minus: str = "-") -> str:
    """A change with its sign: ``signed(0.224, ".3f")`` -> ``"+0.224"``, ``signed(-0.014,
    ".1%")`` -> ``"-1.4%"``. A change that rounds to zero at ``spec`` has no sign: ``"0"``,
    ``"0.0%"`` — never ``"-0"`` or ``"+0.0%"``. ``spec`` is a format spec without a sign or a
    width (``",.0f"``, ``".2%"``, ``".2e"``); ``minus``: the sign of a decrease (``"−"``,
    the typographic minus, on screen). NaN and infinities are written as ``format`` does."""
    spec = spec.replace("+", "")
    if value != value or value in (float("inf"), float("-inf")):
        return format(value, spec)
    text = format(abs(value), spec)
    mantissa = text.lower().split("e")[0]
    if not any(c in "123456789" for c in mantissa):
        return "0" if "e" in text.lower() else text
    return ("+" if value > 0 else minus) + text
