"""The studio's side of the device agent protocol (see ``studio.services.agent.server``):
health, capabilities, upload by content hash, and generation with streamed tokens."""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError


class AgentError(StudioError):
    """The agent refused, failed or could not be reached: one line saying which."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class AgentClient:
    def __init__(self, url: str, token: str, timeout: float = 30.0,
                 cafile: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._ssl = ssl.create_default_context(cafile=cafile) if cafile else None

    # ---- plumbing -----------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: bytes | None = None,
                 ctype: str = "application/json", timeout: float | None = None):
        req = urllib.request.Request(self.url + path, data=body, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if body is not None:
            req.add_header("Content-Type", ctype)
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout,
                                          context=self._ssl)
        except urllib.error.HTTPError as exc:
            try:
                msg = json.loads(exc.read().decode()).get("error") or exc.reason
            except (ValueError, AttributeError):
                msg = exc.reason
            if exc.code == 401:
                msg = f"the agent at {self.url} refused the token (401): pair again"
            err = AgentError(f"{msg}")
            err.status = exc.code  # type: ignore[attr-defined]
            raise err from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AgentError(f"the agent at {self.url} is unreachable ({reason}): is "
                             "`studio agent serve` running there?") from None

    def _json(self, method: str, path: str, obj: Any = None) -> Any:
        body = json.dumps(obj).encode() if obj is not None else None
        with self._request(method, path, body) as r:
            return json.loads(r.read().decode() or "null")

    # ---- API ----------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        with self._request("GET", "/health", timeout=5.0) as r:
            out = json.loads(r.read().decode())
        out["rtt_ms"] = (time.perf_counter() - t0) * 1e3
        return out

    def info(self) -> dict[str, Any]:
        return self._json("GET", "/info")

    def upload(self, path: Path) -> str:
        """Upload one file unless the agent holds its content already; returns its hash."""
        digest = _sha256(path)
        try:
            with self._request("HEAD", f"/artifacts/{digest}"):
                return digest
        except AgentError as exc:
            if getattr(exc, "status", None) != 404:
                raise
        with open(path, "rb") as f:
            data = f.read()
        with self._request("PUT", f"/artifacts/{digest}", data, "application/octet-stream",
                           timeout=max(self.timeout, 300.0)):
            pass
        return digest

    def upload_folder(self, folder: Path, names: list[str] | None = None) -> str:
        """Upload the files of ``folder`` (or ``names`` in it) and make them one model on the
        agent; returns its model id."""
        folder = Path(folder)
        files = ([folder / n for n in names] if names else
                 [p for p in sorted(folder.rglob("*")) if p.is_file()])
        manifest = {p.relative_to(folder).as_posix(): self.upload(p) for p in files}
        return self._json("POST", "/models", {"files": manifest})["model"]

    def _cancel_quietly(self, job: str) -> None:
        try:
            self._json("DELETE", f"/jobs/{job}")
        except StudioError:
            pass

    def profile(self, model: str, backend: str, repeats: int, sdk_build: str | None = None,
                fp16: bool = False, on_progress: Callable[[int, int], None] | None = None,
                run_options: dict[str, str] | None = None) -> dict[str, Any]:
        """Profile ``repeats`` decode steps of an uploaded compiled context on the agent's HTP
        backend; returns each repeat's profiling CSV and op trace (text) with its host load."""
        job = self._json("POST", "/jobs", {"kind": "profile", "model": model, "backend": backend,
                                           "repeats": int(repeats), "sdk_build": sdk_build,
                                           "fp16": bool(fp16),
                                           "run_options": dict(run_options or {})})["job"]
        return self._stream(job, on_progress=on_progress)

    def tensors(self, model: str, backend: str, graph: str, feeds: list[str],
                outputs: list[str], fp16: bool = False) -> dict[str, Any]:
        """Run the uploaded ``graph`` on the agent's HTP ``backend`` on each uploaded feed
        file; ``{(feed index, output name): array}``."""
        job = self._json("POST", "/jobs", {"kind": "tensors", "model": model,
                                           "backend": backend, "graph": graph, "feeds": feeds,
                                           "outputs": outputs, "fp16": bool(fp16)})["job"]
        got = self._stream(job)
        with np.load(io.BytesIO(base64.b64decode(got["npz"])), allow_pickle=False) as z:
            arrays = {(int(k.split("/", 1)[0]), k.split("/", 1)[1]): z[k] for k in z.files}
        return {"arrays": arrays, "source": got.get("source"), "backend": got.get("backend")}

    def _stream(self, job: str, on_token: Callable[[int, int], None] | None = None,
                on_progress: Callable[[int, int], None] | None = None,
                should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        cancelled = False
        try:
            with self._request("GET", f"/jobs/{job}/events", timeout=900.0) as r:
                event = None
                for raw in r:
                    line = raw.decode().rstrip("\n")
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        data = json.loads(line[6:])
                        if event == "progress" and on_progress is not None:
                            on_progress(int(data["repeat"]), int(data["repeats"]))
                        elif event == "token" and on_token is not None:
                            on_token(int(data["index"]), int(data["token"]))
                            try:
                                stop = should_stop is not None and should_stop()
                            except BaseException:  # the caller cancelled: end the agent's job
                                self._cancel_quietly(job)
                                raise
                            if stop and not cancelled:
                                cancelled = True
                                self._json("DELETE", f"/jobs/{job}")
                        elif event == "done":
                            return data
                        elif event == "error":
                            raise AgentError(f"the agent's job failed: {data['message']}")
        except (ConnectionError, OSError, ValueError, http.client.HTTPException) as exc:
            if isinstance(exc, AgentError):
                raise
            raise AgentError(f"the agent at {self.url} went away mid-run ({exc}); the job is "
                             "lost: check the agent and run again") from None
        raise AgentError(f"the agent at {self.url} closed the job's stream before its result "
                         "(the agent stopped?): run again")

    def generate(self, model: str, backend: str, prompt_ids: list[int], max_new_tokens: int,
                 sampling: dict[str, Any] | None = None, eos_ids: list[int] | None = None,
                 sdk_build: str | None = None, on_token: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None,
                 run_options: dict[str, str] | None = None,
                 image: str | None = None) -> dict[str, Any]:
        """Run a generation job and stream its tokens; ``should_stop()`` cancels it.
        ``run_options``: the HTP's run-time options the agent opens its sessions with.
        ``image``: an uploaded .npz of a vision-language model's ``pixel_values`` (its
        SHA-256): the agent runs its encoder and splices the rows into the prompt."""
        job = self._json("POST", "/jobs", {
            "kind": "generate", "model": model, "backend": backend,
            "prompt_ids": [int(t) for t in prompt_ids], "max_new_tokens": int(max_new_tokens),
            "sampling": sampling or {}, "eos_ids": eos_ids or [], "sdk_build": sdk_build,
            "run_options": dict(run_options or {}),
            **({"image": image} if image is not None else {}),
        })["job"]
        return self._stream(job, on_token=on_token, should_stop=should_stop)
