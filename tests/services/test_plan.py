from pathlib import Path

import pytest

from studio.core import project as pf
from studio.core.errors import StudioError
from studio.services.pipeline import plan

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/tiny-coder/tiny-coder.qstudio"


def labels(jobs):
    return [j.label for j in jobs]


def test_full_plan_is_a_dag_in_dependency_order():
    p = pf.load(EXAMPLE)
    jobs = plan(p)
    t = p.targets[0]
    assert labels(jobs) == [
        "export", "quantize", f"compile[{t}]", f"validate[{t}]", "run[cpu]",
        f"run[htp-sim/{t}]", f"profile[{t}]", "report",
    ]
    for i, j in enumerate(jobs):
        assert all(d < i for d in j.deps)
    assert labels([jobs[d] for d in jobs[3].deps]) == ["export", "quantize", f"compile[{t}]"]
    assert len(jobs[-1].deps) == len(jobs) - 1


def test_requested_stage_pulls_in_its_inputs_only():
    p = pf.load(EXAMPLE)
    assert labels(plan(p, ["quantize"])) == ["export", "quantize"]
    t = p.targets[0]
    assert labels(plan(p, ["profile"])) == ["export", "quantize", f"compile[{t}]", f"profile[{t}]"]


def test_unknown_stage_or_target_is_refused():
    p = pf.load(EXAMPLE)
    with pytest.raises(StudioError, match="unknown stage 'deploy'"):
        plan(p, ["deploy"])
    with pytest.raises(StudioError, match="not one of the project's targets"):
        plan(p, ["compile"], ["snapdragon-888"])
