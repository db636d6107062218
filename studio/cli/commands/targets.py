"""``studio targets``: list the chip catalog."""

from __future__ import annotations

import argparse

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.core.catalog import load_catalog


def add_arguments(p: argparse.ArgumentParser) -> None:
    """None: the catalog is listed whole."""


def run(args: argparse.Namespace, ctx: Context) -> int:
    for key, chip in load_catalog().items():
        print(f"{key:<24} {chip.name:<32} htp_arch v{chip.htp_arch}  soc_model {chip.soc_model}")
    return 0


COMMAND = registered("targets", add_arguments, run)
