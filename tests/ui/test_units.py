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
