"""Exports of the profile model: CSV columns and the chrome trace of a table with times."""

import csv
import io

from studio.core.events import EventTable
from studio.core.profile import Profile
from studio.core.profile_export import to_chrome_trace, to_csv


def _profile() -> Profile:
    p = Profile(source="measured", device="host-cpu")
    p.table = EventTable.from_rows([
        {"op": "a", "op_type": "MatMul", "track": "t1", "start": 5.0, "dur": 2.0, "layer": 0},
        {"op": "b", "op_type": "Add", "track": "t2", "start": 6.0, "dur": 1.0, "dma": True},
    ])
    return p


def test_chrome_trace_names_tracks_and_keeps_times():
    trace = to_chrome_trace(_profile())
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {e["args"]["name"] for e in meta if e["name"] == "thread_name"} == {"t1", "t2"}
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["ts"], e["dur"]) for e in xs] == [(5.0, 2.0), (6.0, 1.0)]
    assert xs[0]["args"]["layer"] == 0 and xs[1]["args"]["dma"] is True
    assert trace["otherData"]["source"] == "measured"


def test_csv_has_every_column_and_the_source():
    rows = list(csv.DictReader(io.StringIO(to_csv(_profile()))))
    assert rows[0]["source"] == "measured" and rows[0]["op"] == "a"
    assert rows[1]["dma"] == "True" and rows[0]["cycles"] == ""
