"""The HTP toolchain's options as recipe settings (``[htp]``): validated in one line, baked
into the compile (and its key), and judged by the HTP compiler's own figures of a decode step
(optrace: DRAM and VTCM bytes, DMA ops, HTP ops, the binary's size) — deterministic, so an
optimization level compares exactly where the simulator's cycles do not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.core import project as pf
from studio.core.errors import StudioError
from tests.cli.conftest import share_store, studio

pytestmark = pytest.mark.slow


def _profile(project: Path) -> dict:
    """The stored profile result of the project's current settings."""
    from studio.core.artifacts import ArtifactStore
    from studio.services.history import current_keys

    p = pf.load(project)
    keys = current_keys(p, ["profile"])
    label = next(k for k in keys if k.startswith("profile[htp-sim"))
    art = ArtifactStore(p.folder / "artifacts").get(keys[label])
    assert art is not None, label
    return json.loads((art.path / "result.json").read_text())


def _figures(result: dict) -> dict[str, float]:
    return {m["name"]: m["value"] for m in result["metrics"] if m["name"].startswith("compiler_")}


@pytest.fixture(scope="module")
def levels(batch_run, small_project, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """The small project's profile at the backend's default optimization (the session's
    batch), then one project compiled here from the session's quantized graph at
    optimization level 1 and, re-run in the same folder, level 2 (two runs of its history)."""
    out = {"default": (small_project, _profile(small_project))}
    f = tmp_path_factory.mktemp("levels") / "o.qstudio"
    share_store(small_project, f, stages={"export", "quantize"})
    for level in (1, 2):
        f.write_text(small_project.read_text() + f"\n[htp]\noptimization_level = {level}\n")
        r = studio("--batch", f, "--stages", "profile")
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"htp_graph_finalization_optimization_mode={level}" in r.stderr  # compile says
        out[f"O{level}"] = (f, _profile(f))
    return out


def test_the_compiler_figures_are_recorded_and_deterministic(levels):
    """Every profile records the compiler's figures, labelled measured on the HTP compiler
    (not the simulator's noisy cycles); level 2 is the backend's default (the same binary and
    the same figures, compiled twice), level 1 gives another graph (fewer HTP ops, less VTCM
    traffic measured on the sample)."""
    default, o1, o2 = (_figures(levels[k][1]) for k in ("default", "O1", "O2"))
    assert set(default) == {"compiler_dram_bytes_per_step", "compiler_vtcm_bytes_per_step",
                            "compiler_dma_ops_per_step", "compiler_htp_ops",
                            "compiler_binary_bytes", "compiler_vtcm_peak_bytes",
                            "compiler_spill_fill_ops"}
    # the VTCM the graph uses stays within the chip's (8 MB on the default chip)
    assert 0 < default["compiler_vtcm_peak_bytes"] <= 8 << 20
    m = next(m for m in levels["default"][1]["metrics"] if m["name"] == "compiler_htp_ops")
    assert (m["source"], m["device"]) == ("measured", "htp-compiler")
    assert "deterministic" in m["detail"] and "default options" in m["detail"]
    assert default["compiler_dram_bytes_per_step"] > 1e6 and default["compiler_dma_ops_per_step"]
    # compiled twice with the same options (once by the session, once as level 2): the same
    # figures; the binary's size only within the few bytes of its graph's name, which the
    # QNN EP makes from a hash of the model file's path (a decimal of 19 or 20 digits)
    size = "compiler_binary_bytes"
    assert {k: v for k, v in o2.items() if k != size} == \
        {k: v for k, v in default.items() if k != size}
    assert abs(o2[size] - default[size]) <= 8
    assert o1["compiler_htp_ops"] < default["compiler_htp_ops"]
    assert o1 != default
    print(f"\ncompiler figures: default {default}\n  level 1 {o1}")


def test_compare_shows_the_compiler_figures_of_two_levels(levels):
    """`studio compare` on the two runs (level 1, then 2): the setting that changed and the
    compiler's figures side by side, fewer bytes marked better, the op count neutral."""
    f, _ = levels["O2"]
    r = studio("compare", f, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert [(c["key"], c["a"], c["b"]) for c in got["settings"]] == [
        ("htp.optimization_level", 1, 2)]
    rows = {m["name"]: m for m in got["metrics"]}
    ops = rows["compiler_htp_ops"]
    assert ops["a"] < ops["b"] and ops["better"] is None  # neither better nor worse
    vtcm = rows["compiler_vtcm_bytes_per_step"]
    assert vtcm["source"] == "measured" and vtcm["better"] == (vtcm["b"] < vtcm["a"])


@pytest.mark.parametrize("body, needle", [
    ("optimization_level = 4", "htp.optimization_level must be between 0 and 3, not 4"),
    ("vtcm_mb = 100", "htp.vtcm_mb must be between 0 and 64, not 100"),
    ("fp16_relaxation = 1", "htp.fp16_relaxation must be a bool"),
    ("spill_fill = true", "spill_fill"),
    ('graph_io = "int8"', "htp.graph_io = 'int8' is not one of float, quantized"),
    ('performance_mode = "turbo"', "htp.performance_mode = 'turbo' is not one of burst,"),
])
def test_bad_htp_settings_give_one_line(tmp_path, body, needle):
    f = tmp_path / "p.qstudio"
    f.write_text(f'schema_version = 1\n[model]\nsource = "sample:tiny-coder"\n[htp]\n{body}\n')
    with pytest.raises(StudioError) as err:
        pf.load(f)
    assert needle in err.value.message and "\n" not in err.value.message


def test_a_vtcm_budget_over_the_chips_is_refused_at_compile(small_project, tmp_path):
    f = tmp_path / "v.qstudio"
    f.write_text(small_project.read_text() + "\n[htp]\nvtcm_mb = 64\n")
    share_store(small_project, f, stages={"export", "quantize"})
    r = studio("--batch", f, "--stages", "compile")
    assert r.returncode == 2
    assert "htp.vtcm_mb = 64 is more than the 8 MB of VTCM Snapdragon 8 Gen 3 has" in r.stderr


def test_the_docs_list_every_setting_and_every_knob_not_exposed():
    from studio.core.settings import NOT_EXPOSED, SECTION_KEYS

    doc = (Path(__file__).parents[2] / "docs" / "htp-options.md").read_text()
    assert all(f"`htp.{k}`" in doc for k in SECTION_KEYS["htp"])
    assert all(f"| {k} |" in doc for k in NOT_EXPOSED)


def _share(project: Path, block: str) -> tuple[float, float]:
    """(share of ``block`` in the decode step, the step's median cycles) of the newest
    profile: shares compare across runs, cycles only on a quiet host."""
    r = studio("profile", "show", project, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    return got["by_block"][block]["share"], got["stats"]["median"]


@pytest.fixture(scope="module")
def float_io(batch_run, small_project, tmp_path_factory) -> tuple[Path, dict]:
    """The small project compiled with float graph I/O (the opt-out: quantized I/O is the
    default) from the session's quantized graphs, validated, run and profiled on the
    simulator (in the HTP's burst mode)."""
    f = tmp_path_factory.mktemp("graph-io") / "io.qstudio"
    share_store(small_project, f, stages={"export", "quantize"})
    f.write_text(small_project.read_text() + '\n[htp]\ngraph_io = "float"\n'
                 'performance_mode = "burst"\n')
    r = studio("--batch", f, "--stages", "validate,run,profile", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    return f, json.loads(r.stdout)


def test_quantized_graph_io_is_the_default_and_cuts_the_edge_conversions(
        float_io, small_project, batch_run):
    """The KV cache and the hand-offs as the NPU's integers by default: validation's gates
    pass on the simulator (the host keeps the cache as 16-bit integers), the deployable
    binaries record the cache's encodings an app feeds them with, and the decode step's Q/DQ
    share is far below float I/O's (shares within each profile: the simulator's cycles follow
    host load)."""
    from studio.core.artifacts import ArtifactStore
    from studio.core.settings import Htp
    from studio.engine.deploy import read
    from studio.services.history import current_keys

    assert Htp.default("graph_io") == "quantized"
    jobs = {j["stage"]: j for j in batch_run[1]["jobs"]}
    assert "graph I/O quantized" in jobs["compile"]["summary"]
    assert all(g["passed"] for g in batch_run[1]["gates"]), batch_run[1]["gates"]
    p = pf.load(small_project)
    keys = current_keys(p, ["compile"])
    art = ArtifactStore(p.folder / "artifacts").get(
        keys[next(k for k in keys if k.startswith("compile"))])
    rec = read(art.path)
    assert rec["graph_io"] == "quantized" and rec["kv_cache"]["dtype"] == "uint16"
    (enc,) = rec["kv_cache"]["encodings"]
    assert all(e["dtype"] == "uint16" and e["scale"] > 0 for e in enc.values())
    assert not (art.path / "genie-staging").exists()  # the staged graphs are not kept
    f, summary = float_io
    assert "graph I/O quantized" not in {j["stage"]: j for j in summary["jobs"]}["compile"][
        "summary"]
    assert all(g["passed"] for g in summary["gates"]), summary["gates"]
    io_share, io_cycles = _share(small_project, "data movement / Q-DQ")
    float_share, float_cycles = _share(f, "data movement / Q-DQ")
    assert io_share < float_share / 2, (io_share, float_share)
    print(f"\nQ/DQ share of the decode step: float I/O {float_share:.1%} "
          f"({float_cycles:,.0f} cycles), quantized I/O {io_share:.1%} ({io_cycles:,.0f})")


def test_the_performance_mode_is_a_run_setting_the_sessions_take(float_io):
    """htp.performance_mode (an unknown one: test_bad_htp_settings_give_one_line): declared
    by the run and profile stages, not by the compile (the binaries do not change with it);
    the run stage says the mode its HTP sessions ran with (the CPU has no HTP to vote for)."""
    from studio.core.stagegraph import DECLARATIONS

    declared = {d.name: d.settings for d in DECLARATIONS}
    assert "htp.performance_mode" in declared["run"] and "htp.performance_mode" in \
        declared["profile"] and "htp.performance_mode" not in declared["compile"]
    runs = [j for j in float_io[1]["jobs"] if j["stage"] == "run"]
    sim = next(j for j in runs if "HTP simulator" in j["summary"])
    cpu = next(j for j in runs if "host CPU" in j["summary"])
    assert "performance mode burst" in sim["summary"]
    assert "performance mode" not in cpu["summary"]
