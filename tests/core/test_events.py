"""The columnar profile event table and the repeat statistics of simulated figures."""

import numpy as np
import pytest

from studio.core.errors import StudioError
from studio.core.events import BLOCKS, COLUMNS, EventTable
from studio.core.profile import LOAD_LIMIT, SPREAD_LIMIT, Profile, repeat_stats


def _table() -> EventTable:
    return EventTable.from_rows([
        {"op": "q", "op_type": "MatMul", "layer": 0, "block": "QKV projection", "cycles": 30.0,
         "track": "HTP"},
        {"op": "sm", "op_type": "Softmax", "layer": 0, "block": "attention: softmax",
         "cycles": 5.0, "track": "HTP"},
        {"op": "down", "op_type": "MatMul", "layer": 1, "block": "down_proj", "cycles": 15.0,
         "track": "HTP", "dram_read": 1024.0, "dma": True},
        {"op": "head", "op_type": "MatMul", "block": "embedding / lm_head", "cycles": 50.0},
    ])


def test_group_sums_counts_and_decoding():
    t = _table()
    assert len(t) == 4
    assert t.group_sum("op_type", "cycles") == {"MatMul": 95.0, "Softmax": 5.0}
    assert t.group_sum("layer", "cycles") == {-1: 50.0, 0: 35.0, 1: 15.0}
    assert t.group_count("block")["down_proj"] == 1
    assert list(t["op"]) == ["q", "sm", "down", "head"]
    assert t.has("cycles") and t.has("dram_read") and not t.has("start")
    assert t.value("dram_read").sum() == 1024.0  # NaN counts as 0 in sums
    assert t["dma"].tolist() == [False, False, True, False]
    assert set(t.vocab["block"]) <= set(BLOCKS)


def test_take_and_rows():
    t = _table()
    sub = t.take(t["layer"] == 0)
    assert len(sub) == 2 and sub.group_sum("block", "cycles")["QKV projection"] == 30.0
    row = t.rows()[3]
    assert set(row) == set(COLUMNS) and row["layer"] == -1 and row["start"] is None


def test_npz_round_trip_and_damaged_file(tmp_path):
    t = _table()
    t.save(tmp_path / "events.npz")
    back = EventTable.load(tmp_path / "events.npz")
    assert back.rows() == t.rows() and back.time_unit == t.time_unit
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(StudioError, match="profile the run again"):
        EventTable.load(tmp_path / "bad.npz")


def test_bad_rows_are_refused():
    with pytest.raises(ValueError, match="unknown event column"):
        EventTable.from_rows([{"opname": "x"}])
    with pytest.raises(ValueError, match="rows"):
        EventTable(codes={"op": np.zeros(2, np.int32)}, vocab={"op": ["a"]},
                   num={"cycles": np.zeros(3)})


def test_large_table_group_by_is_vectorised():
    n = 200_000
    rng = np.random.default_rng(0)
    t = EventTable(codes={"block": rng.integers(0, 3, n).astype(np.int32)},
                   vocab={"block": ["a", "b", "c"]}, num={"dur": np.ones(n)})
    sums = t.group_sum("block")
    assert sum(sums.values()) == n


def test_repeat_stats_quiet_host_is_reliable():
    s = repeat_stats([100.0, 104.0, 98.0, 101.0, 160.0], [0.01] * 5, "cycles")
    assert s["median"] == 101.0 and s["runs"] == 5
    assert s["spread"] == pytest.approx(3 / 101)  # one odd run does not make it unreliable
    assert s["range"] == pytest.approx(62 / 101)
    assert s["reliable"] and not s["warnings"]


def test_repeat_stats_warns_on_spread_load_and_few_runs():
    busy = repeat_stats([100.0, 180.0, 120.0, 260.0, 90.0], [0.6, 0.7, 0.5, 0.8, 0.6])
    assert busy["spread"] > SPREAD_LIMIT and busy["median_other_load"] > LOAD_LIMIT
    assert not busy["reliable"] and len(busy["warnings"]) == 2
    assert any("host CPUs" in w for w in busy["warnings"])
    few = repeat_stats([100.0], [0.0])
    assert not few["reliable"] and "at least 3" in few["warnings"][0]


def test_profile_keeps_stats_and_device_but_not_the_table():
    p = Profile(source="simulated", stats=repeat_stats([1.0, 1.0, 1.0], [0, 0, 0]),
                device="htp-sim:x", table=_table())
    d = p.to_dict()
    assert "table" not in d
    back = Profile.from_dict(d)
    assert back.stats == p.stats and back.device == "htp-sim:x" and back.table is None
