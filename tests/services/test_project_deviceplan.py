"""The device memory plan of a project (studio.services.deviceplan) and the doctor's check of
it: the Llama-3.1-8B shape (real safetensors headers over a sparse file, as the plan reads
headers only) whole at W8A16 fails with the part count that fits; with export.parts = "auto"
the export takes the device's count and the plan fits; the export's key follows the targets'
NPU limits, not their names."""

from __future__ import annotations

from studio.core import project as pf
from studio.core.stagegraph import PlannedJob, stage_config
from studio.services import doctor as d
from studio.services.deviceplan import plans_dict, project_plans
from studio.services.projects import part_plan
from tests.cli.test_doctor import _project, sparse_checkpoint


def test_the_8b_shape_whole_fails_the_doctor_with_the_part_count(tmp_path):
    ckpt = sparse_checkpoint(tmp_path / "llama-8b-shape")
    p = pf.load(_project(tmp_path, ckpt, parts=1, context=4096))
    (plan,) = project_plans(p)
    # exported whole, the bundle ships the whole model's binaries: one part
    # the 1.05 GB embedding table at 16 bits (W8A16's activations) fits no part count
    assert plan.inputs.parts == 1 and plan.fits is False
    assert plan.suggestion == "the embedding table at 8 bits in 9 parts"
    (check,) = d.check_device_plan(p)
    assert check.status == "FAIL" and check.name == "device memory plan (snapdragon-8-gen-3)"
    assert 'quantization.embedding = "INT8", export.parts = 9' in check.fix
    assert "does not fit" in check.detail

    auto = pf.load(_project(tmp_path, ckpt, name="auto", parts="auto", context=4096))
    # the device's count (the export sizes the table at 8 bits), tighter than the host's 6
    assert len(part_plan(auto).parts) == 9
    (plan,) = project_plans(auto)
    assert plan.inputs.parts == 9 and plan.fits is False
    auto.quantization["embedding"] = "INT8"
    (plan,) = project_plans(auto)
    assert plan.inputs.parts == 9 and plan.fits is True
    assert d.check_device_plan(auto)[0].status == "PASS"
    data = plans_dict(auto)["plans"][0]
    assert data["fits"] is True and data["npu_va_bytes"] == 3891 << 20
    assert {r["source"] for r in data["rows"]} == {"estimated"}


def test_a_target_without_known_limits_warns(tmp_path):
    p = pf.load(_project(tmp_path, "sample:tiny-coder", context=128))
    p.targets = ["snapdragon-888"]
    (check,) = d.check_device_plan(p)
    assert check.status == "WARN" and "does not know" in check.fix


def test_the_export_key_hashes_the_targets_limits_only_for_auto_parts(tmp_path):
    p = pf.load(_project(tmp_path, "sample:tiny-coder", parts="auto", context=128))
    job = PlannedJob("export")

    def identity(targets):
        p.targets = targets
        return stage_config(p, job).hashed["targets"]

    gen3 = identity(["snapdragon-8-gen-3"])
    assert gen3 == {"npu_context_bytes": [1 << 30]}
    assert identity(["snapdragon-8-gen-3", "snapdragon-8-elite"]) == gen3  # same limits
    assert identity(["snapdragon-888"]) == {"npu_context_bytes": []}
    p.export.parts = 1
    assert identity(["snapdragon-8-gen-3"]) is None


def test_the_report_shows_the_plan_with_its_sources(tmp_path):
    import json

    import jsonschema

    from studio.engine.report import SCHEMA_PATH, build_report, render_html
    from studio.services.deviceplan import plans_dict
    from tests.conftest import small_sample_project

    p = pf.load(small_sample_project(tmp_path, "r"))
    data = build_report(p, {}, device_plan=plans_dict(p))
    jsonschema.validate(json.loads(json.dumps(data)), json.loads(SCHEMA_PATH.read_text()))
    html = render_html(data)
    assert "Device memory plan" in html and "whole weights" in html  # shared: one binary
    assert "[VA] about 3.8 GiB" in html and "; fits</p>" in html


def test_the_plan_says_whether_the_draft_reads_the_targets_table(tmp_path):
    """The host side beside the NPU plan: the shipped draft reads the target's token table
    (equal, byte for byte): its 2 MiB table is not held; with model.draft_embedding = "own",
    or a draft of another width, 0 bytes and why — in the plan's data, its lines and the
    doctor's check."""
    import json

    from studio.services.deviceplan import draft_table_share, plan_lines

    p = pf.load(_project(tmp_path, "sample:tiny-coder", context=128))
    assert "draft_table" not in plans_dict(p) and not d.check_draft_table(p)
    p.model["draft"] = "sample:tiny-coder-draft"
    data = plans_dict(p)
    table = data["draft_table"]
    assert table["shareable"] and table["values"] == "equal"
    assert (table["saved_bytes"], table["source"]) == (2048 * 256 * 4, "estimated")
    lines = plan_lines(p, data)
    assert lines[-1] == table["line"] and "2.0 MiB saved on the host CPU" in lines[-1]
    (check,) = d.check_draft_table(p)
    assert check.status == "PASS" and check.name == "draft's token table"
    p.model["draft_embedding"] = "own"
    assert draft_table_share(p).saved_bytes == 0
    assert 'model.draft_embedding = "own"' in plans_dict(p)["draft_table"]["why"]
    # a draft of another width: not shareable, why, 0 bytes (a config is all it takes)
    other = tmp_path / "narrow-draft"
    other.mkdir()
    from studio.core.samples import sample_path

    for f in sample_path("tiny-coder-draft").iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((other / "config.json").read_text())
    cfg["hidden_size"] = 128
    (other / "config.json").write_text(json.dumps(cfg))
    p.model["draft_embedding"] = "auto"
    share = draft_table_share(p, str(other))
    assert not share.shareable and share.saved_bytes == 0
    assert share.why.startswith("widths differ: the target's rows are 256 wide, the draft's 128")
