"""Guards for the Qt binding itself (PySide6 6.12 on Python 3.11 drops a reference to None on
every void call and later crashes the process)."""

from __future__ import annotations

import sys


def test_none_refcount_is_stable_across_void_qt_calls(qapp):
    from PySide6.QtWidgets import QWidget

    w = QWidget()
    w.setEnabled(True)  # warm up
    before = sys.getrefcount(None)
    for _ in range(1000):
        w.setEnabled(True)
    after = sys.getrefcount(None)
    assert abs(after - before) < 50, f"refcount of None moved by {after - before} over 1000 calls"


def test_pyside_version_is_pinned_below_6_12():
    import PySide6

    major, minor = (int(x) for x in PySide6.__version__.split(".")[:2])
    assert (major, minor) < (6, 12), f"PySide6 {PySide6.__version__}: 6.12 crashes on Python 3.11"


def test_services_helpers_do_not_import_qt():
    import subprocess

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('PySide6', 'shiboken6', 'pyqtgraph', 'qasync'):\n"
        "            raise ImportError('Qt is not allowed here')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import studio.services.projects, studio.services.history, studio.services.devices\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
