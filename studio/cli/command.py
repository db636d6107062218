"""What a command of the ``studio`` command line is.

Each command is one module of :mod:`studio.cli.commands` that ends with its declaration::

    COMMAND = Command("targets", "list the chip catalog", add_arguments, run)

and is listed once in :data:`studio.cli.commands.COMMANDS`, the registry the parser is built
from. A command module imports only what its arguments need at the top; what its work needs
(the services, numpy, torch behind them) it imports inside ``run``, so that ``studio --help``
and every other command stay quick to start (the declarations are named tuples, not
dataclasses, for the same reason: ``dataclasses`` imports ``inspect``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NamedTuple

from studio.core.errors import StudioError

PdfPrinter = Callable[[str, dict[str, str]], bytes]
"""(report HTML, charts by name) -> PDF bytes: see ``studio.services.reports.write``."""


class Parser(argparse.ArgumentParser):
    """Every parser of the command line, sub-commands' included: a usage error is bad input
    like any other, one line on stderr and exit code 2."""

    def error(self, message: str):  # one line, exit 2, like every other bad input
        raise StudioError(f"{message} (see studio --help)")


class Context(NamedTuple):
    """What a command gets beside its arguments, from whoever started the command line.

    ``pdf_printer`` prints a report's PDF; it needs Qt, which ``studio.cli`` may not import,
    so ``studio/__main__.py`` hands one in and ``python -m studio.cli`` runs without."""

    pdf_printer: PdfPrinter | None = None


class Command(NamedTuple):
    """One sub-command: its name, its one line in ``studio --help``, the function that adds
    its arguments to its own parser and the one that runs it (returning the exit code)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Context], int]
