"""A registered agent (``studio agent serve`` on another machine): the files a job needs go
up by content hash (once), the job runs on one of the agent's backends (its host CPU, its
HTP simulator or NPU) and its tokens or profiles stream back; the figures carry the source
of that backend (the agent labels them too, and a label that disagrees is refused)."""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.checks import FAIL, PASS, WARN, Check
from studio.core.devices import DeviceKind
from studio.core.devices.agent import backend_of, name_of
from studio.core.errors import StudioError
from studio.core.fsutil import link_or_copy
from studio.core.units import format_bytes
from studio.engine.device_registry import Registry
from studio.engine.devices._base import Backend as _Base
from studio.engine.devices._base import compiled_files
from studio.engine.layerdiff import external_files


class Backend(_Base):
    @classmethod
    def listed(cls, decl: DeviceKind, registry: Any, health: bool = False
               ) -> list[dict[str, Any]]:
        """The agents of the user's device registry; with ``health``, each asked how it is
        (:func:`health`)."""
        if registry is None:
            registry = Registry()
        return [{"id": a.id, "kind": decl.kind, "url": a.url, "name": a.name,
                 "label": f"agent {a.name} ({a.url})",
                 "status": health_line(registry, a.name) if health else "not checked yet"}
                for a in registry.agents()]

    @classmethod
    def choices(cls, row: dict[str, Any], targets: list[str]) -> list[tuple[str, str]]:
        """An agent's host CPU, and its HTP simulator of each target."""
        name = row["name"]
        return [(f"{name} · host CPU", f"agent:{name}")] + [
            (f"{name} · HTP simulator {t}", f"agent:{name}@htp-sim:{t}") for t in targets]

    def __init__(self, device, registry: Any = None,
                 run_options: dict[str, str] | None = None) -> None:
        super().__init__(device, registry, run_options)
        self._client = None
        self._info: dict[str, Any] | None = None

    @property
    def client(self):
        if self._client is None:
            self._client = self.registry.client(name_of(self.device))
        return self._client

    def info(self) -> dict[str, Any]:
        """The agent's capabilities (its backends, versions and machine)."""
        if self._info is None:
            self._info = self.client.info()
        return self._info

    def _backend_info(self) -> dict[str, Any]:
        backends = {b["id"]: b for b in self.info().get("backends", [])}
        name, backend = name_of(self.device), backend_of(self.device)
        if backend not in backends:
            raise StudioError(f"agent {name!r} has no backend {backend!r}; it has "
                              f"{', '.join(backends) or 'none'}")
        return backends[backend]

    def check(self) -> None:
        self._backend_info()

    def check_known(self) -> None:
        """Registered on this machine, with its token (no request to the agent)."""
        _ = self.client

    def versions(self) -> dict[str, str]:
        b = self._backend_info()
        return {k: str(v) for k, v in b.items() if k.endswith(("_build", "_version")) and v}

    def upload(self, folder: Path, names: list[str]) -> str:
        folder = Path(folder)
        return self.client.upload_folder(folder, [n for n in names if (folder / n).is_file()])

    def describe(self, scheme: str) -> str:
        if not self.device.chip:
            return "FP32 on the agent's CPU"
        return f"{scheme} on the agent's {backend_of(self.device)}"

    def doctor_checks(self, project: Any, sdk: tuple[str | None, str]) -> list:
        """``studio doctor --device agent:NAME``: reachable, its token, its QNN SDK build
        against ``sdk`` (the build of the project's binaries and where it was read), the
        project's chips among its HTPs, its memory."""
        name, area = name_of(self.device), "device"
        try:
            client = self.client
        except StudioError as exc:
            return [Check(area, f"agent {name}", FAIL, str(exc),
                          "studio devices add NAME --url URL --token-file F")]
        try:
            h = client.health()
        except StudioError as exc:
            return [Check(area, "reachable", FAIL, str(exc),
                          f"start the agent (studio agent serve) and check {client.url}")]
        out = [Check(area, "reachable", PASS, f"{client.url}, {h.get('rtt_ms', 0):.0f} ms")]
        try:
            info = client.info()
        except StudioError as exc:
            return out + [Check(area, "authenticated", FAIL, str(exc),
                                "studio devices add NAME --url URL --token-file F, with "
                                "the agent's token")]
        m = info.get("machine", {})
        out.append(Check(area, "authenticated", PASS,
                         f"the token is accepted by {m.get('name', '?')} ({m.get('system', '?')} "
                         f"{m.get('machine', '?')}, onnxruntime-qnn "
                         f"{m.get('onnxruntime_qnn') or 'missing'})"))
        backends = info.get("backends", [])
        htp = [b for b in backends if b.get("chip")]
        want, where = sdk
        builds = sorted({b.get("qnn_sdk_build") for b in htp if b.get("qnn_sdk_build")})
        if not htp:
            out.append(Check(area, "QNN SDK build", FAIL, "the agent runs no HTP (no "
                             "onnxruntime-qnn on its machine)",
                             "pip install onnxruntime-qnn on the agent's machine"))
        elif want and want not in builds:
            out.append(Check(area, "QNN SDK build", FAIL,
                             f"the agent runs QNN SDK {', '.join(builds)}; {where} were built with "
                             f"{want}: a context binary loads only on the SDK that compiled it "
                             "(QNN 5000 / 5004)",
                             "install the same onnxruntime-qnn on both machines, then compile "
                             "again"))
        else:
            out.append(Check(area, "QNN SDK build", PASS, f"{', '.join(builds)} (as {where})"))
        if project is not None:
            chips = {b["chip"] for b in htp}
            missing = [t for t in project.targets if t not in chips]
            if missing:
                out.append(Check(area, "Hexagon architecture", FAIL,
                                 f"the agent's HTP runs {', '.join(sorted(chips)) or 'no chip'}; "
                                 f"the project targets {', '.join(missing)}",
                                 "add the agent's chip to the project's targets, or use another "
                                 "agent"))
            else:
                out.append(Check(area, "Hexagon architecture", PASS,
                                 f"the agent runs every target ({', '.join(project.targets)})"))
        mem = info.get("machine", {}).get("memory_bytes")
        out.append(Check(area, "memory", PASS if mem else WARN,
                         f"{format_bytes(int(mem))} on the agent's machine" if mem
                         else "not reported"))
        return out

    def tensor_runner(self):
        """A layer diff's HTP runs on the agent's HTP backend: each graph (with its external
        data files) and the feeds uploaded under ``work`` (files the agent holds already are
        skipped), run there, the named outputs back."""
        if not self.device.on_npu:
            raise StudioError(f"studio bisect --device runs on an agent's HTP "
                              f"(agent:NAME@htp:CHIP or agent:NAME@htp-sim:CHIP), not on its "
                              f"{backend_of(self.device) or 'cpu'}")
        client, backend = self.client, backend_of(self.device)

        def run(graph: Path, names: list[str], feeds: list[dict[str, Any]], fp16: bool,
                work: Path) -> dict:
            folder = Path(work) / f"upload-{graph.parent.name}-{graph.stem}"
            folder.mkdir(parents=True, exist_ok=True)
            files = [graph.name, *external_files(graph)]
            for f in files:
                if not (folder / f).exists():
                    link_or_copy((graph.parent / f).resolve(), folder / f)
            feed_files = []
            for i, feed in enumerate(feeds):
                arrays: dict[str, Any] = {k: np.asarray(v) for k, v in feed.items()}
                np.savez(folder / f"feeds_{i}.npz", **arrays)  # type: ignore[arg-type]
                feed_files.append(f"feeds_{i}.npz")
            model = client.upload_folder(folder, files + feed_files)
            return client.tensors(model, backend, graph.name, feed_files, names, fp16)["arrays"]

        return run

    def check_generation(self, speculative: bool, window: bool, kv: str | None,
                         project_kv: str) -> None:
        if speculative or kv or window:
            raise StudioError("a remote agent runs plain decoding so far: leave out "
                              "--speculative, --kv and --window for agent devices")

    def _model(self, export: Path, compiled: Path | None,
               log: Callable[[str], None] | None) -> tuple[str, str | None]:
        """Upload what the backend runs (the export for its CPU, the target's compiled
        context for its HTP): (the agent's model id, the SDK build it was compiled with)."""
        if log is not None:
            log(f"uploading to agent {name_of(self.device)} (files it holds already are "
                "skipped)")
        if not self.device.chip:
            names = ["prefill.onnx", "decode.onnx", "graph.json"]
            if (Path(export) / "vision.onnx").is_file():  # a vision-language model's encoder
                names.append("vision.onnx")
            return self.upload(export, names), None
        if compiled is None:
            raise StudioError(f"the {self.device.name} runs a compiled context: run the "
                              "compile stage")
        sdk = json.loads((Path(compiled) / "result.json").read_text()).get("sdk_version")
        return self.upload(compiled, compiled_files(compiled)), sdk

    def open_generator(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                       fp16: bool, log: Callable[[str], None] | None = None) -> Any:
        model, sdk = self._model(export, compiled, log)
        return RemoteGenerator(self, model, sdk, spec)

    def open_encoder(self, export: Path, compiled: Path | None, spec: dict[str, Any],
                     fp16: bool) -> Any:
        """None: the agent runs the vision encoder within the generation job (the pixels go
        with the prompt; the encoder's time comes back with the tokens)."""
        return None

    def profile_decode_steps(self, compiled: Path, spec: dict[str, Any], folder: Path,
                             repeats: int, fp16: bool, progress: Any
                             ) -> Iterator[tuple[dict[str, Any], float]]:
        """The repeats run on the agent's HTP backend; each repeat's CSV and op trace come
        back and are written under ``folder``, with the load of the agent's host."""
        name, backend, source = name_of(self.device), backend_of(self.device), self.source
        progress.update(0.02, f"uploading to agent {name} (files it holds already are skipped)")
        model = self.upload(compiled, compiled_files(compiled))
        sdk = json.loads((Path(compiled) / "result.json").read_text()).get("sdk_version")

        def on_progress(i: int, n: int) -> None:
            progress.update(0.05 + 0.8 * i / n, f"profiled decode step {i}/{n} on agent {name}")

        got = self.client.profile(model, backend, repeats, sdk, fp16, on_progress=on_progress,
                                  run_options=self.run_options)
        if got.get("source") != source:
            raise StudioError(f"agent {name} labels its {backend} figures {got.get('source')!r}, "
                              f"not {source!r}: name the backend as the agent lists it")
        if len(got["repeats"]) != repeats:
            raise StudioError(f"agent {name} returned {len(got['repeats'])} profiled runs, not "
                              f"{repeats}")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for i, r in enumerate(got["repeats"]):
            csv_path = folder / f"qnn_profile_{i + 1}.csv"
            csv_path.write_text(r["csv"])
            trace = None
            if r.get("op_trace"):
                trace = folder / f"qnn_profile_{i + 1}_op_trace.json"
                trace.write_text(r["op_trace"])
            yield ({"csv": str(csv_path), "op_trace": str(trace) if trace else None,
                    "level": r.get("level"), "source": r.get("source", source)},
                   float(r.get("other_load") or 0.0))


def health_line(registry: Any, name: str) -> str:
    """One line on a registered agent: reachable with its round trip, machine and first
    backends, or why not."""
    try:
        c = registry.client(name)
        h = c.health()
        info = c.info()
    except StudioError as exc:
        return f"unreachable: {exc.message}"
    backends = ", ".join(f"{b['id']} ({b['source']})" for b in info.get("backends", [])[:3])
    more = len(info.get("backends", [])) - 3
    return (f"ok, {h['rtt_ms']:.1f} ms; {info['machine'].get('name')} "
            f"({info['machine'].get('machine')}); backends {backends}"
            + (f" and {more} more" if more > 0 else ""))


def _eos_list(eos_id: int | Iterable[int] | None) -> list[int]:
    if eos_id is None:
        return []
    return [int(eos_id)] if isinstance(eos_id, int) else [int(t) for t in eos_id]


class RemoteGenerator:
    """Generation on an agent with the interface of the local generators (``greedy`` /
    ``generate``): the agent runs the model and streams its tokens back; ``stop`` and a
    cancelled ``progress`` end the agent's job."""

    verify_len = 0  # no verify graph: plain decoding
    ring_window = None
    cache = None  # the KV cache lives on the agent
    prefill_session = decode_session = None

    def __init__(self, backend: Backend, model: str, sdk: str | None, spec: dict[str, Any]):
        self.backend = backend
        self.model = model
        self.sdk = sdk
        self.spec = spec
        self.context_len = int(spec["context_length"])
        self._image: str | None = None  # the next generation's uploaded pixels

    def set_window(self, window: int | None) -> None:
        if window is not None:
            raise StudioError("a remote agent runs plain decoding so far: leave out --window")

    def set_pixels(self, patches) -> None:
        """A vision-language model's image for the next generation: its patches (an
        :class:`studio.engine.vision.ImagePatches`) and their grid, uploaded to the agent (as
        an .npz blob) and run through the agent's encoder there."""
        buf = io.BytesIO()
        np.savez(buf, pixel_values=np.asarray(patches.pixels, dtype=np.float32),
                 grid=np.asarray([patches.grid_h, patches.grid_w], dtype=np.int64))
        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / "pixels.npz"
            f.write_bytes(buf.getvalue())
            self._image = self.backend.client.upload(f)

    def greedy(self, prompt_ids: list[int], max_new_tokens: int,
               eos_id: int | Iterable[int] | None = None,
               on_step: Callable[[int, int], None] | None = None,
               progress: Any = None) -> dict[str, Any]:
        return self.generate(prompt_ids, max_new_tokens, eos_id=eos_id, on_step=on_step,
                             progress=progress)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, sampler: Any = None,
                 eos_id: int | Iterable[int] | None = None,
                 stop: Callable[[list[int]], bool] | None = None,
                 on_step: Callable[[int, int], None] | None = None,
                 progress: Any = None) -> dict[str, Any]:
        be = self.backend
        name, backend, source = name_of(be.device), backend_of(be.device), be.source
        sampling = sampler.cfg.to_dict() if sampler is not None else {}
        got: list[int] = []
        stopped = [False]
        raised: list[BaseException] = []

        def on_token(i: int, token: int) -> None:
            got.append(token)
            try:
                if on_step is not None:
                    on_step(i, token)
                if stop is not None and stop(got):
                    stopped[0] = True
            except BaseException as exc:  # noqa: BLE001 - raised again in should_stop
                raised.append(exc)

        def should_stop() -> bool:  # a cancelled job stops here; the agent's job ends with it
            if raised:
                raise raised[0]
            if progress is not None:
                progress.check()
            return stopped[0]

        try:
            image, self._image = self._image, None
            out = be.client.generate(self.model, backend, [int(t) for t in prompt_ids],
                                     max_new_tokens, sampling, _eos_list(eos_id), self.sdk,
                                     on_token=on_token, should_stop=should_stop,
                                     run_options=be.run_options, image=image)
        except StudioError as exc:
            if not (stopped[0] and "cancelled" in exc.message):
                raise
            out = {"tokens": got, "ttft_s": 0.0, "prefill_s": 0.0, "step_s": [],
                   "prompt_chunks": 0, "source": source, "stopped": "stop"}
        if out.get("source") and out["source"] != source:
            raise StudioError(f"agent {name} labels its {backend} figures {out['source']!r}, not "
                              f"{source!r}: name the backend as the agent lists it")
        if stopped[0]:
            out["stopped"] = "stop"
        return out
