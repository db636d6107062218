"""Every change to a project is a command on a stack: undo/redo live in the core.

A command applies itself to a :class:`~studio.core.project.Project` and returns the set of
``(section, key)`` it changed so that views refresh only those. The GUI mirrors
``can_undo`` / ``can_redo`` into its actions and never mutates the project directly; batch
edits go through the same stack.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from studio.core.errors import StudioError
from studio.core.project import Project, from_dict
from studio.core.settings import SECTIONS, Section

Change = frozenset[tuple[str, str]]


@dataclass
class SetValue:
    """Set ``project.<section>.<key> = value`` (``section == ""`` for top-level fields); the
    edited project is validated as a whole before anything changes."""

    section: str
    key: str
    value: Any
    #: what the edit does in the user's words ("Set 7 layers' activations to INT16"); the
    #: Undo / Redo actions show it (default: the section, key and value)
    label: str = ""
    _old: Any = field(default=None, init=False, repr=False)

    @property
    def text(self) -> str:
        if self.label:
            return self.label
        where = f"{self.section}.{self.key}" if self.section else self.key
        return f"Set {where} to {self.value!r}"

    def _values(self, p: Project) -> Section:
        """The section the edit changes; a StudioError for a section or key that no
        declaration has (studio.core.settings)."""
        if self.section not in SECTIONS:
            raise StudioError(f"unknown section [{self.section}] (sections: "
                              f"{', '.join(SECTIONS)})")
        values: Section = getattr(p, self.section)
        if self.key not in values:
            raise StudioError(values.unknown(self.key))
        return values

    def _get(self, p: Project) -> Any:
        return getattr(p, self.key) if not self.section else self._values(p)[self.key]

    def _set(self, p: Project, value: Any) -> None:
        if not self.section:
            setattr(p, self.key, copy.deepcopy(value))
        else:
            self._values(p)[self.key] = copy.deepcopy(value)

    def apply(self, p: Project) -> Change:
        self._old = copy.deepcopy(self._get(p))
        trial = p.copy()
        self._set(trial, self.value)
        from_dict(trial.to_dict())  # validates; raises StudioError and changes nothing
        self._set(p, self.value)
        return frozenset({(self.section, self.key)})

    def revert(self, p: Project) -> Change:
        self._set(p, self._old)
        return frozenset({(self.section, self.key)})


@dataclass
class SetValues:
    """Several :class:`SetValue` edits as one step of the undo stack (e.g. a sweep point's
    settings applied to the project): all apply or none, one Undo reverts them all."""

    edits: list[SetValue]
    label: str = ""

    @property
    def text(self) -> str:
        return self.label or "; ".join(e.text for e in self.edits)

    def apply(self, p: Project) -> Change:
        trial = p.copy()
        for e in self.edits:
            SetValue(e.section, e.key, e.value)._set(trial, e.value)
        from_dict(trial.to_dict())  # the edits together must make a valid project
        change: set[tuple[str, str]] = set()
        for e in self.edits:
            e._old = copy.deepcopy(e._get(p))
            e._set(p, e.value)
            change.add((e.section, e.key))
        return frozenset(change)

    def revert(self, p: Project) -> Change:
        change: set[tuple[str, str]] = set()
        for e in reversed(self.edits):
            change |= e.revert(p)
        return frozenset(change)


class CommandStack:
    def __init__(self, project: Project):
        self.project = project
        self._done: list[SetValue | SetValues] = []
        self._undone: list[SetValue | SetValues] = []
        self._clean_index = 0
        self.listeners: list[Callable[[Change], None]] = []

    def _notify(self, change: Change) -> None:
        for cb in list(self.listeners):
            cb(change)

    def push(self, cmd: SetValue | SetValues) -> Change:
        try:
            change = cmd.apply(self.project)
        except StudioError:
            raise
        self._done.append(cmd)
        if self._clean_index > len(self._done) - 1 and self._undone:
            self._clean_index = -1  # the clean state can no longer be reached by redo
        self._undone.clear()
        self._notify(change)
        return change

    def undo(self) -> Change:
        if not self._done:
            return frozenset()
        cmd = self._done.pop()
        change = cmd.revert(self.project)
        self._undone.append(cmd)
        self._notify(change)
        return change

    def redo(self) -> Change:
        if not self._undone:
            return frozenset()
        cmd = self._undone.pop()
        change = cmd.apply(self.project)
        self._done.append(cmd)
        self._notify(change)
        return change

    @property
    def can_undo(self) -> bool:
        return bool(self._done)

    @property
    def can_redo(self) -> bool:
        return bool(self._undone)

    @property
    def undo_text(self) -> str:
        return self._done[-1].text if self._done else ""

    @property
    def redo_text(self) -> str:
        return self._undone[-1].text if self._undone else ""

    @property
    def dirty(self) -> bool:
        return len(self._done) != self._clean_index

    def mark_clean(self) -> None:
        self._clean_index = len(self._done)
