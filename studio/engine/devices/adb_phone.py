"""Phones over adb, with the user's QAIRT SDK: find the devices and their SoC, push a compiled
context binary with ``qnn-net-run`` and the HTP libraries, run it, pull the outputs back.

UNVERIFIED ON HARDWARE: no phone can be attached to the machines this is developed on. The
command lines follow the QAIRT documentation of ``qnn-net-run`` (``--backend``,
``--retrieve_context``, ``--input_list``, ``--output_dir``, ``--profiling_level``) and the
output formats of ``adb devices -l`` / ``getprop`` / ``qnn-net-run`` (``Result_N/<output>.raw``);
the tests check the commands built and the parsing of text in those documented formats, not a
run on a phone. The UI says so next to every adb device.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from studio.core.catalog import get_chip
from studio.core.errors import StudioError
from studio.engine.qnn_profile import parse_profile_csv
from studio.engine.qnn_system import context_binary

UNVERIFIED = "adb path unverified on hardware here: no phone was attached when it was built"
REMOTE_ROOT = "/data/local/tmp/qstudio"


@dataclass(frozen=True)
class AdbDevice:
    serial: str
    state: str  # device | unauthorized | offline | ...
    model: str = ""
    product: str = ""

    @property
    def ready(self) -> bool:
        return self.state == "device"


def parse_devices(text: str) -> list[AdbDevice]:
    """``adb devices -l`` output: ``SERIAL<TAB or spaces>STATE key:value ...`` per line after
    ``List of devices attached``; daemon start-up lines (``* daemon ...``) are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("List of devices", "*")):
            continue
        parts = line.split()
        if len(parts) < 2:
            continue
        kv = dict(p.split(":", 1) for p in parts[2:] if ":" in p)
        out.append(AdbDevice(parts[0], parts[1], kv.get("model", ""), kv.get("product", "")))
    return out


def parse_getprop(text: str) -> dict[str, str]:
    """``getprop`` output: ``[key]: [value]`` per line."""
    return dict(re.findall(r"^\[([^\]]+)\]: \[([^\]]*)\]\s*$", text, flags=re.M))


def chip_of(props: dict[str, str]):
    """The catalog chip of a phone from its SoC properties (``ro.soc.model``, e.g. SM8650)."""
    soc = props.get("ro.soc.model") or props.get("ro.board.platform") or ""
    if not soc:
        raise StudioError("the phone reports no ro.soc.model: is it a Snapdragon device?")
    try:
        return get_chip(soc)
    except StudioError:
        raise StudioError(f"the phone's SoC {soc} is not in the chip catalog: add it to "
                          "resources/catalog/chips.toml") from None


def sdk_files(sdk_root: Path, htp_arch: int) -> dict[str, Path]:
    """The files ``qnn-net-run`` needs on an Android phone, from a QAIRT SDK folder (name on
    the phone -> local path); a clear error names the first one missing."""
    root = Path(sdk_root)
    v = f"V{int(htp_arch)}"
    want = {
        "qnn-net-run": root / "bin" / "aarch64-android" / "qnn-net-run",
        "libQnnHtp.so": root / "lib" / "aarch64-android" / "libQnnHtp.so",
        "libQnnSystem.so": root / "lib" / "aarch64-android" / "libQnnSystem.so",
        f"libQnnHtp{v}Stub.so": root / "lib" / "aarch64-android" / f"libQnnHtp{v}Stub.so",
        f"libQnnHtp{v}Skel.so": root / "lib" / f"hexagon-v{int(htp_arch)}" / "unsigned"
        / f"libQnnHtp{v}Skel.so",
    }
    for name, path in want.items():
        if not path.is_file():
            raise StudioError(f"the QAIRT SDK at {root} has no {name} ({path}): set the SDK "
                              "folder in the settings to a QAIRT SDK with Android libraries")
    return want


def run_commands(serial: str, workdir: str, context_name: str, input_list: str,
                 local: dict[str, Path], profiling: str = "basic",
                 adb: str = "adb") -> list[list[str]]:
    """The adb command lines of one run: make the folder, push the SDK files, the context
    binary and the inputs, run ``qnn-net-run`` on the HTP, pull ``output``."""
    check_serial(serial)
    remote = f"{REMOTE_ROOT}/{workdir}"
    cmds = [[adb, "-s", serial, "shell", "mkdir", "-p", remote]]
    for name, path in local.items():
        cmds.append([adb, "-s", serial, "push", str(path), f"{remote}/{name}"])
    cmds.append([adb, "-s", serial, "shell",
                 net_run_command(remote, context_name, input_list, profiling=profiling)])
    cmds.append([adb, "-s", serial, "pull", f"{remote}/output"])
    return cmds


def check_serial(serial: str) -> str:
    if not re.match(r"^[A-Za-z0-9._:-]+$", serial or ""):
        raise StudioError(f"bad adb serial {serial!r}")
    return serial


def net_run_command(remote: str, context_name: str, input_list: str, output_dir: str = "output",
                    profiling: str = "basic", perf_profile: str = "",
                    native: bool = False) -> str:
    """The shell line that runs ``qnn-net-run`` on the HTP in ``remote`` (the SDK files and
    the context binary pushed there); ``perf_profile``: the HTP's performance mode (the
    project's ``htp.performance_mode``; qnn-net-run's ``--perf_profile``); ``native``: the
    input and output ``.raw`` files hold each tensor in its own data type (uint16 masks and
    caches, int32 ids: ``--use_native_input_files --use_native_output_files``)."""
    if perf_profile and not re.match(r"^[a-z_]+$", perf_profile):
        raise StudioError(f"bad performance mode {perf_profile!r}")
    return (f"cd {remote} && chmod 755 qnn-net-run && rm -rf {output_dir} && "
            f"LD_LIBRARY_PATH={remote} ADSP_LIBRARY_PATH={remote} ./qnn-net-run "
            f"--backend libQnnHtp.so --retrieve_context {context_name} --input_list {input_list} "
            f"--output_dir {output_dir}" + (f" --profiling_level {profiling}" if profiling else "")
            + (f" --perf_profile {perf_profile}" if perf_profile else "")
            + (" --use_native_input_files --use_native_output_files" if native else ""))


def read_outputs(output_dir: Path, outputs: dict[str, tuple[str, list[int]]],
                 result: int = 0) -> dict[str, Any]:
    """The tensors ``qnn-net-run`` wrote for input line ``result``: ``Result_N/<name>.raw``
    read with each output's dtype and shape (names with ``:`` / ``/`` as the tool writes
    them, ``_``)."""
    folder = Path(output_dir) / f"Result_{result}"
    if not folder.is_dir():
        raise StudioError(f"qnn-net-run wrote no {folder.name} in {output_dir}: see its log")
    out = {}
    for name, (dtype, shape) in outputs.items():
        f = folder / f"{re.sub(r'[:/]', '_', name)}.raw"
        if not f.is_file():
            raise StudioError(f"qnn-net-run wrote no output {name!r} ({f.name})")
        arr = np.fromfile(f, dtype=np.dtype(dtype))
        want = int(np.prod(shape))
        if arr.size != want:
            raise StudioError(f"output {name!r} has {arr.size} values, the graph says {want} "
                              f"{shape}: was it run with another graph?")
        out[name] = arr.reshape(shape)
    return out


class Adb:
    """A thin runner around the ``adb`` binary (``adb`` on PATH by default)."""

    def __init__(self, binary: str | None = None, timeout: float = 120.0) -> None:
        self.binary = binary or shutil.which("adb") or ""
        self.timeout = timeout

    @property
    def available(self) -> bool:
        return bool(self.binary) and Path(self.binary).exists()

    def run(self, argv: list[str]) -> str:
        if not self.available:
            raise StudioError("adb is not installed (Android platform-tools): install it to "
                              "run on a phone")
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise StudioError(f"adb did not answer in {self.timeout:.0f} s: "
                              f"{' '.join(argv[:4])}") from None
        if r.returncode != 0:
            last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
            raise StudioError(f"adb failed ({' '.join(argv[1:5])}): {last[0]}")
        return r.stdout

    def devices(self) -> list[AdbDevice]:
        return parse_devices(self.run([self.binary, "devices", "-l"]))

    def props(self, serial: str) -> dict[str, str]:
        return parse_getprop(self.run([self.binary, "-s", serial, "shell", "getprop"]))

    def push(self, serial: str, local: Path, remote: str) -> None:
        self.run([self.binary, "-s", serial, "push", str(local), remote])

    def pull(self, serial: str, remote: str, local: Path) -> None:
        self.run([self.binary, "-s", serial, "pull", remote, str(local)])

    def shell(self, serial: str, command: str) -> str:
        return self.run([self.binary, "-s", serial, "shell", command])


def profile_viewer(sdk_root: Path) -> Path | None:
    """The SDK's host ``qnn-profile-viewer`` (it turns qnn-net-run's profiling log into the
    CSV the profiler reads); None when the SDK has no x86 Linux tools."""
    p = Path(sdk_root) / "bin" / "x86_64-linux-clang" / "qnn-profile-viewer"
    return p if p.is_file() else None


def log_to_csv(sdk_root: Path, log: Path, csv_path: Path, timeout: float = 120.0) -> Path:
    """qnn-net-run's binary profiling log as a QNN profiling CSV, by the SDK's viewer."""
    viewer = profile_viewer(sdk_root)
    if viewer is None:
        raise StudioError(f"the QAIRT SDK at {sdk_root} has no bin/x86_64-linux-clang/"
                          "qnn-profile-viewer: use the SDK's Linux x86_64 package to read "
                          "profiles from a phone")
    r = subprocess.run([str(viewer), "--input_log", str(log), "--output", str(csv_path)],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 or not csv_path.is_file():
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        raise StudioError(f"qnn-profile-viewer could not read {log.name}: {last[0]}")
    return csv_path


def execute_us(csv_path: Path) -> float | None:
    """The graph's execute time (µs) of the last run in a QNN profiling CSV, if it has one."""
    prof = parse_profile_csv(csv_path, source="measured")
    scale = {"us": 1.0, "ms": 1e3, "ns": 1e-3}
    for ev in prof.events:
        if ev.kind == "EXECUTE" and ev.unit in scale and ev.samples:
            return float(ev.samples[-1]) * scale[ev.unit]
    return None


@dataclass(frozen=True)
class IOSpec:
    """A graph input / output as ONNX Runtime's ``NodeArg`` shows it (what the runtime reads)."""
    name: str
    type: str
    shape: list[int]


_ONNX_TYPES = {1: "tensor(float)", 2: "tensor(uint8)", 3: "tensor(int8)", 4: "tensor(uint16)",
               5: "tensor(int16)", 6: "tensor(int32)", 7: "tensor(int64)", 9: "tensor(bool)",
               10: "tensor(float16)"}


def graph_io(ctx_onnx: Path) -> tuple[list[IOSpec], list[IOSpec]]:
    """The inputs and outputs of a compiled context model, with static shapes."""
    g = onnx.load(str(ctx_onnx), load_external_data=False).graph

    def spec(v) -> IOSpec:
        t = v.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        if any(d <= 0 for d in shape):
            raise StudioError(f"{ctx_onnx.name}: {v.name} has no static shape; a context "
                              "binary runs static shapes only")
        return IOSpec(v.name, _ONNX_TYPES.get(t.elem_type, "tensor(float)"), shape)

    return [spec(v) for v in g.input], [spec(v) for v in g.output]


class AdbPhone:
    """A phone over adb with the user's QAIRT SDK: the SDK files go up once, each compiled
    context once (named by its hash), and :meth:`session` runs one of them like an ONNX
    Runtime session (UNVERIFIED ON HARDWARE, see the module docstring)."""

    def __init__(self, serial: str, sdk_root: Path | None, chip, runner: Adb | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.serial = check_serial(serial)
        if sdk_root is None:
            raise StudioError("no QAIRT SDK folder is set: studio devices sdk PATH (or "
                              "QNN_SDK_ROOT) names the SDK whose qnn-net-run runs on the phone")
        self.sdk_root = Path(sdk_root)
        self.chip = chip
        self.adb = runner or Adb()
        self.log = log or (lambda _m: None)
        self.remote = f"{REMOTE_ROOT}/work"
        self._ready = False

    def check(self) -> None:
        """The phone is attached and authorised, and its SoC is the chip the context was
        compiled for."""
        found = {d.serial: d for d in self.adb.devices()}
        dev = found.get(self.serial)
        if dev is None:
            raise StudioError(f"adb sees no phone {self.serial} (it sees "
                              f"{', '.join(found) or 'none'}): plug it in and enable USB "
                              "debugging")
        if not dev.ready:
            raise StudioError(f"phone {self.serial} is {dev.state}: accept the debugging "
                              "prompt on the phone (unauthorized) or reconnect it (offline)")
        got = chip_of(self.adb.props(self.serial))
        if got.key != self.chip.key:
            raise StudioError(f"phone {self.serial} is a {got.name} ({got.soc_model}), not a "
                              f"{self.chip.name}: use adb:{self.serial}@{got.key} and compile "
                              "for that target")

    def prepare(self) -> None:
        if self._ready:
            return
        self.check()
        files = sdk_files(self.sdk_root, int(self.chip.htp_arch))
        self.adb.shell(self.serial, f"mkdir -p {self.remote}/in")
        self.log(f"pushing qnn-net-run and the HTP libraries to {self.serial}")
        for name, path in files.items():
            self.adb.push(self.serial, path, f"{self.remote}/{name}")
        self._ready = True

    def session(self, ctx_onnx: Path, profiling: str = "basic",
                perf_profile: str = "") -> AdbSession:
        self.prepare()
        blob = context_binary(Path(ctx_onnx))
        name = f"ctx-{hashlib.sha256(blob).hexdigest()[:16]}.bin"
        have = self.adb.shell(self.serial, f"ls {self.remote}/{name} 2>/dev/null; true")
        if name not in have:
            self.log(f"pushing {Path(ctx_onnx).name}'s context binary ({len(blob) >> 10} KiB)")
            with tempfile.TemporaryDirectory(prefix="qstudio-adb-") as tmp:
                local = Path(tmp) / name
                local.write_bytes(blob)
                self.adb.push(self.serial, local, f"{self.remote}/{name}")
        inputs, outputs = graph_io(Path(ctx_onnx))
        odd = [f"{v.name} ({v.type})" for v in inputs + outputs if v.type not in NATIVE]
        if odd:
            raise StudioError(f"{Path(ctx_onnx).name} has inputs / outputs of a type the adb "
                              f"path does not send ({', '.join(odd[:3])})")
        return AdbSession(self, name, inputs, outputs, profiling, perf_profile)


#: the tensor types a phone's qnn-net-run is sent in their own data type (native files)
NATIVE = {"tensor(float)": "float32", "tensor(int64)": "int64", "tensor(int32)": "int32",
          "tensor(uint16)": "uint16", "tensor(uint8)": "uint8"}


class AdbSession:
    """One compiled context on a phone, run input by input through ``qnn-net-run``: inputs
    go up as float32 ``.raw`` files (the tool's default; it converts them to the graph's
    types), outputs come back as float32 — or, for a graph with integer I/O (the deployable
    binaries: a uint16 mask, int32 ids, a quantized cache), every tensor in its own data type
    (native files; unverified on a phone here). Each :meth:`run` records the device's execute time
    from qnn-net-run's profiling log (``last_execute_us``; None when the SDK has no viewer)
    and the whole adb round trip (``last_round_trip_s``)."""

    def __init__(self, phone: AdbPhone, context_name: str, inputs: list[IOSpec],
                 outputs: list[IOSpec], profiling: str, perf_profile: str = "") -> None:
        self.phone = phone
        self.context_name = context_name
        self._inputs, self._outputs = inputs, outputs
        self.profiling = profiling
        self.perf_profile = perf_profile
        self.last_execute_us: float | None = None
        self.execute_log: list[float | None] = []  # each run's device execute time (µs)
        self.last_round_trip_s = 0.0
        self.last_profile_csv: Path | None = None
        self.profile_dir: Path | None = None  # keep each run's profiling CSV here when set

    def get_inputs(self) -> list[IOSpec]:
        return list(self._inputs)

    def get_outputs(self) -> list[IOSpec]:
        return list(self._outputs)

    def run(self, output_names: list[str] | None, feeds: dict[str, Any]) -> list[Any]:
        phone, adb, serial = self.phone, self.phone.adb, self.phone.serial
        missing = [i.name for i in self._inputs if i.name not in feeds]
        if missing:
            raise StudioError(f"inputs missing for {self.context_name}: {', '.join(missing)}")
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="qstudio-adb-") as tmp:
            folder = Path(tmp)
            line = []
            native = any(v.type not in ("tensor(float)", "tensor(int64)")
                         for v in self._inputs + self._outputs)
            for i, spec in enumerate(self._inputs):
                f = folder / f"in{i}.raw"
                np.ascontiguousarray(feeds[spec.name], dtype=np.dtype(
                    NATIVE[spec.type] if native else "float32")).tofile(f)
                adb.push(serial, f, f"{phone.remote}/in/{f.name}")
                line.append(f"{spec.name}:=in/{f.name}")
            (folder / "input_list.txt").write_text(" ".join(line) + "\n")
            adb.push(serial, folder / "input_list.txt", f"{phone.remote}/in/input_list.txt")
            adb.shell(serial, net_run_command(phone.remote, self.context_name,
                                              "in/input_list.txt", profiling=self.profiling,
                                              perf_profile=self.perf_profile, native=native))
            adb.pull(serial, f"{phone.remote}/output", folder)
            shapes = {o.name: (NATIVE[o.type] if native else "float32", o.shape)
                      for o in self._outputs}
            got = read_outputs(folder / "output", shapes)
            self.last_round_trip_s = time.perf_counter() - t0
            self.last_execute_us = None
            log = folder / "output" / "qnn-profiling-data_0.log"
            if self.profiling and log.is_file() and profile_viewer(phone.sdk_root):
                dest = Path(self.profile_dir or folder)
                dest.mkdir(parents=True, exist_ok=True)
                n = len(list(dest.glob("qnn_profile_*.csv"))) + 1
                csv_path = log_to_csv(phone.sdk_root, log, dest / f"qnn_profile_{n}.csv")
                self.last_profile_csv = csv_path if self.profile_dir else None
                self.last_execute_us = execute_us(csv_path)
            self.execute_log.append(self.last_execute_us)
        names = output_names or [o.name for o in self._outputs]
        return [got[n] for n in names]
