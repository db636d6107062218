"""A phone over adb (``adb:SERIAL@CHIP``) with the user's QAIRT SDK: the target's compiled
context runs through ``qnn-net-run``, one call per pass (the context is loaded each time);
its figures are the phone's own execute times from qnn-net-run's profiling (``measured``).
UNVERIFIED ON HARDWARE: see :mod:`studio.engine.devices.adb_phone`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from studio.core.catalog import get_chip
from studio.core.checks import FAIL, PASS, WARN, Check
from studio.core.devices import DeviceKind
from studio.core.devices.adb import serial_of
from studio.core.errors import StudioError
from studio.core.units import format_bytes
from studio.engine import deploy, deployed, profiling
from studio.engine.deployed import decode_context
from studio.engine.device_registry import Registry
from studio.engine.devices._base import Backend as _Base
from studio.engine.devices.adb_phone import UNVERIFIED, Adb, AdbPhone, chip_of
from studio.engine.genie import BundleRunner
from studio.engine.llm_runtime import StaticKVGenerator

ROUND_TRIPS = ("adb round trips (push, context load, run, pull), not the graph's latency: the "
               "SDK has no qnn-profile-viewer to read the phone's own times")


class Backend(_Base):
    probes = True  # adb answers in its own time
    group = "Phones over adb"

    @classmethod
    def listed(cls, decl: DeviceKind, registry: Any, health: bool = False
               ) -> list[dict[str, Any]]:
        """Phones adb sees (``adb devices -l``), each marked unverified on hardware, and
        saying so when no QAIRT SDK is set; one row saying adb is missing when it is."""
        runner = Adb()
        if not runner.available:
            return [{"id": "adb", "kind": decl.kind, "source": "", "note": True,
                     "status": "adb not installed (Android platform-tools): phones are not "
                               "listed"}]
        try:
            devs = runner.devices()
        except StudioError as exc:
            return [{"id": "adb", "kind": decl.kind, "source": "", "note": True,
                     "status": exc.message}]
        if registry is None:
            registry = Registry()
        root, _where = registry.sdk_root()
        sdk = "" if root else "; no QAIRT SDK set: studio devices sdk PATH"
        return [{"id": f"adb:{d.serial}", "kind": decl.kind, "source": decl.source,
                 "serial": d.serial, "ready": d.ready, "model": d.model,
                 "label": f"phone {d.serial}",
                 "status": f"{d.state} {d.model}".strip() + f" ({UNVERIFIED}){sdk}"}
                for d in devs]

    @classmethod
    def choices(cls, row: dict[str, Any], targets: list[str]) -> list[tuple[str, str]]:
        """A ready phone runs a target's compiled context (unverified here)."""
        if row.get("note") or not row.get("ready"):
            return []
        return [(f"phone {row['serial']} · {t} (unverified)", f"adb:{row['serial']}@{t}")
                for t in targets]

    def phone(self, log: Callable[[str], None] | None = None):
        """The phone, with the QAIRT SDK from the settings (a one-line error when none is
        set)."""
        sdk, _where = self.registry.sdk_root()
        return AdbPhone(serial_of(self.device), sdk, get_chip(self.device.chip), log=log)

    def check(self) -> None:
        self.phone()

    def versions(self) -> dict[str, str]:
        sdk, _where = self.registry.sdk_root()
        return {"qairt_sdk": str(sdk)} if sdk else {}

    def doctor_checks(self, project: Any, sdk: tuple[str | None, str]) -> list:
        """``studio doctor --device adb:SERIAL``: listed and ready, its SoC against the
        project's targets, the QAIRT SDK folder, QNN libraries under /vendor/lib64, free
        memory. UNVERIFIED ON HARDWARE: the phone's answers are read as the Android tools
        document them (getprop, /proc/meminfo, the shell's environment)."""
        serial, area = serial_of(self.device), "device"
        adb = Adb()
        if not adb.available:
            return [Check(area, "adb", FAIL, "adb is not installed",
                          "install Android platform-tools and put adb on PATH")]
        try:
            listed = {d.serial: d for d in adb.devices()}
        except StudioError as exc:
            return [Check(area, "adb", FAIL, str(exc), "check the USB cable and adb devices")]
        d = listed.get(serial)
        if d is None or not d.ready:
            return [Check(area, "reachable", FAIL,
                          f"{serial} is {'not listed by adb' if d is None else d.state}",
                          "connect the phone, allow USB debugging, check adb devices")]
        out = [Check(area, "reachable", PASS, f"{serial} {d.model}".strip())]
        props = adb.props(serial)
        chip = chip_of(props)
        if project is not None:
            if chip is None:
                out.append(Check(area, "Hexagon architecture", WARN,
                                 f"the phone's SoC ({props.get('ro.soc.model', '?')}) is not in the "
                                 "chip catalog", "add it to the catalog, or name it: adb:SERIAL@CHIP"))
            elif chip.key not in project.targets:
                out.append(Check(area, "Hexagon architecture", FAIL,
                                 f"the phone is {chip.name} (HTP v{chip.htp_arch}); the project "
                                 f"targets {', '.join(project.targets)}",
                                 f"add {chip.key} to the project's targets and compile for it"))
            else:
                out.append(Check(area, "Hexagon architecture", PASS,
                                 f"{chip.name} (HTP v{chip.htp_arch}), a target of the project"))
        sdk_root, where = self.registry.sdk_root()
        if sdk_root is None:
            out.append(Check(area, "QAIRT SDK", FAIL, "no SDK folder set: the phone runs the SDK's "
                             "qnn-net-run", "studio devices sdk PATH (or QNN_SDK_ROOT)"))
        else:
            out.append(Check(area, "QAIRT SDK", PASS, f"{sdk_root} ({where})"))
        env = adb.shell(serial, "echo $ADSP_LIBRARY_PATH").strip()
        vendor = adb.shell(serial, "ls /vendor/lib64 2>/dev/null | grep -i libQnnHtp; true").split()
        if vendor:
            out.append(Check(area, "library paths", WARN,
                             f"/vendor/lib64 holds {', '.join(vendor[:3])}: an app that does not "
                             "put its own folder first loads the vendor's QNN, whose version may "
                             "differ (QNN 1008)", "set LD_LIBRARY_PATH and ADSP_LIBRARY_PATH with "
                             "the pushed SDK folder first"))
        else:
            out.append(Check(area, "library paths", PASS,
                             f"no QNN libraries under /vendor/lib64; ADSP_LIBRARY_PATH "
                             f"{env or '(unset: the studio sets it per run)'}"))
        mem = adb.shell(serial, "cat /proc/meminfo")
        avail = next((int(ln.split()[1]) * 1024 for ln in mem.splitlines()
                      if ln.startswith("MemAvailable:")), None)
        out.append(Check(area, "memory", PASS if avail else WARN,
                         f"{format_bytes(avail)} available on the phone" if avail else
                         "the phone did not report MemAvailable"))
        return out

    def describe(self, scheme: str) -> str:
        return f"{scheme} on {self.device.name}"

    def check_generation(self, speculative: bool, window: bool, kv: str | None,
                         project_kv: str) -> None:
        if speculative or window:
            raise StudioError("a phone over adb runs plain decoding: leave out --speculative "
                              "and --window for adb devices")
        if (kv or project_kv) != project_kv:
            raise StudioError("a phone runs the project's own compiled graphs: leave out --kv "
                              "for adb devices")

    def open_generator(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                       fp16: bool, log: Callable[[str], None] | None = None) -> Any:
        """A generator whose prefill and decode graphs run on the phone (its sessions are the
        generator's ``prefill_session`` / ``decode_session``)."""
        if compiled is None:
            raise StudioError(f"{self.device.name} runs a compiled context: run the compile "
                              "stage")
        if len(spec.get("parts") or []) > 1:
            raise StudioError(f"{self.device.name} runs one context binary per graph so far, "
                              "and this model is in parts: run it on htp-sim or an agent, or "
                              "export it with export.parts = 1")
        phone = self.phone(log)
        mode = self.run_options.get("htp_performance_mode", "")

        record = deploy.read(compiled)
        if record is not None:  # the deployable binaries, fed as Genie feeds them

            sessions = {ar: [phone.session(p, perf_profile=mode) for p in paths]
                        for ar, paths in deployed.graph_paths(compiled, record).items()}
            gen = deployed.DeployedGenerator(BundleRunner(sessions, spec,
                                                        int(record["context_size"]),
                                                        deployed.cache_encodings(record)), spec)
            gen.prefill_session = sessions[max(sessions)][0]
            gen.decode_session = sessions[1][0]
            return gen
        return StaticKVGenerator(phone.session(Path(compiled) / "prefill_ctx.onnx",
                                               perf_profile=mode),
                                 phone.session(Path(compiled) / "decode_ctx.onnx",
                                               perf_profile=mode), spec)

    def run_figures(self, out: dict[str, Any], gen: Any) -> tuple[dict[str, Any], str, str]:
        timed = device_times(out, gen.prefill_session, gen.decode_session)
        if timed is None:
            return out, "round_trip_", ROUND_TRIPS
        return timed, "", self.timing_note

    def generation_figures(self, out: dict[str, Any], gen: Any) -> tuple[dict[str, Any], str]:
        timed = device_times(out, gen.prefill_session, gen.decode_session)
        if timed is None:  # round trips are not the graph's latency: no figures then
            return ({**out, "ttft_s": None, "step_s": []},
                    "no device times: the SDK has no qnn-profile-viewer to read qnn-net-run's "
                    "profiling logs (adb round trips are not latency)")
        return ({**timed, "ttft_s": timed["prefill_s"]},
                self.timing_note + "; time to first token is the prefill's execute time")

    def profile_decode_steps(self, compiled: Path, spec: dict[str, Any], folder: Path,
                             repeats: int, fp16: bool, progress: Any
                             ) -> Iterator[tuple[dict[str, Any], float]]:
        """qnn-net-run at the detailed level, its profiling log turned into the QNN CSV by the
        SDK's viewer (the phone's load is not measured: 0)."""
        phone = self.phone(progress.log)

        sess = phone.session(decode_context(compiled), profiling="detailed",
                             perf_profile=self.run_options.get("htp_performance_mode", ""))
        sess.profile_dir = Path(folder)
        feeds = profiling.synthetic_feeds(sess, {"position_ids": int(spec["prompt_length"])})
        for i in range(repeats):
            progress.check()
            progress.update(0.05 + 0.8 * i / repeats,
                            f"profiling decode step {i + 1}/{repeats} on phone "
                            f"{serial_of(self.device)}")
            sess.run(None, feeds)
            if sess.last_profile_csv is None:
                raise StudioError("qnn-net-run wrote no profiling log on the phone, or the SDK "
                                  "has no qnn-profile-viewer to read it")
            yield ({"csv": str(sess.last_profile_csv), "op_trace": None, "level": "detailed",
                    "source": self.source}, 0.0)


def device_times(out: dict[str, Any], pre, dec) -> dict[str, Any] | None:
    """A generation's prefill and per-token times as the phone's own execute times (from
    qnn-net-run's profiling logs); None when a pass has none (no profile viewer)."""
    steps = len(out["step_s"])
    log_pre, log_dec = list(pre.execute_log), list(dec.execute_log)
    if not log_pre or any(v is None for v in log_pre + log_dec) or len(log_dec) < steps:
        return None
    extra = log_dec[:len(log_dec) - steps]  # prompt tokens past P go through decode steps
    return {**out, "prefill_s": (sum(log_pre) + sum(extra)) / 1e6,  # type: ignore[arg-type]
            "step_s": [v / 1e6 for v in log_dec[len(log_dec) - steps:]]}  # type: ignore[operator]
