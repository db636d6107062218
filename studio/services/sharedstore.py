"""The machine's shared artifact store: the projects of one machine reuse each other's stages.

Two projects of the same checkpoint, shapes and recipe make the same export, the same
quantized graphs and the same context binaries: every artifact key is the hash of what made
it (:mod:`studio.core.artifacts`), so a key one project stored is the artifact another project
needs. With a shared store set, a job whose key its project does not hold takes it from the
shared store (its files hard-linked into the project's store, checked against their
recorded digests first; the job says "cached: from the machine's shared store"), and a job a
project computes is put there for the others. Two processes that need the same key at once
compute it once: the second waits for the first (the shared store's key lock) and takes it.

Measurements (the run and profile stages' timings) are not shared: each project measures
its own. A stage's finished parts stay in its project (:mod:`studio.core.partcache`).

Set per machine, not per project, in ``settings.toml`` of the studio's config folder
(``QSTUDIO_CONFIG_DIR`` or the user's config folder)::

    [artifacts]
    shared_store = "/data/qstudio-artifacts"

Off unless set. Hard links keep one copy on disk where the store and the projects share a
file system. Nothing is ever removed from the shared store by the studio: delete the folder
to reclaim the space (projects keep their own links).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from studio.core.artifacts import ArtifactStore
from studio.core.errors import StudioError
from studio.engine.device_registry import config_dir

SETTINGS_FILE = "settings.toml"


def settings_path() -> Path:
    """The machine's settings file (it may not exist)."""
    return config_dir() / SETTINGS_FILE


def shared_store() -> ArtifactStore | None:
    """The shared store the machine's settings name, opened; None when none is set."""
    path = settings_path()
    if not path.exists():
        return None
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise StudioError(f"{path} cannot be read ({exc}): fix it or remove it") from None
    value = (data.get("artifacts") or {}).get("shared_store", "")
    if value in ("", None):
        return None
    if not isinstance(value, str):
        raise StudioError(f"{path}: artifacts.shared_store is {value!r}: give a folder as a "
                          "string, or remove the key")
    folder = Path(value).expanduser()
    try:
        return ArtifactStore(folder).open()
    except OSError as exc:
        raise StudioError(f"{path}: the shared store {folder} cannot be opened "
                          f"({exc.strerror or exc}): create it or remove the key") from None
