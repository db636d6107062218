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
        assert "measured on host CPU on agent lab" in page.run_result.toPlainText()
        assert page.run_progress.text() == "6/6 tokens" and not page.stop_btn.isEnabled()
        page.run_btn.click()  # Stop before the first token: the run ends as stopped
        page.stop_btn.click()
        qtbot.waitUntil(lambda: page.run_btn.isEnabled(), timeout=120_000)
        assert page.run_progress.text() == "stopped" and page.last_result is None

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


def test_the_add_dialog_takes_a_certificate_and_a_phone_needs_the_sdk(
        make_window, copy_project, exported_template, tmp_path, qtbot, monkeypatch):
    """The Add agent dialog's certificate field; a phone adb lists (a stand-in adb: no phone
    here) appears in Run on, and running on it without a QAIRT SDK says what to do; choosing
    the SDK folder is kept in the settings."""
    from studio.core.catalog import default_chip_key, get_chip
    from studio.ui.pages.devices import AddAgentDialog
    from tests.engine import fake_phone

    monkeypatch.setenv("QSTUDIO_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    chip = get_chip(default_chip_key())
    env = fake_phone.install(tmp_path / "phone", [], chip.key, chip.htp_arch)
    for k in ("PATH", "FAKE_PHONE_ROOT", "FAKE_PHONE_SERIAL", "FAKE_PHONE_SOC"):
        monkeypatch.setenv(k, env[k])
    dlg = AddAgentDialog()
    dlg.name.setText("kit")
    dlg.url.setText("https://10.0.0.5:8765")
    dlg.token.setText("t0k")
    dlg.cafile.setText("/etc/ssl/agent.pem")
    assert dlg.values() == ("kit", "https://10.0.0.5:8765", "t0k", "/etc/ssl/agent.pem")
    dlg.deleteLater()

    win = make_window()
    assert win.open_project(copy_project(exported_template, tmp_path / "p"))
    page = win.show_page("Devices")
    assert "not set" in page.sdk_label.text()
    phone = f"adb:R5CW1234ABC@{chip.key}"
    qtbot.waitUntil(lambda: page.run_device.findData(phone) >= 0, timeout=30_000)
    assert "unverified on hardware" in page.adb_label.text()
    page.run_device.setCurrentIndex(page.run_device.findData(phone))
    page.run_btn.click()
    qtbot.waitUntil(lambda: page.run_btn.isEnabled() and not page.stop_btn.isEnabled(),
                    timeout=60_000)
    assert "no QAIRT SDK folder is set" in page.run_result.toPlainText()
    assert page.run_progress.text() == "failed"
    page.choose_sdk(str(tmp_path / "phone" / "sdk"))
    assert page.sdk_label.text().endswith("sdk (from settings)")
    page.choose_sdk(str(tmp_path))  # not an SDK: refused, the setting stays
    assert page.sdk_label.text().endswith("sdk (from settings)")


def test_an_agent_check_after_quit_ends_quietly(make_window, tmp_path, qtbot, monkeypatch):
    """Quitting while the Devices page checks its agents (its 30 s timer) left a task that
    failed with "cannot schedule new futures after shutdown" (a traceback on every Quit):
    work asked of the window's pool after its shutdown is dropped, the check ends quietly."""
    import asyncio

    monkeypatch.setenv("QSTUDIO_CONFIG_DIR", str(tmp_path / "cfg"))
    win = make_window()
    page = win.show_page("Devices")
    page.registry().add("gone", "http://127.0.0.1:9", "t0ken", "")
    win.ctl.shutdown()  # what Quit does
    dropped = win.ctl.in_thread(lambda: 1)
    assert isinstance(dropped, asyncio.Future) and dropped.cancelled()
    page.check_agents()
    task = page._check_task
    assert task is not None
    qtbot.waitUntil(task.done, timeout=10_000)
    assert task.cancelled() or task.exception() is None
