"""Bad input: exit code 2, one line on stderr, no traceback, nothing half-written."""

from pathlib import Path

import pytest

from tests.cli.conftest import SMALL, default_target, studio


def write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "p.qstudio"
    f.write_text(text)
    return f


def assert_clean_failure(r, needle: str, tmp_path: Path, before: dict[str, bytes]):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    assert needle in lines[-1], lines[-1]
    # nothing the user had changed; no artifact was stored
    for name, data in before.items():
        assert (tmp_path / name).read_bytes() == data
    for store in tmp_path.glob("*.studio/artifacts/objects"):
        assert not any(store.rglob("artifact.json"))


def snapshot(tmp_path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}


def small(**subs) -> str:
    text = SMALL.format(target=default_target())
    for old, new in subs.items():
        text = text.replace(old, new)
    return text


CASES = {
    "malformed TOML": ("schema_version = 1\nname = [\n", "not valid TOML"),
    "unknown key": (small(**{'name = "small"': 'name = "small"\ncolour = "red"'}), "unknown key 'colour'"),
    "newer schema": (small(**{"schema_version = 1": "schema_version = 7"}), "newer QStudio"),
    "wrong type": (small(**{"prompt_length = 16": 'prompt_length = "16"'}), "must be a int"),
    "context shorter than prompt": (small(**{"context_length = 64": "context_length = 8"}),
                                    "must be larger than"),
    "unknown target": (small(**{'targets = ["': 'targets = ["htp-v99", "'}), "unknown target 'htp-v99'"),
    "missing model folder": (small(**{'"sample:tiny-coder"': '"./no-such-model"'}), "not found"),
    "unknown sample": (small(**{'"sample:tiny-coder"': '"sample:gpt-17"'}), "gpt-17"),
    # nonsense settings are refused when the file is read, naming the key and the limit
    "no stages": (small() + '\n[pipeline]\nstages = []\n', "pipeline.stages is empty"),
    "huge max_new_tokens": (small(**{"max_new_tokens = 8": "max_new_tokens = 1000000000"}),
                            "run.max_new_tokens = 1000000000 is more than the exported context"),
    "negative greedy_tokens": (small(**{"greedy_tokens = 8": "greedy_tokens = -5"}),
                               "validation.greedy_tokens must be at least 1"),
    "empty prompt": (small(**{'prompt = "def __init__(self"': 'prompt = "  "'}),
                     "run.prompt is empty"),
    # caught by preflight, in seconds, before any stage
    "prompt longer than the context": (small(**{'prompt = "def __init__(self"':
                                                'prompt = "' + "def f(x): return x + 1\\n" * 24
                                                + '"'}),
                                       "shorten the prompt or raise export.context_length"),
    "generation past the context": (small(**{"max_new_tokens = 8": "max_new_tokens = 60"}),
                                    "run.max_new_tokens = 60 does not fit"),
    "override that matches nothing": (small(**{'calibration_samples = 2':
                                               'calibration_samples = 2\n[quantization.overrides]'
                                               '\n"decoder.block.*" = "INT16"'}),
                                      "'decoder.block.*' match(es) no layer"),
    "unknown weight rounding": (small(**{"calibration_samples = 2": "calibration_samples = 2\n"
                                         'weight_rounding = "awq"'}),
                                "quantization.weight_rounding = 'awq' is not one of nearest"),
    "weight rounding on per-tensor weights": (
        small(**{'weight_granularity = "per_channel"': 'weight_granularity = "per_tensor"\n'
                 'weight_rounding = "seqmse"'}),
        "weight_rounding seqmse works on per-channel weights"),
    # values of the wrong element type or out of any sensible range: refused by the typed
    # settings when the file is read, not by a traceback later
    "a device that is a list": (small(**{"max_new_tokens = 8": 'max_new_tokens = 8\n'
                                         'devices = [["cpu"]]'}),
                                "run.devices[0] must be a str, not list ['cpu']"),
    "a device that is a table": (small(**{"max_new_tokens = 8": 'max_new_tokens = 8\n'
                                          'devices = [{a = 1}]'}),
                                 "run.devices[0] must be a str, not dict {'a': 1}"),
    "an absurd token count": (small(**{"heldout_tokens = 96": "heldout_tokens = "
                                       "9223372036854775807"}),
                              "validation.heldout_tokens = 9223372036854775807 is more than"),
    "a gate that is not a number": (small(**{"max_perplexity_increase = 0.05":
                                             "max_perplexity_increase = nan"}),
                                    "gates.max_perplexity_increase must be a finite number"),
    "a sweep's best that is a list": (small() + '\n[[sweeps]]\nname = "s"\nbest = []\n'
                                      '[sweeps.axes]\n"quantization.scheme" = ["W8A8"]\n',
                                      "best = [] is not one of"),
    # 30**7 points: counted from the axes' lengths, refused before any is made
    "a sweep grid too large to expand": (
        small() + '\n[[sweeps]]\nname = "huge"\n[sweeps.axes]\n' + "".join(
            f'"{key}" = {list(range(16, 46))}\n' for key in (
                "validation.heldout_tokens", "sensitivity.heldout_tokens", "waterfall.new_tokens",
                "bundle.new_tokens", "graph.repeats", "graph.seq_len", "pruning.drop_blocks")),
        "has 21870000000 points; at most 256"),
}


# the preflight cases load the sample model (several seconds each): the slow tier
PREFLIGHT = ("prompt longer than the context", "generation past the context",
             "override that matches nothing")


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in PREFLIGHT
                                  else c for c in CASES])
def test_bad_project_file(tmp_path, case):
    text, needle = CASES[case]
    f = write(tmp_path, text)
    before = snapshot(tmp_path)
    r = studio("--batch", f)
    assert_clean_failure(r, needle, tmp_path, before)


def test_folder_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "empty-model").mkdir()
    f = write(tmp_path, small(**{'"sample:tiny-coder"': '"empty-model"'}))
    before = snapshot(tmp_path)
    assert_clean_failure(studio("--batch", f), "config.json", tmp_path, before)


def test_unsupported_architecture(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                               n_positions=64)).save_pretrained(tmp_path / "gpt2")
    f = write(tmp_path, small(**{'"sample:tiny-coder"': '"gpt2"'}))
    before = snapshot(tmp_path)
    assert_clean_failure(studio("--batch", f), "GPT2", tmp_path, before)


def test_corrupt_onnx_source(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07garbage that is not a protobuf" * 10)
    f = write(tmp_path, small(**{'"sample:tiny-coder"': '"model.onnx"'}))
    before = snapshot(tmp_path)
    assert_clean_failure(studio("--batch", f), "not a valid ONNX model", tmp_path, before)


def test_empty_calibration_file(tmp_path):
    (tmp_path / "calib.txt").write_text("  \n")
    f = write(tmp_path, small(**{"calibration_samples = 2": 'calibration_samples = 2\ncalibration_text = "calib.txt"'}))
    before = snapshot(tmp_path)
    assert_clean_failure(studio("--batch", f), "is empty", tmp_path, before)


def test_unwritable_project_folder(tmp_path):
    f = write(tmp_path, small())
    (tmp_path / "p.studio").write_text("a file where the project folder should be")
    before = snapshot(tmp_path)
    assert_clean_failure(studio("--batch", f), "cannot", tmp_path, before)


def test_unknown_stage(tmp_path):
    f = write(tmp_path, small())
    before = snapshot(tmp_path)
    assert_clean_failure(studio("--batch", f, "--stages", "export,deploy"), "unknown stage 'deploy'",
                         tmp_path, before)


def test_target_not_in_project(tmp_path):
    f = write(tmp_path, small())
    before = snapshot(tmp_path)
    assert_clean_failure(studio("--batch", f, "--target", "nope"), "not one of the project's targets",
                         tmp_path, before)


def test_missing_project_file(tmp_path):
    assert_clean_failure(studio("--batch", tmp_path / "nope.qstudio"), "does not exist", tmp_path, {})


def test_new_refuses_to_overwrite(tmp_path):
    f = write(tmp_path, "keep me")
    before = snapshot(tmp_path)
    assert_clean_failure(studio("new", f, "--sample", "tiny-coder"), "already exists", tmp_path, before)


def test_new_with_unknown_sample(tmp_path):
    assert_clean_failure(studio("new", tmp_path / "x.qstudio", "--sample", "nope"), "nope", tmp_path, {})
    assert not (tmp_path / "x.qstudio").exists()


def test_new_then_info(tmp_path):
    r = studio("new", tmp_path / "x.qstudio", "--sample", "tiny-coder")
    assert r.returncode == 0, r.stderr
    r = studio("info", tmp_path / "x.qstudio")
    assert r.returncode == 0 and "tiny-coder" in r.stdout


def test_no_command_given(tmp_path):
    assert_clean_failure(studio("--json"), "nothing to do", tmp_path, {})


def test_a_second_run_on_the_same_project_is_refused(tmp_path):
    import subprocess
    import sys

    f = write(tmp_path, small())
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from studio.core.fsutil import RunLock\n"
         f"RunLock({str(tmp_path / 'p.studio')!r}).acquire()\n"
         "print('locked', flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = snapshot(tmp_path)
        assert_clean_failure(studio("--batch", f), "another pipeline run", tmp_path, before)
    finally:
        holder.kill()
        holder.wait()


def test_new_from_a_checkpoint_folder(tmp_path):
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    from studio.core.samples import sample_path

    LlamaForCausalLM(LlamaConfig(vocab_size=2048, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1)).save_pretrained(tmp_path / "llama")
    # a checkpoint comes with its tokenizer (here the sample's, 2048 tokens)
    shutil.copy(sample_path("tiny-coder") / "tokenizer.json", tmp_path / "llama")
    r = studio("new", tmp_path / "l.qstudio", "--checkpoint", tmp_path / "llama",
               "--target", "snapdragon-8-elite", "--scheme", "W8A8")
    assert r.returncode == 0, r.stderr
    r = studio("info", tmp_path / "l.qstudio", "--json")
    import json

    data = json.loads(r.stdout)
    assert data["targets"] == ["snapdragon-8-elite"]
    assert data["quantization"]["scheme"] == "W8A8"


def test_new_from_a_folder_that_is_not_a_checkpoint_writes_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    r = studio("new", tmp_path / "x.qstudio", "--checkpoint", tmp_path / "empty")
    assert_clean_failure(r, "config.json", tmp_path, {})
    assert not (tmp_path / "x.qstudio").exists()


# ---- studio compare ------------------------------------------------------------------------
def _history(tmp_path: Path, runs: int) -> Path:
    """A project file with ``runs`` recorded runs with results in its real run history."""
    from studio.core import project as projectfile
    from studio.core.jobs import JobStore
    from studio.core.metrics import Metric
    from tests.cli.conftest import record_run

    f = write(tmp_path, small())
    settings = projectfile.load(f).to_dict()
    store = JobStore(tmp_path / "p.studio" / "runs.sqlite")
    for i in range(runs):
        record_run(store, settings, [Metric("top1_agreement", 0.9 + i / 100, "fraction",
                                            "simulated", "htp-sim", default_target())])
    store.close()
    return f


def test_compare_a_missing_project(tmp_path):
    assert_clean_failure(studio("compare", tmp_path / "nope.qstudio"), "does not exist",
                         tmp_path, {})


def test_compare_a_project_that_never_ran(tmp_path):
    f = write(tmp_path, small())
    before = snapshot(tmp_path)
    assert_clean_failure(studio("compare", f), "has no runs yet", tmp_path, before)
    assert not (tmp_path / "p.studio").exists()  # reading the history creates nothing


@pytest.mark.parametrize("runs", [0, 1])
def test_compare_needs_two_runs_with_results(tmp_path, runs):
    f = _history(tmp_path, runs)
    before = snapshot(tmp_path)
    assert_clean_failure(studio("compare", f), f"has {runs} run(s) with results", tmp_path,
                         before)


@pytest.mark.parametrize("ids, needle", [
    (("1", "7"), "run 7 is not in this project's history"),
    (("9",), "run 9 is not in this project's history"),
    (("two",), "invalid int value: 'two'"),
    (("1", "1"), "run 1 was given twice"),
    (("2",), "run 2 is the newest run with results"),
])
def test_compare_bad_run_ids(tmp_path, ids, needle):
    f = _history(tmp_path, 2)
    before = snapshot(tmp_path)
    assert_clean_failure(studio("compare", f, *ids), needle, tmp_path, before)


def test_stages_option_without_a_name(tmp_path):
    f = write(tmp_path, small())
    before = snapshot(tmp_path)
    assert_clean_failure(studio("--batch", f, "--stages", ",,"), "no stages given", tmp_path,
                         before)


def test_the_libraries_it_loads_write_nothing_in_the_home(tmp_path):
    """ONNX Runtime opens a telemetry store in the user's home as it is imported
    (``~/.cache/Microsoft/DeveloperTools/.onnxruntime/onnxruntime.db``): every entry point
    turns it off first (studio.core.thirdparty), so a command that loads it leaves the home as
    it was, whatever its outcome. ``studio doctor`` loads it to check the QNN backend."""
    import os
    import subprocess
    import sys

    from studio.core import thirdparty
    from tests.cli.conftest import ROOT

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("XDG_") and k not in thirdparty.DEFAULTS}
    env.update(HOME=str(home), QSTUDIO_CONFIG_DIR=str(tmp_path / "config"))
    code = ("import sys; from studio.cli.main import main; rc = main(sys.argv[1:]); "
            "assert 'onnxruntime' in sys.modules; sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, "doctor"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == []
