"""What every device kind is made of: :class:`Device` (one device, the labels of its figures
from its kind), :class:`DeviceKind` (a kind's declaration), the table of registered kinds,
the one parser of device ids (:func:`device`) and :class:`DeviceBackend`, what a kind's
engine module implements.

A kind's own facts live in its declaration (``studio/core/devices/<kind>.py``, or inline in
its registration in ``studio/core/devices/__init__.py``); what differs between kinds is a field
or a method of :class:`DeviceKind` that the kind's declaration sets or overrides, never a
branch on the kind's name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from studio.core.catalog import get_chip
from studio.core.errors import StudioError


@dataclass(frozen=True)
class Device:
    kind: str  # a registered kind: host-cpu | htp-sim | htp | agent | adb | local-ort | ...
    id: str  # "cpu", "htp-sim:snapdragon-8-gen-3", "agent:lab@htp-sim:snapdragon-8-gen-3",
    # "adb:SERIAL@snapdragon-8-gen-3", "htp:snapdragon-8-gen-3" (this machine's own NPU)
    chip: str = ""  # catalog key for HTP devices
    name: str = ""

    @property
    def decl(self) -> DeviceKind:
        return kind_decl(self.kind)

    @property
    def remote(self) -> Device | None:
        """The device that runs this one's work on another machine, as that machine sees it
        (an agent's backend: its host CPU, its HTP simulator or NPU); None otherwise."""
        return self.decl.remote_device(self)

    @property
    def source(self) -> str:
        """The label of every figure this device produces (timings and numerics): a device
        run through another (an agent) labels as that one (its HTP simulator ``simulated``,
        its CPU and a real NPU ``measured``)."""
        there = self.remote
        return there.source if there is not None else self.decl.source

    @property
    def on_npu(self) -> bool:
        there = self.remote
        return there.on_npu if there is not None else self.decl.on_npu

    @property
    def runs_genie(self) -> bool:
        """Whether Genie runs a bundle on this device here (the HTP simulator)."""
        return self.decl.runs_genie

    @property
    def runs(self) -> str:
        """The role of the stage whose artifact this device runs beside the export:
        ``compile`` (a chip's compiled context), ``quantize`` (the quantized graphs, where
        the kind says so) or ``export`` (the FP32 export alone)."""
        return self.decl.runs or ("compile" if self.chip else "export")

    @property
    def timing_note(self) -> str:
        return self.decl.device_timing_note(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DeviceBackend(Protocol):
    """What runs work on a device of one kind: one class per kind in
    ``studio/engine/devices/<module>.py`` (its :class:`DeviceKind` names the module), made by
    ``studio.engine.devices.backend(device)``. Stages and services ask it; they never branch
    on the kind. Folders are artifacts: ``export`` (FP32 graphs and ``graph.json``),
    ``compiled`` (what the device runs beside the export, :attr:`Device.runs`: a target's
    compiled context, the quantized graphs; ``None`` for a device that runs the export)."""

    device: Device
    #: the QNN HTP backend's run-time options for the sessions it opens (``{}``: the
    #: backend's defaults), e.g. ``{"htp_performance_mode": "burst"}``
    run_options: dict[str, str]

    @property
    def source(self) -> str:
        """The source label of the figures it produces (the device's)."""
        ...

    @property
    def timing_note(self) -> str:
        """What its timings are (the device's note)."""
        ...

    def check(self) -> None:
        """The device is reachable and set up; a one-line StudioError says what to do."""
        ...

    def check_known(self) -> None:
        """The device is one this machine knows, checked without reaching it (before any
        stage runs: an agent must be in the device registry, with its token); a one-line
        StudioError says what to do."""
        ...

    def versions(self) -> dict[str, str]:
        """The SDK / runtime it runs with (names -> versions; {} when unknown)."""
        ...

    def upload(self, folder: Path, names: list[str]) -> str:
        """Put ``names`` of ``folder`` where the device runs them; returns what names the
        uploaded model there (the folder itself for a local device)."""
        ...

    def describe(self, scheme: str) -> str:
        """What a generation runs on it, for summaries (``W8A16 on the HTP simulator …``)."""
        ...

    def doctor_checks(self, project: Any, sdk: tuple[str | None, str]) -> list:
        """``studio doctor --device``: the device's findings (:class:`studio.core.checks.
        Check`) against the project and ``sdk`` (its binaries' QNN SDK build, and where it
        was read)."""
        ...

    def tensor_runner(self) -> Any:
        """``run(graph, names, feeds, fp16, work)`` running a layer diff's HTP side on the
        device (``studio bisect --device``); a one-line StudioError where it runs none."""
        ...

    def check_generation(self, speculative: bool, window: bool, kv: str | None,
                         project_kv: str) -> None:
        """Refuse decoding options the device cannot run (one line saying which)."""
        ...

    def open_generator(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                       fp16: bool, log: Callable[[str], None] | None = None) -> Any:
        """An LLM generator (``greedy`` / ``generate`` of
        :class:`studio.engine.llm_runtime.StaticKVGenerator`) over the device's graphs."""
        ...

    def open_encoder(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                     fp16: bool) -> Any:
        """A vision-language model's vision encoder on the device (a session: ``run(names,
        {"pixel_values": ...})``); None where the device runs it within its generation job
        (an agent: the generator's ``set_pixels`` sends the image with the prompt); a
        one-line StudioError where the device runs none."""
        ...

    def part_scorer(self, compiled: Path, spec: dict[str, Any], fp16: bool) -> Any:
        """For a model in parts: teacher-forced logits with one part's compiled graphs loaded
        at a time (``teacher_forced_logits`` of
        :class:`studio.engine.part_runner.StreamedScorer`), or None where the device runs the
        parts only chained."""
        ...

    def run_figures(self, out: dict[str, Any], gen: Any) -> tuple[dict[str, Any], str, str]:
        """A run stage's generation as the device's figures: (timings, metric name prefix,
        note) — the prefix names timings that are not the graph's latency."""
        ...

    def generation_figures(self, out: dict[str, Any], gen: Any) -> tuple[dict[str, Any], str]:
        """A generation (``studio generate``) as the device's figures: (its result with
        ``ttft_s``, the timing note)."""
        ...

    def open_session(self, graph: Path, compiled: Path | None, strict: bool) -> Any:
        """An ONNX Runtime-like session of a graph model: the FP32 ``graph`` on a device
        that runs it as is, the ``compiled`` context on an NPU."""
        ...

    def profile_decode_steps(self, compiled: Path, spec: dict[str, Any], folder: Path,
                             repeats: int, fp16: bool, progress: Any
                             ) -> Iterator[tuple[dict[str, Any], float]]:
        """``repeats`` profiled decode steps of a compiled LLM context, each as (the profile
        run's info — ``csv``, ``op_trace``, ``level``, ``source`` —, the other load of the host
        it ran on), written under ``folder``."""
        ...

    def profile_inferences(self, compiled: Path, feed: dict[str, Any], folder: Path,
                           repeats: int, strict: bool, progress: Any
                           ) -> Iterator[tuple[dict[str, Any], float]]:
        """``repeats`` profiled inferences of a compiled graph model on ``feed``, as
        :meth:`profile_decode_steps`."""
        ...


@dataclass(frozen=True)
class DeviceKind:
    """One device kind, declared once: adding a kind is its declaration, registered by one
    line in ``studio/core/devices/__init__.py`` (:func:`register_kind`), plus its backend
    module ``studio/engine/devices/<module>.py`` (running work, listing its devices).

    A kind whose ids need no rule of their own (an alias such as ``local-ort``) is declared
    with its fields alone; a kind with its own id grammar or device behaviour (an agent, a
    phone) subclasses it in a module of this package and overrides :meth:`make`,
    :meth:`remote_device`, :meth:`device_timing_note` or :meth:`check_form`."""

    kind: str
    source: str  # the label of its figures (an agent's are its backend's)
    module: str  # its backend: studio.engine.devices.<module> (a dotted path: any module)
    prefix: str = ""  # the start of its ids ("agent:"); "" for ids matched exactly (aliases)
    # an id (and the project's chips) -> its Device; None: the kind's own rule (make)
    parse: Callable[[str, list[str] | None], Device] | None = None
    on_npu: bool = False
    timing_note: str = ""
    aliases: tuple[str, ...] = ()  # ids that name it whole ("cpu")
    form: str = ""  # how its ids read, for errors
    runs_genie: bool = False  # Qualcomm's Genie runs a bundle on it here
    title: str = ""  # what people call it ("host CPU"): its device's name, where it lists
    # the stages that fan out over devices (fan_out "device") which its devices run
    stages: tuple[str, ...] = ()
    # the role of the stage whose artifact it runs beside the export (``quantize``); "": a
    # chip's compiled context where its device has a chip, the export alone where not
    runs: str = ""
    # the bare name run.devices and --device take ("cpu", "htp-sim"); for a kind of one
    # device per chip (per_chip) it names the project's targets' (its first for --device)
    shorthand: str = ""
    per_chip: bool = False
    default: bool = False  # in a new project's run.devices (by its shorthand)
    project_ids: bool = False  # run.devices may name its ids one by one ("agent:lab")
    # its devices are other machines (an agent, a phone): the Devices page runs on them
    elsewhere: bool = False

    def make(self, device_id: str, chips: list[str] | None = None) -> Device:
        """The device ``device_id`` (an id of this kind) names; ``chips``: the project's
        targets, where an id may leave its chip to them."""
        if self.parse is not None:
            return self.parse(device_id, chips)
        if self.per_chip:
            chip = device_id[len(self.prefix):] if self.prefix else ""
            if not chip:
                raise StudioError(f"device {device_id!r}: name the chip, e.g. "
                                  f"{self.prefix or self.kind + ':'}snapdragon-8-gen-3")

            c = get_chip(chip)
            return Device(self.kind, f"{self.prefix}{c.key}", c.key, f"{self.title} ({c.name})")
        return Device(self.kind, self.aliases[0] if self.aliases else device_id, "",
                      self.title or device_id)

    def matches(self, device_id: str) -> bool:
        return device_id in self.aliases or bool(self.prefix and device_id.startswith(
            self.prefix))

    def check_form(self, device_id: str) -> None:
        """Check an id's form where the project may complete it (run.devices): StudioError
        with the form to use."""
        self.make(device_id)

    def remote_device(self, dev: Device) -> Device | None:
        """The device that runs ``dev``'s work on another machine (an agent's backend)."""
        return None

    def device_timing_note(self, dev: Device) -> str:
        return self.timing_note


# Every registered kind, by name (filled by studio/core/devices/__init__.py)
DEVICE_KINDS: dict[str, DeviceKind] = {}
# kind -> the source label of its figures (an agent's depends on its backend, see Device)
KINDS: dict[str, str] = {}


def register_kind(decl: DeviceKind) -> None:
    """Declare a device kind (its backend module implements :class:`DeviceBackend`)."""
    DEVICE_KINDS[decl.kind] = decl
    KINDS[decl.kind] = decl.source


def kind_decl(kind: str) -> DeviceKind:
    try:
        return DEVICE_KINDS[kind]
    except KeyError:
        raise StudioError(f"unknown device kind {kind!r}; known: "
                          f"{', '.join(DEVICE_KINDS)}") from None


def backend_module(kind: str) -> str:
    """The module of a kind's backend (``studio.engine.devices.<module>``, or a dotted path)."""
    module = kind_decl(kind).module
    return module if "." in module else f"studio.engine.devices.{module}"


def device(device_id: str, chips: list[str] | None = None) -> Device:
    """The device a job's id names (``cpu``, ``htp-sim:CHIP``, ``agent:NAME[@BACKEND]``;
    ``adb:SERIAL[@CHIP]``; ``htp-sim/CHIP`` from older run histories): the one parser of
    device ids. ``chips``: the project's targets, which name an adb phone's chip when the id
    does not."""
    device_id = device_id or ""
    for k in DEVICE_KINDS.values():
        if k.matches(device_id):
            return k.make(device_id, chips)
    kind, _, chip = device_id.partition("/")  # "htp-sim/CHIP" of older run histories
    old = DEVICE_KINDS.get(kind)
    if chip and old is not None and old.per_chip and old.prefix:
        return old.make(f"{old.prefix}{chip}", chips)
    forms = [k.form for k in DEVICE_KINDS.values() if k.form]
    raise StudioError(f"unknown device {device_id!r}: use {', '.join(forms[:-1])} or "
                      f"{forms[-1]}")
