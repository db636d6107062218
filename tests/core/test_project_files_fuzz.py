"""Generated project *files*: the settings' declarations give the values (valid ones, their
limits and past them, every TOML type), [[sweeps]] tables get axes of any length, and the bytes
are then mutated (a byte-order mark, a cut, inserted or flipped bytes, deep nesting). Each file
is written and read by ``project.load`` as ``studio`` reads it: a project, or one line
(StudioError) — never another exception, never more than a second."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest

from studio.core import project as pf
from studio.core.errors import StudioError
from studio.core.settings import SECTION_KEYS
from tests.core.test_settings import EXAMPLE, _values_for

#: how many files are generated (about 12 s on one core)
EXAMPLES = 300
SLOWEST_S = 1.0


def test_generated_and_mutated_project_files_load_or_fail_in_one_line(tmp_path):
    import tomli_w
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings
    from hypothesis import strategies as st

    base = pf.load(EXAMPLE).to_dict()
    keys = sorted(f"{s}.{k}" for s, ks in SECTION_KEYS.items() for k in ks
                  if not (s == "model" and k == "source"))
    axis_keys = [k for k in keys if not k.startswith("pipeline.")]

    @st.composite
    def sweeps(draw):
        tables = []
        for i in range(draw(st.integers(0, 2))):
            axes = {}
            for key in draw(st.lists(st.sampled_from(axis_keys), max_size=8, unique=True)):
                n = draw(st.sampled_from([0, 1, 2, 30, 300]))
                axes[key] = [draw(_values_for(key)) for _ in range(min(n, 3))] + list(
                    range(max(0, n - 3)))
            table = {"name": draw(st.sampled_from([f"s{i}", "", "a/b"])), "axes": axes}
            if draw(st.booleans()):
                table["best"] = draw(st.sampled_from(["smallest", "fastest", "", 3]))
            tables.append(table)
        return tables

    @st.composite
    def files(draw):
        data = copy.deepcopy(base)
        for key in draw(st.lists(st.sampled_from(keys), max_size=4, unique=True)):
            section, _, leaf = key.partition(".")
            data[section][leaf] = draw(_values_for(key))
        data["sweeps"] = draw(sweeps())
        if not data["sweeps"]:
            del data["sweeps"]
        try:
            raw = tomli_w.dumps(data).encode()
        except (TypeError, ValueError):
            raw = b"schema_version = 1\n"
        how = draw(st.sampled_from(["as is", "bom", "cut", "insert", "flip", "deep"]))
        at = draw(st.integers(0, max(0, len(raw) - 1)))
        if how == "bom":
            raw = b"\xef\xbb\xbf" + raw
        elif how == "cut":
            raw = raw[:at]
        elif how == "insert":
            raw = raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
        elif how == "flip" and raw:
            raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1:]
        elif how == "deep":
            depth = draw(st.sampled_from([31, 33, 1000, 50_000]))
            raw += b"\ndeep = " + b"[" * depth + b"]" * depth + b"\n"
        return raw

    f = tmp_path / "p.qstudio"
    seen = {"loaded": 0, "refused": 0, "cases": 0, "slowest": 0.0}

    @hsettings(max_examples=EXAMPLES, deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(files())
    def check(raw):
        f.write_bytes(raw)
        started = time.monotonic()
        try:
            p = pf.load(f)
        except StudioError as exc:
            assert "\n" not in exc.message and len(exc.message) < 600, exc.message
            seen["refused"] += 1
        else:
            assert pf.from_dict(p.to_dict()) == pf.from_dict(p.to_dict())
            seen["loaded"] += 1
        took = time.monotonic() - started
        seen["cases"] += 1
        seen["slowest"] = max(seen["slowest"], took)
        assert took < SLOWEST_S, f"{took:.2f} s to read a {len(raw)}-byte file"

    started = time.monotonic()
    check()
    print(f"{seen['cases']} generated files in {time.monotonic() - started:.1f} s: "
          f"{seen['loaded']} loaded, {seen['refused']} refused in one line, slowest "
          f"{seen['slowest'] * 1000:.0f} ms")
    assert seen["refused"] and seen["loaded"]


@pytest.mark.parametrize("depth", [33, 999, 100_000])
def test_nesting_is_refused_in_one_line_at_any_depth(tmp_path, depth):
    f = tmp_path / "deep.qstudio"
    f.write_text("schema_version = 1\nx = " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(StudioError, match="nests tables or lists"):
        pf.load(Path(f))
