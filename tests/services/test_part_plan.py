"""The part plan the Model page shows: read from the checkpoint's weight headers, with the
predicted peak memory of the stages that hold a part."""

from __future__ import annotations

import pytest

from studio.core import project as pf
from studio.core.errors import StudioError
from studio.services.projects import part_plan
from tests.conftest import small_sample_project


def test_the_sample_in_two_parts(tmp_path):
    p = pf.load(small_sample_project(tmp_path, "plan", export={"parts": 2}))
    plan = part_plan(p)
    assert [q["blocks"] for q in plan.parts] == [(0, 1), (2, 3)]
    assert [q["name"] for q in plan.parts] == ["part1_of_2", "part2_of_2"]
    assert set(plan.peaks) == {"export", "quantize"} and all(v > 0 for v in plan.peaks.values())
    text = plan.text()
    assert text.startswith("Plan: 2 parts of blocks 0–1, 2–3; the largest holds")
    assert "(estimated)" in text and "GiB free now" in text


def test_a_budget_no_split_meets_is_the_export_stages_own_refusal(tmp_path):
    p = pf.load(small_sample_project(tmp_path, "plan", export={"parts": "auto",
                                                               "max_part_mb": 1}))
    with pytest.raises(StudioError, match="raise export.max_part_mb"):
        part_plan(p)
