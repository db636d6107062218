"""What a stage sees (:class:`StageContext`: its settings, inputs, device and the device's
backend) and the helpers every stage module shares: metrics labelled by their source (from
the device that produced them), a text input read with one-line errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.core.catalog import Chip, get_chip
from studio.core.devices import Device, DeviceBackend, htp_simulator
from studio.core.errors import StudioError
from studio.core.fsutil import read_input
from studio.core.keys import StageSettings
from studio.core.metrics import Metric
from studio.core.partcache import PartCache
from studio.core.progress import Progress
from studio.core.stagegraph import STAGES, StageConfig
from studio.core.stages.run import HtpRun
from studio.engine.devices import backend, run_options
from studio.worker.parts import Part, PartsConfig, Say, run_parts


@dataclass
class StageContext:
    """What a stage sees: its frozen config (only the settings its key hashes), its input
    artifacts, the folder it writes, and (for stages that read it) the run history."""

    config: StageConfig
    inputs: dict[str, Path]  # upstream job label -> artifact folder
    out: Path
    history: dict[str, Any] = field(default_factory=dict)
    facts: list[dict[str, Any]] = field(default_factory=list)  # run facts, not artifact content
    # finished parts by part key (a part-by-part stage run by the pipeline), and what the
    # part keys add to tell the stage's code and tool versions apart
    parts: PartCache = field(default_factory=lambda: PartCache(None))
    part_salt: str = ""
    #: how the stage's parts run: set by the executor that runs the stage
    parts_config: PartsConfig = field(default_factory=PartsConfig)

    def run_parts(self, parts: list[Part], progress: Progress, say: Say, at_once: int = 1):
        """Run the stage's sub-work (its parts) where its executor says
        (:mod:`studio.worker.parts`); yields (index, result) as each part finishes."""
        return run_parts(parts, self.parts_config, progress, say, at_once)

    @property
    def settings(self) -> StageSettings:
        """The stage's settings, as its declared class (a stage module reads its own class:
        ``QuantizeSettings.of(ctx.config)``, typed)."""
        return STAGES[self.config.stage].settings_class.of(self.config)

    @property
    def target(self) -> str:
        return self.config.item

    def input(self, stage: str, target: str = "") -> Path:
        label = f"{stage}[{target}]" if target else stage
        if label not in self.inputs:
            raise StudioError(f"stage input {label} is missing: run the pipeline from the start")
        return self.inputs[label]

    def device_input(self) -> Path | None:
        """What the job's device runs beside the export (:attr:`Device.runs`): its chip's
        compiled context, or the quantized graphs for a kind that runs them; None for a
        device that runs the export alone. Found among the job's inputs by the role of the
        stage that made it (the plan gave the job that input)."""
        dev = self.device
        if dev.runs == "export":
            return None
        for label, folder in self.inputs.items():
            stage, _, item = label.partition("[")
            decl = STAGES.get(stage)
            if decl is not None and decl.role == dev.runs and item.rstrip("]") == (
                    dev.chip if decl.fan_out == "target" else ""):
                return folder
        raise StudioError(f"stage input {dev.runs}{f'[{dev.chip}]' if dev.chip else ''} is "
                          "missing: run the pipeline from the start")

    @property
    def chip(self) -> Chip:
        return get_chip(self.config.chip)

    @property
    def device(self) -> Device:
        """The device this job runs on: its own for device stages, the chip's simulator for
        per-target stages."""
        return self.config.device or htp_simulator(self.config.chip)

    @property
    def backend(self) -> DeviceBackend:
        """What runs work on :attr:`device` (``studio/engine/devices``)."""
        s = self.settings
        mode = s.performance_mode if isinstance(s, HtpRun) else ""
        return backend(self.device, run_options=run_options(mode))

    def device_metric(self, name: str, value: float, unit: str, detail: str = ""
                      ) -> dict[str, Any]:
        """A figure this job's device produced, labelled from it."""
        return device_metric(self.device, name, value, unit, detail)

    def fact(self, name: str, value: float, unit: str, detail: str = "") -> None:
        """A run fact (e.g. how long the stage took): kept in the run history only."""
        self.facts.append(metric(name, value, unit, "measured", "host-cpu", self.config.chip,
                                  detail))


#: the longest calibration or held-out text read (whole, into memory)
MAX_TEXT_BYTES = 64 << 20


def read_text(path: Path, what: str) -> str:
    """A text input: a regular file (see :func:`studio.core.fsutil.read_input`) of UTF-8
    text with some content, or one line."""
    raw = read_input(path, MAX_TEXT_BYTES, f"the {what}")
    if b"\0" in raw:
        raise StudioError(f"the {what} {path} is a binary file, not text: give a UTF-8 text "
                          "file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise StudioError(f"the {what} {path} is not UTF-8 text") from None
    if not text.strip():
        raise StudioError(f"the {what} {path} is empty: give a text file with some content")
    return text


def metric(name: str, value: float, unit: str, source: str, device: str, target: str = "",
            detail: str = "") -> dict[str, Any]:
    return Metric(name, float(value), unit, source, device, target, detail).to_dict()


def host_metric(name: str, value: float, unit: str = "", detail: str = "") -> dict[str, Any]:
    """A figure measured on this host's CPU."""
    return metric(name, value, unit, "measured", "host-cpu", "", detail)


def device_metric(dev: Device, name: str, value: float, unit: str, detail: str = "",
                   ) -> dict[str, Any]:
    """A figure produced on ``dev``: its source label comes from the device."""
    return metric(name, value, unit, dev.source, dev.kind, dev.chip, detail)
