"""The catalog of target chips (Snapdragon SoCs with a Hexagon HTP).

Pure Python: reads ``resources/catalog/chips.toml`` with :mod:`tomllib`. A :class:`Chip`
carries what the QNN HTP backend needs (``htp_arch``, ``soc_model``, ``vtcm_mb``) and what
the user must know about the target (FP16 support, whether the simulator's numerics can
be trusted for it, notes, and where the numbers come from), with the performance model's
figures and the NPU's memory limits the device memory plan judges a bundle by
(:mod:`studio.core.deviceplan`), each with its source or unknown.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from studio.core.errors import StudioError
from studio.core.fsutil import stat_key
from studio.core.resources import resources_dir

DEFAULT_CATALOG_PATH = resources_dir() / "catalog" / "chips.toml"

NUMERICS = ("verified", "unverified", "wrong-on-simulator")
HTP_ARCHS = (68, 69, 73, 75, 79, 81)


@dataclass(frozen=True)
class Chip:
    key: str
    name: str
    htp_arch: int
    soc_model: int
    vtcm_mb: int
    notes: str = ""
    soc: str = ""
    fp16: bool = True
    numerics: str = "unverified"
    source: str = ""
    # performance-model figures: None where the catalog says "unknown" (or says nothing)
    ddr_type: str = "unknown"
    ddr_gbps: float | None = None
    ddr_source: str = ""
    # the NPU's own path to memory where it is narrower than the DDR bus (a laptop's wide bus
    # shared with a CPU and GPU); None: the NPU reaches the whole bus
    npu_gbps: float | None = None
    npu_source: str = ""
    htp_cores: int | None = None
    htp_tops: float | None = None
    htp_source: str = ""
    # the device memory plan's limits (studio/core/deviceplan.py), in MiB: what the NPU maps
    # in one address space, and the largest one context binary; None: unknown
    npu_va_mib: int | None = None
    npu_va_source: str = ""
    npu_context_mib: int | None = None
    npu_context_source: str = ""

    @property
    def npu_va_bytes(self) -> int | None:
        """What the NPU maps in one address space (None: unknown)."""
        return None if self.npu_va_mib is None else self.npu_va_mib << 20

    @property
    def npu_context_bytes(self) -> int | None:
        """The largest context binary the NPU maps (None: unknown)."""
        return None if self.npu_context_mib is None else self.npu_context_mib << 20

    def perf_unknown(self) -> list[str]:
        """The performance-model figures the catalog does not know for this chip."""
        out = []
        if self.ddr_gbps is None:
            out.append("DDR bandwidth (ddr_gbps)")
        if self.htp_tops is None:
            out.append("peak HTP TOPS (htp_tops)")
        if self.htp_cores is None:
            out.append("HTP core count (htp_cores)")
        return out

    @property
    def numerics_trusted(self) -> bool:
        """False where the HTP simulator is known to compute wrong results for this arch."""
        return self.numerics != "wrong-on-simulator"

    @property
    def label(self) -> str:
        """Short text for lists: 'Snapdragon 8 Gen 3 (SM8650, HTP v75)'."""
        inner = ", ".join(x for x in (self.soc, f"HTP v{self.htp_arch}") if x)
        return f"{self.name} ({inner})"

    def warnings(self) -> list[str]:
        """Lines to show beside any result computed for this target."""
        out = []
        if self.numerics == "wrong-on-simulator":
            out.append(
                f"{self.name}: the QNN HTP simulator's numerics for v{self.htp_arch} were observed "
                "wrong; validate accuracy on a real device"
            )
        elif self.numerics == "unverified":
            out.append(
                f"{self.name}: simulator numerics for v{self.htp_arch} not yet verified against FP32"
            )
        return out


_REQUIRED = {"name": str, "htp_arch": int, "soc_model": int, "vtcm_mb": int}
_OPTIONAL = {"notes": str, "soc": str, "fp16": bool, "numerics": str, "source": str,
             "ddr_type": str, "ddr_source": str, "htp_source": str, "npu_source": str,
             "npu_va_source": str, "npu_context_source": str}
#: performance figures: a positive number, or the string "unknown"; a number needs its source
_PERF = {"ddr_gbps": (float, "ddr_source"), "htp_tops": (float, "htp_source"),
         "htp_cores": (int, "htp_source"), "npu_gbps": (float, "npu_source"),
         "npu_va_mib": (int, "npu_va_source"), "npu_context_mib": (int, "npu_context_source")}
UNKNOWN = "unknown"


def _parse_chip(key: str, table: object, where: str) -> Chip:
    if not isinstance(table, dict):
        raise StudioError(f"chip catalog {where}: [chips.{key}] must be a table; fix the file")
    if key != key.strip().lower() or not key or any(c.isspace() for c in key):
        raise StudioError(
            f"chip catalog {where}: key '{key}' must be a lowercase id without spaces; rename it"
        )
    values: dict[str, object] = {}
    for field, typ in {**_REQUIRED, **_OPTIONAL}.items():
        if field not in table:
            if field in _REQUIRED:
                raise StudioError(
                    f"chip catalog {where}: [chips.{key}] lacks '{field}'; add it to the file"
                )
            continue
        value = table[field]
        # bool is an int in Python: keep the two apart.
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            raise StudioError(
                f"chip catalog {where}: [chips.{key}].{field} must be {typ.__name__}, "
                f"not {value!r}; fix the file"
            )
        values[field] = value
    for field, (typ, source_field) in _PERF.items():
        if field not in table or table[field] == UNKNOWN:
            continue
        value = table[field]
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if typ is int:
            ok = ok and isinstance(value, int)
        if not ok or value <= 0:
            raise StudioError(
                f"chip catalog {where}: [chips.{key}].{field} must be a positive "
                f"{'integer' if typ is int else 'number'} or \"unknown\", not {value!r}; "
                "fix the file"
            )
        if not str(table.get(source_field, "")).strip():
            raise StudioError(
                f"chip catalog {where}: [chips.{key}].{field} has no {source_field}; say where "
                "the figure comes from, or write \"unknown\""
            )
        values[field] = typ(value)
    unknown = sorted(set(table) - set(_REQUIRED) - set(_OPTIONAL) - set(_PERF))
    if unknown:
        raise StudioError(
            f"chip catalog {where}: [chips.{key}] has unknown field(s) {', '.join(unknown)}; "
            "remove them or fix their spelling"
        )
    if values["htp_arch"] not in HTP_ARCHS:
        raise StudioError(
            f"chip catalog {where}: [chips.{key}].htp_arch {values['htp_arch']} is not one of "
            f"{', '.join(map(str, HTP_ARCHS))}; fix the file"
        )
    if values["soc_model"] <= 0 or values["vtcm_mb"] <= 0:  # type: ignore[operator]
        raise StudioError(
            f"chip catalog {where}: [chips.{key}] soc_model and vtcm_mb must be positive; fix the file"
        )
    if values.get("numerics", "unverified") not in NUMERICS:
        raise StudioError(
            f"chip catalog {where}: [chips.{key}].numerics must be one of {', '.join(NUMERICS)}; "
            "fix the file"
        )
    return Chip(key=key, **values)  # type: ignore[arg-type]


def _read(path: str | Path | None) -> tuple[dict, str]:
    p = Path(path) if path is not None else DEFAULT_CATALOG_PATH
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise StudioError(
            f"chip catalog {p} not found; reinstall QStudio or pass a catalog path"
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise StudioError(f"chip catalog {p} is not valid TOML ({e}); fix the file") from None
    return data, str(p)


#: parsed catalogs by file (:func:`~studio.core.fsutil.stat_key`): a run asks for its chips
#: thousands of times (every job's key, every figure's target), and parsing the TOML each time
#: took 1.6 % of the test suite's sampled time; an edited file gets another key and is read again
_PARSED: dict[tuple[str, int, int, int], tuple[dict[str, Chip], str]] = {}


def _load(path: str | Path | None) -> tuple[dict[str, Chip], str]:
    try:
        key = stat_key(Path(path) if path is not None else DEFAULT_CATALOG_PATH)
    except OSError:
        return _parse(path)  # _read says what is wrong with it
    if key not in _PARSED:
        _PARSED[key] = _parse(path)
    catalog, default = _PARSED[key]
    return dict(catalog), default  # the chips are frozen; the dict is the caller's own


def _parse(path: str | Path | None) -> tuple[dict[str, Chip], str]:
    data, where = _read(path)
    chips = data.get("chips")
    if not isinstance(chips, dict) or not chips:
        raise StudioError(f"chip catalog {where} has no [chips.<key>] tables; fix the file")
    catalog = {key: _parse_chip(key, table, where) for key, table in chips.items()}
    default = data.get("default", next(iter(catalog)))
    if default not in catalog:
        raise StudioError(
            f"chip catalog {where}: default '{default}' is not one of its chips; fix the file"
        )
    return catalog, default


def load_catalog(path: str | Path | None = None) -> dict[str, Chip]:
    """All chips of the catalog, by key, in file order."""
    return _load(path)[0]


def default_chip_key(path: str | Path | None = None) -> str:
    """The catalog's default target (its ``default`` key, else its first chip)."""
    return _load(path)[1]


def get_chip(key: str, path: str | Path | None = None) -> Chip:
    """The chip with this key, or with this part number (``SM8650``), case-insensitive."""
    catalog = load_catalog(path)
    wanted = str(key).strip().lower()
    if wanted in catalog:
        return catalog[wanted]
    for chip in catalog.values():
        if chip.soc and chip.soc.lower() == wanted:
            return chip
    raise StudioError(f"unknown target '{key}'; known targets: {', '.join(catalog)}")
