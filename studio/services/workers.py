"""Worker subprocesses (``python -m studio.worker``) and a bounded pool of them.

A :class:`WorkerProcess` runs one job spec at a time over the JSON-lines protocol
(``studio/worker/protocol.py``) and stays warm for the next; a crash or a kill ends it and
the next job starts a new one. A :class:`LocalPool` keeps up to ``size`` of them, sized by
:func:`local_workers` from the host's cores and free memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.hostmem import available_memory

OnMessage = Callable[[dict[str, Any]], None]

#: memory one stage job of a small model may take (torch + onnxruntime + the HTP simulator);
#: a larger checkpoint needs about three times its size on top
JOB_BASE_MEMORY = 1_500 * 2**20


def worker_command() -> list[str]:
    """The command line of a worker subprocess: ``python -m studio.worker``, or in a frozen
    desktop build (PyInstaller, where ``sys.executable`` is the app itself) the app with
    ``--studio-worker``, which ``studio/__main__.py`` hands to the worker's main."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "--studio-worker"]
    return [sys.executable, "-m", "studio.worker"]


def job_memory(model_bytes: int = 0) -> int:
    """Bytes one stage job needs: the base plus three copies of the model's weights (the
    FP32 graph, the quantized graph and the context binary being built)."""
    return JOB_BASE_MEMORY + 3 * max(0, model_bytes)


def local_workers(asked: int | None, model_bytes: int = 0) -> tuple[int, str]:
    """How many local workers to run, and why: at most the cores and what free memory
    holds (``asked`` is capped by both; None asks for as many as they allow)."""
    cores = os.cpu_count() or 1
    by_memory = max(1, available_memory() // job_memory(model_bytes))
    cap = min(cores, by_memory)
    if asked is None:
        return cap, (f"{cap} worker(s): {cores} core(s), memory for {by_memory} job(s) "
                     f"of {job_memory(model_bytes) >> 20} MiB")
    if asked < 1:
        raise StudioError(f"--workers {asked}: give at least 1")
    if asked > cap:
        return cap, (f"{cap} worker(s), not {asked}: {cores} core(s), memory for {by_memory} "
                     f"job(s) of {job_memory(model_bytes) >> 20} MiB")
    return asked, f"{asked} worker(s)"


class WorkerProcess:
    """One warm worker subprocess; ``run`` sends a job spec and returns its outcome."""

    def __init__(self, scratch_root: Path):
        self.scratch_root = Path(scratch_root)
        self.proc: asyncio.subprocess.Process | None = None
        self.scratch: Path | None = None
        self._stderr: asyncio.Future | None = None
        self.on_stderr: Callable[[str], None] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        if self.alive:
            return
        # the stages' temporary files go under the store's tmp folder, which the next open
        # cleans after a killed run
        self.scratch = self.scratch_root / f"scratch-{os.getpid()}-{id(self):x}"
        self.scratch.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, TMPDIR=str(self.scratch))
        self.proc = await asyncio.create_subprocess_exec(
            *worker_command(),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, limit=1 << 24, env=env,
        )
        self._stderr = asyncio.ensure_future(self._read_stderr(self.proc))

    async def _read_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr
        async for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line and self.on_stderr is not None:
                self.on_stderr(line)

    def terminate(self) -> None:
        """Stop the job it runs (SIGTERM to its process group)."""
        if self.alive:
            assert self.proc is not None
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._drop_scratch()

    async def stop(self) -> None:
        """Kill the worker (its process group) and wait until it is gone: its exit reaped,
        its pipes and their reader closed, its scratch folder removed. What is left to the
        garbage collector after the event loop closes (an interrupted ``asyncio.run``) ends
        in "RuntimeError: Event loop is closed" on stderr; a run stopped by Ctrl-C awaits this
        instead."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
        reader, self._stderr = self._stderr, None
        if reader is not None:  # it ends at the pipe's end; its outcome is not wanted
            await asyncio.wait({reader}, timeout=5)
            if not reader.done():
                reader.cancel()
        self._drop_scratch()

    def _drop_scratch(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    async def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None and proc.stdin is not None:
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                self.proc = proc
                self.kill()
                await proc.wait()
        if self._stderr is not None:
            await self._stderr
            self._stderr = None
        self._drop_scratch()

    async def run(self, spec: dict[str, Any], on_message: OnMessage | None = None
                  ) -> dict[str, Any]:
        """Run one job: the worker's ``result`` / ``error`` line, or, when the process
        died, ``{"type": "died", "returncode": rc}``."""
        await self.start()
        proc = self.proc
        assert proc is not None and proc.stdin and proc.stdout
        try:
            proc.stdin.write(json.dumps(spec).encode() + b"\n")
            await proc.stdin.drain()
            while True:
                raw = await proc.stdout.readline()
                if not raw:
                    break
                try:
                    msg = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                if msg.get("type") in ("result", "error") and msg.get("job_id") == spec.get(
                        "job_id"):
                    return msg
                if on_message is not None:
                    on_message(msg)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except asyncio.CancelledError:
            await self.stop()
            raise
        rc = await proc.wait()
        self.proc = None
        self._drop_scratch()
        return {"type": "died", "returncode": rc}


def died_message(rc: int | None) -> str:
    if rc is not None and rc < 0:
        try:
            return f"the worker process was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"the worker process was killed by signal {-rc}"
    return f"the worker process ended with code {rc}"


class LocalPool:
    """Up to ``size`` warm workers on this machine; ``run`` waits for a free one."""

    name = "local"

    def __init__(self, size: int, scratch_root: Path, parts: dict[str, Any] | None = None):
        self.size = size
        self.parts = parts  # how a job's own parts run (studio.worker.parts), into its spec
        self._free: asyncio.Queue[WorkerProcess] = asyncio.Queue()
        for _ in range(size):
            self._free.put_nowait(WorkerProcess(scratch_root))
        self._all = list(self._free._queue)  # type: ignore[attr-defined]
        self._busy: dict[int, WorkerProcess] = {}

    def describe(self) -> str:
        return f"local process pool, {self.size} worker(s)"

    async def run(self, spec: dict[str, Any], on_message: OnMessage | None = None
                  ) -> dict[str, Any]:
        worker = await self._free.get()
        self._busy[spec["job_id"]] = worker
        if self.parts is not None:
            spec = {**spec, "parts": self.parts}
        try:
            return await worker.run(spec, on_message)
        finally:
            self._busy.pop(spec["job_id"], None)
            self._free.put_nowait(worker)

    def cancel(self, job_id: int | None = None) -> None:
        for jid, worker in list(self._busy.items()):
            if job_id is None or jid == job_id:
                worker.terminate()

    async def close(self) -> None:
        for worker in self._all:
            await worker.close()

    def kill(self) -> None:
        for worker in self._all:
            worker.kill()

    async def stop(self) -> None:
        """Every worker killed and reaped (:meth:`WorkerProcess.stop`)."""
        for worker in self._all:
            await worker.stop()
