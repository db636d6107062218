"""The ``studio`` command line.

    studio                       open the desktop app (see studio/__main__.py)
    studio --batch FILE [...]    run a project's pipeline headless (CI): studio.cli.batch
    studio COMMAND ...           one of the commands of studio.cli.commands (studio --help
                                 lists them; each module's docstring gives its usage)

Errors are handled here, once for every command: a :class:`StudioError` is one line on stderr
and its exit code. Exit codes: 0 success, 1 an accuracy gate failed, 2 bad input (one line on
stderr), 3 a stage crashed (a bug: its traceback is in the job log).
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
import threading
from collections.abc import Sequence

from studio.cli.command import Command, Context, Parser, PdfPrinter, Registered
from studio.cli.commands import COMMANDS
from studio.core import thirdparty
from studio.core.errors import StudioError


def build_parser(commands: Sequence[Command | Registered] = COMMANDS,
                 chosen: str | None = None) -> argparse.ArgumentParser:
    """The top-level options (batch mode's) and one sub-parser per command, in order; only
    the ``chosen`` command's module is imported, to add its arguments (``None``: none, as
    ``studio --help`` needs, whose sub-parsers then take any arguments unread)."""
    p = Parser(prog="studio", description="QStudio: deploy language models to Snapdragon NPUs.")
    p.add_argument("--batch", metavar="FILE", help="run the project's pipeline headless")
    p.add_argument("--stages", help="comma-separated stages to run (their inputs run too)")
    p.add_argument("--remeasure", action="store_true",
                   help="time the run and profile stages again instead of reusing a "
                        "measurement (e.g. one taken while the host was busy)")
    p.add_argument("--target", action="append", help="only this target (repeatable)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    for command in commands:
        if command.name == chosen:
            command.load().add_arguments(sub.add_parser(command.name, help=command.help))
        else:
            sub.add_parser(command.name, help=command.help, add_help=False)
    return p


def chosen_command(argv: Sequence[str], commands: Sequence[Command | Registered]) -> str | None:
    """The command ``argv`` names, read as the whole parser reads it (None: batch mode or
    none), without importing any command's module."""
    args, _rest = build_parser(commands).parse_known_args(list(argv))
    return args.command


def _interruptible() -> None:
    """SIGINT cancels the command even when it was started with SIGINT ignored: a shell
    without job control starts background jobs (``studio --batch p.qstudio &``) that way, and
    a CI runner or supervisor that stops the job with ``kill -INT`` would otherwise see it run
    to the end."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None, *, pdf_printer: PdfPrinter | None = None,
         commands: Sequence[Command | Registered] = COMMANDS) -> int:
    """Run the command line on ``argv`` and return its exit code. ``pdf_printer`` prints
    reports as PDF (``studio/__main__.py`` passes Qt's); ``commands`` is the registry."""
    argv = sys.argv[1:] if argv is None else argv
    thirdparty.settle()  # before any library is imported: offline, no telemetry store
    ctx = Context(pdf_printer=pdf_printer)
    _interruptible()
    try:
        chosen = chosen_command(argv, commands)
        args = build_parser(commands, chosen).parse_args(argv)
        if args.command:
            command = next(c for c in commands if c.name == args.command)
            return command.load().run(args, ctx)
        if args.batch:
            # batch mode's work (the services, the libraries behind them), imported when
            # --batch runs: studio --help stays light, as for a command (Registered.load)
            from studio.cli.batch import run_batch

            return run_batch(args, ctx)
        raise StudioError("nothing to do: give --batch FILE, or a command (new, info, compare, "
                          "targets)")
    except StudioError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        print(f"error: a file name is too long ({str(exc.filename)[:60]}…): give a shorter "
              "one", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (studio ... | head): not an error
        sys.stdout = None  # type: ignore[assignment]
        return 0


if __name__ == "__main__":
    sys.exit(main())
