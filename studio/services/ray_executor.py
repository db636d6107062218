"""Stage jobs as Ray tasks: a sweep spread over a Ray cluster (``pip install qstudio[ray]``).

Each stage job of each point is one Ray task with a resource request (one CPU and the
memory :func:`studio.services.workers.job_memory` gives). Artifacts move by content hash:

- **shared store**: a node that sees the project's artifact store at the same path (the
  local cluster, or a cluster on a shared file system) reads its inputs there and writes
  its output into the store's tmp folder; the coordinator commits it under its key.
- **copy**: any other node gets its inputs as archives through Ray's object store (each
  key packed once, unpacked once per node into a cache keyed by the artifact key) and
  sends its output back as an archive, which the coordinator commits into the project's
  store. ``transfer="copy"`` forces this even where the store is visible.

A stage's own parts (the compile of a model exported in parts) go to Ray as tasks of their
own (``ctx.run_parts``, :mod:`studio.worker.parts`: the job spec's ``parts`` says so): on
any node with the shared store, on the stage's node with a copy.

A node lost while a task runs (its worker process or machine dies) is retried by Ray up
to ``max_retries`` times; a stage's own error is not retried (it would fail again).
Cancelling sends a forced cancel to the running tasks.

Verified here on a local Ray cluster on 127.0.0.1 (``ray start --head``); a multi-machine
cluster (``--ray-address HOST:PORT``) is the same code path, not tried here.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import socket
import tarfile
import tempfile
import traceback
import uuid
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.errors import StudioError as _UserError
from studio.core.fsutil import atomic_write_text
from studio.services.workers import OnMessage, job_memory
from studio.worker.parts import PartsConfig
from studio.worker.stages import run_stage

TRANSFERS = ("auto", "copy")
_STORE_ID = ".store-id"


def _pack(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                tar.add(p, arcname=str(p.relative_to(folder)))
    return buf.getvalue()


def _unpack(blob: bytes, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        tar.extractall(dest, filter="data")


class _Collect:
    """A Progress for a stage run inside a Ray task: keeps the log lines it is given."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def update(self, fraction: float, message: str = "") -> None:
        return None

    def log(self, message: str) -> None:
        self.lines.append(message)

    def partial(self, data: dict[str, Any]) -> None:
        return None

    def check(self) -> None:
        return None


# the node's own temporary folder, read once: a task points TMPDIR at its scratch folder
# while it runs (the stages' temporary files), and puts it back after
_NODE_TMP = tempfile.gettempdir()


def _node_cache() -> Path:
    return Path(_NODE_TMP) / "qstudio-ray-inputs"


def run_task(spec: dict[str, Any], store_root: str, store_id: str, transfer: str,
             input_refs: dict[str, Any]) -> dict[str, Any]:
    """The body of one Ray task (runs on a cluster node): the stage, in this process."""
    root = Path(store_root)
    try:
        shared = transfer != "copy" and (root / _STORE_ID).read_text().strip() == store_id
    except OSError:
        shared = False
    spec = dict(spec)
    scratch = Path(tempfile.mkdtemp(prefix="qstudio-task-", dir=_NODE_TMP))
    old_tmp = os.environ.get("TMPDIR")
    try:
        if not shared:
            import ray  # optional (the ray extra): this runs inside a Ray task

            inputs = {}
            for label, key in spec["input_keys"].items():
                folder = _node_cache() / key
                if not (folder / "artifact.json").exists():
                    tmp = _node_cache() / f".{key}.{uuid.uuid4().hex}"
                    _unpack(ray.get(input_refs[key]), tmp)
                    try:
                        tmp.rename(folder)
                    except OSError:  # another task unpacked it first

                        shutil.rmtree(tmp, ignore_errors=True)
                inputs[label] = str(folder)
            spec["inputs"] = inputs
            spec["workdir"] = str(scratch / "out")
            Path(spec["workdir"]).mkdir()
        os.environ["TMPDIR"] = str(scratch)
        tempfile.tempdir = None
        # a stage's parts (the compile's) go to Ray as tasks of their own: anywhere when this
        # task works in the shared store, else on this node, which alone holds its inputs
        spec["parts"] = PartsConfig("ray", ray_where="any" if shared else "node").to_spec()

        progress = _Collect()
        try:
            out = run_stage(spec, progress)  # type: ignore[arg-type]
        except _UserError as exc:
            return {"type": "error", "kind": "user", "message": exc.message,
                    "node": socket.gethostname()}
        except Exception as exc:  # noqa: BLE001 - reported with its traceback
            return {"type": "error", "kind": "bug", "message": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(), "node": socket.gethostname()}
        return {"type": "result", "result": out["result"], "facts": out["facts"],
                "log": progress.lines[-200:], "node": socket.gethostname(),
                "archive": None if shared else _pack(Path(spec["workdir"]))}
    finally:
        if old_tmp is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old_tmp
        tempfile.tempdir = None
        shutil.rmtree(scratch, ignore_errors=True)


class RayExecutor:
    """Runs stage jobs as Ray tasks; see the module docstring."""

    name = "ray"

    def __init__(self, store, address: str | None, workers: int | None,
                 transfer: str = "auto", model_bytes: int = 0, max_retries: int = 2):
        try:  # optional: the ray extra (pip install 'qstudio[ray]')
            import ray
        except ImportError:
            raise StudioError("the ray executor needs the ray package: pip install "
                              "'qstudio[ray]' (or use --executor local)") from None
        if transfer not in TRANSFERS:
            raise StudioError(f"transfer {transfer!r} is not one of {', '.join(TRANSFERS)}")
        self.ray = ray
        self.store = store
        self.transfer = transfer
        self.memory = job_memory(model_bytes)
        self.max_retries = max_retries
        self._refs: dict[int, Any] = {}
        self._archives: dict[str, Any] = {}
        id_file = Path(store.root) / _STORE_ID
        if not id_file.exists():
            atomic_write_text(id_file, uuid.uuid4().hex)
        self.store_id = id_file.read_text().strip()
        self.started_here = False
        if not ray.is_initialized():
            try:
                if address:
                    ray.init(address=address, log_to_driver=False,
                             configure_logging=False)
                else:
                    ray.init(num_cpus=workers or os.cpu_count() or 1, include_dashboard=False,
                             log_to_driver=False, configure_logging=False,
                             object_store_memory=256 * 2**20)
                    self.started_here = True
            except Exception as exc:  # noqa: BLE001 - ray raises many kinds here
                where = address or "a local cluster"
                raise StudioError(f"cannot start or reach Ray at {where}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                                  " (start one with: ray start --head)") from None
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.size = min(workers, cpus) if workers else cpus
        self.address = address or "local"
        self._task = ray.remote(run_task)

    def describe(self) -> str:
        return (f"Ray ({self.address}), {self.size} task(s) at once, "
                f"{self.memory >> 20} MiB and 1 CPU per task")

    def _archive(self, key: str, path: Path) -> Any:
        ref = self._archives.get(key)
        if ref is None:
            ref = self._archives[key] = self.ray.put(_pack(path))
        return ref

    async def run(self, spec: dict[str, Any], on_message: OnMessage | None = None
                  ) -> dict[str, Any]:
        refs = {}
        if self.transfer == "copy" or not self._local_cluster():
            refs = {key: self._archive(key, Path(spec["inputs"][label]))
                    for label, key in spec["input_keys"].items()}
        task = self._task.options(num_cpus=1, memory=self.memory,
                                  max_retries=self.max_retries, retry_exceptions=False)
        ref = task.remote(spec, str(self.store.root), self.store_id, self.transfer, refs)
        self._refs[spec["job_id"]] = ref
        try:
            out = await asyncio.wrap_future(ref.future())
        except asyncio.CancelledError:
            self.ray.cancel(ref, force=True)
            raise
        except self.ray.exceptions.TaskCancelledError:
            return {"type": "died", "returncode": None, "message": "cancelled"}
        except self.ray.exceptions.RayTaskError as exc:  # the task itself raised
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            return {"type": "error", "kind": "bug", "job_id": spec["job_id"],
                    "message": f"{type(cause).__name__}: {cause}",
                    "traceback": str(exc)}
        except self.ray.exceptions.RayError as exc:  # its worker or node died
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return {"type": "died", "returncode": None,
                    "message": f"the Ray task was lost after {self.max_retries} retries "
                               f"({type(exc).__name__}{': ' + first if first else ''})"}
        finally:
            self._refs.pop(spec["job_id"], None)
        if on_message is not None:
            for line in out.get("log", []):
                on_message({"type": "log", "line": line})
        if out.get("archive") is not None:
            _unpack(out.pop("archive"), Path(spec["workdir"]))
        out["job_id"] = spec["job_id"]
        return out

    def _local_cluster(self) -> bool:
        return self.address == "local" or self.address.split(":")[0] in (
            "127.0.0.1", "localhost", socket.gethostname())

    def cancel(self, job_id: int | None = None) -> None:
        for jid, ref in list(self._refs.items()):
            if job_id is None or jid == job_id:
                self.ray.cancel(ref, force=True)

    async def close(self) -> None:
        self._archives.clear()
        if self.started_here:
            self.ray.shutdown()

    def kill(self) -> None:
        self.cancel()
        if self.started_here:
            self.ray.shutdown()

    async def stop(self) -> None:
        """As :meth:`kill` (the tasks run in Ray's processes: nothing of them to reap here)."""
        self.kill()
