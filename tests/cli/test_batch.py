"""End to end: `studio --batch` on the real sample model and the real QNN HTP simulator."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.cli.conftest import ROOT, studio

pytestmark = pytest.mark.slow


def test_batch_runs_every_stage_and_writes_the_report(batch_run, small_project):
    r, summary = batch_run
    stages = [j["stage"] for j in summary["jobs"]]
    assert stages[:2] == ["export", "quantize"] and stages[-1] == "report"
    assert {j["state"] for j in summary["jobs"]} == {"succeeded"}
    names = {(m["name"], m["source"]) for m in summary["metrics"]}
    assert ("decode_tokens_per_s", "simulated") in names
    assert ("decode_tokens_per_s", "measured") in names
    report = small_project.with_suffix(".studio") / "reports" / "latest.html"
    html = report.read_text()
    assert "<svg" in html and "simulated" in html and "measured" in html
    data = json.loads(report.with_suffix(".json").read_text())
    sources = {m["source"] for m in data["metrics"]}
    assert sources <= {"measured", "simulated"} and "simulated" in sources
    # every run metric from the simulator is labelled simulated, host CPU measured
    for m in data["metrics"]:
        if m["device"] == "htp-sim":
            assert m["source"] == "simulated"
        if m["device"] == "host-cpu":
            assert m["source"] == "measured"


def test_w8a16_on_the_simulator_meets_the_accuracy_bar(batch_run, small_project):
    _, summary = batch_run
    gates = {g["gate"]: g for g in summary["gates"]}
    assert gates["min_logits_cosine"]["value"] >= 0.99
    assert gates["max_perplexity_increase"]["value"] <= 0.05
    assert summary["gates_passed"]
    data = json.loads((small_project.with_suffix(".studio") / "reports/latest.json").read_text())
    comp = next(v for k, v in data["stages"].items() if k.startswith("compile["))
    assert all(p["all_on_npu"] for p in comp["placement"].values())
    assert comp["sdk_version"]
    # the greedy check on the project's validation.greedy_prompts (2 here, 4 by default)
    val = next(v for k, v in data["stages"].items() if k.startswith("validate["))
    assert val["greedy_prompts"] == 2 and val["greedy_fp32"] and val["greedy_htp"]


def test_second_run_is_all_cached(batch_run, small_project):
    t0 = time.perf_counter()
    r = studio("--batch", small_project, "--json")
    took = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr
    jobs = json.loads(r.stdout)["jobs"]
    assert all(j["cached"] for j in jobs if j["stage"] != "report")
    assert took < 0.25 * batch_run[1]["seconds"] + 10


def test_info_describes_the_project(batch_run, small_project):
    r = studio("info", small_project, "--json")
    assert r.returncode == 0
    data = json.loads(r.stdout)
    assert data["name"] == "small" and data["recent_runs"]
    assert {m["source"] for m in data["latest_metrics"]} <= {"measured", "simulated"}


def _gone(pid: int) -> bool:
    """The process has ended (a zombie waiting for its reaper counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _ends(pid: int, timeout: float = 60) -> bool:
    """Wait for a state (the process ended), not for a time; the timeout only bounds a hang."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


def _wait_for_running_job(proc, db, stage: str, timeout: float = 300, target: str = "%"):
    """(run_id, worker pid) of the first running ``stage`` job of ``proc``'s run that has
    reported progress, or None when the process ended (or the time ran out) before one did.
    Waits for a state, never for a time: a loaded machine only makes it slower."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        con = sqlite3.connect(db)
        try:
            row = con.execute("SELECT run_id, pid FROM jobs WHERE state='running' AND stage=? "
                              "AND target LIKE ? AND progress > 0 ORDER BY id DESC LIMIT 1",
                              (stage, target)).fetchone()
        except sqlite3.OperationalError:  # the run history is being created
            row = None
        finally:
            con.close()
        if row:
            return row
        time.sleep(0.2)
    return None


def test_kill_9_mid_stage_then_rerun_completes(batch_run, small_project, tmp_path):
    # change only the run stage's settings so that the rerun work is short
    text = small_project.read_text().replace("max_new_tokens = 8", "max_new_tokens = 12")
    proj = small_project.with_name("small.qstudio")
    proj.write_text(text)
    before = proj.read_bytes()
    db = proj.with_suffix(".studio") / "runs.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "studio.cli", "--batch", str(proj), "--quiet"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    running = _wait_for_running_job(proc, db, "run")  # a run job has reported progress
    if running:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert running, "the run stage never started"
    assert proj.read_bytes() == before
    r = studio("--batch", proj, "--json")
    assert r.returncode == 0, r.stderr
    assert "interrupted" in r.stderr
    con = sqlite3.connect(db)
    states = [s for (s,) in con.execute("SELECT state FROM jobs")]
    assert "interrupted" in states
    # nothing half-written: every stored artifact verifies, no temp folders left
    from studio.core.artifacts import ArtifactStore

    store = ArtifactStore(proj.with_suffix(".studio") / "artifacts")
    assert all(store.verify(a) for a in store.all())
    assert not any(store.tmp.iterdir())


def test_ctrl_c_cancels_the_run_and_stops_its_worker(batch_run, small_project):
    before = text = small_project.read_text()
    for n in (8, 12):  # a long generation on the simulator: Ctrl-C lands inside it
        text = text.replace(f"max_new_tokens = {n}", "max_new_tokens = 40")
    small_project.write_text(text)
    try:
        _ctrl_c(small_project)
    finally:  # the session's project as the other tests expect it (it leaked 40 tokens
        small_project.write_text(before)  # into every later test of this worker: the phone's
        # run stage then took 106 s instead of 11)


def _ctrl_c(small_project):
    db = small_project.with_suffix(".studio") / "runs.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "studio.cli", "--batch", str(small_project),
                             "--quiet", "--stages", "run"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    running = _wait_for_running_job(proc, db, "run", target="htp-sim%")
    if running:
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert running, "the run stage never started"
    run_id, worker_pid = running
    assert proc.returncode == 130, err
    # ends cleanly: one line, no traceback (nor asyncio's "Event loop is closed" from a
    # worker's pipes left to the garbage collector), no lock held, no temporary folder left
    assert err.strip() == "interrupted", err
    from studio.core.artifacts import RESUME_PREFIX, ArtifactStore, holds_finished_parts
    from studio.core.fsutil import RunLock

    folder = small_project.with_suffix(".studio")
    assert not RunLock(folder).held()
    tmp = ArtifactStore(folder / "artifacts").tmp
    left = [p.name for p in tmp.iterdir()
            if not (p.name.startswith(RESUME_PREFIX) and holds_finished_parts(p))]
    assert left == [], left
    con = sqlite3.connect(db)
    states = {s for (s,) in con.execute("SELECT state FROM jobs WHERE run_id=?", (run_id,))}
    assert "running" not in states and "queued" not in states and "cancelled" in states
    assert con.execute("SELECT state FROM runs WHERE id=?", (run_id,)).fetchone()[0] == "cancelled"
    assert _ends(worker_pid), f"the worker {worker_pid} outlived the batch"


def test_a_failing_gate_exits_1_and_says_which(batch_run, small_project, tmp_path):
    # validation results are cached; only the gate changes, so this is quick
    strict = small_project.read_text().replace("min_logits_cosine = 0.99",
                                                "min_logits_cosine = 0.999999")
    before = small_project.read_text()
    small_project.write_text(strict)
    try:
        r = studio("--batch", small_project, "--json")
    finally:
        small_project.write_text(before)
    assert r.returncode == 1, r.stderr
    summary = json.loads(r.stdout)
    failed = [g for g in summary["gates"] if not g["passed"]]
    assert [g["gate"] for g in failed] == ["min_logits_cosine"]
    assert "FAIL" in r.stderr
    report = json.loads((small_project.with_suffix(".studio") / "reports/latest.json").read_text())
    assert report["gates_passed"] is False


def test_a_killed_quantize_leaves_its_temp_files_in_the_project_and_the_next_open_cleans_them(
        batch_run, small_project):
    before = small_project.read_text()
    # a recipe of its own, so that quantize really runs (export comes from the cache)
    # (more calibration samples than the shared run: a longer calibration to catch it in)
    small_project.write_text(before.replace("calibration_samples = 2", "calibration_samples = 6"))
    tmp = small_project.with_suffix(".studio") / "artifacts" / "tmp"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "studio.cli", "--batch",
                                 str(small_project), "--quiet", "--stages", "quantize"],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seen: list[str] = []
        deadline = time.time() + 300
        # watch the folder itself, tightly: the calibration's temp files live only while
        # ORT calibrates (seconds on a quiet machine, less than a poll on a loaded one
        # if the poll waited for the job's state first)
        while time.time() < deadline and proc.poll() is None and not seen:
            seen = [p.name for p in tmp.glob("scratch-*/*")]
            if not seen:
                time.sleep(0.02)
        ended = proc.poll() is not None
        if not ended:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert seen, ("quantize ended before its temporary files were seen" if ended else
                      "quantize never wrote a temporary file under the project's tmp folder")
        r = studio("--batch", small_project, "--stages", "export", "--quiet")  # the next run
        assert r.returncode == 0, r.stderr
        assert not any(tmp.iterdir())
    finally:
        small_project.write_text(before)


def test_a_worker_killed_by_a_signal_is_reported_as_such(batch_run, small_project):
    before = small_project.read_text()
    text = before
    for n in (8, 12, 40):  # a long generation that is not cached
        text = text.replace(f"max_new_tokens = {n}\n", "max_new_tokens = 39\n")
    small_project.write_text(text)
    db = small_project.with_suffix(".studio") / "runs.sqlite"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "studio.cli", "--batch",
                                 str(small_project), "--stages", "run", "--quiet"], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        running = _wait_for_running_job(proc, db, "run", target="htp-sim%")
        if running:
            os.kill(running[1], signal.SIGKILL)  # the worker, not the batch
        _, err = proc.communicate(timeout=120)
    finally:
        small_project.write_text(before)
    assert running, "the run stage never started"
    assert proc.returncode == 3, err
    assert "killed by SIGKILL" in err
    assert "traceback" not in err  # there is none: the process was killed
