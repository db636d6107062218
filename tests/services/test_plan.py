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
        f"run[htp-sim:{t}]", f"profile[htp-sim:{t}]", "report",
    ]
    for i, j in enumerate(jobs):
        assert all(d < i for d in j.deps)
    assert labels([jobs[d] for d in jobs[3].deps]) == ["export", "quantize", f"compile[{t}]"]
    assert labels([jobs[d] for d in jobs[4].deps]) == ["export"]
    assert len(jobs[-1].deps) == len(jobs) - 1


def test_devices_fan_out_per_target_chip():
    p = pf.load(EXAMPLE)
    p.targets = ["snapdragon-8-gen-3", "snapdragon-8-elite"]
    jobs = plan(p, ["run", "profile"])
    assert labels(jobs) == [
        "export", "quantize", "compile[snapdragon-8-gen-3]", "compile[snapdragon-8-elite]",
        "run[cpu]", "run[htp-sim:snapdragon-8-gen-3]", "run[htp-sim:snapdragon-8-elite]",
        "profile[htp-sim:snapdragon-8-gen-3]", "profile[htp-sim:snapdragon-8-elite]",
    ]
    elite = jobs[6]
    assert labels([jobs[d] for d in elite.deps]) == ["export", "compile[snapdragon-8-elite]"]
    assert elite.chip == "snapdragon-8-elite"
    p.run["devices"] = ["cpu"]
    assert labels(plan(p, ["run", "profile"])) == ["export", "run[cpu]"]


def test_requested_stage_pulls_in_its_inputs_only():
    p = pf.load(EXAMPLE)
    assert labels(plan(p, ["quantize"])) == ["export", "quantize"]
    t = p.targets[0]
    assert labels(plan(p, ["profile"])) == [
        "export", "quantize", f"compile[{t}]", f"profile[htp-sim:{t}]"]


def test_retry_plans_the_job_and_everything_downstream_of_it():
    p = pf.load(EXAMPLE)
    t = p.targets[0]
    assert labels(plan(p, retry=("quantize", ""))) == [
        "export", "quantize", f"compile[{t}]", f"validate[{t}]", f"run[htp-sim:{t}]",
        f"profile[htp-sim:{t}]", "report",
    ]  # run[cpu] does not depend on quantize: not re-run
    assert labels(plan(p, retry=("run", "cpu"))) == ["export", "run[cpu]", "report"]
    # a job id of an older history ("htp-sim/CHIP") still names its device
    assert labels(plan(p, retry=("run", f"htp-sim/{t}")))[-2:] == [f"run[htp-sim:{t}]", "report"]
    p.pipeline["stages"] = ["export", "quantize", "compile"]
    assert labels(plan(p, retry=("quantize", ""))) == ["export", "quantize", f"compile[{t}]"]


def test_unknown_stage_or_target_is_refused():
    p = pf.load(EXAMPLE)
    with pytest.raises(StudioError, match="unknown stage 'deploy'"):
        plan(p, ["deploy"])
    with pytest.raises(StudioError, match="not one of the project's targets"):
        plan(p, ["compile"], ["snapdragon-888"])
    with pytest.raises(StudioError, match="no stages given"):
        plan(p, [])
    with pytest.raises(StudioError, match="not a job of this project's plan"):
        plan(p, retry=("compile", "snapdragon-888"))
