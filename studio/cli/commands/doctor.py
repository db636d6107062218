"""``studio doctor [FILE] [--device D] [--json]``: this machine, a project and a device
checked before the work — each check PASS / WARN / FAIL with its fix in one line. Exit code
0 when nothing failed, 1 when a check failed (2 for bad arguments, as everywhere)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import device_arg
from studio.services.doctor import FAIL, doctor, verdict


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", help="a project file (its plan, data and binaries are "
                                           "checked too)")
    p.add_argument("--device", dest="doctor_device", type=device_arg,
                   help="a device to check: agent:NAME or adb:SERIAL")
    p.add_argument("--json", dest="doctor_json", action="store_true",
                   help="print the checks as JSON")


def run(args: argparse.Namespace, ctx: Context) -> int:
    def show(c) -> None:
        if not args.doctor_json:
            print(c.line(), flush=True)

    checks = doctor(Path(args.file) if args.file else None, args.doctor_device, on_check=show)
    if args.doctor_json:
        print(json.dumps({"checks": [c.to_dict() for c in checks],
                          "verdict": verdict(checks)}, indent=1))
    else:
        print(verdict(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0


COMMAND = registered("doctor", add_arguments, run)
