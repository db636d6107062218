"""The resource locator: the top-level resources/ of a checkout, the package's
studio/resources once installed (a wheel, the frozen desktop build)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import studio
from studio.core import resources
from studio.core.resources import resources_dir

ROOT = Path(__file__).resolve().parents[2]


def test_this_checkout_finds_its_own_top_level_resources():
    # the studio imported here is this checkout's (an editable install may point elsewhere)
    assert Path(studio.__file__).resolve().parent == ROOT / "studio"
    assert resources_dir() == ROOT / "resources"
    assert (resources_dir() / "catalog" / "chips.toml").is_file()
    assert not (ROOT / "studio" / "resources").exists()


def _locator_in(package: Path) -> Path:
    """resources_dir() of a copy of the locator module placed in ``package``/core."""
    (package / "core").mkdir(parents=True)
    copy = package / "core" / "resources.py"
    shutil.copy2(resources.__file__, copy)
    spec = importlib.util.spec_from_file_location("_located", copy)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.resources_dir()


def test_an_installed_package_finds_its_own_copy(tmp_path):
    site = tmp_path / "site-packages"
    (site / "studio" / "resources" / "catalog").mkdir(parents=True)
    (site / "resources").mkdir()  # some other distribution's top-level folder: not ours
    assert _locator_in(site / "studio") == site / "studio" / "resources"


def test_a_checkout_finds_the_top_level_folder(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "resources").mkdir()
    assert _locator_in(tmp_path / "studio") == tmp_path / "resources"
