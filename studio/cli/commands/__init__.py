"""The commands of the ``studio`` command line, one module each, and their registry.

:data:`COMMANDS` is the one place a command is registered, with its line of help:
``studio.cli.main`` builds the parser from it, and ``studio --help`` lists the commands in its
order without importing them; the command a line names is imported when it runs (see
:mod:`studio.cli.command`). A new command is a module here ending with
``COMMAND = registered(name, add_arguments, run)`` and one line below.
"""

from __future__ import annotations

from collections.abc import Callable

from studio.cli.command import Command, Registered

COMMANDS: tuple[Registered, ...] = (
    Registered("new", "create a project file"),
    Registered("info", "describe a project file"),
    Registered("compare", "compare two runs: changed settings and metric deltas"),
    Registered("layerdiff", "FP32 vs host QDQ vs HTP tensor by tensor (run studio --batch FILE "
                            "--stages layerdiff first)"),
    Registered("bisect", "where a quantized model leaves FP32: FP32 vs the unquantized HTP, the "
                         "layers that add error, the first layer out of band, and a verdict"),
    Registered("overrides", "per-tensor precision as QNN / AIMET encodings JSON"),
    Registered("targets", "list the chip catalog"),
    Registered("doctor", "check this machine, a project and a device before the work: each check "
                         "PASS / WARN / FAIL with its fix"),
    Registered("generate", "generate text with the deployed model on a device"),
    Registered("prune", "rank blocks by ablation and write a pruned checkpoint"),
    Registered("bundle", "a Genie bundle for a target chip, checked by running Genie on the HTP "
                         "simulator"),
    Registered("graph", "any ONNX network onto a target's NPU: placement, quantization, "
                        "validation per output, latency"),
    Registered("agent", "the device agent that runs jobs on a target machine"),
    Registered("devices", "the device registry: list, add or remove agents"),
    Registered("waterfall", "the optimization waterfall: each step measured on the host CPU and "
                            "estimated for a chip"),
    Registered("profile", "show, export or import profiles"),
    Registered("sweep", "run a recipe sweep: every point through the stage graph, the Pareto "
                        "front and the best point"),
    Registered("queue", "the window's work queue: list, add, run headless, cancel"),
    Registered("report", "write the report of a run (any run of the history) as HTML, Markdown, "
                         "PDF or JSON"),
    Registered("demo", "the full-screen stakeholder demo of a project (a window: studio demo FILE"
                       " [--scene N|NAME] [--windowed])"),
    Registered("estimate", "estimated prefill / decode tok/s of an architecture on a chip "
                           "(performance model, no weights needed)"),
)


def registered(name: str, add_arguments: Callable, run: Callable) -> Command:
    """A command module's declaration: its functions, with its line of help from
    :data:`COMMANDS` (the registry holds the help so that ``studio --help`` needs no
    command's module)."""
    entry = next((c for c in COMMANDS if c.name == name), None)
    if entry is None:
        raise LookupError(f"the command {name!r} is not in studio.cli.commands.COMMANDS")
    return Command(name, entry.help, add_arguments, run)
