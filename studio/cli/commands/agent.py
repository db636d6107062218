"""``studio agent serve [--host 127.0.0.1] [--port P] [--token-file F] [--tls-cert C --tls-key
K]``: the device agent that runs jobs on a target machine.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import signal
import ssl
import sys
from pathlib import Path

import platformdirs

from studio.cli.command import Context, Parser
from studio.cli.commands import registered
from studio.cli.common import number, out_path, whole
from studio.core.errors import StudioError
from studio.services.agent import server


def add_arguments(p: argparse.ArgumentParser) -> None:
    ags = p.add_subparsers(dest="agent_command", parser_class=Parser, required=True)
    sv = ags.add_parser("serve", help="serve jobs over HTTP (bearer token; 127.0.0.1 unless "
                                      "told otherwise)")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=whole(0, 65535), default=8765, help="0: any free port")
    sv.add_argument("--token-file", dest="token_file",
                    help="read the token from this file (default: a new pairing token, printed)")
    sv.add_argument("--tls-cert", dest="tls_cert")
    sv.add_argument("--tls-key", dest="tls_key")
    sv.add_argument("--store", help="where uploaded files live (default: the user's data folder)")
    sv.add_argument("--max-upload-mb", dest="max_upload_mb", type=number(high=1 << 20, above=0),
                    default=2048.0, help="the largest file one upload may hold, in MB")
    sv.add_argument("--max-jobs", dest="max_jobs", type=whole(1, 64), default=1,
                    help="jobs run at once (more wait: 429)")


def run(args: argparse.Namespace, ctx: Context) -> int:
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise StudioError(f"cannot read the token file {args.token_file}: "
                              f"{exc.strerror}") from None
        if not token:
            raise StudioError(f"the token file {args.token_file} is empty")
    else:
        token = server.new_token()
    ctx = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise StudioError("TLS needs both --tls-cert and --tls-key")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise StudioError(f"cannot load the TLS certificate / key: {exc}") from None
    if args.store:  # the user's folder: the one rule for every writer's path
        store = out_path(args.store, folder=True)
    else:
        store = platformdirs.user_data_path("qstudio", appauthor=False) / "agent"
    server.check_store(store)
    server.check_host(args.host)
    if args.host not in ("127.0.0.1", "localhost", "::1") and ctx is None:
        print("warning: serving beyond this machine without TLS: the token crosses the "
              "network in clear", file=sys.stderr)

    def ready(url: str) -> None:
        print(f"QStudio agent listening on {url}", flush=True)
        if not args.token_file:
            print(f"pairing token: {token}", flush=True)
        print(f"store: {store}", flush=True)

    async def main() -> None:
        task = asyncio.ensure_future(server.serve(
            store, args.host, args.port, token, ctx, int(args.max_upload_mb * (1 << 20)),
            args.max_jobs, ready))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    try:
        asyncio.run(main())
    except OSError as exc:
        raise StudioError(f"cannot listen on {args.host}:{args.port} ({exc.strerror or exc})"
                          + (": choose another --port" if exc.errno == errno.EADDRINUSE
                             else "")) from None
    print("agent stopped", file=sys.stderr)
    return 0


COMMAND = registered("agent", add_arguments, run)
