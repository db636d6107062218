"""What a command of the ``studio`` command line is.

Each command is one module of :mod:`studio.cli.commands` that ends with its declaration::

    COMMAND = registered("targets", add_arguments, run)

and is listed once, with its line of help, in :data:`studio.cli.commands.COMMANDS`, the
registry the parser is built from. The registry names the module and does not import it:
``studio --help`` reads only the registry, and a command line imports the one module it runs
(:meth:`Registered.load`), which imports its work — the services, and the libraries behind
them — at its top. (The declarations are named tuples, not dataclasses: ``dataclasses``
imports ``inspect``, which ``studio --help`` does not need.)
"""

from __future__ import annotations

import argparse
import importlib
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

    def load(self) -> Command:
        """The command itself (a registry entry loads its module)."""
        return self


class Registered(NamedTuple):
    """A command of the registry: its name (its module is ``studio.cli.commands.<name>``)
    and its one line in ``studio --help``; the module is imported when the command runs."""

    name: str
    help: str

    @property
    def module(self) -> str:
        return f"studio.cli.commands.{self.name}"

    def load(self) -> Command:
        """The module's :data:`COMMAND`, the module imported now (once)."""
        command = importlib.import_module(self.module).COMMAND
        if not isinstance(command, Command) or command.name != self.name:
            raise TypeError(f"{self.module}.COMMAND is not the command {self.name!r}")
        return command
