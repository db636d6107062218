"""The device agent for real: `studio agent serve` as a subprocess on an ephemeral 127.0.0.1
port, the small project's decode run through it on the CPU and on the HTP simulator (tokens
equal to the local run), authentication, upload checks, and an agent killed mid-run."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from studio.core.errors import StudioError
from tests.cli.conftest import default_target, studio
from tests.conftest import copy_store

pytestmark = pytest.mark.slow


class Agent:
    def __init__(self, tmp: Path, port: int = 0, max_upload_mb: float = 64.0) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.token_file = tmp / "token"
        if not self.token_file.exists():
            self.token_file.write_text("s3cret-token-for-tests\n")
        self.store = tmp / "store"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "studio.cli", "agent", "serve", "--port", str(port),
             "--token-file", str(self.token_file), "--store", str(self.store),
             "--max-upload-mb", str(max_upload_mb)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert "listening on" in line, (line, self.proc.stderr.read() if self.proc.poll() else "")
        self.url = line.split("listening on ")[1].strip()
        self.port = int(self.url.rsplit(":", 1)[1])
        self.token = self.token_file.read_text().strip()

    def request(self, method: str, path: str, body: bytes | None = None,
                token: str | None = "default", ctype: str = "application/json") -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=body, method=method)
        if token is not None:
            req.add_header("Authorization", f"Bearer {self.token if token == 'default' else token}")
        if body is not None:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else {}
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def agent(tmp_path):
    a = Agent(tmp_path)
    yield a
    a.stop()


def test_auth_uploads_and_traversal_are_checked(agent, tmp_path):
    assert agent.request("GET", "/health", token=None) == (200, {"status": "ok", "protocol": 1})
    assert agent.request("GET", "/info", token=None)[0] == 401
    assert agent.request("GET", "/info", token="wrong")[0] == 401
    status, info = agent.request("GET", "/info")
    assert status == 200 and info["backends"][0] == {"id": "cpu", "kind": "host-cpu",
                                                     "source": "measured"}

    data = b"hello agent"
    good = hashlib.sha256(data).hexdigest()
    assert agent.request("PUT", f"/artifacts/{good}", data, ctype="application/octet-stream")[0] == 201
    assert (agent.store / "blobs" / good).read_bytes() == data
    bad = hashlib.sha256(b"other").hexdigest()
    status, body = agent.request("PUT", f"/artifacts/{bad}", data,
                                 ctype="application/octet-stream")
    assert status == 400 and "does not match" in body["error"]
    assert not (agent.store / "blobs" / bad).exists()
    for name in ("..%2F..%2Fx", "not-a-hash", "A" * 64):
        assert agent.request("PUT", f"/artifacts/{name}", data,
                             ctype="application/octet-stream")[0] in (400, 404)

    before = {p for p in tmp_path.rglob("*")}
    for rel in ("../x", "/etc/passwd", "a/../../x", "%2e%2e/x", "..\\x", "C:/x", "a//b", "./a"):
        status, body = agent.request("POST", "/models",
                                     json.dumps({"files": {rel: good}}).encode())
        assert status == 400 and "bad file name" in body["error"], (rel, status, body)
    assert {p for p in tmp_path.rglob("*")} == before  # nothing written anywhere
    status, body = agent.request("POST", "/models", json.dumps({"files": {"dir/a.txt": good}}).encode())
    assert status == 200 and (agent.store / "models" / body["model"] / "dir" / "a.txt").is_file()
    status, body = agent.request("POST", "/jobs", json.dumps({"kind": "generate", "model": "0" * 32,
                                                            "backend": "cpu"}).encode())
    assert status == 400 and "unknown model" in body["error"]
    # context binaries built with another QNN SDK: refused with both versions named
    sim = next(b for b in info["backends"] if b["kind"] == "htp-sim")
    model = agent.request("POST", "/models", json.dumps({"files": {"a.txt": good}}).encode())[1]
    status, body = agent.request("POST", "/jobs", json.dumps({
        "kind": "generate", "model": model["model"], "backend": sim["id"],
        "sdk_build": "v2.0.0.000000000000"}).encode())
    assert status == 409 and "v2.0.0.000000000000" in body["error"]
    assert sim["qnn_sdk_build"] in body["error"]


def test_an_upload_over_the_limit_is_refused(tmp_path):
    small = Agent(tmp_path, max_upload_mb=0.001)  # about 1 KiB
    try:
        data = os.urandom(4096)
        status, body = small.request("PUT", f"/artifacts/{hashlib.sha256(data).hexdigest()}",
                                     data, ctype="application/octet-stream")
        assert status == 413 and "limit" in json.dumps(body)
        assert not list((small.store / "blobs").iterdir())
    finally:
        small.stop()


def test_generation_through_the_agent_equals_the_local_run(batch_run, small_project, agent,
                                                           tmp_path):
    env = dict(os.environ, QSTUDIO_CONFIG_DIR=str(tmp_path / "cfg"))
    r = studio("devices", "add", "lab", "--url", agent.url, "--token-file", agent.token_file,
               env=env)
    assert r.returncode == 0 and "ok," in r.stdout, r.stderr
    r = studio("devices", "list", "--json", env=env)
    rows = {d["id"]: d for d in json.loads(r.stdout)}
    assert rows["agent:lab"]["status"].startswith("ok")

    args = ["generate", small_project, "--prompt", "def __init__(self", "--max-new-tokens", "8",
            "--json"]
    local = json.loads(studio(*args).stdout)
    remote = json.loads(studio(*args, "--device", "agent:lab", env=env).stdout)
    assert remote["tokens"] == local["tokens"] and remote["source"] == "measured"
    assert remote["device"] == "agent:lab@cpu"
    chip = default_target()
    sim_local = json.loads(studio(*args, "--device", "htp-sim").stdout)
    sim = json.loads(studio(*args, "--device", f"agent:lab@htp-sim:{chip}", env=env).stdout)
    assert sim["tokens"] == sim_local["tokens"] and sim["source"] == "simulated"

    r = studio("generate", small_project, "--prompt", "x", "--device", "agent:nope", env=env)
    assert r.returncode == 2 and "no device named 'nope'" in r.stderr


def test_an_agent_killed_mid_run_fails_the_job_clearly_and_comes_back(batch_run, small_project,
                                                                     tmp_path):
    from studio.core import project as pf
    from studio.services.generate import generate_remote
    from studio.services.registry import Registry

    a = Agent(tmp_path / "a")
    reg = Registry(tmp_path / "cfg")
    reg.add("lab", a.url, a.token)
    chip = default_target()
    project = pf.load(small_project)
    seen: list[str] = []

    def on_text(text: str) -> None:  # the first token arrives: the agent dies
        seen.append(text)
        if len(seen) == 1:
            a.proc.kill()
            a.proc.wait(10)

    with pytest.raises(StudioError) as err:
        generate_remote(project, "def __init__(self", f"agent:lab@htp-sim:{chip}", 40,
                        on_text=on_text, registry=reg)
    assert "went away" in err.value.message or "closed the job's stream" in err.value.message
    with pytest.raises(StudioError, match="unreachable"):
        reg.client("lab").health()
    b = Agent(tmp_path / "a", port=a.port)  # restarted on the same port, same token
    try:
        deadline = time.time() + 20
        while True:
            try:
                assert reg.client("lab").health()["status"] == "ok"
                break
            except StudioError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        out = generate_remote(project, "def __init__(self", "agent:lab", 4, registry=reg)
        assert len(out["tokens"]) == 4
    finally:
        b.stop()


def test_run_and_profile_stages_on_agent_devices(batch_run, small_project, agent, tmp_path):

    env = dict(os.environ, QSTUDIO_CONFIG_DIR=str(tmp_path / "cfg"))
    assert studio("devices", "add", "lab", "--url", agent.url, "--token", agent.token,
                  env=env).returncode == 0
    chip = default_target()
    proj = tmp_path / "remote.qstudio"
    text = small_project.read_text().replace(
        "[run]\n", f'[run]\ndevices = ["cpu", "agent:lab", "agent:lab@htp-sim:{chip}"]\n', 1)
    # the HTP's run-time performance mode goes to the agent with each job
    proj.write_text(text + '\n[htp]\nperformance_mode = "burst"\n')
    copy_store(small_project.with_suffix(".studio"), proj.with_suffix(".studio"))
    r = studio("--batch", proj, "--stages", "run,profile", "--json", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    jobs = {(j["stage"], j["target"]): j for j in json.loads(r.stdout)["jobs"]}
    prof = jobs[("profile", f"agent:lab@htp-sim:{chip}")]  # the agent's HTP is profiled
    assert prof["state"] == "succeeded" and "(simulated," in prof["summary"]
    assert ("profile", "agent:lab@cpu") not in jobs  # its CPU is not an NPU
    cpu = jobs[("run", "agent:lab@cpu")]
    sim = jobs[("run", f"agent:lab@htp-sim:{chip}")]
    assert cpu["state"] == sim["state"] == "succeeded"
    assert "(measured, FP32 on the agent's CPU)" in cpu["summary"]
    assert "(simulated," in sim["summary"] and "performance mode burst" in sim["summary"]
    assert "performance mode" not in cpu["summary"]
    assert jobs[("export", "")]["cached"]  # the agent runs what the store already holds
    bad = tmp_path / "bad.qstudio"
    bad.write_text(small_project.read_text().replace(
        "[run]\n", '[run]\ndevices = ["agent:../x"]\n', 1))
    r = studio("--batch", bad, "--stages", "run", env=env)
    assert r.returncode == 2 and "agent device is agent:NAME" in r.stderr


def test_tls_serves_https_with_the_given_certificate(tmp_path):
    """--tls-cert / --tls-key: the agent speaks HTTPS; a client trusting that certificate
    gets through, one that does not is refused by TLS, not by the agent."""
    import shutil as _shutil

    from studio.engine.devices.agent_client import AgentClient

    if _shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    token = tmp_path / "token"
    token.write_text("tls-token")
    proc = subprocess.Popen(
        [sys.executable, "-m", "studio.cli", "agent", "serve", "--port", "0", "--token-file",
         str(token), "--store", str(tmp_path / "store"), "--tls-cert", str(cert), "--tls-key",
         str(key)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().split("listening on ")[1].strip()
        assert url.startswith("https://127.0.0.1:")
        info = AgentClient(url, "tls-token", cafile=str(cert)).info()
        assert info["backends"][0]["id"] == "cpu"
        with pytest.raises(StudioError, match="unreachable"):
            AgentClient(url, "tls-token").health()  # an untrusted certificate
        env = dict(os.environ, QSTUDIO_CONFIG_DIR=str(tmp_path / "cfg"))
        r = studio("devices", "add", "secure", "--url", url, "--token", "tls-token",
                   "--cafile", cert, env=env)
        assert r.returncode == 0 and "ok," in r.stdout, r.stdout + r.stderr
    finally:
        proc.terminate()
        proc.wait(20)
