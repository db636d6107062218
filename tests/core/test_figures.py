"""The catalogue of figures: one title per quantity, one function per figure, one way of
writing each, and every figure a stage records has its entry."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from studio.core import figures
from studio.core.metrics import SOURCES

ROOT = Path(__file__).resolve().parents[2] / "studio"


def test_titles_are_unique_and_every_entry_is_whole():
    titles = [f.title for f in figures.CATALOGUE.values()]
    assert len(titles) == len(set(titles)), sorted(t for t in titles if titles.count(t) > 1)
    for key, f in figures.CATALOGUE.items():
        assert f.key == key
        assert f.counts and f.title and f.sources
        assert set(f.sources) <= set(SOURCES), key
        assert f.better in ("", "higher", "lower"), key
        assert figures.by_title(f.title) is f


def test_every_entry_names_a_function_that_exists():
    for f in figures.CATALOGUE.values():
        module, _, qualname = f.computed_by.partition(":")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        assert callable(obj), f.computed_by


def test_a_neighbour_named_in_a_tip_is_another_entry():
    """The tooltip's "not to be confused with" names a figure a page shows."""
    for f in figures.CATALOGUE.values():
        if f.neighbour:
            named = f.neighbour.split(" (")[0]
            assert named != f.title, f.key
            tip = f.tip()
            assert f.counts in tip and f.neighbour in tip


def _recorded_names() -> set[str]:
    """Every literal figure name the stages record (metric helpers, stage facts, the
    bundle's and the profile compiler's figure tables)."""
    names: set[str] = set()
    call = re.compile(r"(?:host_metric|device_metric|metric|fact)\(\s*(?:[a-z]+,\s*)?"
                      r"f?\"((?:\{prefix\})?[a-z0-9_]+)\"")
    bundle_files = [ROOT / "engine" / "bundle.py", ROOT / "engine" / "bundle_report.py"]
    for path in list((ROOT / "worker").rglob("*.py")) + bundle_files:
        text = path.read_text()
        for name in call.findall(text):
            if name.startswith("{prefix}"):
                base = name.removeprefix("{prefix}")
                names |= {base, f"round_trip_{base}"}
            else:
                names.add(name)
    profile = (ROOT / "worker" / "stages" / "profile.py").read_text()
    names |= set(re.findall(r"\(\"[a-z_]+\", \"(compiler_[a-z_]+)\"", profile))
    bundle = "\n".join(f.read_text() for f in bundle_files)  # the figure table's module too
    names |= set(re.findall(r"\(\"((?:genie|bundle)_[a-z0-9_]+)\"", bundle))
    block = bundle[bundle.index("for k, unit in"):]
    block = block[:block.index("]")]
    names |= {f"bundle_{k}" for k in re.findall(r"\(\"([a-z_0-9]+)\", \"", block)}
    return names


def test_every_figure_a_stage_records_is_in_the_catalogue():
    names = _recorded_names()
    assert {"export_seconds", "logits_cosine_mean", "decode_tokens_per_s",
            "compiler_htp_ops", "genie_tokens_per_s", "bundle_perplexity",
            "round_trip_decode_ms_per_token", "latency_ms"} <= names  # the scan sees them
    missing = sorted(n for n in names if n not in figures.CATALOGUE)
    assert missing == []


@pytest.mark.parametrize("value,unit,text", [
    (5_085_000, "B", "4.8 MiB"),
    (8 * 2**20, "B", "8.0 MiB"),
    (0.97656, "fraction", "97.7%"),
    (-0.0001, "fraction", "0.0%"),
    (-0.0, "", "0"),
    (-0.00001, "ms", "-1e-05 ms"),
    (3.2478, "tok/s", "3.248 tok/s"),
    (307.94, "ms", "307.9 ms"),
    (725, "ops", "725 ops"),
    (54.4912, "ppl", "54.491"),
    (None, "ms", "—"),
])
def test_one_way_of_writing_a_unit(value, unit, text):
    assert figures.fmt_unit(value, unit) == text


def test_no_minus_zero_anywhere():
    for v in (-0.0, -1e-12, -0.00004):
        for unit in ("", "ms", "fraction", "tok/s", "ppl"):
            out = figures.fmt_unit(v, unit)
            assert not re.match(r"^-0(\.0*)?(\s|%|$)", out), (v, unit, out)


def test_the_deployed_kv_cache_is_the_precision_the_binaries_take():
    # the element the deployed binaries keep their cache in (ModelInfo.kv_cache_bytes counts
    # the bytes at it)
    assert figures.kv_cache_dtype("quantized", "float") == ("uint16", 2)
    assert figures.kv_cache_dtype("quantized", "int8") == ("uint8", 1)
    assert figures.kv_cache_dtype("float", "float") == ("float32", 4)
    assert figures.kv_cache_dtype("float", "int8") == ("uint8", 1)
