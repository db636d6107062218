from pathlib import Path

import pytest

from studio.core import project as pf
from studio.core.commands import CommandStack, SetValue
from studio.core.errors import StudioError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/tiny-coder/tiny-coder.qstudio"


def test_undo_redo_and_dirty_state():
    p = pf.load(EXAMPLE)
    stack = CommandStack(p)
    seen = []
    stack.listeners.append(seen.append)
    assert not stack.dirty and not stack.can_undo
    change = stack.push(SetValue("quantization", "scheme", "W8A8"))
    assert change == {("quantization", "scheme")}
    assert p.quantization["scheme"] == "W8A8" and stack.dirty
    assert stack.undo_text == "Set quantization.scheme to 'W8A8'"
    stack.undo()
    assert p.quantization["scheme"] == "W8A16" and not stack.dirty and stack.can_redo
    stack.redo()
    assert p.quantization["scheme"] == "W8A8"
    stack.mark_clean()
    assert not stack.dirty
    assert len(seen) == 3


def test_invalid_edit_changes_nothing():
    p = pf.load(EXAMPLE)
    stack = CommandStack(p)
    with pytest.raises(StudioError):
        stack.push(SetValue("export", "context_length", 8))
    assert p.export["context_length"] == 128
    assert not stack.can_undo
