"""The QNN HTP backend of this machine: the HTP simulator for a chip on an x86 host
(``htp-sim``, ``simulated``), the NPU itself on an Arm64 Snapdragon (``htp``, ``measured``:
what an agent on a Snapdragon laptop runs). Compiled context binaries run through the QNN
execution provider of ONNX Runtime."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from studio.core.catalog import get_chip
from studio.core.devices import DeviceKind
from studio.core.errors import StudioError
from studio.engine import deploy, deployed, profiling, qnn
from studio.engine.deploy import read
from studio.engine.devices._base import Backend as _Base
from studio.engine.hostload import HostLoadMeter
from studio.engine.llm_runtime import htp_generator, htp_session_maker
from studio.engine.part_runner import StreamedScorer

#: context-binary bytes the x86 HTP simulator holds at once in one process, measured here on
#: the Qwen2.5-3B shape in 9 parts (W8A16, context 128): the first 8 parts' binaries (6.69 GB)
#: loaded, the 9th part's prefill (to 7.08 GB) failed "the QNN HTP has no memory left", after
#: 43 s and 8.5 GiB of the host's memory (the validation's peak); the same shape's two
#: largest parts (2.18 GB) generate
SIM_HOLDS_BYTES = 6_690_000_000


def sim_holds_bytes() -> int:
    """:data:`SIM_HOLDS_BYTES`, or ``QSTUDIO_SIM_HOLDS_BYTES`` where set (a host whose
    simulator holds less or more; tests of the part-by-part checks)."""
    forced = os.environ.get("QSTUDIO_SIM_HOLDS_BYTES", "").strip()
    return int(forced) if forced.isdigit() else SIM_HOLDS_BYTES


def binary_bytes(compiled: Path) -> int:
    """The bytes of the compiled contexts under ``compiled`` (every part's), as loaded."""
    deployed = read(compiled)
    if deployed is not None:  # the separate binaries the simulator runs
        return int(deployed["binary_bytes"])
    return sum(f.stat().st_size for f in Path(compiled).rglob("*")
               if f.is_file() and (f.name.endswith("_ctx.onnx") or f.suffix == ".bin"))


class Backend(_Base):
    @classmethod
    def listed(cls, decl: DeviceKind, registry: Any, health: bool = False
               ) -> list[dict[str, Any]]:
        """The simulator, one per catalog chip, where onnxruntime-qnn is installed (this
        machine's own NPU, ``htp``, is what an agent on a Snapdragon lists)."""
        if decl.source != "simulated":
            return []
        try:
            version("onnxruntime-qnn")
        except PackageNotFoundError:
            return []
        return [{"id": f"{decl.prefix}CHIP", "kind": decl.kind, "source": decl.source,
                 "label": decl.title, "status": "ok (one per catalog chip: studio targets)"}]

    @classmethod
    def choices(cls, row: dict[str, Any], targets: list[str]) -> list[tuple[str, str]]:
        return [(f"{row['label']} · {t}", f"{row['id'].partition(':')[0]}:{t}")
                for t in targets]

    @property
    def chip(self):
        return get_chip(self.device.chip)

    def check(self) -> None:
        if self.device.kind == "htp" and platform.machine().lower() not in (
                "arm64", "aarch64"):
            raise StudioError(f"{self.device.id} is the NPU of an Arm64 Snapdragon, and this "
                              f"machine is {platform.machine()}: use htp-sim:{self.device.chip}")

    def versions(self) -> dict[str, str]:
        return {k: v for k, v in qnn.versions().items() if v}

    def open_generator(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                       fp16: bool, log: Callable[[str], None] | None = None) -> Any:
        self.check()
        if compiled is None:
            raise StudioError(f"the {self.device.name} runs a compiled context: run the "
                              "compile stage")
        parts = len(spec.get("parts") or [])
        if self.device.kind == "htp-sim" and parts > 1:
            # refused before loading what cannot be held: trying costs minutes and GiBs
            held, holds = binary_bytes(compiled), sim_holds_bytes()
            if held > holds:
                raise StudioError(
                    f"the {self.device.name} cannot hold the {parts} parts' context binaries "
                    f"at once ({held / 1e9:.2f} GB; it held {holds / 1e9:.2f} GB, "
                    "measured on the 3 B shape): generating needs every part loaded; "
                    "generate on the host CPU or a device (an agent), validation scores the "
                    "model part by part")

        if deploy.read(compiled) is not None:  # the binaries that ship, fed as Genie feeds them
            return deployed.generator(compiled, self.chip, spec, self.run_options)
        return htp_generator(compiled, self.chip, spec, fp16, self.run_options)

    def open_encoder(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                     fp16: bool) -> Any:
        self.check()
        ctx = Path(compiled or "") / "vision_ctx.onnx"
        if compiled is None or not ctx.is_file():
            raise StudioError(f"the {self.device.name} runs the vision encoder's compiled "
                              "context: run the compile stage (it compiles vision.onnx too)")
        return qnn.make_session(ctx, self.chip, strict=True, fp16=fp16,
                                extra_options=self.run_options)

    def part_scorer(self, compiled: Path, spec: dict[str, Any], fp16: bool) -> Any:
        """The parts' context binaries one part at a time: a model whose binaries do not fit
        the HTP's memory together (the 3 B shape's 18 on the simulator end in "Memory
        allocation related error" while they load) is still scored."""
        self.check()
        if deploy.read(compiled) is not None:
            return deployed.PartScorer(compiled, self.chip, spec, self.run_options)
        return StreamedScorer(compiled, spec, htp_session_maker(self.chip, fp16,
                                                                self.run_options))

    def open_session(self, graph: Path, compiled: Path | None, strict: bool) -> Any:
        self.check()
        if compiled is None:
            raise StudioError(f"the {self.device.name} runs a compiled context: run the "
                              "graph-compile stage")
        return qnn.make_session(compiled, self.chip, strict=strict)

    def profile_decode_steps(self, compiled: Path, spec: dict[str, Any], folder: Path,
                             repeats: int, fp16: bool, progress: Any
                             ) -> Iterator[tuple[dict[str, Any], float]]:
        return self._repeat(repeats, progress, 0.8, "decode step", lambda csv: (
            profiling.profile_decode_step(deployed.decode_context(compiled), self.chip, spec, csv,
                                    fp16=fp16, runs=1, extra_options=self.run_options)), folder)

    def profile_inferences(self, compiled: Path, feed: dict[str, Any], folder: Path,
                           repeats: int, strict: bool, progress: Any
                           ) -> Iterator[tuple[dict[str, Any], float]]:
        return self._repeat(repeats, progress, 0.9, "inference", lambda csv: (
            profiling.profile_run(compiled, self.chip, feed, csv, strict=strict, op_trace=True)),
            folder)

    def _repeat(self, repeats: int, progress: Any, span: float, what: str,
                profile_one: Callable[[Path], dict[str, Any]], folder: Path
                ) -> Iterator[tuple[dict[str, Any], float]]:
        """Profile ``repeats`` times (each into ``qnn_profile_N.csv``), yielding each profile
        with the other processes' CPU load while it ran (the simulator's times follow it)."""
        self.check()
        for i in range(repeats):
            progress.check()
            progress.update(0.05 + span * i / repeats,
                            f"profiling {what} {i + 1}/{repeats} on {self.chip.name}")
            with HostLoadMeter() as meter:
                info = profile_one(Path(folder) / f"qnn_profile_{i + 1}.csv")
            yield info, meter.sample.other_load if meter.sample else 0.0
