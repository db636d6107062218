"""The app's own settings (theme, recent projects, window state) in platform directories.

One :class:`AppSettings` object is made by ``app.main`` (or by a test, pointing at a temp
folder) and passed explicitly to the window: no global QSettings.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from PySide6.QtCore import QByteArray, QSettings

MAX_RECENT = 10
THEMES = ("system", "light", "dark")


def default_config_dir() -> Path:
    env = os.environ.get("QSTUDIO_CONFIG_DIR")
    if env:
        return Path(env)

    return platformdirs.user_config_path("qstudio", appauthor=False)


def default_projects_dir() -> Path:
    """Where the new-project wizard proposes to put projects."""
    env = os.environ.get("QSTUDIO_PROJECTS_DIR")
    if env:
        return Path(env)

    return platformdirs.user_documents_path() / "QStudio"


class AppSettings:
    def __init__(self, config_dir: Path | None = None):
        self.config_dir = Path(config_dir) if config_dir else default_config_dir()
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.config_dir / "qstudio.ini"
        self.qs = QSettings(str(self.path), QSettings.Format.IniFormat)

    # ---- recent projects ----------------------------------------------------------------
    def recent_projects(self) -> list[Path]:
        raw = self.qs.value("recent/projects", [])
        if isinstance(raw, str):
            raw = [raw] if raw else []
        return [Path(p) for p in (raw or [])]

    def add_recent(self, path: Path) -> None:
        path = Path(path).resolve()
        items = [p for p in self.recent_projects() if p != path]
        items.insert(0, path)
        self.qs.setValue("recent/projects", [str(p) for p in items[:MAX_RECENT]])
        self.qs.sync()

    def remove_recent(self, path: Path) -> None:
        items = [p for p in self.recent_projects() if p != Path(path)]
        self.qs.setValue("recent/projects", [str(p) for p in items])
        self.qs.sync()

    def clear_recent(self) -> None:
        self.qs.setValue("recent/projects", [])
        self.qs.sync()

    # ---- preferences ------------------------------------------------------------------------
    @property
    def theme(self) -> str:
        value = str(self.qs.value("ui/theme", "system"))
        return value if value in THEMES else "system"

    @theme.setter
    def theme(self, value: str) -> None:
        self.qs.setValue("ui/theme", value)

    @property
    def autosave_seconds(self) -> int:
        try:
            return max(0, int(self.qs.value("projects/autosave_seconds", 30)))
        except (TypeError, ValueError):
            return 30

    @autosave_seconds.setter
    def autosave_seconds(self, value: int) -> None:
        self.qs.setValue("projects/autosave_seconds", int(value))

    @property
    def last_folder(self) -> Path:
        value = self.qs.value("projects/last_folder", "")
        return Path(str(value)) if value else default_projects_dir()

    @last_folder.setter
    def last_folder(self, path: Path) -> None:
        self.qs.setValue("projects/last_folder", str(path))

    # ---- window state ----------------------------------------------------------------------
    def window_state(self) -> tuple[QByteArray | None, QByteArray | None, str]:
        geo = self.qs.value("window/geometry")
        state = self.qs.value("window/state")
        page = str(self.qs.value("window/page", "Overview"))
        return (
            geo if isinstance(geo, QByteArray) else None,
            state if isinstance(state, QByteArray) else None,
            page,
        )

    def save_window_state(self, geometry: QByteArray, state: QByteArray, page: str) -> None:
        self.qs.setValue("window/geometry", geometry)
        self.qs.setValue("window/state", state)
        self.qs.setValue("window/page", page)
        self.qs.sync()

    def value(self, key: str, default=None):
        return self.qs.value(key, default)

    def set_value(self, key: str, value) -> None:
        self.qs.setValue(key, value)
