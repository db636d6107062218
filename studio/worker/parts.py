"""A stage's parts: the sub-work a stage asks for (``ctx.run_parts``), run where the
scheduler's executor says.

The executor that runs the stage (:mod:`studio.services.executors`) puts how its parts run
into the job spec (:class:`PartsConfig`, ``spec["parts"]``): on this machine, each part in a
process of its own, as many at once as the stage asks and the cores and free memory allow
(chosen by the scheduler's policy, :func:`studio.core.workpolicy.select`, each part with its
predicted memory); or, for a stage that runs as a Ray task, as Ray tasks of their own (on any
node that sees the project's store, or on the stage's node, which alone holds its inputs).
Cancelling the stage kills its part processes (or cancels its Ray tasks).
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from multiprocessing.connection import wait
from typing import Any

from studio.core import workpolicy
from studio.core.errors import StudioError
from studio.core.hostmem import available_memory
from studio.core.progress import Progress
from studio.worker.lifetime import die_with_parent

ON = ("processes", "ray")
RAY_WHERE = ("any", "node")


@dataclass(frozen=True)
class PartsConfig:
    """How a stage's parts run (set by the executor running the stage)."""

    on: str = "processes"  # "processes": this machine; "ray": Ray tasks
    processes: int = 0  # parts at once on this machine (0: as the cores and memory allow)
    ray_where: str = "any"  # Ray: "any" node that sees the store, or this "node"

    def __post_init__(self) -> None:
        if self.on not in ON or self.ray_where not in RAY_WHERE or self.processes < 0:
            raise ValueError(f"bad parts config {self}")

    def to_spec(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> PartsConfig:
        return cls(**spec) if spec else cls()

    @classmethod
    def local(cls, project: Any) -> PartsConfig:
        """Parts on this machine, as many at once as the project's
        ``pipeline.part_processes`` says (0: as the cores and the free memory allow)."""
        return cls("processes", int(project.pipeline["part_processes"]))

    @property
    def on_ray(self) -> bool:
        """Parts go to Ray: asked for, and this process is connected to a cluster."""
        if self.on != "ray" or "ray" not in sys.modules:
            return False
        import ray  # optional heavy dependency: only where the stage runs as a Ray task

        return bool(ray.is_initialized())


@dataclass(frozen=True)
class Part:
    """One part: ``fn(*args)`` (a module-level function: it is sent to another process),
    named for the progress line, with its predicted peak memory."""

    index: int
    name: str
    fn: Callable[..., Any]
    args: tuple
    memory: int


@dataclass(frozen=True)
class Say:
    """How the part runner words its progress: "{verb} {names} {where} ({how})", the stage's
    bar at (start + steps x parts done) / total."""

    verb: str
    where: str
    start: int
    total: int
    steps: int

    def __call__(self, progress: Progress, names: list[str], how: str, done: int) -> None:
        progress.update((self.start + self.steps * done) / self.total,
                        f"{self.verb} {', '.join(names)} {self.where} ({how})")


def run_parts(parts: list[Part], config: PartsConfig, progress: Progress, say: Say,
              at_once: int = 1) -> Iterator[tuple[int, Any]]:
    """Run ``parts`` where ``config`` says; yields (index, result) as each finishes."""
    if config.on_ray:
        yield from _on_ray(parts, config.ray_where == "node", progress, say)
    else:
        yield from _in_processes(parts, at_once, progress, say)


# ---- this machine: a process per part ------------------------------------------------------
def _part_main(conn: Any, fn: Callable[..., Any], args: tuple) -> None:
    """A part's process: ends with the stage's process (a killed job leaves none behind),
    leaves Ctrl-C to it, sends back its result or its error."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        out: tuple[str, Any] = ("result", fn(*args))
    except BaseException as exc:  # noqa: BLE001 - sent to the stage, which raises it
        out = ("error", exc)
    try:
        conn.send(out)
    except Exception as exc:  # noqa: BLE001 - an error that does not pickle, in words
        conn.send(("error", RuntimeError(f"{type(out[1]).__name__}: {out[1]} ({exc})")))
    conn.close()


def _in_processes(parts: list[Part], at_once: int, progress: Progress, say: Say
                  ) -> Iterator[tuple[int, Any]]:
    mp = multiprocessing.get_context("spawn")
    by_id = {p.index + 1: p for p in parts}
    waiting = dict(by_id)
    running: dict[int, tuple[Any, Any]] = {}  # id -> (process, its end of the pipe)
    done, said = 0, ""
    try:
        while waiting or running:
            free = available_memory() - sum(by_id[i].memory for i in running)
            chosen = workpolicy.select(
                [workpolicy.Work(i, workpolicy.RUNNING, memory=by_id[i].memory)
                 for i in running]
                + [workpolicy.Work(i, memory=p.memory) for i, p in waiting.items()],
                slots=at_once, free_bytes=free)
            for i in chosen.start:
                part = waiting.pop(i)
                mine, theirs = mp.Pipe(duplex=False)
                proc = mp.Process(target=_part_main, args=(theirs, part.fn, part.args),
                                  daemon=True)
                proc.start()
                theirs.close()
                running[i] = (proc, mine)
            names = [by_id[i].name for i in sorted(running)]
            if names and f"{names}" != said:  # once per change, not every poll
                said = f"{names}"
                say(progress, names, f"{at_once} at a time", done)
            ready = wait([c for _, c in running.values()]
                         + [p.sentinel for p, _ in running.values()], timeout=0.5)
            for i in sorted(running):
                proc, conn = running[i]
                if conn not in ready and proc.sentinel not in ready:
                    continue
                got = _outcome(by_id[i], proc, conn)
                del running[i]
                done += 1
                yield by_id[i].index, got
            progress.check()
    except BaseException:
        for proc, conn in running.values():
            proc.kill()
            proc.join()
            conn.close()
        raise


def _outcome(part: Part, proc: Any, conn: Any) -> Any:
    """A finished part's result; its error raised (a process that died: in one line)."""
    try:
        kind, value = conn.recv()
    except EOFError:
        proc.join()
        raise StudioError(f"{part.name}: its process ended with code {proc.exitcode} before "
                          "it finished") from None
    finally:
        conn.close()
    proc.join()
    if kind == "error":
        raise value
    return value


# ---- a Ray cluster: a task per part ---------------------------------------------------------
def _on_ray(parts: list[Part], node_only: bool, progress: Progress, say: Say
            ) -> Iterator[tuple[int, Any]]:
    """Each part a Ray task asking for one CPU and its predicted memory, so Ray places them
    where both are free (``node_only``: on this task's node, which alone sees the parts'
    folders). A part no node can give its memory to is refused in one line; cancelling
    cancels the tasks."""
    import ray  # optional heavy dependency: parts go to Ray only inside a Ray task

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    here = ray.get_runtime_context().get_node_id()
    if node_only:
        nodes = [n for n in nodes if n.get("NodeID") == here] or nodes
    offer = max((n.get("Resources", {}).get("memory", 0) for n in nodes), default=0)
    options: dict[str, Any] = {"num_cpus": 1, "max_retries": 2}
    if node_only:
        # optional (the ray extra), loaded in a Ray task only
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(here, soft=False)
    running: dict[Any, Part] = {}
    remote: dict[Any, Any] = {}
    for part in parts:
        why = workpolicy.refusal(workpolicy.Work(part.index, memory=part.memory), part.name,
                                 slots=1, memory_budget=int(offer) or None,
                                 where="the largest Ray node")
        if why:
            raise StudioError(f"{why}: export in more parts (export.max_part_mb) or add a "
                              "node with more memory")
        task = remote.setdefault(part.fn, ray.remote(part.fn))
        running[task.options(memory=part.memory, **options).remote(*part.args)] = part
    done, said = 0, ""
    try:
        pending = list(running)
        while pending:
            names = sorted(running[r].name for r in pending)
            if f"{names}" != said:
                said = f"{names}"
                say(progress, names, "Ray tasks", done)
            finished, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            for ref in sorted(finished, key=lambda r: running[r].index):
                try:
                    got = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # the part's own error, in a line
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, StudioError):
                        raise StudioError(cause.message) from None
                    raise
                done += 1
                yield running[ref].index, got
            progress.check()
    except BaseException:
        for ref in running:
            ray.cancel(ref, force=True)
        raise
