"""The graphs of a model's parts run as one graph.

A model exported in parts (:mod:`studio.core.parts`) has, for each graph kind (prefill,
decode, verify), one graph per part in ``<folder>/<part name>/``; a single part keeps its
graphs in the folder itself. :class:`ChainSession` runs one kind's part graphs in order
behind ONNX Runtime's ``run`` / ``get_inputs`` interface, so every consumer of a graph (the
generator, validation, a device backend) takes N parts as it takes one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError


class ChainSession:
    """The sessions of one graph kind's parts, in order, as one session: ``run`` feeds each
    part the inputs it names (the previous part's hand-off among them) and returns the
    outputs asked for, whichever part made them."""

    def __init__(self, sessions: Sequence[Any]):
        if not sessions:
            raise StudioError("a chain of parts needs at least one graph")
        self.sessions = list(sessions)
        self._ins = [[i.name for i in s.get_inputs()] for s in self.sessions]
        self._outs = [[o.name for o in s.get_outputs()] for s in self.sessions]
        made: set[str] = set()
        inputs: list[Any] = []
        for s in self.sessions:
            for i in s.get_inputs():
                if i.name not in made and i.name not in {x.name for x in inputs}:
                    inputs.append(i)
            made.update(o.name for o in s.get_outputs())
        self._inputs = inputs
        self._outputs = [o for s in self.sessions for o in s.get_outputs()]

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def run(self, output_names, feeds, run_options=None):
        values: dict[str, Any] = dict(feeds)
        for session, ins, outs in zip(self.sessions, self._ins, self._outs, strict=True):
            got = session.run(outs, {n: values[n] for n in ins}, run_options)
            values.update(zip(outs, got, strict=True))
        names = output_names or [o.name for o in self._outputs]
        return [values[n] for n in names]


def part_dirs(spec: dict, graphs_dir: Path) -> list[Path]:
    """The folder of each part's graphs (the graphs folder itself for a single part)."""
    parts = spec.get("parts") or []
    if len(parts) <= 1:
        return [Path(graphs_dir)]
    return [Path(graphs_dir) / p["name"] for p in parts]


def chain_session(spec: dict, graphs_dir: Path, graph: str, make) -> Any:
    """One session for ``graph`` (prefill / decode / verify): ``make(path)`` of the single
    graph, or a :class:`ChainSession` over the parts' graphs."""
    dirs = part_dirs(spec, graphs_dir)
    if len(dirs) == 1:
        return make(dirs[0] / f"{graph}.onnx")
    return ChainSession([make(d / f"{graph}.onnx") for d in dirs])
