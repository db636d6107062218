from pathlib import Path

import pytest

from studio.core import project as pf
from studio.core.errors import StudioError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/tiny-coder/tiny-coder.qstudio"


def test_example_project_loads_and_round_trips(tmp_path):
    p = pf.load(EXAMPLE)
    assert p.name == "tiny-coder"
    assert p.export == {"prompt_length": 32, "context_length": 128}
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
    assert p.export == {"prompt_length": 16, "context_length": 64}
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
