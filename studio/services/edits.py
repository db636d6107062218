"""The undoable edits between two versions of a project (a leaf: restoring an autosave and
applying a sweep's point both turn one project into another with these)."""

from __future__ import annotations

from studio.core.commands import SetValue
from studio.core.project import Project


def project_edits(current: Project, wanted: Project) -> list[SetValue]:
    """The SetValue commands that turn ``current`` into ``wanted`` (for undoable restores)."""
    a, b = current.to_dict(), wanted.to_dict()
    cmds: list[SetValue] = []
    for key in ("name", "targets", "sweeps"):
        if a.get(key) != b.get(key):
            cmds.append(SetValue("", key, b.get(key, [])))
    for section, values in b.items():
        if not isinstance(values, dict):
            continue
        for key, value in values.items():
            if a.get(section, {}).get(key) != value:
                cmds.append(SetValue(section, key, value))
    return cmds
