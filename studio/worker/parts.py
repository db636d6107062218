"""A stage's parts: the sub-work a stage asks for (``ctx.run_parts``), run where the
scheduler's executor says.

The executor that runs the stage (:mod:`studio.services.executors`) puts how its parts run
into the job spec (:class:`PartsConfig`, ``spec["parts"]``). Either way the parts are work
items of a :class:`~studio.core.scheduler.Scheduler` (the one the pipelines, sweeps and
queues run on), each with its predicted memory, which starts them through the executor's
``start``: on this machine, each part in a process of its own, as many at once as the stage
asks and the cores and free memory allow; or, for a stage that runs as a Ray task, as Ray
tasks of their own (on any node that sees the project's store, or on the stage's node,
which alone holds its inputs), as many at once as the cluster's memory holds. Cancelling
the stage cancels the scheduler's items: their processes are killed (or their Ray tasks
cancelled).
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
from studio.core.scheduler import FAILED, SUCCEEDED, Scheduler, WorkItem
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
    """Each part a process of its own, started by a :class:`Scheduler` with ``at_once``
    slots and the free memory less what the running parts are predicted to take."""
    mp = multiprocessing.get_context("spawn")
    by_id = {p.index + 1: p for p in parts}
    running: dict[int, tuple[Any, Any]] = {}  # id -> (process, its end of the pipe)

    def start(item: WorkItem) -> None:
        part = by_id[item.id]
        mine, theirs = mp.Pipe(duplex=False)
        proc = mp.Process(target=_part_main, args=(theirs, part.fn, part.args), daemon=True)
        proc.start()
        theirs.close()
        running[item.id] = (proc, mine)

    sched = Scheduler(slots=max(1, at_once),
                      free_bytes=lambda: available_memory()
                      - sum(by_id[i].memory for i in running))

    def stop(i: int) -> None:
        if i in running:
            running[i][0].kill()

    for i, part in by_id.items():
        sched.add(part.name, item_id=i, start=start, memory=part.memory,
                  stop=lambda i=i: stop(i))
    done, said = 0, ""
    try:
        while True:
            sched.step()
            _raise_failed(sched)
            if not running:  # a part alone always starts: none runs, none waits
                break
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
                del running[i]
                got = _outcome(by_id[i], proc, conn)
                sched.ended(i, SUCCEEDED, result=got)
                done += 1
                yield by_id[i].index, got
            progress.check()
    except BaseException:
        sched.cancel()  # kills the running parts' processes
        for proc, conn in running.values():
            proc.join()
            conn.close()
        raise


def _raise_failed(sched: Scheduler) -> None:
    """A part the scheduler could not start (its process did not start, or no slot can ever
    hold it) ends the stage, with that reason."""
    for item in sched.items.values():
        if item.state == FAILED:
            raise item.error or StudioError(item.why)


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
    for part in parts:
        why = workpolicy.refusal(workpolicy.Work(part.index, memory=part.memory), part.name,
                                 slots=1, memory_budget=int(offer) or None,
                                 where="the largest Ray node")
        if why:
            raise StudioError(f"{why}: export in more parts (export.max_part_mb) or add a "
                              "node with more memory")
    remote: dict[Any, Any] = {}
    refs: dict[int, Any] = {}  # a started part's id -> its task

    def start(item: WorkItem) -> None:
        part = by_id[item.id]
        task = remote.setdefault(part.fn, ray.remote(part.fn))
        refs[item.id] = task.options(memory=part.memory, **options).remote(*part.args)

    def stop(i: int) -> None:
        if i in refs:
            ray.cancel(refs[i], force=True)

    # as many at once as the cluster's memory holds: Ray places each task where a CPU and
    # its memory are free
    by_id = {p.index + 1: p for p in parts}
    total = sum(int(n.get("Resources", {}).get("memory", 0)) for n in nodes)
    sched = Scheduler(slots=len(parts), where="the Ray cluster",
                      free_bytes=lambda: total - sum(by_id[i].memory for i in refs))
    for i, part in by_id.items():
        sched.add(part.name, item_id=i, start=start, memory=part.memory,
                  stop=lambda i=i: stop(i))
    done, said = 0, ""
    try:
        sched.step()
        _raise_failed(sched)
        while refs:
            names = sorted(by_id[i].name for i in refs)
            if f"{names}" != said:
                said = f"{names}"
                say(progress, names, "Ray tasks", done)
            finished, _ = ray.wait(list(refs.values()), num_returns=1, timeout=0.5)
            for i in sorted(i for i, r in refs.items() if r in finished):
                try:
                    got = ray.get(refs.pop(i))
                except ray.exceptions.RayTaskError as exc:  # the part's own error, in a line
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, StudioError):
                        raise StudioError(cause.message) from None
                    raise
                sched.ended(i, SUCCEEDED, result=got)
                done += 1
                yield by_id[i].index, got
            sched.step()
            _raise_failed(sched)
            progress.check()
    except BaseException:
        sched.cancel()  # cancels the tasks still running
        raise
