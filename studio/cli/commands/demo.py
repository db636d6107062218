"""``studio demo FILE [--scene N|NAME] [--windowed]``: the full-screen demo of a project.

Listed here for ``studio --help``; the demo opens a window, so ``studio/__main__.py`` takes
``studio demo`` before the command line sees it, and the command line alone only says so.
"""

from __future__ import annotations

import argparse

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.core.errors import StudioError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")


def run(args: argparse.Namespace, ctx: Context) -> int:
    raise StudioError("the demo opens a window, which the command line alone cannot: "
                      f"run `studio demo {args.file}`")


COMMAND = registered("demo", add_arguments, run)
