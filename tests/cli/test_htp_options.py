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
    # compiled twice with the same options (once by the session, once as level 2): identical
    assert o2 == default
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
