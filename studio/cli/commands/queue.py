"""``studio queue list [--all] [--json]`` | ``studio queue add FILE [--stages S,..] [--target T
...] [--remeasure] [--sweep NAME [--workers K]] [--priority normal|high]`` | ``studio queue
run [--poll S] [--quiet]`` | ``studio queue cancel ID``: the window's work queue from the
command line — the same file in the app's config folder, the same scheduler
(:mod:`studio.services.workqueue`): ``list`` says why each waiting item waits, ``add`` lines
up a project's run or sweep (the same work already waiting is not queued twice), ``run``
runs what waits headless until nothing does (items added meanwhile too; the window's pause
does not hold it), ``cancel`` ends an item that has not started."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from studio.cli.command import Context, Parser
from studio.cli.commands import registered
from studio.cli.common import number, whole
from studio.core import project as projectfile
from studio.core.errors import StudioError
from studio.services import workqueue
from studio.services.pipeline import plan
from studio.services.queuework import HeadlessQueue
from studio.services.registry import config_dir
from studio.services.sweeps import find_spec
from studio.services.workqueue import WorkQueue

PRIORITY = {"normal": 0, "high": 1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="queue_command", parser_class=Parser, required=True,
                           metavar="{list,add,run,cancel}")
    ls = sub.add_parser("list", help="the waiting and running items, and why each waits")
    ls.add_argument("--all", action="store_true", help="the ended items too")
    ls.add_argument("--json", dest="queue_json", action="store_true", help="print JSON")
    add = sub.add_parser("add", help="queue a project's run (or --sweep)")
    add.add_argument("file")
    add.add_argument("--stages", help="comma-separated stages (default: the whole pipeline)")
    add.add_argument("--target", action="append", help="only this target (repeatable)")
    add.add_argument("--remeasure", action="store_true",
                     help="time the run and profile stages again")
    add.add_argument("--sweep", help="queue this [[sweeps]] of the project instead of a run")
    add.add_argument("--workers", type=whole(1, 64), default=1,
                     help="with --sweep: its jobs at once (default 1)")
    add.add_argument("--priority", choices=tuple(PRIORITY), default="normal")
    run = sub.add_parser("run", help="run the waiting items headless, until none waits")
    run.add_argument("--poll", type=number(above=0, high=3600), default=2.0,
                     help="seconds between looks while items wait for another process")
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")
    cancel = sub.add_parser("cancel", help="cancel an item that has not started")
    cancel.add_argument("id", type=whole(1, 2**62))


def _queue():
    return WorkQueue(config_dir() / "queue.sqlite")


def _list(queue, args: argparse.Namespace) -> int:
    sched = workqueue.queue_scheduler(queue, lambda _w: None)
    workqueue.sync(sched, queue, lambda _w: None)  # to say why: nothing starts here
    chosen = sched.selection()
    items = queue.items(finished=args.all)
    why = {i.id: (chosen.why.get(i.id) or ("starts next" if i.id in chosen.start else ""))
           if i.state == workqueue.WAITING else i.message for i in items}
    for item_id in chosen.start:  # nothing starts here: the one chosen starts next, not now
        said = f"#{item_id} of the same project (runs now)"
        why = {k: v.replace(said, f"#{item_id} of the same project (starts next)")
               for k, v in why.items()}
    if args.queue_json:
        print(json.dumps([{"id": i.id, "project": i.project, "name": i.name, "kind": i.kind,
                           "what": i.what, "state": i.state,
                           "priority": workqueue.PRIORITIES[i.priority], "run_id": i.run_id,
                           "why": why[i.id]} for i in items], indent=1))
        return 0
    print(workqueue.Counts.of(items, queue.paused).text() + f" · {queue.slots} at once")
    for i in items:
        high = " (high)" if i.priority else ""
        print(f"#{i.id:<4} {i.state:<10} {i.name}: {i.what}{high}"
              + (f"\n       {why[i.id]}" if why[i.id] else ""))
    return 0


def _add(queue, args: argparse.Namespace) -> int:
    project = projectfile.load(Path(args.file))
    if args.sweep:
        find_spec(project, args.sweep)  # an unknown sweep: one line now, not a failed item
        kind, spec = "sweep", {"sweep": args.sweep, "workers": args.workers}
    else:
        stages = ([s.strip() for s in args.stages.split(",") if s.strip()]
                  if args.stages is not None else None)
        plan(project, stages, args.target)  # an unknown stage or target: one line now
        kind, spec = "pipeline", {"stages": stages, "targets": args.target, "retry": None,
                                  "remeasure": args.remeasure}
    same = workqueue.same_work(queue.items(finished=False), project.path, kind, spec)
    if same is not None and same.state == workqueue.WAITING:
        print(f"#{same.id} ({same.what}) already waits: not queued twice")
        return 0
    item = queue.add(project.path, project.name, kind, spec, PRIORITY[args.priority],
                     peak=workqueue.predicted_peak(project, kind, spec))
    print(f"queued #{item.id}: {item.name}: {item.what}")
    return 0


def _run(queue, args: argparse.Namespace) -> int:
    def say(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    ran = asyncio.run(HeadlessQueue(queue, say).run(poll=args.poll))
    if not ran:
        say("nothing waits in the queue")
        return 0
    ok = sum(1 for w in ran if w.state == "succeeded")
    say(f"{len(ran)} item(s) ran: {ok} succeeded, {len(ran) - ok} did not")
    return 0 if ok == len(ran) else 2


def _cancel(queue, args: argparse.Namespace) -> int:
    item = queue.get(args.id)  # no such item: one line
    if not queue.cancel_waiting(item.id):
        item = queue.get(item.id)
        if item.state == "running":
            raise StudioError(f"#{item.id} runs now (in a window or a studio queue run): "
                              "stop it there")
        raise StudioError(f"#{item.id} has ended ({item.state}): there is nothing to cancel")
    print(f"cancelled #{item.id}: {item.name}: {item.what}")
    return 0


def run(args: argparse.Namespace, ctx: Context) -> int:
    queue = _queue()
    try:
        return {"list": _list, "add": _add, "run": _run,
                "cancel": _cancel}[args.queue_command](queue, args)
    finally:
        queue.close()


COMMAND = registered("queue", add_arguments, run)
