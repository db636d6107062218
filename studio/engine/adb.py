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

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError

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
    from studio.core.catalog import get_chip

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


def context_binary(ctx_onnx: Path) -> bytes:
    """The QNN context binary a compiled ``…_ctx.onnx`` holds (embedded in its EPContext node,
    or in the ``.bin`` file beside it that the node names)."""
    import onnx

    model = onnx.load(str(ctx_onnx), load_external_data=False)
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        attrs = {a.name: a for a in node.attribute}
        embed = attrs["embed_mode"].i if "embed_mode" in attrs else 1
        data = attrs["ep_cache_context"].s if "ep_cache_context" in attrs else b""
        if embed:
            return bytes(data)
        path = Path(ctx_onnx).parent / data.decode()
        if not path.is_file():
            raise StudioError(f"the context binary {path} that {ctx_onnx.name} names is missing: "
                              "compile again")
        return path.read_bytes()
    raise StudioError(f"{ctx_onnx} has no EPContext node: it is not a compiled context model")


def run_commands(serial: str, workdir: str, context_name: str, input_list: str,
                 local: dict[str, Path], profiling: str = "basic",
                 adb: str = "adb") -> list[list[str]]:
    """The adb command lines of one run: make the folder, push the SDK files, the context
    binary and the inputs, run ``qnn-net-run`` on the HTP, pull ``output``."""
    if not re.match(r"^[A-Za-z0-9._:-]+$", serial):
        raise StudioError(f"bad adb serial {serial!r}")
    remote = f"{REMOTE_ROOT}/{workdir}"
    cmds = [[adb, "-s", serial, "shell", "mkdir", "-p", remote]]
    for name, path in local.items():
        cmds.append([adb, "-s", serial, "push", str(path), f"{remote}/{name}"])
    run = (f"cd {remote} && chmod 755 qnn-net-run && LD_LIBRARY_PATH={remote} "
           f"ADSP_LIBRARY_PATH={remote} ./qnn-net-run --backend libQnnHtp.so "
           f"--retrieve_context {context_name} --input_list {input_list} --output_dir output"
           + (f" --profiling_level {profiling}" if profiling else ""))
    cmds.append([adb, "-s", serial, "shell", run])
    cmds.append([adb, "-s", serial, "pull", f"{remote}/output"])
    return cmds


def read_outputs(output_dir: Path, outputs: dict[str, tuple[str, list[int]]],
                 result: int = 0) -> dict[str, Any]:
    """The tensors ``qnn-net-run`` wrote for input line ``result``: ``Result_N/<name>.raw``
    read with each output's dtype and shape (names with ``:`` / ``/`` as the tool writes
    them, ``_``)."""
    import numpy as np

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
