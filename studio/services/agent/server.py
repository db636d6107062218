"""The device agent: an aiohttp server that runs on a target machine and runs the studio's
jobs there (``studio agent serve``).

Protocol (JSON over HTTP; every route but ``/health`` needs ``Authorization: Bearer TOKEN``,
compared in constant time):

``GET /health``
    ``{"status": "ok", "protocol": N}`` — no details before authentication.
``GET /info``
    versions (onnxruntime, onnxruntime-qnn, QNN SDK build), the machine, and the backends it
    runs with the source label of their figures (``measured`` on real hardware, ``simulated``
    on the HTP simulator).
``HEAD|PUT /artifacts/<sha256>``
    a file by content hash: PUT stores the body when its SHA-256 matches (else 400), refuses a
    body over the size limit (413); names that are not 64 hex digits are refused (400).
``POST /models``  ``{"files": {"relative/path": sha256}}``
    a folder of uploaded files (relative paths only: no ``..``, no absolute or drive paths, no
    backslashes, no encoded forms, no path both a file and a folder) -> ``{"model": id}`` (the
    manifest's hash).
``POST /jobs``  ``{"kind": "generate", "model", "backend", "prompt_ids", "max_new_tokens",
"sampling", "eos_ids", "sdk_build"}`` -> ``{"job": id}``; at most ``max_jobs`` at once (429).
``{"kind": "profile", ...}`` profiles decode steps; ``{"kind": "tensors", "graph", "feeds",
"outputs", "fp16"}`` runs an uploaded graph on its HTP and returns the named outputs (a layer
diff's tensors on a device).
``GET /jobs/<id>/events``
    server-sent events: ``token`` (``{"index", "token"}``), then ``done`` (the result) or
    ``error`` (``{"message"}``).
``DELETE /jobs/<id>``
    cancels between tokens.

An HTP job whose context binaries were built with another QNN SDK than the agent's is refused
with both versions named.

Bad requests cost little and never a 500: a JSON body is at most :data:`MAX_JSON_BODY` bytes
(413; the upload limit is for ``PUT /artifacts`` only), UTF-8, nested at most
:data:`studio.core.fsutil.MAX_NESTING` deep, of the shape its route takes (else 400); the job
limit is taken before the request awaits anything, so concurrent ``POST /jobs`` never start
more than ``max_jobs``; a client that keeps sending a wrong token is answered 429 for a while
(the throttle keys on the address and the token tried, so the right token from the same
address, a shared NAT's other clients, still gets in; only someone trying many different
tokens from one address locks that address out);
what an upload or a model left half-made (``tmp/``) is removed when the agent starts.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import io
import json
import os
import platform
import re
import secrets
import shutil
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from aiohttp import web

from studio.core.catalog import get_chip, load_catalog
from studio.core.devices import HOST_CPU, device, local_device
from studio.core.errorcodes import explain
from studio.core.errors import Cancelled, StudioError
from studio.core.fsutil import parse_json
from studio.core.progress import EventProgress
from studio.core.sampling import Sampler, SamplingConfig
from studio.core.settings import PERFORMANCE_MODES
from studio.engine import qnn, vision, vision_input
from studio.engine.devices import backend as device_backend
from studio.engine.llm_runtime import load_graph_spec
from studio.services.devices import package_version

PROTOCOL = 1
DEFAULT_MAX_UPLOAD = 2 << 30  # 2 GiB per file
#: the largest JSON body (a model's manifest of thousands of files is some hundred KB)
MAX_JSON_BODY = 4 << 20
#: the most files one model may hold
MAX_MODEL_FILES = 10_000
#: tries of one wrong token from one address within AUTH_WINDOW_S seconds before that token
#: from that address is answered 429 (a client with a stale token; the others get in)
MAX_AUTH_FAILURES = 20
#: different wrong tokens from one address within AUTH_WINDOW_S seconds before the address is
#: answered 429 whatever it sends (someone guessing: a right guess must not be told apart)
MAX_WRONG_TOKENS = 20
AUTH_WINDOW_S = 60.0
#: addresses remembered before those without a recent failure are forgotten
MAX_AUTH_PEERS = 4096
HEX64 = re.compile(r"^[0-9a-f]{64}$")


class Refused(StudioError):
    """A request refused with an HTTP status other than 400 (its one-line reason)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def check_store(store: Path) -> None:
    """``--store``: a folder (or a path where one can be made), checked before anything is
    written or bound."""
    store = Path(store)
    if store.exists() and not store.is_dir():
        raise StudioError(f"--store {store} is a file, not a folder: give the folder uploaded "
                          "files live in")
    parent = store
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise StudioError(f"--store {store}: {parent} is not a folder this user can write to")


def check_host(host: str) -> None:
    """``--host``: a name or address that resolves, before anything is written or bound."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise StudioError(f"--host {host!r} does not resolve ({why}): give a name or address "
                          "of this machine, e.g. 127.0.0.1 or 0.0.0.0") from None


def listen(host: str, port: int):
    """A listening socket on ``host:port`` (bound before the agent writes anything)."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def safe_relpath(name: str) -> PurePosixPath:
    """``name`` as a relative POSIX path inside a folder, or StudioError: no absolute or drive
    paths, no ``..`` or empty parts, no backslashes, no percent-encoded or control characters."""
    if not isinstance(name, str) or not name or len(name) > 255:
        raise StudioError(f"bad file name {name!r}")
    if "\\" in name or "%" in name or any(ord(c) < 32 for c in name) or ":" in name:
        raise StudioError(f"bad file name {name!r}: no backslashes, encoded or drive forms")
    p = PurePosixPath(name)
    if p.is_absolute() or any(part in ("", ".", "..") for part in name.split("/")):
        raise StudioError(f"bad file name {name!r}: a relative path inside the model folder")
    return p


@dataclass
class Job:
    id: str
    kind: str
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    done: bool = False
    created: float = field(default_factory=time.time)


def machine_info() -> dict[str, Any]:
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on every OS
        memory = None
    return {"name": platform.node() or "agent", "system": platform.system(),
            "release": platform.release(), "machine": platform.machine(),
            "cpus": os.cpu_count() or 1, "memory_bytes": memory,
            "python": platform.python_version(),
            "onnxruntime": package_version("onnxruntime"),
            "onnxruntime_qnn": package_version("onnxruntime-qnn")}


def backends() -> list[dict[str, Any]]:
    """What this agent runs, each a device of this machine with the source label of its
    figures: the host CPU (measured) and the HTP — the simulator on an x86 host (simulated),
    the real NPU on an Arm64 Snapdragon (measured)."""
    out: list[dict[str, Any]] = [{"id": "cpu", "kind": HOST_CPU.kind, "source": HOST_CPU.source}]
    try:
        sdk = qnn.versions().get("qnn_sdk_build")
    except (StudioError, ImportError, OSError):
        return out
    real = platform.machine().lower() in ("arm64", "aarch64")
    for key in load_catalog():
        dev = device(f"htp:{key}" if real else f"htp-sim:{key}")
        out.append({"id": dev.id, "chip": dev.chip, "kind": dev.kind, "source": dev.source,
                    "qnn_sdk_build": sdk})
    return out


def _backend(backend: dict[str, Any], spec: dict[str, Any] | None = None):
    """The backend that runs a job on one of this agent's devices (``backend["id"]``), with
    the job's run-time options (checked when the job was taken)."""
    return device_backend(local_device(backend["id"]),
                          run_options=(spec or {}).get("run_options") or {})


def check_run_options(options: Any) -> dict[str, str]:
    """A job's ``run_options``: only the QNN HTP backend's ``htp_performance_mode``, one of
    the modes it takes; anything else is refused in one line."""
    if options in (None, {}):
        return {}
    if not isinstance(options, dict):
        raise StudioError("run_options must be an object of QNN HTP run-time options")
    unknown = sorted(set(options) - {"htp_performance_mode"})
    if unknown:
        raise StudioError(f"run_options {', '.join(unknown)} are not taken: this agent takes "
                          "htp_performance_mode only")
    mode = options.get("htp_performance_mode")
    if mode not in PERFORMANCE_MODES or not mode:
        raise StudioError(f"htp_performance_mode {mode!r} is not one of "
                          f"{', '.join(m for m in PERFORMANCE_MODES if m)}")
    return {"htp_performance_mode": str(mode)}


class Agent:
    def __init__(self, store: Path, token: str, max_upload: int = DEFAULT_MAX_UPLOAD,
                 max_jobs: int = 1) -> None:
        if max_jobs < 1 or max_upload < 1:
            raise StudioError("an agent needs max_jobs and max_upload of at least 1")
        self.store = Path(store)
        (self.store / "blobs").mkdir(parents=True, exist_ok=True)
        (self.store / "models").mkdir(parents=True, exist_ok=True)
        # what an upload or a model killed half-way left behind
        shutil.rmtree(self.store / "tmp", ignore_errors=True)
        (self.store / "tmp").mkdir(parents=True, exist_ok=True)
        # address -> (time, digest of the token tried) of each recent wrong token
        self._auth_failures: dict[str, list[tuple[float, bytes]]] = {}
        self.token = token.encode()
        self.max_upload = int(max_upload)
        self.slots = asyncio.Semaphore(max_jobs)
        self.max_jobs = max_jobs
        self.jobs: dict[str, Job] = {}
        self.running = 0
        self._backends: list[dict[str, Any]] | None = None
        self._tasks: set[asyncio.Task] = set()

    # ---- HTTP ---------------------------------------------------------------------------------
    def app(self) -> web.Application:
        # client_max_size bounds the JSON bodies read whole; uploads stream (max_upload)
        app = web.Application(middlewares=[self._auth], client_max_size=MAX_JSON_BODY)
        app.add_routes([
            web.get("/health", self.health), web.get("/info", self.info),
            web.head("/artifacts/{name}", self.has_artifact),
            web.put("/artifacts/{name}", self.put_artifact),
            web.post("/models", self.make_model), web.post("/jobs", self.start_job),
            web.get("/jobs/{id}/events", self.events), web.delete("/jobs/{id}", self.cancel_job),
        ])
        app.on_shutdown.append(self._shutdown)
        return app

    def _throttled(self, peer: str, tried: bytes, now: float) -> str:
        """Why a request from ``peer`` with a token of digest ``tried`` is answered 429 now
        ("" when it is not): that token refused :data:`MAX_AUTH_FAILURES` times from there, or
        :data:`MAX_WRONG_TOKENS` different wrong tokens from there (a guesser)."""
        recent = [(t, d) for t, d in self._auth_failures.get(peer, ())
                  if now - t < AUTH_WINDOW_S]
        if recent:
            self._auth_failures[peer] = recent
        else:
            self._auth_failures.pop(peer, None)
        if len({d for _, d in recent}) >= MAX_WRONG_TOKENS:
            return ("too many different wrong tokens from this address: try again in a "
                    "minute")
        if sum(d == tried for _, d in recent) >= MAX_AUTH_FAILURES:
            return ("this token was refused too many times from this address: check it "
                    "(studio devices add NAME --url URL --token-file F) and try again in a "
                    "minute")
        return ""

    def _failed(self, peer: str, tried: bytes, now: float) -> None:
        if len(self._auth_failures) >= MAX_AUTH_PEERS and peer not in self._auth_failures:
            for old in [p for p, f in self._auth_failures.items()
                        if now - f[-1][0] >= AUTH_WINDOW_S]:
                del self._auth_failures[old]
        self._auth_failures.setdefault(peer, []).append((now, tried))

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if request.path != "/health":
            peer = request.remote or "?"
            now = time.monotonic()
            got = request.headers.get("Authorization", "")
            given = got[7:].encode() if got.startswith("Bearer ") else b""
            # the throttle keys on the address and the token tried (its digest: no token is
            # kept): one client's wrong token does not lock out the right one
            tried = hashlib.sha256(given).digest()
            why = self._throttled(peer, tried, now)
            if why:
                return web.json_response({"error": why}, status=429)
            if not hmac.compare_digest(given, self.token):
                self._failed(peer, tried, now)
                return web.json_response({"error": "a valid bearer token is required"},
                                         status=401)
        try:
            return await handler(request)
        except Refused as exc:
            return web.json_response({"error": exc.message}, status=exc.status)
        except StudioError as exc:
            return web.json_response({"error": exc.message}, status=400)

    async def _json(self, request: web.Request, route: str) -> dict[str, Any]:
        """The request's JSON object: at most MAX_JSON_BODY bytes (413), UTF-8, well-formed,
        not nested deeply, an object (400 for the rest)."""
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise Refused(f"{route}: the body is over the agent's JSON limit of "
                          f"{MAX_JSON_BODY} bytes", 413) from None
        body = parse_json(raw, f"{route}: the body")
        if not isinstance(body, dict):
            raise StudioError(f"{route}: the body must be a JSON object")
        return body

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "protocol": PROTOCOL})

    async def info(self, _request: web.Request) -> web.Response:
        if self._backends is None:
            self._backends = await asyncio.to_thread(backends)
        return web.json_response({"protocol": PROTOCOL, "machine": machine_info(),
                                  "backends": self._backends, "max_jobs": self.max_jobs,
                                  "running": self.running, "max_upload": self.max_upload})

    def _blob(self, name: str) -> Path:
        if not isinstance(name, str) or not HEX64.match(name):
            raise StudioError(f"artifact names are SHA-256 hex digests, not {name!r}")
        return self.store / "blobs" / name

    async def has_artifact(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._blob(request.match_info["name"]).is_file()
                            else 404)

    async def put_artifact(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        dest = self._blob(name)
        if request.content_length is not None and request.content_length > self.max_upload:
            return web.json_response({"error": f"the file is over the agent's limit of "
                                               f"{self.max_upload} bytes"}, status=413)
        fd, tmp = tempfile.mkstemp(dir=self.store / "tmp")
        h, size = hashlib.sha256(), 0
        try:
            with os.fdopen(fd, "wb") as f:
                async for chunk in request.content.iter_chunked(1 << 20):
                    size += len(chunk)
                    if size > self.max_upload:
                        return web.json_response({"error": "the file is over the agent's "
                                                 f"limit of {self.max_upload} bytes"},
                                                 status=413)
                    h.update(chunk)
                    f.write(chunk)
            if h.hexdigest() != name:
                return web.json_response({"error": f"content hash {h.hexdigest()} does not "
                                                   f"match the name {name}"}, status=400)
            os.replace(tmp, dest)
            return web.json_response({"stored": name, "bytes": size}, status=201)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    async def make_model(self, request: web.Request) -> web.Response:
        body = await self._json(request, "POST /models")
        files = body.get("files")
        if not isinstance(files, dict) or not files:
            raise StudioError("POST /models takes {\"files\": {relative path: sha256}}")
        if len(files) > MAX_MODEL_FILES:
            raise StudioError(f"POST /models: {len(files)} files; a model holds at most "
                              f"{MAX_MODEL_FILES}")
        checked = {str(safe_relpath(k)): self._blob(v) for k, v in files.items()}
        for rel in checked:  # "a" and "a/b": one path cannot be a file and a folder
            clash = next((str(d) for d in PurePosixPath(rel).parents if str(d) in checked),
                         None)
            if clash is not None:
                raise StudioError(f"bad file name {rel!r}: {clash!r} is a file of the model, "
                                  "not a folder")
        missing = [k for k, b in checked.items() if not b.is_file()]
        if missing:
            raise StudioError(f"upload these files first: {', '.join(sorted(missing)[:20])}")
        mid = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:32]
        folder = self.store / "models" / mid
        if not folder.is_dir():
            tmp = Path(tempfile.mkdtemp(dir=self.store / "tmp"))
            try:
                for rel, blob in checked.items():
                    target = (tmp / rel).resolve()
                    if not str(target).startswith(str(tmp.resolve()) + os.sep):
                        raise StudioError(f"bad file name {rel!r}")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        os.link(blob, target)
                    except OSError:
                        shutil.copy2(blob, target)
                try:
                    os.replace(tmp, folder)
                except OSError:
                    if not folder.is_dir():  # else: the same model, made by a request at once
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return web.json_response({"model": mid})

    async def start_job(self, request: web.Request) -> web.Response:
        spec = await self._json(request, "POST /jobs")
        if spec.get("kind") not in ("generate", "profile", "tensors"):
            raise StudioError("jobs: kind must be generate, profile or tensors")
        # the slot is taken here, before any await: concurrent requests cannot both pass
        if self.running >= self.max_jobs:
            return web.json_response({"error": f"the agent runs {self.max_jobs} job(s) at a "
                                               "time; try again when one ends"}, status=429)
        self.running += 1
        started = False
        try:
            response = await self._start(spec)
            started = response.status == 202  # else refused (409): no job holds the slot
            return response
        finally:
            if not started:
                self.running -= 1

    async def _start(self, spec: dict[str, Any]) -> web.Response:
        """The rest of ``POST /jobs``, with a slot already taken (given back by the caller
        unless the job starts: the job gives it back when it ends)."""
        folder = self.store / "models" / str(spec.get("model", ""))
        if not re.match(r"^[0-9a-f]{32}$", str(spec.get("model", ""))) or not folder.is_dir():
            raise StudioError("unknown model: upload it with POST /models first")
        backend = str(spec.get("backend", "cpu"))
        known = {b["id"]: b for b in await asyncio.to_thread(backends)}
        if backend not in known:
            raise StudioError(f"this agent has no backend {backend!r}; it has "
                              f"{', '.join(known)}")

        on_npu = local_device(backend).on_npu
        want = spec.get("sdk_build")
        have = known[backend].get("qnn_sdk_build")
        if on_npu and want and have and want != have:
            return web.json_response({"error": f"the context binaries were built with QNN SDK "
                                               f"{want} but this agent runs {have}: compile "
                                               "with the agent's SDK"}, status=409)
        spec["run_options"] = check_run_options(spec.get("run_options"))
        if spec["kind"] in ("profile", "tensors") and not on_npu:
            raise StudioError(f"{spec['kind']} jobs run on an HTP backend of the agent, not "
                              "its CPU")
        job = Job(uuid.uuid4().hex, spec["kind"])
        self.jobs[job.id] = job
        run = {"generate": self._run_generate, "profile": self._run_profile,
               "tensors": self._run_tensors}[job.kind]
        task = asyncio.ensure_future(run(job, folder, known[backend], spec))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return web.json_response({"job": job.id}, status=202)

    async def _run_generate(self, job: Job, folder: Path, backend: dict, spec: dict) -> None:
        loop = asyncio.get_running_loop()

        def emit(kind: str, data: Any) -> None:
            loop.call_soon_threadsafe(job.queue.put_nowait, (kind, data))

        def work() -> dict[str, Any]:
            gspec = load_graph_spec(folder)
            # the uploaded folder is the export (the CPU) or a compiled context (the HTP)
            be = _backend(backend, spec)
            gen = be.open_generator(folder, folder, gspec, bool(spec.get("fp16")))
            encoder_s = None
            if spec.get("image") is not None:  # a VL model: the pixels through its encoder
                encoder_s = _encode_image(be, folder, gspec, spec, gen, self._blob)
            s = spec.get("sampling") or {}
            sampler = Sampler(SamplingConfig(float(s.get("temperature", 0.0)),
                                             int(s.get("top_k", 0)), float(s.get("top_p", 1.0)),
                                             s.get("seed")))
            out = gen.generate([int(t) for t in spec.get("prompt_ids") or []],
                               int(spec.get("max_new_tokens", 16)), sampler=sampler,
                               eos_id=spec.get("eos_ids") or None,
                               on_step=lambda i, t: emit("token", {"index": i, "token": t}),
                               progress=EventProgress(job.cancel))
            out["source"] = backend["source"]
            out["backend"] = backend["id"]
            if encoder_s is not None:
                out["encoder_s"] = encoder_s
            return out

        await self._finish(job, work)

    async def _finish(self, job: Job, work) -> None:
        """Run ``work`` in a thread within the job limit; its result or its one-line error
        ends the job's event stream."""
        try:
            async with self.slots:
                result = await asyncio.to_thread(work)
            job.queue.put_nowait(("done", result))
        except Cancelled:
            job.queue.put_nowait(("error", {"message": "cancelled", "cancelled": True}))
        except StudioError as exc:
            job.queue.put_nowait(("error", {"message": exc.message}))
        except Exception as exc:  # noqa: BLE001 - reported to the client, not lost

            job.queue.put_nowait(("error", {"message": explain(f"{type(exc).__name__}: {exc}")}))
        finally:
            job.done = True
            self.running -= 1

    async def _run_profile(self, job: Job, folder: Path, backend: dict, spec: dict) -> None:
        """``repeats`` profiled decode steps of the uploaded context, each with the host load
        it ran under; each repeat's CSV and op trace come back as text."""
        loop = asyncio.get_running_loop()

        def work() -> dict[str, Any]:
            gspec = load_graph_spec(folder)
            repeats = max(1, min(int(spec.get("repeats") or 5), 50))
            out: list[dict[str, Any]] = []
            with tempfile.TemporaryDirectory(dir=self.store / "tmp") as d:
                steps = _backend(backend, spec).profile_decode_steps(
                    folder, gspec, Path(d), repeats, bool(spec.get("fp16")),
                    EventProgress(job.cancel))
                for i, (info, load) in enumerate(steps):
                    trace = info.get("op_trace")
                    out.append({
                        "csv": Path(info["csv"]).read_text(),
                        "op_trace": Path(trace).read_text() if trace else None,
                        "level": info.get("level"), "source": backend["source"],
                        "other_load": load,
                    })
                    loop.call_soon_threadsafe(job.queue.put_nowait,
                                              ("progress", {"repeat": i + 1,
                                                            "repeats": repeats}))
            return {"repeats": out, "source": backend["source"], "backend": backend["id"]}

        await self._finish(job, work)

    async def _run_tensors(self, job: Job, folder: Path, backend: dict, spec: dict) -> None:
        """The uploaded ONNX graph (``graph``, a file of the model folder, quantized, with
        extra outputs) prepared for the agent's HTP and run on each uploaded feed file
        (``feeds``: .npz files of the folder); the ``outputs`` it names come back as one
        .npz, base64 (``{"npz", "source", "backend"}``) — what a layer diff compares on a
        device."""
        def member(name: Any) -> Path:
            names = {p.name for p in folder.iterdir() if p.is_file()}
            if not isinstance(name, str) or name not in names:
                raise StudioError(f"tensors job: {name!r} is not a file of the uploaded model")
            return folder / name

        def work() -> dict[str, Any]:
            graph = member(spec.get("graph"))
            feeds = [member(f) for f in spec.get("feeds") or []]
            names = spec.get("outputs") or []
            if not feeds or not names or not all(isinstance(n, str) for n in names):
                raise StudioError("tensors job: give feeds (.npz files) and output names")
            progress = EventProgress(job.cancel)
            sess = qnn.make_session(graph, get_chip(backend["chip"]), strict=True,
                                    fp16=bool(spec.get("fp16")))
            out: dict[str, Any] = {}
            for i, f in enumerate(feeds):
                progress.check()
                with np.load(f, allow_pickle=False) as z:
                    feed = {k: z[k] for k in z.files}
                for n, v in zip(names, sess.run(names, feed), strict=True):
                    out[f"{i}/{n}"] = v
            buf = io.BytesIO()
            np.savez(buf, **out)
            return {"npz": base64.b64encode(buf.getvalue()).decode(),
                    "source": backend["source"], "backend": backend["id"]}

        await self._finish(job, work)

    async def events(self, request: web.Request) -> web.StreamResponse:
        job = self.jobs.get(request.match_info["id"])
        if job is None:
            return web.json_response({"error": "no such job"}, status=404)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        while True:
            kind, data = await job.queue.get()
            await resp.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())
            if kind in ("done", "error"):
                break
        self.jobs.pop(job.id, None)
        return resp

    async def cancel_job(self, request: web.Request) -> web.Response:
        job = self.jobs.get(request.match_info["id"])
        if job is None:
            return web.json_response({"error": "no such job"}, status=404)
        job.cancel.set()
        return web.json_response({"cancelling": job.id})

    async def _shutdown(self, _app: web.Application) -> None:
        for job in self.jobs.values():
            job.cancel.set()


def _encode_image(be, folder: Path, gspec: dict[str, Any], spec: dict[str, Any], gen,
                  blob) -> float:
    """A generate job's image: the uploaded .npz of ``pixel_values`` and their ``grid``
    (patches: rows, columns; a blob named by its SHA-256) through the backend's vision
    encoder, its rows set on ``gen`` for the prefill; returns the encoder's seconds on this
    agent."""
    vs = vision_input.vision_spec(gspec)
    if vs is None:
        raise StudioError("generate job: an image was sent but the model takes none")
    path = blob(spec["image"])
    if not path.is_file():
        raise StudioError("generate job: upload the image's pixels first (PUT /artifacts)")
    try:
        with np.load(path, allow_pickle=False) as z:
            pixels = np.asarray(z["pixel_values"], dtype=np.float32)
            gh, gw = (int(x) for x in np.asarray(z["grid"]).reshape(2))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StudioError(f"generate job: the image is not an .npz of pixel_values and grid "
                          f"({exc})") from None
    m = vs.merge
    if (gh <= 0 or gw <= 0 or gh % m or gw % m or gh * gw > vs.patches
            or pixels.shape != (gh * gw, vs.patch_dim)):
        raise StudioError(f"generate job: pixel_values is {list(pixels.shape)} on a grid of "
                          f"{gh} x {gw} patches; the encoder takes [grid_h x grid_w, "
                          f"{vs.patch_dim}], grid sides multiples of {m}, at most "
                          f"{vs.patches} patches")
    encoder = be.open_encoder(folder, folder, gspec, bool(spec.get("fp16")))
    patches = vision_input.ImagePatches(pixels, gh, gw, m)
    rows, seconds = vision.timed_encode_pixels(encoder, patches, vs)
    gen.set_image(rows, patches.llm_grid)
    return seconds


def new_token() -> str:
    return secrets.token_urlsafe(24)


async def serve(store: Path, host: str, port: int, token: str, ssl_context=None,
                max_upload: int = DEFAULT_MAX_UPLOAD, max_jobs: int = 1,
                ready=None) -> None:
    """Serve until cancelled (SIGINT / SIGTERM in ``studio agent serve``); ``ready(url)`` is
    called once listening."""
    sock = listen(host, port)  # bound first: a port in use or a bad host writes nothing
    try:
        agent = Agent(store, token, max_upload, max_jobs)
    except BaseException:
        sock.close()
        raise
    runner = web.AppRunner(agent.app(), handle_signals=False)
    await runner.setup()
    site = web.SockSite(runner, sock, ssl_context=ssl_context)
    await site.start()
    bound = sock.getsockname()[1]
    scheme = "https" if ssl_context else "http"
    if ready is not None:
        ready(f"{scheme}://{host}:{bound}")
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
