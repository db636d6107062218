"""The studio's SeqMSE against AIMET's on the sample's prefill graph, where AIMET is present.

``aimet-onnx`` is an optional, large extra (it brings its own CUDA torch), so it lives in its
own virtual environment that sees the studio's packages (``benchmarks/compare_aimet.py``
says how). Point ``QSTUDIO_AIMET_PYTHON`` at that environment's Python to run this test; it
is skipped otherwise. The studio quantizes the session's export at W4A16 per channel with
nearest and with SeqMSE rounding; the script gives AIMET the same graph, calibration windows
and held-out text and scores all four on the host against FP32.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.conftest import share_store, studio
from tests.conftest import ROOT

AIMET_PYTHON = os.environ.get("QSTUDIO_AIMET_PYTHON", "")

pytestmark = pytest.mark.skipif(
    not AIMET_PYTHON, reason="QSTUDIO_AIMET_PYTHON names no Python with aimet-onnx "
    "(benchmarks/compare_aimet.py says how to install it)")


def _quantized(sample_export: Path, folder: Path, rounding: str) -> Path:
    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.services.history import current_keys

    f = folder / f"{rounding}.qstudio"
    f.write_text(sample_export.read_text().replace('scheme = "W8A16"', 'scheme = "W4A16"')
                 .replace("calibration_samples = 2", "calibration_samples = 8")
                 .replace("[quantization]\n", f'[quantization]\nweight_rounding = "{rounding}"'
                                                "\nrounding_samples = 8\n", 1))
    share_store(sample_export, f, stages={"export"})
    r = studio("--batch", f, "--stages", "quantize", "--quiet")
    assert r.returncode == 0, r.stderr
    p = pf.load(f)
    return ArtifactStore(p.folder / "artifacts").get(current_keys(p, ["quantize"])[
        "quantize"]).path


def test_the_studios_seqmse_lands_where_aimets_does(sample_export, tmp_path):
    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.services.history import current_keys

    p = pf.load(sample_export)
    export = ArtifactStore(p.folder / "artifacts").get(current_keys(p, ["export"])["export"]).path
    near, seq = (_quantized(sample_export, tmp_path, r) for r in ("nearest", "seqmse"))
    out = tmp_path / "aimet.json"
    r = subprocess.run([AIMET_PYTHON, str(ROOT / "benchmarks" / "compare_aimet.py"), str(export),
                        "--studio", f"nearest={near}", "--studio", f"seqmse={seq}",
                        "--tokens", "128", "--json", str(out)],
                       capture_output=True, text=True, timeout=1800,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = {row["variant"]: row for row in data["rows"]}
    kl = {k: v["kl_divergence"] for k, v in rows.items()}
    # both SeqMSEs cut the KL of their own nearest / min-max rounding, and the studio's lands
    # within a quarter of AIMET's
    assert kl["studio seqmse"] < kl["studio nearest"] and kl["AIMET seqmse"] < kl["AIMET min-max"]
    assert abs(kl["studio seqmse"] / kl["AIMET seqmse"] - 1) < 0.25, kl
    (scales,) = [s for s in data["scales"] if s["studio"] == "seqmse"]
    assert scales["weights"] > 20 and 0.9 < scales["median_ratio"] < 1.1, scales
