"""Devices: where a job runs, and therefore what its figures are.

A :class:`Device` has a kind (the host CPU, the QNN HTP simulator for one chip, a remote
agent, a phone over adb), an id that names it in jobs and the run history, the chip
it runs (for the HTP kinds) and the source label of what it produces: ``measured`` on real
hardware, ``simulated`` on the simulator. Stages label their figures from the device that
ran them, never by hand.

Each kind is declared once in :data:`DEVICE_KINDS` (:class:`DeviceKind`): the source label of
its figures, how its ids read, its timing note, and the engine module of its backend
(``studio/engine/devices/<module>.py``), which implements :class:`DeviceBackend`. What runs a
job on a device — a generator, a graph session, a profiled step, an upload — is asked of
that backend (``studio.engine.devices.backend(device)``); nothing else branches on a kind.
A device string is parsed here, by :func:`device`, and nowhere else.

The project file lists device *kinds* in ``run.devices`` (``cpu``, ``htp-sim``); the plan
turns each kind into devices (one simulator per target chip) with :func:`project_devices`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from studio.core.errors import StudioError

AGENT_ID = re.compile(r"^agent:([A-Za-z0-9][A-Za-z0-9._-]{0,63})(?:@(cpu|htp-sim:[a-z0-9-]+|"
                      r"htp:[a-z0-9-]+))?$")
ADB_ID = re.compile(r"^adb:([A-Za-z0-9._:-]{1,64}?)(?:@([a-z0-9-]+))?$")
# The names ``run.devices`` accepts, and the kind each stands for.
PROJECT_KINDS: dict[str, str] = {"cpu": "host-cpu", "htp-sim": "htp-sim"}
SIMULATOR_TIME = "simulator time: follows the host CPU, not device latency"


@dataclass(frozen=True)
class Device:
    kind: str  # host-cpu | htp-sim | htp | agent | adb
    id: str  # "cpu", "htp-sim:snapdragon-8-gen-3", "agent:lab@htp-sim:snapdragon-8-gen-3",
    # "adb:SERIAL@snapdragon-8-gen-3", "htp:snapdragon-8-gen-3" (this machine's own NPU)
    chip: str = ""  # catalog key for HTP devices
    name: str = ""

    @property
    def decl(self) -> DeviceKind:
        return kind_decl(self.kind)

    @property
    def agent(self) -> str:
        """An agent's name; "" otherwise."""
        return self.id[len("agent:"):].partition("@")[0] if self.kind == "agent" else ""

    @property
    def backend(self) -> str:
        """An agent's backend (``cpu``, ``htp-sim:CHIP``, ``htp:CHIP``); "" otherwise."""
        return self.id.partition("@")[2] if self.kind == "agent" else ""

    @property
    def remote(self) -> Device | None:
        """For an agent, the device its backend is on the agent's own machine (its host CPU,
        its HTP simulator or NPU); None otherwise."""
        return local_device(self.backend) if self.kind == "agent" else None

    @property
    def source(self) -> str:
        """The label of every figure this device produces (timings and numerics): an agent's
        are those of its backend (its HTP simulator ``simulated``, its CPU and a real NPU
        ``measured``)."""
        return self.remote.source if self.remote is not None else self.decl.source

    @property
    def on_npu(self) -> bool:
        return self.remote.on_npu if self.remote is not None else self.decl.on_npu

    @property
    def runs_genie(self) -> bool:
        """Whether Genie runs a bundle on this device here (the HTP simulator)."""
        return self.decl.runs_genie

    @property
    def serial(self) -> str:
        """An adb phone's serial; "" otherwise."""
        return self.id[len("adb:"):].partition("@")[0] if self.kind == "adb" else ""

    @property
    def timing_note(self) -> str:
        if self.kind == "agent":
            return "timed on the agent's machine" + (
                "; simulator time: follows its CPU, not device latency"
                if self.source == "simulated" else "")
        return self.decl.timing_note

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DeviceBackend(Protocol):
    """What runs work on a device of one kind: one class per kind in
    ``studio/engine/devices/<module>.py`` (its :class:`DeviceKind` names the module), made by
    ``studio.engine.devices.backend(device)``. Stages and services ask it; they never branch
    on the kind. Folders are artifacts: ``export`` (FP32 graphs and ``graph.json``),
    ``compiled`` (a target's compiled context, ``None`` for a device that runs the export)."""

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
        :class:`studio.engine.llm_parts.StreamedScorer`), or None where the device runs the
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
    """One device kind, declared once: adding a kind is one entry in :data:`DEVICE_KINDS`
    (:func:`register_kind`) plus its backend module."""

    kind: str
    source: str  # the label of its figures (an agent's are its backend's)
    module: str  # its backend: studio.engine.devices.<module> (a dotted path: any module)
    prefix: str  # the start of its ids ("agent:"); "" for ids matched exactly (aliases)
    parse: Callable[[str, list[str] | None], Device]  # an id (and the project's chips)
    on_npu: bool = False
    timing_note: str = ""
    aliases: tuple[str, ...] = ()  # ids that name it whole ("cpu")
    form: str = ""  # how its ids read, for errors
    runs_genie: bool = False  # Qualcomm's Genie runs a bundle on it here


HOST_CPU = Device("host-cpu", "cpu", "", "host CPU")


def _chip(key: str):
    from studio.core.catalog import get_chip

    return get_chip(key)


def htp_simulator(chip_key: str) -> Device:
    chip = _chip(chip_key)
    return Device("htp-sim", f"htp-sim:{chip.key}", chip.key, f"HTP simulator ({chip.name})")


def htp_npu(chip_key: str) -> Device:
    """The NPU of this machine (an Arm64 Snapdragon, as an agent runs on): ``htp:CHIP``."""
    chip = _chip(chip_key)
    return Device("htp", f"htp:{chip.key}", chip.key, f"HTP ({chip.name})")


def _chip_id(device_id: str, make: Callable[[str], Device]) -> Device:
    chip = device_id.partition(":")[2]
    if not chip:
        raise StudioError(f"device {device_id!r}: name the chip, e.g. "
                          f"{device_id.partition(':')[0]}:snapdragon-8-gen-3")
    return make(chip)


def agent_device(device_id: str, chips: list[str] | None = None) -> Device:
    """``agent:NAME[@BACKEND]`` (BACKEND ``cpu`` by default, ``htp-sim:CHIP`` or
    ``htp:CHIP``) as a Device."""
    m = AGENT_ID.match(device_id or "")
    if not m:
        raise StudioError(f"device {device_id!r}: an agent device is agent:NAME, "
                          "agent:NAME@htp-sim:CHIP or agent:NAME@htp:CHIP")
    name, backend = m.group(1), m.group(2) or "cpu"
    there = local_device(backend)
    where = "host CPU" if not there.chip else (
        f"HTP simulator {there.chip}" if there.source == "simulated" else f"HTP {there.chip}")
    return Device("agent", f"agent:{name}@{there.id}", there.chip, f"{where} on agent {name}")


def adb_device(device_id: str, chips: list[str] | None = None) -> Device:
    """``adb:SERIAL[@CHIP]`` as a Device: a phone over adb running the compiled context of
    CHIP (a catalog chip; without one, the project's only target in ``chips``)."""
    m = ADB_ID.match(device_id or "")
    if not m:
        raise StudioError(f"device {device_id!r}: a phone is adb:SERIAL or adb:SERIAL@CHIP "
                          "(the serial adb devices lists)")
    serial, chip_key = m.group(1), m.group(2)
    if not chip_key:
        if not chips or len(chips) != 1:
            raise StudioError(f"device {device_id!r}: name the phone's chip, e.g. "
                              f"adb:{serial}@snapdragon-8-gen-3 (the project has "
                              f"{len(chips or [])} targets)")
        chip_key = chips[0]
    chip = _chip(chip_key)
    return Device("adb", f"adb:{serial}@{chip.key}", chip.key, f"phone {serial} ({chip.name})")


def _adb_form(device_id: str) -> None:
    if not ADB_ID.match(device_id):
        adb_device(device_id)  # raises with the form to use


# Every device kind. A new kind: one entry here (or register_kind) and its backend module.
DEVICE_KINDS: dict[str, DeviceKind] = {d.kind: d for d in (
    DeviceKind("host-cpu", "measured", "host_cpu", "", lambda _i, _c: HOST_CPU,
               aliases=("cpu", "host-cpu"), form="cpu"),
    DeviceKind("htp-sim", "simulated", "htp_sim", "htp-sim:",
               lambda i, _c: _chip_id(i, htp_simulator), on_npu=True,
               timing_note=SIMULATOR_TIME, form="htp-sim:<chip>", runs_genie=True),
    DeviceKind("htp", "measured", "htp_sim", "htp:", lambda i, _c: _chip_id(i, htp_npu),
               on_npu=True, timing_note="timed on this machine's NPU"),
    DeviceKind("agent", "measured", "agent", "agent:", agent_device,
               form="agent:<name>[@backend]"),
    DeviceKind("adb", "measured", "adb", "adb:", adb_device, on_npu=True,
               timing_note=("timed on the phone by qnn-net-run's profiling (this adb path is "
                            "unverified on hardware here)"), form="adb:<serial>[@chip]"),
)}
# the kinds whose ids ``run.devices`` may list one by one (beside PROJECT_KINDS), with the
# check of an id's form (the chip of an adb phone may come from the project's only target)
PROJECT_IDS: dict[str, Callable[[str], Any]] = {"agent": agent_device, "adb": _adb_form}
# kind -> the source label of its figures (an agent's depends on its backend, see Device)
KINDS: dict[str, str] = {k: d.source for k, d in DEVICE_KINDS.items()}


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


def local_device(backend: str) -> Device:
    """What an agent's backend id (``cpu``, ``htp-sim:CHIP``, ``htp:CHIP``) is on the agent's
    own machine."""
    return HOST_CPU if backend == "cpu" else device(backend)


def device(device_id: str, chips: list[str] | None = None) -> Device:
    """The device a job's id names (``cpu``, ``htp-sim:CHIP``, ``agent:NAME[@BACKEND]``;
    ``adb:SERIAL[@CHIP]``; ``htp-sim/CHIP`` from older run histories). ``chips``: the
    project's targets, which name an adb phone's chip when the id does not."""
    device_id = device_id or ""
    for k in DEVICE_KINDS.values():
        if device_id in k.aliases or (k.prefix and device_id.startswith(k.prefix)):
            return k.parse(device_id, chips)
    kind, _, chip = device_id.partition("/")
    if kind == "htp-sim" and chip:
        return htp_simulator(chip)
    forms = [k.form for k in DEVICE_KINDS.values() if k.form]
    raise StudioError(f"unknown device {device_id!r}: use {', '.join(forms[:-1])} or "
                      f"{forms[-1]}")


def check_id(device_id: str) -> None:
    """Check a device id's form, where the project may complete it (an adb phone's chip
    may be the project's only target): StudioError with the form to use."""
    for kind, check in PROJECT_IDS.items():
        if device_id.startswith(DEVICE_KINDS[kind].prefix):
            check(device_id)
            return
    device(device_id)


def check_kinds(kinds: list[str]) -> None:
    for k in kinds:
        form = next((check for kind, check in PROJECT_IDS.items() if isinstance(k, str)
                     and k.startswith(DEVICE_KINDS[kind].prefix)), None)
        if form is not None:
            form(k)
        elif k not in PROJECT_KINDS:
            raise StudioError(
                f"run.devices: unknown device {k!r}; known: {', '.join(PROJECT_KINDS)}, "
                "agent:NAME[@BACKEND] for a registered agent and adb:SERIAL[@CHIP] for a phone"
            )


def project_devices(kinds: list[str], chips: list[str]) -> list[Device]:
    """The devices a project's ``run.devices`` names, the simulator once per target chip;
    a device with a chip of its own (an agent's HTP, a phone) runs a target's compiled
    context only."""
    check_kinds(kinds)
    out: list[Device] = []
    for k in kinds:
        if k in PROJECT_KINDS:
            kind = PROJECT_KINDS[k]
            out.extend([device(k)] if not DEVICE_KINDS[kind].on_npu else
                       [device(f"{DEVICE_KINDS[kind].prefix}{c}") for c in chips])
            continue
        dev = device(k, chips)
        if not dev.chip or dev.chip in chips:
            out.append(dev)
    return out
