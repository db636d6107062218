"""A stand-in for what cannot exist here: a Snapdragon phone on adb, with a QAIRT SDK.

`install(folder, contexts, chip)` writes
- ``bin/adb``: answers ``devices -l`` and ``getprop`` in adb's documented formats, keeps the
  phone's ``/data/local/tmp`` in a local folder, copies files for ``push`` / ``pull`` and runs
  ``shell`` lines there with bash;
- a QAIRT SDK tree (``sdk/``) whose ``qnn-net-run`` reads the ``--input_list`` and float32
  ``.raw`` inputs as the real tool does and writes ``output/Result_0/<name>.raw`` — but runs
  the context on this host's HTP simulator (it finds the compiled ``*_ctx.onnx`` whose
  context binary was pushed, among ``contexts``), and whose ``qnn-profile-viewer`` turns the
  "profiling log" (here the simulator's QNN profiling CSV) into the CSV.

So the numerics are real (the HTP simulator) and only the transport is a stand-in; the
studio's adb code path itself stays unverified on hardware.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

ADB = r'''#!__PY__
import os, shutil, subprocess, sys
root = os.environ["FAKE_PHONE_ROOT"]
serial = os.environ.get("FAKE_PHONE_SERIAL", "R5CW1234ABC")
with open(os.path.join(root, "adb.log"), "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\n")
args = sys.argv[1:]
if args[:1] == ["devices"]:
    print("List of devices attached")
    print(f"{serial}\tdevice usb:1-1 product:pineapple model:SM_S928B device:e3q transport_id:2")
    sys.exit(0)
if args[:1] != ["-s"] or len(args) < 3:
    sys.exit("adb: usage")
if args[1] != serial:
    sys.stderr.write(f"adb: device '{args[1]}' not found\n")
    sys.exit(1)
cmd, rest = args[2], args[3:]
def local(remote):
    return os.path.join(root, remote.lstrip("/"))
if cmd == "shell":
    line = " ".join(rest)
    if line == "getprop":
        print("[ro.product.model]: [SM-S928B]")
        print("[ro.soc.manufacturer]: [QTI]")
        print(f"[ro.soc.model]: [{os.environ.get('FAKE_PHONE_SOC', 'SM8650')}]")
        sys.exit(0)
    line = line.replace("/data/local/tmp", os.path.join(root, "data/local/tmp"))
    r = subprocess.run(["bash", "-c", line], cwd=root)
    sys.exit(r.returncode)
if cmd == "push":
    src, dst = rest
    os.makedirs(os.path.dirname(local(dst)), exist_ok=True)
    shutil.copyfile(src, local(dst))
    print(f"{src}: 1 file pushed")
    sys.exit(0)
if cmd == "pull":
    src, dst = rest
    if not os.path.exists(local(src)):
        sys.stderr.write(f"adb: error: remote object '{src}' does not exist\n")
        sys.exit(1)
    target = os.path.join(dst, os.path.basename(src.rstrip("/"))) if os.path.isdir(dst) else dst
    if os.path.isdir(local(src)):
        shutil.copytree(local(src), target, dirs_exist_ok=True)
    else:
        shutil.copyfile(local(src), target)
    sys.exit(0)
sys.exit(f"adb: unknown command {cmd}")
'''

NET_RUN = r'''#!__PY__
import hashlib, os, sys
if os.environ.get("LD_LIBRARY_PATH"):  # the phone's libraries are placeholders here
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "ADSP_LIBRARY_PATH")}
    os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], env)
import argparse, json, shutil
from pathlib import Path
import numpy as np
from studio.engine import profiling, qnn
from studio.engine.devices.adb_phone import graph_io
ap = argparse.ArgumentParser()
for a in ("--backend", "--retrieve_context", "--input_list", "--output_dir", "--profiling_level"):
    ap.add_argument(a)
for a in ("--use_native_input_files", "--use_native_output_files"):
    ap.add_argument(a, action="store_true")
a = ap.parse_args()
want = hashlib.sha256(Path(a.retrieve_context).read_bytes()).hexdigest()
index = json.loads(Path(os.environ["FAKE_QNN_INDEX"]).read_text())
if want not in index:
    sys.exit("qnn-net-run: could not load the context binary")
model = Path(index[want])
inputs, outputs = graph_io(model)
types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
         "tensor(uint16)": np.uint16, "tensor(uint8)": np.uint8}
line = Path(a.input_list).read_text().split()
paths = dict(p.split(":=", 1) for p in line)
feeds = {i.name: np.fromfile(paths[i.name], types[i.type] if a.use_native_input_files
                             else np.float32).reshape(i.shape).astype(types[i.type])
         for i in inputs}
chip = os.environ["FAKE_PHONE_CHIP"]
out = Path(a.output_dir)
(out / "Result_0").mkdir(parents=True, exist_ok=True)
if a.profiling_level:
    info = profiling.profile_run(model, chip, feeds, out / "profile.csv", level=a.profiling_level,
                           op_trace=False)
    shutil.move(info["csv"], out / "qnn-profiling-data_0.log")
    got = info["outputs"]
else:
    got = qnn.make_session(model, chip, strict=True).run(None, feeds)
for o, v in zip(outputs, got):
    np.asarray(v, types[o.type] if a.use_native_output_files else np.float32).tofile(
        out / "Result_0" / (o.name + ".raw"))
'''

VIEWER = r'''#!__PY__
import argparse, shutil
ap = argparse.ArgumentParser()
ap.add_argument("--input_log")
ap.add_argument("--output")
a = ap.parse_args()
shutil.copyfile(a.input_log, a.output)
'''


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace("__PY__", sys.executable))
    path.chmod(0o755)


def install(folder: Path, contexts: list[Path], chip: str, htp_arch: int,
            serial: str = "R5CW1234ABC", soc: str = "SM8650") -> dict[str, str]:
    """Write the fake adb and SDK under ``folder``; the environment that uses them."""
    folder = Path(folder)
    _script(folder / "bin" / "adb", ADB)
    sdk = folder / "sdk"
    _script(sdk / "bin" / "aarch64-android" / "qnn-net-run", NET_RUN)
    _script(sdk / "bin" / "x86_64-linux-clang" / "qnn-profile-viewer", VIEWER)
    v = f"V{htp_arch}"
    for lib in ("libQnnHtp.so", "libQnnSystem.so", f"libQnnHtp{v}Stub.so"):
        (sdk / "lib" / "aarch64-android").mkdir(parents=True, exist_ok=True)
        (sdk / "lib" / "aarch64-android" / lib).write_text("placeholder\n")
    skel = sdk / "lib" / f"hexagon-v{htp_arch}" / "unsigned" / f"libQnnHtp{v}Skel.so"
    skel.parent.mkdir(parents=True, exist_ok=True)
    skel.write_text("placeholder\n")
    (folder / "phone").mkdir(exist_ok=True)
    # the compiled models the fake qnn-net-run can stand in for, by their context binary's
    # hash (hashed once here, not at every call: a step of a generation is one call)
    from studio.engine.devices.adb_phone import context_binary

    index = {hashlib.sha256(context_binary(f)).hexdigest(): str(f)
             for c in contexts for f in sorted(Path(c).glob("*_ctx.onnx"))}
    (folder / "contexts.json").write_text(json.dumps(index))
    root = Path(__file__).resolve().parents[2]
    return {
        "PATH": f"{folder / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "FAKE_PHONE_ROOT": str(folder / "phone"), "FAKE_PHONE_SERIAL": serial,
        "FAKE_PHONE_SOC": soc, "FAKE_PHONE_CHIP": chip,
        "FAKE_QNN_INDEX": str(folder / "contexts.json"),
        "QNN_SDK_ROOT": str(sdk),
        "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH"))
                                      if p),
    }
