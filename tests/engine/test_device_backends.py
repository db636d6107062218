"""Device backends: each kind's backend is found from its declaration in core/devices, and a
new kind is one module plus one registration (shown with a kind made here, run by the real
run stage)."""

from __future__ import annotations

import shutil
from types import MappingProxyType

import pytest

from studio.core import devices
from studio.core.errors import StudioError
from studio.engine.devices import backend


def test_every_kind_has_a_backend_that_labels_from_its_device():
    ids = ["cpu", "htp-sim:snapdragon-8-gen-3", "agent:lab", "agent:lab@htp-sim:snapdragon-8-gen-3",
           "adb:R5CW1234ABC@snapdragon-8-gen-3", "htp:snapdragon-8-gen-3"]
    # and each kind whose shorthand is an id of its own (a kind without rules of its own)
    ids += [k.shorthand for k in devices.DEVICE_KINDS.values() if k.shorthand and not k.per_chip]
    kinds = set()
    for i in ids:
        dev = devices.device(i)
        be = backend(dev)
        kinds.add(dev.kind)
        assert be.device == dev and be.source == dev.source
        assert type(be).__module__ == devices.backend_module(dev.kind)
    assert kinds == set(devices.DEVICE_KINDS)
    assert backend(devices.device("agent:lab@htp-sim:snapdragon-8-gen-3")).source == "simulated"
    with pytest.raises(StudioError, match="graph projects run on the host CPU"):
        backend(devices.device("agent:lab")).open_session(None, None, True)  # type: ignore[arg-type]


def test_ids_are_parsed_by_the_kind_table():
    assert devices.device("htp-sim/snapdragon-8-gen-3").id == "htp-sim:snapdragon-8-gen-3"
    assert devices.device("agent:lab").id == "agent:lab@cpu"
    with pytest.raises(StudioError, match="unknown device 'gpu:0'"):
        devices.device("gpu:0")


def test_a_new_device_kind_is_one_module_and_one_registration(tmp_path, tiny_qwen_dir,
                                                              qwen_graphs):
    from studio.core.progress import RecordingProgress
    from studio.core.stagegraph import StageConfig
    from studio.worker.stages import StageContext, stage_function
    from tests.engine.one_thread_backend import KIND

    export, _spec = qwen_graphs
    folder = tmp_path / "export"
    shutil.copytree(export, folder)
    (folder / "tokenizer").mkdir()
    for f in tiny_qwen_dir.glob("*token*"):
        shutil.copy2(f, folder / "tokenizer" / f.name)

    devices.register_kind(KIND)
    try:
        dev = devices.device("cpu1:lab")
        assert dev.kind == "host-cpu-1" and dev.source == "measured"
        settings = {"quantization.scheme": "W8A16", "run.prompt": "hello there",
                    "run.max_new_tokens": 4, "run.image": "", "model.chat_template": "checkpoint",
                    "htp.performance_mode": ""}
        config = StageConfig("run", dev.id, MappingProxyType(settings), MappingProxyType({}),
                             MappingProxyType({}))
        ctx = StageContext(config, {"export": folder}, tmp_path / "out")
        out = stage_function("run")(ctx, RecordingProgress())
    finally:
        del devices.DEVICE_KINDS[KIND.kind], devices.KINDS[KIND.kind]
    assert out["device_id"] == "cpu1:lab" and len(out["tokens"]) == 4
    assert "(measured, FP32 on one host CPU thread)" in out["summary"]
    assert {m["source"] for m in out["metrics"]} == {"measured"}
    assert {m["device"] for m in out["metrics"]} == {"host-cpu-1"}
    with pytest.raises(StudioError, match="unknown device"):
        devices.device("cpu1:lab")
