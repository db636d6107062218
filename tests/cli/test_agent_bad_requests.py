"""The device agent under bad requests, for real: ``studio agent serve`` as a subprocess on an
ephemeral 127.0.0.1 port. Malformed bodies are 400 (413 past the JSON limit), never 500;
concurrent ``POST /jobs`` never start more jobs than ``--max-jobs``; 200 concurrent malformed
and valid requests leave no 500 and no temporary file; what an upload killed half-way left is
gone when the agent starts; wrong tokens are answered 429 after a while."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.cli.test_agent import Agent

H = hashlib.sha256(b"hello agent").hexdigest()

MALFORMED: dict[str, tuple[str, bytes]] = {
    "an unclosed object": ("/models", b"{"),
    "an empty body": ("/models", b""),
    "bytes that are not UTF-8": ("/models", b"\xff\xfe{\"files\": 1}"),
    "JSON nested 100000 deep": ("/models", b"[" * 100_000 + b"]" * 100_000),
    "JSON nested 40 deep": ("/jobs", b"[" * 40 + b"]" * 40),
    "a list, not an object": ("/jobs", b"[]"),
    "a hash that is a number": ("/models", json.dumps({"files": {"x": 5}}).encode()),
    "a file and a folder of one name": ("/models", json.dumps({"files": {"a": H, "a/b": H}})
                                        .encode()),
    "files that is a list": ("/models", json.dumps({"files": [H]}).encode()),
    "a kind that is a list": ("/jobs", json.dumps({"kind": ["generate"]}).encode()),
    "a model that is a table": ("/jobs", json.dumps({"kind": "generate", "model": {"x": 1}})
                                .encode()),
}


@pytest.fixture
def agent(tmp_path):
    # an upload and a model killed half-way by an earlier agent on this store
    tmp = tmp_path / "store" / "tmp"
    (tmp / "tmpk3j2_model" / "dir").mkdir(parents=True)
    (tmp / "tmpk3j2_model" / "dir" / "a.bin").write_bytes(b"half")
    (tmp / "tmpupload").write_bytes(b"partial upload")
    a = Agent(tmp_path)
    yield a
    a.stop()


def _post(agent: Agent, path: str, body: bytes) -> tuple[int, dict]:
    return agent.request("POST", path, body)


def test_leftovers_are_cleaned_and_malformed_bodies_are_400(agent):
    assert list((agent.store / "tmp").iterdir()) == []  # cleaned at start
    assert agent.request("PUT", f"/artifacts/{H}", b"hello agent",
                         ctype="application/octet-stream")[0] == 201
    for name, (path, body) in MALFORMED.items():
        status, answer = _post(agent, path, body)
        assert status == 400 and answer.get("error"), (name, status, answer)
        assert "\n" not in answer["error"], (name, answer)
    status, answer = _post(agent, "/models", b'{"files": {"a": "' + b"0" * (5 << 20) + b'"}}')
    assert status == 413 and "JSON limit" in answer["error"], (status, answer)
    assert list((agent.store / "tmp").iterdir()) == []
    assert list((agent.store / "models").iterdir()) == []


def test_the_job_limit_holds_under_concurrent_requests(agent):
    assert agent.request("PUT", f"/artifacts/{H}", b"hello agent",
                         ctype="application/octet-stream")[0] == 201
    status, body = _post(agent, "/models", json.dumps({"files": {"graph.json": H}}).encode())
    assert status == 200
    job = json.dumps({"kind": "generate", "model": body["model"], "backend": "cpu"}).encode()
    start = threading.Barrier(10)

    def one(_):
        start.wait()
        return _post(agent, "/jobs", job)[0]

    with ThreadPoolExecutor(10) as pool:
        statuses = Counter(pool.map(one, range(10)))
    # --max-jobs 1: one job starts, the others are told to wait; never two at once
    assert statuses == {202: 1, 429: 9}, statuses


def test_200_concurrent_malformed_and_valid_requests(agent):
    blobs = [f"blob {i}".encode() for i in range(20)]
    for data in blobs[:2]:
        assert agent.request("PUT", f"/artifacts/{hashlib.sha256(data).hexdigest()}", data,
                             ctype="application/octet-stream")[0] == 201
    manifest = json.dumps({"files": {"a/x.bin": hashlib.sha256(blobs[0]).hexdigest(),
                                     "b.bin": hashlib.sha256(blobs[1]).hexdigest()}}).encode()
    bodies = list(MALFORMED.values())

    def one(i: int) -> tuple[str, int]:
        kind = i % 6
        if kind == 0:
            path, body = bodies[i % len(bodies)]
            return "malformed", _post(agent, path, body)[0]
        if kind == 1:  # the same model, many times at once
            return "model", _post(agent, "/models", manifest)[0]
        if kind == 2:
            data = blobs[i % len(blobs)]
            return "upload", agent.request("PUT", f"/artifacts/{hashlib.sha256(data).hexdigest()}",
                                           data, ctype="application/octet-stream")[0]
        if kind == 3:
            return "bad hash", agent.request("PUT", f"/artifacts/{H}", b"other bytes",
                                             ctype="application/octet-stream")[0]
        if kind == 4:
            return "info", agent.request("GET", "/info")[0]
        return "unknown model", _post(agent, "/jobs", json.dumps(
            {"kind": "generate", "model": "0" * 32}).encode())[0]

    started = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(one, range(200)))
    took = time.monotonic() - started
    by_kind: dict[str, Counter] = {}
    for kind, status in answers:
        by_kind.setdefault(kind, Counter())[status] += 1
    print(f"200 requests in {took:.1f} s: "
          + "; ".join(f"{k} {dict(v)}" for k, v in sorted(by_kind.items())))
    assert all(status < 500 for _, status in answers), by_kind
    assert set(by_kind["malformed"]) == {400}
    assert set(by_kind["model"]) == {200}
    assert set(by_kind["upload"]) == {201}
    assert set(by_kind["bad hash"]) == {400}
    assert set(by_kind["info"]) == {200}
    assert set(by_kind["unknown model"]) == {400}
    assert list((agent.store / "tmp").iterdir()) == []  # no leftovers
    assert len(list((agent.store / "models").iterdir())) == 1
    assert agent.request("GET", "/health", token=None)[0] == 200


def test_wrong_tokens_are_answered_429_after_a_while(agent):
    statuses = [agent.request("GET", "/info", token=f"guess-{i}")[0] for i in range(25)]
    assert statuses[:20] == [401] * 20 and set(statuses[20:]) == {429}
    assert agent.request("GET", "/health", token=None)[0] == 200
    # someone guessing from an address locks it out, the right token too: a right guess
    # must not be told apart from a wrong one
    assert agent.request("GET", "/info")[0] == 429


def test_a_clients_wrong_token_does_not_lock_out_the_right_one(agent):
    """Clients behind one address (a shared NAT, or every client on loopback): one with a
    stale token is answered 429 after a while, and only for that token; the right token from
    the same address still gets in, and so does another client's first wrong try (401)."""
    statuses = [agent.request("GET", "/info", token="stale-token")[0] for _ in range(25)]
    assert statuses[:20] == [401] * 20 and set(statuses[20:]) == {429}
    status, answer = agent.request("GET", "/info", token="stale-token")
    assert status == 429 and "this token was refused too many times" in answer["error"]
    assert agent.request("GET", "/info")[0] == 200
    assert agent.request("GET", "/info", token="another-typo")[0] == 401
    assert agent.request("GET", "/info")[0] == 200


def test_run_options_other_than_the_performance_mode_are_refused(agent):
    """A job's run_options reach the agent's sessions: only htp_performance_mode, one of the
    QNN HTP backend's modes; anything else is a one-line 400."""
    assert agent.request("PUT", f"/artifacts/{H}", b"hello agent",
                         ctype="application/octet-stream")[0] == 201
    status, body = _post(agent, "/models", json.dumps({"files": {"graph.json": H}}).encode())
    assert status == 200
    for options, needle in (({"vtcm_mb": "2"}, "htp_performance_mode only"),
                            ({"htp_performance_mode": "turbo"}, "is not one of"),
                            (["burst"], "must be an object")):
        status, answer = _post(agent, "/jobs", json.dumps({
            "kind": "generate", "model": body["model"], "backend": "cpu",
            "run_options": options}).encode())
        assert status == 400 and needle in answer["error"], (options, status, answer)
        assert "\n" not in answer["error"]
