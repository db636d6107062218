"""The playground puts a prompt through the checkpoint's chat template (its box checked, its
source in the tooltip) and shows the prompt as the model read it; cleared, the prompt goes
in as written; a checkpoint without a template has the box off, saying so. The Model page
says the same."""

from __future__ import annotations

import pytest

from tests.engine.chat_checkpoints import make_chat_checkpoint
from tests.engine.conftest import corpus_text

pytestmark = pytest.mark.slow


def test_the_playground_applies_the_chat_template(make_window, tmp_path, qtbot):
    from studio.services.session import Studio
    from tests.ui.conftest import wait_task

    ck = make_chat_checkpoint(tmp_path / "ck", corpus_text())
    Studio.create(tmp_path / "chat.qstudio", str(ck), pipeline={"stages": ["export"]}).close()
    win = make_window()
    assert win.open_project(tmp_path / "chat.qstudio")
    summary = wait_task(qtbot, win.ctl.run(["export"]))
    assert summary.state == "succeeded", summary.to_dict()
    model_page = win.show_page("Model")
    qtbot.waitUntil(lambda: model_page.prompts.isVisibleTo(model_page), timeout=60_000)
    assert model_page.prompts.text().startswith("Prompts: chat template: tokenizer_config.json")
    page = win.show_page("LLM")
    page.tabs.setCurrentWidget(page.playground)
    pg = page.playground
    assert pg.chat.isEnabled() and pg.chat.isChecked()
    assert pg.chat.toolTip().startswith("chat template: tokenizer_config.json's chat_template")

    pg.prompt.setPlainText("def add(a, b):")
    pg.max_new.setValue(4)
    pg.go.click()
    qtbot.waitUntil(lambda: not pg.is_running(), timeout=120_000)
    out = pg.last
    assert out is not None and out["prompt_format"]["applied"], pg.stats.text()
    assert pg.output.toPlainText().startswith(out["prompt_text"])
    assert "<|im_start|>user\ndef add(a, b):<|im_end|>" in out["prompt_text"]
    assert "(chat template)" in pg.stats.text()

    pg.chat.setChecked(False)
    pg.go.click()
    qtbot.waitUntil(lambda: not pg.is_running(), timeout=120_000)
    assert not pg.last["prompt_format"]["applied"]
    assert pg.output.toPlainText().startswith("def add(a, b):")

    # the sample has no template: the box is off and says so
    Studio.create(tmp_path / "text.qstudio", "sample:tiny-coder").close()
    assert win.open_project(tmp_path / "text.qstudio")
    page = win.show_page("LLM")
    assert not page.playground.chat.isEnabled() and not page.playground.chat.isChecked()
    assert page.playground.chat.toolTip().startswith("no chat template in the checkpoint")
