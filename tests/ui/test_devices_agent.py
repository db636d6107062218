"""The Devices page with a real agent: add it, see it healthy, run the exported sample on it
and see the result with its source; a wrong token shows the refusal."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_add_an_agent_run_on_it_and_a_wrong_token(make_window, copy_project, exported_template,
                                                  tmp_path, qtbot, monkeypatch):
    from tests.cli.test_agent import Agent

    monkeypatch.setenv("QSTUDIO_CONFIG_DIR", str(tmp_path / "cfg"))
    agent = Agent(tmp_path / "agent")
    try:
        win = make_window()
        win.resize(1280, 900)
        assert win.open_project(copy_project(exported_template, tmp_path / "p"))
        page = win.show_page("Devices")
        assert page.agents.rowCount() == 0 and not page.run_btn.isEnabled()

        page.add_agent("lab", agent.url, agent.token)
        qtbot.waitUntil(lambda: page.agents.rowCount() == 1
                        and page.agents.item(0, 3).text().startswith("ok"), timeout=30_000)
        assert "host-cpu" in page.agents.item(0, 3).text()
        assert "QNN SDK" in page.details["lab"] and "CPUs" in page.agents.item(0, 1).toolTip()
        assert page.run_device.currentData() == "agent:lab"
        page.run_tokens.setValue(6)
        page.run_btn.click()
        qtbot.waitUntil(lambda: page.run_btn.isEnabled() and page.last_result is not None,
                        timeout=120_000)
        out = page.last_result
        assert len(out["tokens"]) == 6 and out["source"] == "measured"
        assert "measured on cpu on agent lab" in page.run_result.toPlainText()

        page.add_agent("wrong", agent.url, "not-the-token")
        qtbot.waitUntil(lambda: page.health.get("wrong", "").startswith("auth failed"),
                        timeout=30_000)
        assert "refused the token (401)" in page.health["wrong"]
        page.agents.selectRow(1)
        page.remove_agent()
        assert page.agents.rowCount() == 1
        win.grab().save(str(tmp_path / "devices.png"))
    finally:
        agent.stop()
