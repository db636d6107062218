"""Where the shipped resources are: the chip catalog, the sample models and texts, the
bundled model configs, the performance model's anchors and fit, the schemas, the report
templates and the icon.

In a source checkout (and an editable install of one) they are the top-level ``resources/``
folder beside ``studio/``; a wheel carries the same folder inside the package as
``studio/resources`` (``setup.py`` maps it there), and so does the frozen desktop build
(``packaging/desktop/qstudio.spec``). :func:`resources_dir` is the one place that knows;
every path to a resource starts from it.
"""

from __future__ import annotations

from pathlib import Path

#: the ``studio`` package folder
_PACKAGE = Path(__file__).resolve().parents[1]


def resources_dir() -> Path:
    """The resources folder: ``resources/`` of the checkout whose ``studio/`` this is (a
    ``pyproject.toml`` beside it says it is one), else the installed copy,
    ``studio/resources``."""
    root = _PACKAGE.parent
    if (root / "pyproject.toml").is_file() and (root / "resources").is_dir():
        return root / "resources"
    return _PACKAGE / "resources"
