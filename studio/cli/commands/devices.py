"""``studio devices list [--json] | add NAME --url URL (--token T | --token-file F) | remove
NAME | sdk [PATH | --clear]``: the device registry.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studio.cli.command import Context, Parser
from studio.cli.commands import registered
from studio.core.errors import StudioError
from studio.services.devices import agent_health, device_rows
from studio.services.registry import Registry


def add_arguments(p: argparse.ArgumentParser) -> None:
    dvs = p.add_subparsers(dest="devices_command", parser_class=Parser, required=True)
    dl = dvs.add_parser("list", help="every device with its health and capabilities")
    dl.add_argument("--json", dest="devices_json", action="store_true")
    da = dvs.add_parser("add", help="register an agent (URL and its pairing token)")
    da.add_argument("name")
    da.add_argument("--url", required=True)
    tok = da.add_mutually_exclusive_group(required=True)
    tok.add_argument("--token")
    tok.add_argument("--token-file", dest="token_file")
    da.add_argument("--cafile", default="", help="the certificate an https agent is trusted by "
                                                "(its self-signed certificate or its CA)")
    dr = dvs.add_parser("remove", help="forget an agent")
    dr.add_argument("name")
    dk = dvs.add_parser("sdk", help="show or set the QAIRT SDK folder phones over adb run "
                                    "qnn-net-run from")
    dk.add_argument("path", nargs="?", help="the folder the QAIRT SDK unpacked into")
    dk.add_argument("--clear", action="store_true", help="forget the folder")


def run(args: argparse.Namespace, ctx: Context) -> int:
    reg = Registry()
    if args.devices_command == "add":
        token = args.token
        if args.token_file:
            try:
                token = Path(args.token_file).read_text()
            except OSError as exc:
                raise StudioError(f"cannot read {args.token_file}: {exc.strerror}") from None
        a = reg.add(args.name, args.url, token or "", args.cafile)
        health = agent_health(reg, a.name)
        print(f"added {a.id} ({a.url}): {health}")
        return 0
    if args.devices_command == "remove":
        reg.remove(args.name)
        print(f"removed agent:{args.name}")
        return 0
    if args.devices_command == "sdk":
        if args.clear or args.path:
            reg.set_sdk_root(None if args.clear else args.path)
        root, where = reg.sdk_root()
        print(f"QAIRT SDK: {root} (from {where})" if root else
              "QAIRT SDK: not set (studio devices sdk PATH, or QNN_SDK_ROOT)")
        return 0
    rows = device_rows(reg, health=True)
    if args.devices_json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        print(f"{r['id']:<28} {r['kind']:<9} {r.get('url', ''):<28} {r['status']}")
    return 0


COMMAND = registered("devices", add_arguments, run)
