"""What every backend shares: the device's labels, one-line refusals of what a kind does
not run (each backend overrides what its device does), and the listing of a kind's devices
(``studio devices list``, the Devices page: each backend lists its own)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from studio.core.checks import PASS, Check
from studio.core.devices import Device, DeviceKind
from studio.core.errors import StudioError
from studio.engine.device_registry import Registry


class Backend:
    #: listing this kind's devices runs a program (adb): a window lists them off its thread
    probes = False
    #: what a list of this kind's devices is called ("Phones over adb")
    group = ""

    @classmethod
    def listed(cls, decl: DeviceKind, registry: Any, health: bool = False
               ) -> list[dict[str, Any]]:
        """The devices of the kind ``decl`` this machine has or knows (``studio devices
        list``, the Devices page): rows with ``id``, ``kind``, ``source``, ``status`` and
        ``label`` (what people call it); a row with ``note`` says why none is listed.
        ``registry``: the user's device registry and settings. ``health``: ask each device
        how it is (an agent over the network); without it, only what is cheap to know."""
        return []

    @classmethod
    def choices(cls, row: dict[str, Any], targets: list[str]) -> list[tuple[str, str]]:
        """(label, device id) of what a project with ``targets`` can run on through a listed
        ``row``."""
        return [] if row.get("note") else [(row.get("label") or row["id"], row["id"])]

    def __init__(self, device: Device, registry: Any = None,
                 run_options: dict[str, str] | None = None) -> None:
        self.device = device
        self._registry = registry
        # the QNN HTP backend's run-time options for the sessions this backend opens (the
        # project's [htp] performance_mode as htp_performance_mode); each kind applies them
        # its own way
        self.run_options = dict(run_options or {})

    @property
    def registry(self):
        """The user's device registry and settings (agents, the QAIRT SDK folder)."""
        if self._registry is None:
            self._registry = Registry()
        return self._registry

    @property
    def source(self) -> str:
        return self.device.source

    @property
    def timing_note(self) -> str:
        return self.device.timing_note

    def check(self) -> None:
        return None

    def check_known(self) -> None:
        return None

    def versions(self) -> dict[str, str]:
        return {}

    def doctor_checks(self, project: Any, sdk: tuple[str | None, str]) -> list:
        """``studio doctor --device D``: a device of this machine is checked with the
        machine (its packages, the QNN backend)."""
        return [Check("device", self.device.name or self.device.id, PASS,
                      "runs on this machine (its checks are the machine's, above)")]

    def tensor_runner(self):
        """A layer diff's HTP runs on this device (``studio bisect --device``):
        ``run(graph, names, feeds, fp16, work) -> {(feed index, name): array}``."""
        raise StudioError(f"studio bisect --device runs on an agent's HTP "
                          f"(agent:NAME@htp:CHIP or agent:NAME@htp-sim:CHIP), not on "
                          f"{self.device.name or self.device.id}: without --device it runs "
                          "on this machine's HTP simulator")

    def upload(self, folder: Path, names: list[str]) -> str:
        return str(folder)

    def describe(self, scheme: str) -> str:
        return f"{scheme} on the {self.device.name}"

    def check_generation(self, speculative: bool, window: bool, kv: str | None,
                         project_kv: str) -> None:
        return None

    def open_generator(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                       fp16: bool, log: Callable[[str], None] | None = None) -> Any:
        raise StudioError(f"the {self.device.name} runs no language model")

    def open_encoder(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                     fp16: bool) -> Any:
        """A vision-language model's vision encoder as a session (``pixel_values`` ->
        ``image_embeds``) on this device."""
        raise StudioError(f"{self.device.name or self.device.id} runs the language model's "
                          "graphs only: an image prompt's vision encoder runs on the host CPU "
                          "or the HTP simulator (--device cpu or htp-sim)")

    def part_scorer(self, compiled: Path, spec: dict[str, Any], fp16: bool) -> Any:
        return None

    def run_figures(self, out: dict[str, Any], gen: Any) -> tuple[dict[str, Any], str, str]:
        return out, "", self.timing_note

    def generation_figures(self, out: dict[str, Any], gen: Any) -> tuple[dict[str, Any], str]:
        return out, self.timing_note

    def open_session(self, graph: Path, compiled: Path | None, strict: bool) -> Any:
        raise StudioError(f"graph projects run on the host CPU and the HTP simulator, not on "
                          f"{self.device.name}")

    def profile_decode_steps(self, compiled: Path, spec: dict[str, Any], folder: Path,
                             repeats: int, fp16: bool, progress: Any
                             ) -> Iterator[tuple[dict[str, Any], float]]:
        raise StudioError(f"the {self.device.name} has no NPU to profile")

    def profile_inferences(self, compiled: Path, feed: dict[str, Any], folder: Path,
                           repeats: int, strict: bool, progress: Any
                           ) -> Iterator[tuple[dict[str, Any], float]]:
        raise StudioError(f"graph models are profiled on the HTP simulator, not on "
                          f"{self.device.name}")


def compiled_files(folder: Path) -> list[str]:
    """The files of a compiled context folder a remote device needs: the context models,
    their binaries, ``graph.json``, the encodings of quantized graph I/O and the record of
    the deployable binaries (``deploy.json``: the device feeds them as Genie does)."""
    return [p.name for p in sorted(Path(folder).iterdir()) if p.is_file()
            and (p.name.endswith((".onnx", ".bin"))
                 or p.name in ("graph.json", "io_encodings.json", "deploy.json"))]
