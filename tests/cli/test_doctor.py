"""`studio doctor`: every check made to pass and made to fail for real — this machine's
packages and backend, a project whose plan does not fit (the Llama-3.1-8B shape as one part:
its weight files' headers are real, their data a sparse file, as the plan reads headers
only), short and missing data, a dynamic ONNX input, a real agent on loopback (reachable,
refusing a wrong token, gone, running another SDK than the binaries'), a phone over adb (the
stand-in of tests/engine/fake_phone.py: the adb path is unverified on hardware)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from studio.services import doctor as d
from tests.cli.conftest import default_target, studio

SAMPLE = Path(__file__).resolve().parents[2] / "resources" / "models" / "tiny-coder"


def _by_name(checks) -> dict[str, d.Check]:
    return {c.name: c for c in checks}


def sparse_checkpoint(folder: Path, layers: int = 32, hidden: int = 4096, heads: int = 32,
                      kv_heads: int = 8, inter: int = 14336, vocab: int = 128256) -> Path:
    """A Llama checkpoint of the given shape (Llama-3.1-8B's by default) whose weight file
    has real safetensors headers and zero data in a sparse file (no disk used)."""
    folder.mkdir(parents=True)
    hd = hidden // heads
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden],
              "lm_head.weight": [vocab, hidden]}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": [hidden, hidden],
                   p + "self_attn.k_proj.weight": [kv_heads * hd, hidden],
                   p + "self_attn.v_proj.weight": [kv_heads * hd, hidden],
                   p + "self_attn.o_proj.weight": [hidden, hidden],
                   p + "mlp.gate_proj.weight": [inter, hidden],
                   p + "mlp.up_proj.weight": [inter, hidden],
                   p + "mlp.down_proj.weight": [hidden, inter],
                   p + "input_layernorm.weight": [hidden],
                   p + "post_attention_layernorm.weight": [hidden]}
    header, off = {}, 0
    for name, shape in shapes.items():
        n = 2
        for s in shape:
            n *= s
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + off)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "num_hidden_layers": layers, "vocab_size": vocab,
        "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu"}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SAMPLE / f, folder / f)
    return folder


PROJECT = """schema_version = 1
name = "{name}"
targets = ["{target}"]

[model]
source = "{source}"

[export]
prompt_length = 32
context_length = {context}
parts = {parts}

[quantization]
scheme = "W8A16"
calibration_text = "{calibration}"
calibration_samples = 8

[validation]
heldout_text = "{heldout}"
"""


def _project(tmp: Path, source: Path | str, name: str = "p", parts: int | str = 1,
             context: int = 4096, calibration: str = "sample:calibration",
             heldout: str = "sample:heldout") -> Path:
    f = tmp / f"{name}.qstudio"
    parts_value = f'"{parts}"' if isinstance(parts, str) else parts
    f.write_text(PROJECT.format(name=name, target=default_target(), source=source,
                                context=context, parts=parts_value, calibration=calibration,
                                heldout=heldout))
    return f


def test_this_machine_passes_and_each_machine_check_can_fail(tmp_path):
    r = studio("doctor", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout)
    checks = {c["name"]: c for c in got["checks"]}
    assert checks["QNN HTP backend"]["status"] == "PASS"
    assert "QNN SDK build v2." in checks["QNN HTP backend"]["detail"]
    assert {checks[p]["status"] for p in d.PACKAGES} == {"PASS"}
    assert got["verdict"].startswith("0 failed")
    # each machine check fails on its own condition, with a fix
    assert d.check_python((3, 10)).status == "WARN"
    pk = _by_name(d.check_packages(lambda n: None if n == "onnx" else "2.13.0"))
    assert pk["onnx"].status == "FAIL" and "pip install" in pk["onnx"].fix
    pk = _by_name(d.check_packages(lambda n: "2.9.0"))
    assert pk["torch"].status == "WARN" and "torch==2.13.0" in pk["torch"].fix
    gui = d.check_gui_libraries(lambda name: None if name == "xcb-cursor" else "lib.so")
    assert gui.status == "WARN" and "install-system-deps.sh" in gui.fix
    mem = d.check_memory({"export": 30 << 30}, available=20 << 30)
    assert mem.status == "FAIL" and "export.parts" in mem.fix
    assert d.check_memory({"export": 15 << 30}, available=18 << 30).status == "WARN"
    disk = d.check_disk(tmp_path, need=50 << 30, free=10 << 30)
    assert disk.status == "FAIL" and "free disk space" in disk.fix


def test_a_plan_that_does_not_fit_fails_with_the_fix(tmp_path):
    ckpt = sparse_checkpoint(tmp_path / "llama-8b-shape")
    assert (ckpt / "model.safetensors").stat().st_size > 16e9  # the 8 B shape's bytes ...
    assert (ckpt / "model.safetensors").stat().st_blocks * 512 < 50e6  # ... not on disk
    f = _project(tmp_path, ckpt, parts=1, context=4096)
    r = studio("doctor", f, "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["model"]["status"] == "PASS" and "8,030.3 M parameters" in checks["model"][
        "detail"]
    limit = checks["parts vs the HTP graph limit"]
    assert limit["status"] == "FAIL" and "export.parts" in limit["fix"]
    mem = checks["memory"]
    assert mem["status"] == "FAIL" and "predicted to peak" in mem["detail"], mem
    # in parts, the plan fits the HTP
    g = _project(tmp_path, ckpt, name="parted", parts="auto", context=4096)
    checks = {c["name"]: c for c in json.loads(studio("doctor", g, "--json").stdout)["checks"]}
    assert checks["parts vs the HTP graph limit"]["status"] == "PASS"
    assert checks["context length"]["status"] == "PASS"
    # a context past the model's positions (the sample has 1,024)
    h = _project(tmp_path, "sample:tiny-coder", name="long", context=2048)
    checks = _by_name(d.doctor(h))
    assert checks["context length"].status == "FAIL" and "1024" in checks["context length"].fix
    # the text output: one line per check, the fix after a dash
    r = studio("doctor", f)
    assert r.returncode == 1
    line = next(ln for ln in r.stdout.splitlines() if "parts vs the HTP graph limit" in ln)
    assert line.startswith("FAIL") and " — fix: " in line


def test_missing_and_short_data_and_bad_projects_fail(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("def f(x):\n    return x\n")
    f = _project(tmp_path, "sample:tiny-coder", context=128, calibration=str(short),
                 heldout=str(tmp_path / "missing.txt"))
    checks = _by_name(d.doctor(f))
    cal, held = checks["quantization.calibration_text"], checks["validation.heldout_text"]
    assert cal.status == "FAIL" and "calibration_samples" in cal.fix and "take 256" in cal.detail
    assert held.status == "FAIL" and "missing.txt" in held.detail
    # a held-out text with fewer tokens than validation scores: a warning, not a failure
    mid = tmp_path / "mid.txt"
    mid.write_text((Path(__file__).read_text())[:600])
    g = _project(tmp_path, "sample:tiny-coder", name="mid", context=128, heldout=str(mid))
    held = _by_name(d.doctor(g))["validation.heldout_text"]
    assert held.status == "WARN" and "only" in held.detail and "heldout_tokens" in held.fix
    # an unsupported family
    bad = tmp_path / "gpt2"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"],
                                                 "model_type": "gpt2"}))
    checks = _by_name(d.doctor(_project(tmp_path, bad, name="g", context=128)))
    assert checks["model"].status == "FAIL" and "checkpoint" in checks["model"].fix
    # a file that is not a project
    junk = tmp_path / "junk.qstudio"
    junk.write_text("this is not toml [")
    r = studio("doctor", junk)
    assert r.returncode == 1 and "FAIL  project file" in r.stdout


def test_htp_options_the_targets_cannot_take_fail(tmp_path):
    """[htp] against each target chip: a VTCM budget over the chip's fails with the fix;
    the defaults pass; a changed option is named."""
    f = _project(tmp_path, "sample:tiny-coder", context=128)
    assert _by_name(d.doctor(f))["HTP options"].status == "PASS"
    f.write_text(f.read_text() + "\n[htp]\nvtcm_mb = 64\n")
    c = _by_name(d.doctor(f))["HTP options"]
    assert c.status == "FAIL" and "htp.vtcm_mb = 64 is more than the" in c.detail
    assert "lower htp.vtcm_mb" in c.fix
    f.write_text(f.read_text().replace("vtcm_mb = 64", "optimization_level = 3"))
    c = _by_name(d.doctor(f))["HTP options"]
    assert c.status == "PASS" and c.detail == "optimization_level = 3"


def test_a_dynamic_onnx_input_fails_with_the_shape_to_give(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                                [x], [y]))
    onnx.save(model, tmp_path / "m.onnx")
    f = tmp_path / "g.qstudio"
    f.write_text(f'schema_version = 1\nname = "g"\ntargets = ["{default_target()}"]\n\n'
                 f'[model]\nkind = "onnx-graph"\nsource = "{tmp_path / "m.onnx"}"\n')
    checks = _by_name(d.doctor(f))
    dyn = checks["dynamic shapes"]
    assert dyn.status == "FAIL" and "x" in dyn.detail and "--shape" in dyn.fix
    assert checks["graph.calibration"].status == "FAIL"
    text = f.read_text().replace('[model]', '[graph]\nshapes = { x = [1, 8] }\n\n[model]')
    f.write_text(text)
    assert _by_name(d.doctor(f))["dynamic shapes"].status == "PASS"


@pytest.mark.slow
def test_an_agent_reachable_refused_gone_and_on_another_sdk(tmp_path, monkeypatch):
    from studio.engine import qnn
    from studio.engine.device_registry import Registry
    from tests.cli.test_agent import Agent

    agent = Agent(tmp_path / "agent")
    try:
        reg = Registry(tmp_path / "cfg")
        reg.add("lab", agent.url, agent.token)
        reg.add("wrong", agent.url, "not-the-token")
        f = _project(tmp_path, "sample:tiny-coder", context=128)
        from studio.core import project as pf

        p = pf.load(f)
        ok = _by_name(d.agent_checks("lab", p, reg))
        assert ok["reachable"].status == ok["authenticated"].status == "PASS"
        here = qnn.versions()["qnn_sdk_build"]
        assert ok["QNN SDK build"].status == "PASS" and here in ok["QNN SDK build"].detail
        assert ok["Hexagon architecture"].status == "PASS"
        # binaries compiled by another SDK (their recorded build) against this agent
        other = _by_name(d.agent_checks("lab", p, reg, sdk=("v2.40.0.250101000000",
                                                            "the project's compiled binaries")))
        sdk = other["QNN SDK build"]
        assert sdk.status == "FAIL" and "v2.40.0.250101000000" in sdk.detail and here in sdk.detail
        assert "same onnxruntime-qnn" in sdk.fix
        refused = _by_name(d.agent_checks("wrong", p, reg))
        assert refused["authenticated"].status == "FAIL" and "token" in refused[
            "authenticated"].fix
    finally:
        agent.stop()
    gone = _by_name(d.agent_checks("lab", None, reg))
    assert gone["reachable"].status == "FAIL" and "studio agent serve" in gone["reachable"].fix


def test_a_phone_over_adb_on_the_wrong_chip_or_absent(tmp_path, monkeypatch):
    from studio.core import project as pf
    from studio.core.catalog import get_chip
    from studio.engine.device_registry import Registry
    from tests.engine import fake_phone

    chip = get_chip(default_target())
    env = fake_phone.install(tmp_path / "phone", [], chip.key, chip.htp_arch, soc="SM8750")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    p = pf.load(_project(tmp_path, "sample:tiny-coder", context=128))
    reg = Registry(tmp_path / "cfg")
    checks = _by_name(d.adb_checks("R5CW1234ABC", p, registry=reg))
    assert checks["reachable"].status == "PASS"
    arch = checks["Hexagon architecture"]
    assert arch.status == "FAIL" and "Snapdragon 8 Elite" in arch.detail, arch
    assert checks["QAIRT SDK"].status == "PASS"
    assert checks["memory"].status == "PASS"
    absent = _by_name(d.adb_checks("NOSUCHPHONE", p, registry=reg))
    assert absent["reachable"].status == "FAIL" and "adb devices" in absent["reachable"].fix
