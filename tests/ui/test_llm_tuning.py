"""The LLM page's tuning tabs on the real sample: the playground streams text from the FP32
export (and speculative decoding with prompt lookup shows its acceptance), Stop cancels, the
ablation ranks the blocks and writes a pruned checkpoint, and the waterfall is measured
through the window and drawn with its measured and estimated bars."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_playground_ablation_and_waterfall(make_window, copy_project, exported_template,
                                           tmp_path, qtbot):
    from tests.ui.conftest import wait_task

    win = make_window()
    win.resize(1280, 820)
    assert win.open_project(copy_project(exported_template, tmp_path / "p"))
    page = win.show_page("LLM")
    page.tabs.setCurrentWidget(page.playground)
    pg = page.playground
    assert pg.device.count() == 1 + len(win.ctl.project.targets)

    pg.prompt.setPlainText("def fibonacci(n):\n    a, b = 0, 1\n")
    pg.max_new.setValue(24)
    pg.go.click()
    assert not pg.go.isEnabled() and pg.stop.isEnabled()
    qtbot.waitUntil(lambda: not pg.is_running(), timeout=120_000)
    out = pg.last
    assert out["source"] == "measured" and len(out["tokens"]) >= 1
    assert pg.output.toPlainText().startswith("def fibonacci(n):")
    assert len(pg.output.toPlainText()) > len("def fibonacci(n):\n    a, b = 0, 1\n")
    assert "time to first token" in pg.stats.text() and pg.badge.source == "measured"

    pg.spec.setCurrentText("prompt lookup")
    pg.go.click()
    qtbot.waitUntil(lambda: not pg.is_running(), timeout=120_000)
    assert pg.last["tokens"] == out["tokens"]  # greedy: the same text, fewer target passes
    assert "acceptance" in pg.accept.text() and "tokens per target pass" in pg.accept.text()
    assert not pg.settings()["overlap"]  # overlap is for a draft model only

    # the shipped draft, drafting ahead while the target verifies: the same text
    win.ctl.project.model["draft"] = "sample:tiny-coder-draft"
    pg.spec.setCurrentText("draft model")
    pg.overlap.setChecked(True)
    assert pg.settings()["overlap"]
    pg.go.click()
    qtbot.waitUntil(lambda: not pg.is_running(), timeout=120_000)
    assert pg.last["tokens"] == out["tokens"] and pg.last["speculative"]["overlap"]
    assert "overlapped:" in pg.accept.text()
    # the page says which token table the draft read, and why
    assert "draft's token table: the target's (vocabulary 2,048 and width 256 match, values " \
           "equal)" in pg.accept.text()

    pg.spec.setCurrentText("off")
    pg.go.click()
    pg.cancel()  # before the first token: the thread stops at its first check
    qtbot.waitUntil(lambda: not pg.is_running(), timeout=120_000)
    assert "stopped" in pg.stats.text() and pg.go.isEnabled()

    # the ablation, through the window's run
    page.tabs.setCurrentWidget(page.pruning)
    summary = wait_task(qtbot, win.ctl.run(["ablation"]))
    assert summary.state == "succeeded", summary.to_dict()
    qtbot.waitUntil(lambda: page.pruning.table.rowCount() == 4, timeout=30_000)
    t = page.pruning.table_data
    deltas = [r["delta"] for r in t["blocks"]]
    assert deltas == sorted(deltas) and deltas[0] > 0  # dropping any block costs perplexity
    assert t["pruned_ppl"] > t["baseline_ppl"]
    messages = []
    win.ctl.message.connect(lambda level, text: messages.append((level, text)))
    page.pruning.write_checkpoint(str(tmp_path / "pruned"))
    qtbot.waitUntil(lambda: bool(messages), timeout=60_000)
    assert messages[-1][0] == "info", messages
    assert (tmp_path / "pruned" / "config.json").is_file()
    assert (tmp_path / "pruned.qstudio").is_file()

    # the waterfall: measured on the host CPU, estimated for the chip
    page.tabs.setCurrentWidget(page.waterfall)
    assert page.waterfall.table.rowCount() == 0
    win.ctl.set("waterfall", "new_tokens", 16)  # each step's generation: short in a test
    summary = wait_task(qtbot, win.ctl.run(["waterfall"]), timeout=900_000)
    assert summary.state == "succeeded", summary.to_dict()
    qtbot.waitUntil(lambda: page.waterfall.table.rowCount() == 8, timeout=30_000)
    data = page.waterfall.data
    assert [r["step"] for r in data["steps"]] == ["fp32", "w8a16", "quantized_io", "w4a16",
                                                 "int8_kv", "window", "speculative", "pruned"]
    assert all(r["source"] == "measured" and r["tokens_per_s"] > 0 for r in data["steps"])
    assert all(r["estimated_tokens_per_s"] > 0 for r in data["steps"])
    spec_row = data["steps"][6]
    assert spec_row["ppl"] == data["steps"][5]["ppl"]  # lossless
    # quantized graph I/O: the NPU converts no edge, so the chip's estimate rises; the
    # model keeps its accuracy on the host (one encoding per cache tensor)
    w8, qio = data["steps"][1], data["steps"][2]
    assert qio["estimated_tokens_per_s"] > w8["estimated_tokens_per_s"]
    assert abs(qio["ppl"] / w8["ppl"] - 1) < 0.02, (qio["ppl"], w8["ppl"])
    assert data["steps"][-1]["ppl"] > data["steps"][0]["ppl"]
    page.waterfall.chip.setCurrentText("snapdragon-8-elite")
    assert page.waterfall.data["chip"] == "snapdragon-8-elite"
    win.grab().save(str(tmp_path / "waterfall.png"))
