"""The commands of the ``studio`` command line, one module each, and their registry.

:data:`COMMANDS` is the one place a command is registered: ``studio.cli.main`` builds the
parser from it, and ``studio --help`` lists the commands in its order. A new command is a
module here ending with ``COMMAND = Command(name, help, add_arguments, run)`` (see
:mod:`studio.cli.command`) and one line below.
"""

from __future__ import annotations

from studio.cli.command import Command
from studio.cli.commands import (
    agent,
    bisect,
    bundle,
    compare,
    demo,
    devices,
    doctor,
    estimate,
    generate,
    graph,
    info,
    layerdiff,
    new,
    overrides,
    profile,
    prune,
    queue,
    report,
    sweep,
    targets,
    waterfall,
)

COMMANDS: tuple[Command, ...] = (
    new.COMMAND,
    info.COMMAND,
    compare.COMMAND,
    layerdiff.COMMAND,
    bisect.COMMAND,
    overrides.COMMAND,
    targets.COMMAND,
    doctor.COMMAND,
    generate.COMMAND,
    prune.COMMAND,
    bundle.COMMAND,
    graph.COMMAND,
    agent.COMMAND,
    devices.COMMAND,
    waterfall.COMMAND,
    profile.COMMAND,
    sweep.COMMAND,
    queue.COMMAND,
    report.COMMAND,
    demo.COMMAND,
    estimate.COMMAND,
)
