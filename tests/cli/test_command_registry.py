"""The command line's commands: one module each, registered once in
``studio.cli.commands.COMMANDS``, which the parser, ``studio --help`` and the dispatch read."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import pytest

import studio.cli.commands
from studio.cli.command import Command, Context
from studio.cli.commands import COMMANDS
from studio.cli.main import build_parser, main
from studio.core.errors import GateFailed, StudioError

# a command as a new module under studio/cli/commands/ would write it (there it ends with
# ``COMMAND = Command(...)``, and COMMANDS gets one more line)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("word")
    p.add_argument("--times", type=int, default=1, help="how often (default 1)")


def _run(args: argparse.Namespace, ctx: Context) -> int:
    if args.times < 1:
        raise StudioError(f"--times {args.times}: give at least 1")
    if args.word == "gate":
        raise GateFailed("a gate failed")
    print(" ".join([args.word] * args.times), "(pdf printer)" if ctx.pdf_printer else "")
    return 0


ECHO = Command("echo", "print a word, several times", _add_arguments, _run)


def test_a_new_command_is_one_declaration_in_the_registry(capsys):
    commands = (*COMMANDS, ECHO)
    assert main(["echo", "hi", "--times", "2"], commands=commands) == 0
    assert capsys.readouterr().out == "hi hi \n"
    # what the entry point hands in reaches the command
    assert main(["echo", "hi"], commands=commands, pdf_printer=lambda html, charts: b"") == 0
    assert capsys.readouterr().out == "hi (pdf printer)\n"
    # errors are handled in one place for every command: one line on stderr, its exit code
    assert main(["echo", "hi", "--times", "0"], commands=commands) == 2
    assert capsys.readouterr().err == "error: --times 0: give at least 1\n"
    assert main(["echo", "gate"], commands=commands) == 1
    assert main(["echo", "hi", "--times", "x"], commands=commands) == 2
    assert "invalid int value: 'x' (see studio --help)" in capsys.readouterr().err
    # studio --help lists it after the others, in its own words
    listed = build_parser(commands).format_help()
    assert "    echo                print a word, several times\n" in listed
    assert listed.index("    estimate") < listed.index("    echo")
    # and the registry the real command line uses is unchanged by it
    assert main(["echo", "hi"]) == 2
    assert "invalid choice: 'echo'" in capsys.readouterr().err


def test_every_command_module_is_registered_once_under_its_name():
    modules = sorted(m.name for m in pkgutil.iter_modules(studio.cli.commands.__path__))
    declared = {m: importlib.import_module(f"studio.cli.commands.{m}").COMMAND for m in modules}
    assert {m: c.name for m, c in declared.items()} == {m: m for m in modules}
    assert sorted(c.name for c in COMMANDS) == modules  # each once, none left out
    assert all(declared[c.name] is c.load() for c in COMMANDS)


def test_help_lists_the_commands_in_the_registry_order():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert [(a.dest, a.help) for a in sub._choices_actions] == [(c.name, c.help)
                                                               for c in COMMANDS]
    assert list(sub.choices) == [c.name for c in COMMANDS]


def test_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: studio") and "--batch FILE" in out
