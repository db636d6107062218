import subprocess
import sys

from studio.core.jobs import JobStore
from studio.core.metrics import Metric


def test_jobs_logs_metrics_round_trip(tmp_path):
    db = JobStore(tmp_path / "runs.sqlite")
    run = db.create_run({"stages": None})
    a = db.add_job(run, "export")
    b = db.add_job(run, "quantize", depends_on=[a])
    db.update_job(a, state="running", progress=0.5, message="half")
    db.append_log(a, "line 1")
    db.add_metrics(a, [Metric("ppl", 3.5, "", "measured", "host-cpu")])
    db.update_job(a, state="succeeded", result={"summary": "ok"})
    job = db.job(a)
    assert job.state == "succeeded" and job.result == {"summary": "ok"}
    assert db.job(b).depends_on == [a]
    assert db.log(a) == ["line 1"]
    assert db.metrics(job_id=a)[0].source == "measured"
    assert [j.id for j in db.jobs(run)] == [a, b]
    db.close()
    # WAL mode is on
    import sqlite3

    assert sqlite3.connect(tmp_path / "runs.sqlite").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_jobs_of_a_dead_process_become_interrupted(tmp_path):
    path = tmp_path / "runs.sqlite"
    code = (
        "import os, sys\n"
        "from studio.core.jobs import JobStore\n"
        f"db = JobStore({str(path)!r})\n"
        "r = db.create_run({})\n"
        "j = db.add_job(r, 'export')\n"
        "db.update_job(j, state='running')\n"
        "db.add_job(r, 'quantize')\n"
        "os._exit(0)\n"  # dies without finishing the run
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    db = JobStore(path)
    assert db.mark_interrupted() == 2
    assert {j.state for j in db.jobs()} == {"interrupted"}
    assert db.runs()[0]["state"] == "interrupted"
    assert db.mark_interrupted() == 0
