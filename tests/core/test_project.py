from pathlib import Path

import pytest

from studio.core import project as pf
from studio.core.errors import StudioError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/tiny-coder/tiny-coder.qstudio"


def test_example_project_loads_and_round_trips(tmp_path):
    p = pf.load(EXAMPLE)
    assert p.name == "tiny-coder"
    assert (p.export.prompt_length, p.export.context_length, p.export.parts) == (32, 128, 1)
    out = tmp_path / "copy.qstudio"
    pf.save(p, out)
    q = pf.load(out)
    assert q.to_dict() == p.to_dict()
    assert q.folder == out.with_suffix(".studio").resolve()


def test_defaults_fill_missing_sections(tmp_path):
    f = tmp_path / "a.qstudio"
    f.write_text('schema_version = 1\nname = "a"\n[model]\nsource = "sample:tiny-coder"\n')
    p = pf.load(f)
    assert p.quantization["scheme"] == "W8A16"
    assert p.pipeline["stages"][0] == "export"
    assert p.targets


@pytest.mark.parametrize(
    "text, needle",
    [
        ("schema_version = 1\nname = [", "not valid TOML"),
        ('schema_version = 1\nbogus = 1\n[model]\nsource="x"', "unknown key 'bogus'"),
        ('schema_version = 1\n[model]\nsource="x"\n[export]\nprompt_len = 3', "unknown key 'prompt_len' in [export]"),
        ('schema_version = 99\n[model]\nsource="x"', "newer QStudio"),
        ('[model]\nsource="x"', "schema_version is missing"),
        ('schema_version = 1\n[model]\nsource="x"\n[export]\nprompt_length = "32"', "export.prompt_length must be a int"),
        ('schema_version = 1\n[model]\nsource="x"\n[export]\nprompt_length = 64\ncontext_length = 32', "must be larger than"),
        ('schema_version = 1\n[model]\nsource="x"\n[quantization]\nscheme = "W3A3"', "not one of"),
        ('schema_version = 1\n[model]\nsource="x"\n[quantization.overrides]\n"lm_head" = "INT3"', "INT3"),
        ('schema_version = 1\ntargets = ["no-such-chip"]\n[model]\nsource="x"', "no-such-chip"),
        ('schema_version = 1\n[model]\nsource="x"\n[run]\ndevices = ["gpu"]', "unknown device 'gpu'"),
        ('schema_version = 1\n[model]\nsource="x"\n[pipeline]\nstages = ["deploy"]', "unknown stage 'deploy'"),
        ('schema_version = 1\n[model]\n', "needs the key 'source'"),
        # the typed settings: element types, ranges, finite numbers, closed choices
        ('schema_version = 1\n[model]\nsource="x"\n[run]\ndevices = [["cpu"]]',
         "run.devices[0] must be a str, not list ['cpu']"),
        ('schema_version = 1\n[model]\nsource="x"\n[run]\ndevices = [{a=1}]',
         "run.devices[0] must be a str, not dict {'a': 1}"),
        ('schema_version = 1\n[model]\nsource="x"\n[pipeline]\nstages = ["export", 3]',
         "pipeline.stages[1] must be a str, not int 3"),
        ('schema_version = 1\n[model]\nsource="x"\n[quantization.overrides]\nlm_head = 16',
         "quantization.overrides['lm_head'] must be a str, not int 16"),
        ('schema_version = 1\n[model]\nsource="x"\n[graph.shapes]\nx = [1, "a"]',
         "graph.shapes['x'][1] must be a int, not str 'a'"),
        ('schema_version = 1\n[model]\nsource="x"\n[export]\nprompt_length = -3',
         "export.prompt_length must be between 1 and 4096, not -3"),
        ('schema_version = 1\n[model]\nsource="x"\n[export]\ncontext_length = 100000',
         "export.context_length must be between 2 and 4096, not 100000"),
        ('schema_version = 1\n[model]\nsource="x"\n[validation]\n'
         'heldout_tokens = 9223372036854775807',
         "validation.heldout_tokens = 9223372036854775807 is more than this studio takes"),
        ('schema_version = 1\n[model]\nsource="x"\n[sensitivity]\n'
         'heldout_tokens = 9223372036854775807', "sensitivity.heldout_tokens = 92233"),
        ('schema_version = 1\n[model]\nsource="x"\n[pruning]\n'
         'drop_blocks = 9223372036854775807', "pruning.drop_blocks = 92233"),
        ('schema_version = 1\n[model]\nsource="x"\n[pruning]\ndrop_blocks = 0',
         "pruning.drop_blocks must be at least 1, not 0 (the blocks"),
        ('schema_version = 1\n[model]\nsource="x"\n[bundle]\nmax_context_mb = '
         '9223372036854775807', "bundle.max_context_mb = 92233"),
        ('schema_version = 1\n[model]\nsource="x"\n[bundle]\nprompts = 0',
         "bundle.prompts must be between 1 and 8, not 0"),
        ('schema_version = 1\n[model]\nsource="x"\n[waterfall]\nnew_tokens = 9223372036854775807',
         "waterfall.new_tokens = 92233"),
        ('schema_version = 1\n[model]\nsource="x"\n[waterfall]\nk = 17',
         "waterfall.k must be between 1 and 16, not 17"),
        ('schema_version = 1\n[model]\nsource="x"\n[profile]\nrepeats = -1',
         "profile.repeats must be between 1 and 50, not -1"),
        ('schema_version = 1\n[model]\nsource="x"\n[graph]\nrepeats = 1000000',
         "graph.repeats must be between 1 and 1000, not 1000000"),
        ('schema_version = 1\n[model]\nsource="x"\n[quantization]\ncalibration_samples = '
         '9223372036854775807', "quantization.calibration_samples = 92233"),
        ('schema_version = 1\n[model]\nsource="x"\n[gates]\nmax_perplexity_increase = nan',
         "gates.max_perplexity_increase must be a finite number, not nan"),
        ('schema_version = 1\n[model]\nsource="x"\n[gates]\nmax_perplexity_increase = -1',
         "gates.max_perplexity_increase must be 0 or more, not -1"),
        ('schema_version = 1\n[model]\nsource="x"\n[gates]\nmin_top1_agreement = inf',
         "gates.min_top1_agreement must be a finite number"),
        ('schema_version = 1\n[model]\nsource="x"\n[autoprecision]\n'
         'max_perplexity_change = nan', "autoprecision.max_perplexity_change must be a finite"),
        ('schema_version = 1\n[model]\nsource="x"\n[autoprecision]\n'
         'max_perplexity_change = inf', "autoprecision.max_perplexity_change must be a finite"),
        ('schema_version = 1\n[model]\nsource="x"\n[quantization]\nblock_size = 48',
         "quantization.block_size = 48 is not one of 16, 32, 64, 128"),
        ('schema_version = 1\n[model]\nsource="x"\nkind = "rnn"',
         "model.kind = 'rnn' is not one of causal-lm, encoder, onnx-graph"),
        ('schema_version = 1\n[model]\nsource="x"\n[[sweeps]]\nname = "s"\nbest = []\n'
         '[sweeps.axes]\n"quantization.scheme" = ["W8A8"]', "best = [] is not one of"),
    ],
)
def test_bad_project_files_give_one_clear_line(tmp_path, text, needle):
    f = tmp_path / "bad.qstudio"
    f.write_text(text)
    with pytest.raises(StudioError) as exc:
        pf.load(f)
    msg = str(exc.value)
    assert needle in msg
    assert "\n" not in msg
    assert f.read_text() == text  # loading never rewrites the file


def test_migration_from_schema_0(tmp_path):
    f = tmp_path / "old.qstudio"
    f.write_text('schema_version = 0\n[model]\nsource = "sample:tiny-coder"\n'
                 "[export]\nprompt_len = 16\ncontext_len = 64\n")
    p = pf.load(f)
    assert (p.export.prompt_length, p.export.context_length, p.export.parts) == (16, 64, 1)
    pf.save(p)
    assert "schema_version = 1" in f.read_text()


def test_save_is_atomic_and_keeps_old_file_on_failure(tmp_path, monkeypatch):
    p = pf.load(EXAMPLE)
    out = tmp_path / "p.qstudio"
    pf.save(p, out)
    before = out.read_bytes()
    import studio.core.fsutil as fs

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(fs.os, "fsync", boom)
    p.name = "changed"
    with pytest.raises(OSError):
        pf.save(p, out)
    assert out.read_bytes() == before
    assert [x.name for x in tmp_path.iterdir()] == ["p.qstudio"]  # no temp file left


def test_unwritable_folder_is_a_clear_error(tmp_path):
    import os

    if os.geteuid() == 0:
        # root ignores permission bits: use a path under a regular file instead
        blocker = tmp_path / "file"
        blocker.write_text("x")
        target = blocker / "p.qstudio"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "p.qstudio"
    p = pf.load(EXAMPLE)
    with pytest.raises(StudioError, match="cannot write"):
        pf.save(p, target)
