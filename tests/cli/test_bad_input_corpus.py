"""The bad-input corpus: each case is a command a new user (or a careless script) might type,
run through the real command line in a child process whose HOME is a temporary folder. Every
case must end with exit code 2, at most two lines on stderr (the last ``error: ...`` with the
words the case names), no traceback, no hang, and nothing written anywhere under the test's
folder, the HOME included: no project folder, no store, no temporary file, and no file that
was there (a link, a FIFO, a device's stand-in, a folder of someone else's files) changed.

The whole corpus runs in one child (tests/cli/corpus_driver.py), so the interpreter and the
studio are imported once; the cases are reported one by one.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import ROOT, SMALL, default_target

BIG = 2**63 - 1
MAX = 9 * (1 << 20)  # past the project file's limit (8 MiB)


def _project(**subs: str) -> str:
    text = SMALL.format(target=default_target())
    for old, new in subs.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def _safetensors(path: Path, dtype: str, shape: list[int], data: bytes) -> None:
    header = json.dumps({"model.embed_tokens.weight": {
        "dtype": dtype, "shape": shape, "data_offsets": [0, len(data)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def _checkpoint(folder: Path, heads: int, dtype: str = "F32") -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2,
        "intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": 1, "vocab_size": 4}))
    _safetensors(folder / "model.safetensors", dtype, [4, 2], bytes(32))  # 8 float32 values
    return folder


def _build(world: Path) -> dict[str, list[str]]:
    """The files the cases need (a project, its history, links, a FIFO, bad checkpoints)
    under ``world``, and the cases: name -> the command line."""
    from studio.core.jobs import JobStore
    from tests.cli.conftest import record_run

    w = world
    (w / "home").mkdir()
    good = w / "p.qstudio"
    good.write_text(_project())
    # a run in the history (report / compare / profile look at it before any work)
    store = JobStore(w / "p.studio" / "runs.sqlite")
    record_run(store, None, [])
    store.close()

    def project(name: str, text: str) -> str:
        (w / name).write_text(text)
        return str(w / name)

    theirs = w / "theirs.txt"
    theirs.write_text("someone else's file\n")
    (w / "link.txt").symlink_to(theirs)
    (w / "link-dir").symlink_to(w / "home", target_is_directory=True)
    os.mkfifo(w / "fifo")
    (w / "photos").mkdir()
    (w / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    (w / "zero.qstudio").symlink_to("/dev/zero")
    os.mkfifo(w / "fifo.qstudio")
    (w / "folder.qstudio").mkdir()
    with open(w / "huge.qstudio", "wb") as f:  # sparse: no disk used
        f.truncate(MAX)
    (w / "binary.qstudio").write_bytes(b"\x00\xff\xfe garbage \x00" * 10)
    (w / "truncated.onnx").write_bytes(b"\x08\x07not a protobuf" * 4)
    (w / "calib.npz").write_bytes(b"PK")
    (w / "a-file").write_text("not a folder\n")
    for name, sizes in (("wide", {"hidden_size": 10**9, "num_hidden_layers": 2}),
                        ("deep", {"hidden_size": 64, "num_hidden_layers": 100_000})):
        (w / f"{name}.json").write_text(json.dumps({
            "model_type": "llama", "num_attention_heads": 8, "intermediate_size": 128,
            "vocab_size": 1000, **sizes}))
    sock = w / "agent.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()  # the socket file stays

    axes7 = "".join(f'"{k}" = {list(range(16, 46))}\n' for k in (
        "validation.heldout_tokens", "sensitivity.heldout_tokens", "waterfall.new_tokens",
        "bundle.new_tokens", "graph.repeats", "graph.seq_len", "pruning.drop_blocks"))
    cli_axes = [a for k in ("validation.heldout_tokens", "sensitivity.heldout_tokens",
                            "waterfall.new_tokens", "bundle.new_tokens", "graph.repeats",
                            "graph.seq_len", "pruning.drop_blocks")
                for a in ("--axis", f"{k}={','.join(str(v) for v in range(16, 46))}")]
    P = str(good)
    cases: dict[str, list[str]] = {
        # ---- the project file itself: kind, size, encoding, nesting
        "project is a link to /dev/zero": ["info", str(w / "zero.qstudio")],
        "project is a FIFO": ["info", str(w / "fifo.qstudio")],
        "project is a folder": ["info", str(w / "folder.qstudio")],
        "project of 9 MiB": ["info", str(w / "huge.qstudio")],
        "project that is binary": ["info", str(w / "binary.qstudio")],
        "TOML nested 100000 deep": ["info", project("deep.qstudio",
                                                    "x = " + "[" * 100_000 + "]" * 100_000)],
        "TOML nested 40 deep": ["info", project("deep40.qstudio",
                                                "x = " + "[" * 40 + "]" * 40 + "\n")],
        # ---- settings out of their declared ranges
        "run.devices a list of lists": ["info", project("d1.qstudio", _project(**{
            "max_new_tokens = 8": 'max_new_tokens = 8\ndevices = [["cpu"]]'}))],
        "run.devices a list of tables": ["info", project("d2.qstudio", _project(**{
            "max_new_tokens = 8": "max_new_tokens = 8\ndevices = [{a = 1}]"}))],
        "run.devices empty": ["info", project("d3.qstudio", _project(**{
            "max_new_tokens = 8": "max_new_tokens = 8\ndevices = []"}))],
        "run.devices names a device twice": ["info", project("d4.qstudio", _project(**{
            "max_new_tokens = 8": 'max_new_tokens = 8\ndevices = ["cpu", "htp-sim", "cpu"]'}))],
        "run.devices names an agent twice": ["info", project("d5.qstudio", _project(**{
            "max_new_tokens = 8": 'max_new_tokens = 8\ndevices = ["agent:lab", "agent:lab@cpu"]'
        }))],
        "run.devices names an agent not registered": ["--batch", project("d6.qstudio", _project(**{
            "max_new_tokens = 8": 'max_new_tokens = 8\ndevices = ["cpu", "agent:nosuch"]'}))],
        "targets lists a chip twice": ["info", project("t2.qstudio", _project(**{
            f'targets = ["{default_target()}"]':
                f'targets = ["{default_target()}", "{default_target()}"]'}))],
        "heldout_tokens 2**63-1": ["info", project("h.qstudio", _project(**{
            "heldout_tokens = 96": f"heldout_tokens = {BIG}"}))],
        "sensitivity.heldout_tokens 2**63-1": ["info", project("sh.qstudio", _project()
                                                               + f"[sensitivity]\nheldout_tokens = {BIG}\n")],
        "pruning.drop_blocks 2**63-1": ["info", project("pr.qstudio", _project()
                                                        + f"[pruning]\ndrop_blocks = {BIG}\n")],
        "bundle.parts 2**63-1": ["info", project("bp.qstudio", _project()
                                                 + f"[bundle]\nparts = {BIG}\n")],
        "waterfall.window 2**63-1": ["info", project("ww.qstudio", _project()
                                                     + f"[waterfall]\nwindow = {BIG}\n")],
        "gate nan": ["info", project("g1.qstudio", _project(**{
            "max_perplexity_increase = 0.05": "max_perplexity_increase = nan"}))],
        "gate -1": ["info", project("g2.qstudio", _project(**{
            "max_perplexity_increase = 0.05": "max_perplexity_increase = -1"}))],
        "autoprecision nan": ["info", project("a1.qstudio", _project()
                                              + "[autoprecision]\nmax_perplexity_change = nan\n")],
        "autoprecision inf": ["info", project("a2.qstudio", _project()
                                              + "[autoprecision]\nmax_perplexity_change = inf\n")],
        "graph.shapes a huge dimension": ["info", project("gs.qstudio", _project()
                                                          + f"[graph.shapes]\nx = [1, {BIG}]\n")],
        # ---- sweeps: counted from the axes, before anything is made
        "sweeps best = []": ["info", project("s1.qstudio", _project()
                                             + '[[sweeps]]\nname = "s"\nbest = []\n[sweeps.axes]\n'
                                             '"quantization.scheme" = ["W8A8"]\n')],
        "sweeps 7 axes of 30 in the file": ["info", project("s2.qstudio", _project()
                                                            + '[[sweeps]]\nname = "huge"\n'
                                                            "[sweeps.axes]\n" + axes7)],
        "sweeps one axis of 300 values": ["info", project("s3.qstudio", _project()
                                                          + '[[sweeps]]\nname = "long"\n'
                                                          '[sweeps.axes]\n"graph.repeats" = '
                                                          f"{list(range(1, 301))}\n")],
        "sweep 7 axes of 30 on the command line": ["sweep", P, *cli_axes],
        "sweep --search 0": ["sweep", P, "--axis", "quantization.scheme=W8A16,W8A8",
                             "--search", "0"],
        "sweep --workers 0": ["sweep", P, "--axis", "quantization.scheme=W8A16,W8A8",
                              "--workers", "0"],
        "sweep --minutes -1": ["sweep", P, "--axis", "quantization.scheme=W8A16,W8A8",
                               "--search", "2", "--minutes", "-1"],
        "sweep --executor bogus": ["sweep", P, "--axis", "quantization.scheme=W8A16,W8A8",
                                   "--executor", "bogus"],
        "sweep --apply p999": ["sweep", P, "--axis", "quantization.scheme=W8A16,W8A8",
                               "--apply", "p999"],
        "sweep --stages ''": ["sweep", P, "--axis", "quantization.scheme=W8A16,W8A8",
                              "--stages", ""],
        "sweep --axis a value the setting refuses": [
            "sweep", P, "--axis", "quantization.scheme=BOGUS,W8A8"],
        # ---- options checked before any work
        "batch --stages ''": ["--batch", P, "--stages", ""],
        "batch --target twice": ["--batch", P, "--target", default_target(), "--target",
                                 default_target()],
        "generate --max-new-tokens 0": ["generate", P, "--prompt", "x", "--max-new-tokens",
                                        "0"],
        "generate --speculative --k 0": ["generate", P, "--prompt", "x", "--speculative",
                                         "--k", "0"],
        "generate --temperature nan": ["generate", P, "--prompt", "x", "--temperature", "nan"],
        "generate --top-p 0": ["generate", P, "--prompt", "x", "--top-p", "0"],
        "generate --window 0": ["generate", P, "--prompt", "x", "--window", "0"],
        "generate --device ''": ["generate", P, "--prompt", "x", "--device", ""],
        # a bundle takes minutes to build: generate names the command that builds it
        "generate --runtime genie without a bundle": ["generate", P, "--prompt", "x",
                                                      "--runtime", "genie"],
        "waterfall --chip bogus": ["waterfall", P, "--chip", "bogus"],
        "prune --drop 0": ["prune", P, "--drop", "0"],
        "prune --drop -2": ["prune", P, "--drop", "-2"],
        "prune --drop 1000": ["prune", P, "--drop", "1000"],
        "prune --out a link": ["prune", P, "--out", str(w / "link-dir")],
        "prune --out a folder of other files": ["prune", P, "--out", str(w / "photos")],
        "bundle --out a folder of other files": ["bundle", P, "--out", str(w / "photos")],
        "bundle --out a link": ["bundle", P, "--out", str(w / "link-dir")],
        "bundle --parts -1": ["bundle", P, "--parts", "-1"],
        "compare run 10**23": ["compare", P, "1", str(10**23)],
        "report --run 10**23": ["report", P, "--run", str(10**23)],
        "new with --seq-len 0": ["new", str(w / "n.qstudio"), "--sample", "tiny-coder",
                                 "--seq-len", "0"],
        "new with a 300-character name": ["new", str(w / ("x" * 300 + ".qstudio")),
                                          "--sample", "tiny-coder"],
        "graph of a truncated ONNX": ["graph", str(w / "truncated.onnx"), "--calibration",
                                      str(w / "calib.npz")],
        "estimate --context 0": ["estimate", "--config", "tiny-coder", "--chip",
                                 default_target(), "--context", "0"],
        "estimate a config 10**9 wide": ["estimate", "--config", str(w / "wide.json"),
                                         "--chip", default_target()],
        "estimate a config 100000 layers deep": ["estimate", "--config", str(w / "deep.json"),
                                                 "--chip", default_target()],
        # ---- --out never replaces what is not the studio's
        "report --out a link": ["report", P, "--format", "md", "--out", str(w / "link.txt")],
        "report --out a FIFO": ["report", P, "--format", "md", "--out", str(w / "fifo")],
        "report --out /dev/null": ["report", P, "--format", "md", "--out", "/dev/null"],
        "report --out a socket": ["report", P, "--format", "md", "--out", str(sock)],
        "report --out a folder": ["report", P, "--format", "md", "--out", str(w / "photos")],
        "report --out under a file": ["report", P, "--format", "md", "--out",
                                      str(w / "a-file" / "r.md")],
        "overrides export to /dev/null": ["overrides", "export", P, "/dev/null"],
        "overrides export to a link": ["overrides", "export", P, str(w / "link.txt")],
        "profile export to a FIFO": ["profile", "export", P, str(w / "fifo"), "--format",
                                     "csv"],
        # ---- one rule for every writer: the folder a path goes in must exist (none is made)
        "report --out in a missing folder": ["report", P, "--format", "md", "--out",
                                             str(w / "missing" / "r.md")],
        "overrides export in a missing folder": ["overrides", "export", P,
                                                 str(w / "missing" / "o.json")],
        "profile export in a missing folder": ["profile", "export", P,
                                               str(w / "missing" / "t.csv"), "--format", "csv"],
        "new in a missing folder": ["new", str(w / "missing" / "n.qstudio"), "--sample",
                                    "tiny-coder"],
        "bundle --out in a missing folder": ["bundle", P, "--out", str(w / "missing" / "b")],
        "prune --out in a missing folder": ["prune", P, "--out", str(w / "missing" / "pr")],
        "graph --out in a missing folder": ["graph", str(w / "truncated.onnx"), "--calibration",
                                            str(w / "calib.npz"), "--out",
                                            str(w / "missing" / "g")],
        "agent serve --store in a missing folder": ["agent", "serve", "--port", "0", "--store",
                                                    str(w / "missing" / "store")],
        # ---- checkpoints whose header or config does not hold together
        "checkpoint header I64 over F32 data": ["new", str(w / "c1.qstudio"), "--checkpoint",
                                                str(_checkpoint(w / "ck-i64", 1, "I64"))],
        "checkpoint with 0 attention heads": ["new", str(w / "c2.qstudio"), "--checkpoint",
                                              str(_checkpoint(w / "ck-heads", 0))],
        # ---- the agent: refused before it binds a port or makes its store
        "agent serve --port -1": ["agent", "serve", "--port", "-1"],
        "agent serve --port 70000": ["agent", "serve", "--port", "70000"],
        "agent serve --max-jobs 0": ["agent", "serve", "--max-jobs", "0"],
        "agent serve --max-upload-mb -1": ["agent", "serve", "--max-upload-mb", "-1"],
        "agent serve --max-upload-mb nan": ["agent", "serve", "--max-upload-mb", "nan"],
        "agent serve --store FILE": ["agent", "serve", "--port", "0", "--store",
                                     str(w / "a-file")],
        "agent serve --host no.such.host": ["agent", "serve", "--port", "0", "--host",
                                            "no.such.host.invalid", "--store",
                                            str(w / "agent-store")],
    }
    return cases


#: case -> the words its one line must hold ({P}: the good project's path)
NEEDLES = {
    "project is a link to /dev/zero": "is a character device, not a regular file",
    "project is a FIFO": "is a named pipe (FIFO), not a regular file",
    "project is a folder": "is a folder",
    "project of 9 MiB": "at most 8,388,608 are read",
    "project that is binary": "is not a text file",
    "TOML nested 100000 deep": "nests tables or lists too deeply",
    "TOML nested 40 deep": "nests tables or lists more than 32 deep",
    "run.devices a list of lists": "run.devices[0] must be a str, not list",
    "run.devices a list of tables": "run.devices[0] must be a str, not dict",
    "run.devices empty": "run.devices is empty",
    "run.devices names a device twice": "run.devices names 'cpu' twice: name each device once",
    "run.devices names an agent twice": "run.devices names 'agent:lab@cpu' twice",
    "run.devices names an agent not registered": "run.devices: agent:nosuch@cpu: no device "
                                                 "named 'nosuch': add it with studio devices "
                                                 "add nosuch --url URL --token-file F",
    "targets lists a chip twice": f"targets lists {default_target()} twice: name each chip once",
    "heldout_tokens 2**63-1": "validation.heldout_tokens = 9223372036854775807 is more than",
    "sensitivity.heldout_tokens 2**63-1": "sensitivity.heldout_tokens = 9223372036854775807",
    "pruning.drop_blocks 2**63-1": "pruning.drop_blocks = 9223372036854775807",
    "bundle.parts 2**63-1": "bundle.parts = 9223372036854775807",
    "waterfall.window 2**63-1": "waterfall.window = 9223372036854775807",
    "gate nan": "gates.max_perplexity_increase must be a finite number",
    "gate -1": "gates.max_perplexity_increase must be 0 or more",
    "autoprecision nan": "autoprecision.max_perplexity_change must be a finite number",
    "autoprecision inf": "autoprecision.max_perplexity_change must be a finite number",
    "graph.shapes a huge dimension": "graph.shapes.x must be a list of at most 8 positive",
    "sweeps best = []": "best = [] is not one of",
    "sweeps 7 axes of 30 in the file": "has 21870000000 points; at most 256",
    "sweeps one axis of 300 values": "has 300 values",
    "sweep 7 axes of 30 on the command line": "has 21870000000 points; at most 256",
    "sweep --search 0": "argument --search: 0 is not from 1",
    "sweep --workers 0": "argument --workers: 0 is not from 1",
    "sweep --minutes -1": "argument --minutes: -1 must be more than 0",
    "sweep --executor bogus": "argument --executor: invalid choice: 'bogus'",
    "sweep --apply p999": "--apply 'p999': give best or a point label p1 .. p2",
    "sweep --stages ''": "--stages names no stage",
    "sweep --axis a value the setting refuses": "sweep axis quantization.scheme = 'BOGUS' is "
                                                "not one of W8A16, W8A8",
    "batch --stages ''": "no stages given",
    "batch --target twice": f"target {default_target()} is given twice: name each target once",
    "generate --max-new-tokens 0": "run.max_new_tokens must be at least 1, not 0",
    "generate --speculative --k 0": "argument --k: 0 is not from 1 to 64",
    "generate --temperature nan": "argument --temperature: nan is not a finite number",
    "generate --top-p 0": "argument --top-p: 0 must be more than 0",
    "generate --window 0": "argument --window: 0 is not at least 1",
    "generate --device ''": "argument --device: '' names no device: leave --device out",
    "generate --runtime genie without a bundle": f"build it first with studio bundle {{P}} "
                                                 f"--target {default_target()}",
    "waterfall --chip bogus": "bogus",
    "prune --drop 0": "pruning.drop_blocks must be at least 1, not 0",
    "prune --drop -2": "pruning.drop_blocks must be at least 1, not -2",
    "prune --drop 1000": "pruning.drop_blocks = 1000: the model has",
    "prune --out a link": "is a symbolic link",
    "prune --out a folder of other files": "exists and is not empty",
    "bundle --out a folder of other files": "is a folder that holds other files",
    "bundle --out a link": "is a symbolic link",
    "bundle --parts -1": "bundle.parts must be 0 or more, not -1",
    "compare run 10**23": "is not from 1 to 9223372036854775807",
    "report --run 10**23": "is not from 1 to 9223372036854775807",
    "new with --seq-len 0": "graph.seq_len must be between 2 and 512, not 0",
    "new with a 300-character name": "too long",
    "graph of a truncated ONNX": "not a valid ONNX model",
    "estimate --context 0": "argument --context: 0 is not from 1",
    "estimate a config 10**9 wide": "config wide: 'hidden_size' = 1000000000 must be between 1 "
                                    "and 16777216: the config is damaged",
    "estimate a config 100000 layers deep": "config deep: 'num_hidden_layers' = 100000 must be "
                                            "between 1 and 1024",
    "report --out a link": "is a symbolic link, not a regular file",
    "report --out a FIFO": "is a named pipe (FIFO), not a regular file",
    "report --out /dev/null": "is a character device, not a regular file",
    "report --out a socket": "is a socket, not a regular file",
    "report --out a folder": "is a folder: give a file name",
    "report --out under a file": "a folder on its path is a file",
    "overrides export to /dev/null": "is a character device, not a regular file",
    "overrides export to a link": "is a symbolic link, not a regular file",
    "profile export to a FIFO": "is a named pipe (FIFO), not a regular file",
    **{case: "/missing does not exist: create it first" for case in (
        "report --out in a missing folder", "overrides export in a missing folder",
        "profile export in a missing folder", "new in a missing folder",
        "bundle --out in a missing folder", "prune --out in a missing folder",
        "graph --out in a missing folder", "agent serve --store in a missing folder")},
    "checkpoint header I64 over F32 data": "I64 x [4, 2] is 64 bytes but its offsets span 32",
    "checkpoint with 0 attention heads": "num_attention_heads = 0 must be between 1 and",
    "agent serve --port -1": "argument --port: -1 is not from 0 to 65535",
    "agent serve --port 70000": "argument --port: 70000 is not from 0 to 65535",
    "agent serve --max-jobs 0": "argument --max-jobs: 0 is not from 1 to 64",
    "agent serve --max-upload-mb -1": "argument --max-upload-mb: -1 must be more than 0",
    "agent serve --max-upload-mb nan": "argument --max-upload-mb: nan is not a finite number",
    "agent serve --store FILE": "is a file, not a folder",
    "agent serve --host no.such.host": "--host 'no.such.host.invalid' does not resolve",
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Every case run once in one child process: name -> (result, the world's folder)."""
    base = tmp_path_factory.mktemp("corpus")
    world = base / "world"
    world.mkdir()
    cases = _build(world)
    assert set(cases) == set(NEEDLES)
    (base / "cases.json").write_text(json.dumps(cases))
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env.update(HOME=str(world / "home"), QSTUDIO_CONFIG_DIR=str(world / "home" / ".qstudio"),
               PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, "-m", "tests.cli.corpus_driver", str(world),
                        str(base / "cases.json"), str(base / "results.json")], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((base / "results.json").read_text()), world


@pytest.mark.parametrize("case", list(NEEDLES))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(corpus, case):
    results, world = corpus
    got = results[case]
    assert not got["escaped"], got["escaped"][-3000:]
    lines = [ln for ln in got["stderr"].splitlines() if ln.strip()]
    assert got["rc"] == 2, (got["rc"], got["stderr"][-2000:])
    assert 1 <= len(lines) <= 2 and lines[-1].startswith("error: "), got["stderr"][-2000:]
    assert "Traceback" not in got["stderr"]
    assert NEEDLES[case].replace("{P}", str(world / "p.qstudio")) in lines[-1], lines[-1]
    assert got["changed"] == [], got["changed"]
    assert got["seconds"] < 20, got["seconds"]


def test_the_corpus_left_what_was_there_as_it_was(corpus):
    _, world = corpus
    assert (world / "link.txt").is_symlink()
    assert (world / "theirs.txt").read_text() == "someone else's file\n"
    assert (world / "fifo").is_fifo()
    assert sorted(p.name for p in (world / "photos").iterdir()) == ["cat.jpg"]
    assert not (world / "agent-store").exists() and not (world / "p.studio" / "reports").exists()
    assert not (world / "truncated.studio-graph").exists()
    assert [p.name for p in (world / "home").iterdir()] == []


def test_a_project_saved_with_a_byte_order_mark_is_read(tmp_path):
    from studio.core import project as projectfile

    f = tmp_path / "bom.qstudio"
    f.write_bytes(b"\xef\xbb\xbf" + _project().encode())
    p = projectfile.load(f)
    assert p.name == "small" and p.export.prompt_length == 16
