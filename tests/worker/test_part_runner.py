"""A stage's parts run as items of the scheduler (studio.worker.parts on
studio.core.scheduler), each in a real process of its own: results as they finish, the
slots and the free memory as budgets, a part's error and a cancel end the others' processes.
The parts are standard-library functions, so a spawned process runs them as a stage's
module-level part functions are run."""

import math
import multiprocessing
import os
import time

import pytest

from studio.core.errors import StudioError
from studio.core.hostmem import available_memory
from studio.core.progress import Cancelled, RecordingProgress
from studio.worker.parts import Part, PartsConfig, Say, run_parts

SAY = Say("running", "here", 0, 3, 1)


def names_at_once(progress: RecordingProgress) -> list[int]:
    """How many parts each progress line names as running."""
    return [len(m.split(" here ")[0].removeprefix("running ").split(", "))
            for _, m in progress.updates]


def test_parts_run_in_processes_and_give_their_results_as_they_finish():
    parts = [Part(k, f"part {k + 1}", math.factorial, (k + 3,), 1 << 20) for k in range(3)]
    progress = RecordingProgress()
    got = dict(run_parts(parts, PartsConfig(), progress, SAY, at_once=2))
    assert got == {0: 6, 1: 24, 2: 120}
    assert max(names_at_once(progress)) == 2  # two slots: two parts run together
    assert all(m.endswith("(2 at a time)") for _, m in progress.updates)
    assert not multiprocessing.active_children()


def test_parts_whose_memory_does_not_fit_together_run_one_after_another():
    big = int(available_memory() * 0.6)  # predicted: two do not fit beside each other
    parts = [Part(k, f"part {k + 1}", time.sleep, (0.2,), big) for k in range(3)]
    progress = RecordingProgress()
    got = dict(run_parts(parts, PartsConfig(), progress, SAY, at_once=3))
    assert got == {0: None, 1: None, 2: None}
    assert names_at_once(progress) == [1, 1, 1]


def test_a_part_that_fails_ends_the_stage_with_its_error_and_the_others_processes():
    parts = [Part(0, "part 1", time.sleep, (30,), 1 << 20),
             Part(1, "part 2", int, ("not a number",), 1 << 20)]
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="not a number"):
        list(run_parts(parts, PartsConfig(), RecordingProgress(), SAY, at_once=2))
    assert time.monotonic() - t0 < 20  # part 1 was killed, not waited for
    assert not multiprocessing.active_children()


def test_a_cancelled_stage_kills_its_running_parts():
    parts = [Part(k, f"part {k + 1}", time.sleep, (30,), 1 << 20) for k in range(2)]
    with pytest.raises(Cancelled):
        list(run_parts(parts, PartsConfig(), RecordingProgress(cancel_after=2), SAY,
                       at_once=2))
    assert not multiprocessing.active_children()


def test_a_part_whose_process_dies_is_named_in_one_line():
    parts = [Part(1, "part 2", os._exit, (3,), 1 << 20)]
    with pytest.raises(StudioError, match="part 2: its process ended with code 3 before"):
        list(run_parts(parts, PartsConfig(), RecordingProgress(), SAY))
