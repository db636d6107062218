"""Byte sizes in binary units (KiB, MiB, GiB), the same everywhere the window writes them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from PySide6.QtCore import Qt

from studio.core.units import format_bytes


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (1024**2 - 1, "1.0 MiB"),  # 1023.999 KiB rounds up into the next unit
        (13_700_000, "13.1 MiB"),
        (8 * 1024**2, "8.0 MiB"),
        (3 * 1024**3 + 1024**3 // 2, "3.5 GiB"),
        (2 * 1024**4, "2.0 TiB"),
        (-2048, "-2.0 KiB"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_units_imports_nothing_heavy():
    code = (
        "import sys, studio.core.units as u; "
        "heavy = {'torch', 'onnx', 'onnxruntime', 'numpy', 'PySide6', 'transformers'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_reports_page_writes_file_sizes_in_binary_units(window, project_path):
    assert window.open_project(project_path)
    reports = project_path.with_suffix(".studio") / "reports"
    reports.mkdir(parents=True)
    (reports / "report-1.html").write_bytes(b"x" * 13_700_000)
    page = window.show_page("Reports")
    assert page.model.rowCount() == 1
    assert page.model.index(0, 2).data() == "13.1 MiB"  # 13.7 million bytes, not "13.7 MB"


def test_devices_page_writes_vtcm_in_binary_units(window):
    from studio.core.catalog import load_catalog

    page = window.show_page("Devices")
    chips = list(load_catalog().values())
    col = next(
        c
        for c in range(page.chips.columnCount())
        if page.chips.headerData(c, Qt.Orientation.Horizontal) == "VTCM"
    )
    shown = [page.chips.index(r, col).data() for r in range(page.chips.rowCount())]
    assert shown == [format_bytes(c.vtcm_mb * 1024**2) for c in chips]
    assert all(s.endswith(" MiB") for s in shown)


def test_the_shared_size_helper_is_binary():
    """Pages outside this change (Overview) call widgets.human_bytes: it writes KiB/MiB too."""
    from studio.ui.widgets import human_bytes

    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(13_700_000) == "13.1 MiB"


# ---- changes: a sign where there is one, never "-0" ---------------------------------------------
@pytest.mark.parametrize(
    ("value", "spec", "text"),
    [
        (0.0, ",.0f", "0"),
        (-0.0, ",.0f", "0"),  # an unchanged figure read from the newer side: sign * 0.0
        (-0.3, ",.0f", "0"),  # rounds to zero: no sign either
        (0.4, ",.0f", "0"),
        (-1234.6, ",.0f", "−1,235"),
        (1234.4, ",.0f", "+1,234"),
        (-0.00001, ".2%", "0.00%"),
        (-0.014, ".1%", "−1.4%"),
        (0.0, ".2e", "0"),
        (-1e-9, ".2e", "−1.00e-09"),
        (-0.04, ".1f", "0.0"),
        (0.224, "+.3f", "+0.224"),  # a "+" in the spec is the helper's to add
    ],
)
def test_signed_changes_never_read_minus_zero(value, spec, text):
    from studio.core.units import signed

    assert signed(value, spec, "−") == text


def test_no_change_is_formatted_with_a_bare_sign_spec():
    """Every signed change goes through ``core.units.signed``: a format spec with ``+``
    (``{d:+.1%}``) writes ``-0.0%`` for a change that rounds to zero."""
    import re
    from pathlib import Path

    import studio

    spec = re.compile(r"\{[^{}\n]*:[<>^=]?\d*\+[,_]?\d*(?:\.\d+)?[a-zA-Z%]?\}")
    found = []
    for path in Path(studio.__file__).parent.rglob("*.py"):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if spec.search(line):
                found.append(f"{path.name}:{i}: {line.strip()}")
    assert found == []


def test_fmt_delta_writes_no_minus_zero():
    from studio.ui.pages.figures import fmt_delta

    assert fmt_delta("perplexity", 0.0) == "unchanged"
    assert fmt_delta("top1_agreement", -0.0001) == "0.0 pp"
    assert fmt_delta("perplexity", 0.5, -0.000001) == "+0.500 (0.00%)"
    assert fmt_delta("logits_cosine_mean", -0.0000001) == "0.000000"
