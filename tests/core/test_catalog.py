"""The chip catalog: pure Python, no heavy imports (the backend check is in tests/engine)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from studio.core.catalog import (
    DEFAULT_CATALOG_PATH,
    Chip,
    default_chip_key,
    get_chip,
    load_catalog,
)
from studio.core.errors import StudioError

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_catalog_loads_with_stable_keys():
    assert DEFAULT_CATALOG_PATH == ROOT / "resources" / "catalog" / "chips.toml"
    catalog = load_catalog()
    assert len(catalog) >= 8
    for key, chip in catalog.items():
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", key), key
        assert chip.key == key and chip.name and chip.soc and chip.source
        assert chip.htp_arch in (68, 69, 73, 75, 79, 81)
        assert chip.soc_model > 0 and chip.vtcm_mb > 0
    socs = [c.soc for c in catalog.values()]
    assert len(set(socs)) == len(socs)
    assert default_chip_key() in catalog


@pytest.mark.parametrize(
    ("key", "soc", "arch", "soc_model"),
    [
        ("snapdragon-888", "SM8350", 68, 30),
        ("snapdragon-8-gen-2", "SM8550", 73, 43),
        ("snapdragon-8-gen-3", "SM8650", 75, 57),
        ("snapdragon-8-elite", "SM8750", 79, 69),
        ("snapdragon-x-elite", "SC8380XP", 73, 60),
        ("sa8295p", "SA8295P", 68, 39),
    ],
)
def test_known_targets(key, soc, arch, soc_model):
    chip = get_chip(key)
    assert (chip.soc, chip.htp_arch, chip.soc_model) == (soc, arch, soc_model)
    assert get_chip(soc.lower()) == chip  # part numbers work too
    assert get_chip(f"  {key.upper()} ") == chip


def test_v69_targets_carry_the_numerics_warning():
    v69 = [c for c in load_catalog().values() if c.htp_arch == 69]
    assert v69, "the catalog should list the v69 parts (8 Gen 1, 8+ Gen 1)"
    for chip in v69:
        assert chip.numerics == "wrong-on-simulator" and not chip.numerics_trusted
        assert "wrong" in chip.notes
        assert any("wrong" in w for w in chip.warnings())
    assert get_chip("snapdragon-8-gen-3").warnings() == []
    assert get_chip("snapdragon-8-gen-3").label == "Snapdragon 8 Gen 3 (SM8650, HTP v75)"


def test_unknown_target_lists_the_known_ones():
    keys = list(load_catalog())
    with pytest.raises(StudioError) as e:
        get_chip("snapdragon-9000")
    assert str(e.value) == f"unknown target 'snapdragon-9000'; known targets: {', '.join(keys)}"


CHIP = """
[chips.test-chip]
name = "Test"
htp_arch = 73
soc_model = 43
vtcm_mb = 8
"""


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("this is = = not toml", "not valid TOML"),
        ("schema_version = 1\n", "no \\[chips"),
        (CHIP.replace("vtcm_mb = 8\n", ""), "lacks 'vtcm_mb'"),
        (CHIP.replace("soc_model = 43", "soc_model = true"), "soc_model must be int"),
        (CHIP.replace("soc_model = 43", 'soc_model = "43"'), "soc_model must be int"),
        (CHIP + 'colour = "red"\n', "unknown field"),
        (CHIP.replace("htp_arch = 73", "htp_arch = 70"), "htp_arch 70"),
        (CHIP.replace("soc_model = 43", "soc_model = 0"), "positive"),
        (CHIP + 'numerics = "fine"\n', "numerics must be one of"),
        ('default = "other"\n' + CHIP, "default 'other'"),
        (CHIP.replace("test-chip", "Test-Chip"), "lowercase id"),
    ],
)
def test_bad_catalogs_are_one_line_errors(tmp_path, text, match):
    f = tmp_path / "chips.toml"
    f.write_text(text)
    with pytest.raises(StudioError, match=match) as e:
        load_catalog(f)
    assert "\n" not in str(e.value)


def test_custom_catalog_and_missing_file(tmp_path):
    f = tmp_path / "chips.toml"
    f.write_text(CHIP)
    catalog = load_catalog(f)
    assert catalog == {"test-chip": Chip("test-chip", "Test", 73, 43, 8)}
    assert default_chip_key(f) == "test-chip"
    assert get_chip("test-chip", f).numerics == "unverified"
    with pytest.raises(StudioError, match="not found"):
        load_catalog(tmp_path / "nope.toml")


def test_an_edited_catalog_is_read_again_and_a_broken_one_fails_every_time(tmp_path):
    """The parsed catalog is kept per file version: an edited file is read again by the next
    call, each caller gets a dict of its own, and a file broken after a good read gives its
    error each time."""
    f = tmp_path / "chips.toml"
    f.write_text(CHIP)
    first = load_catalog(f)
    first["other"] = first["test-chip"]
    assert set(load_catalog(f)) == {"test-chip"}
    f.write_text(CHIP.replace("test-chip", "edited-chip"))
    assert set(load_catalog(f)) == {"edited-chip"}
    f.write_text("not toml [")
    for _ in range(2):
        with pytest.raises(StudioError, match="not valid TOML"):
            load_catalog(f)


def test_core_imports_no_heavy_library():
    code = (
        "import sys; import studio.core.catalog, studio.core.profile; "
        "heavy = [m for m in ('onnx', 'onnxruntime', 'torch', 'numpy', 'transformers') "
        "if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_chip_gives_its_performance_figures_a_source_or_says_unknown():
    text = (ROOT / "resources" / "catalog" / "chips.toml").read_text()
    import tomllib

    raw = tomllib.loads(text)["chips"]
    for key, chip in load_catalog().items():
        for field, source in (("ddr_gbps", "ddr_source"), ("htp_tops", "htp_source"),
                              ("htp_cores", "htp_source")):
            assert field in raw[key], (key, field)  # a number or "unknown", never silent
            if getattr(chip, field) is None:
                assert raw[key][field] == "unknown"
            else:
                assert getattr(chip, source), (key, source)
    assert get_chip("snapdragon-8-gen-3").ddr_gbps == 76.8
    assert get_chip("snapdragon-8-elite").ddr_gbps == 84.8
    assert get_chip("snapdragon-x-elite").ddr_gbps == 135.0
    assert get_chip("qcs9100").perf_unknown() == [
        "DDR bandwidth (ddr_gbps)", "peak HTP TOPS (htp_tops)", "HTP core count (htp_cores)"]


@pytest.mark.parametrize(("extra", "match"), [
    ("ddr_gbps = -3.0\nddr_source = \"x\"\n", "positive number"),
    ("ddr_gbps = \"fast\"\n", "positive number"),
    ("htp_cores = 1.5\nhtp_source = \"x\"\n", "positive integer"),
    ("htp_tops = 40.0\n", "has no htp_source"),
])
def test_bad_performance_figures(tmp_path, extra, match):
    f = tmp_path / "chips.toml"
    f.write_text(CHIP + extra)
    with pytest.raises(StudioError, match=match):
        load_catalog(f)
    f.write_text(CHIP + 'ddr_gbps = 51\nddr_source = "spec"\nhtp_tops = "unknown"\n')
    chip = get_chip("test-chip", f)
    assert chip.ddr_gbps == 51.0 and chip.htp_tops is None and chip.htp_cores is None
