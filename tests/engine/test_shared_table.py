"""One token table for the target and its draft: the verdict from the two models' numbers
(the sample pair, a Qwen2.5-3B + Qwen2-0.5B pair from their configs), and the runtime that
really shares it — the shipped draft's graphs rewritten to take the target's table as an
input, ONNX Runtime reading that one array (no copy), greedy speculative decoding still
plain greedy's."""

import numpy as np
import pytest

from studio.core.archs import load_config
from studio.core.drafttable import config_share, table_share
from studio.core.errors import StudioError


def test_the_verdict_from_numbers():
    same = table_share(2048, 256, 2048, 256, True, True)
    assert same.shareable and same.values == "equal"
    assert same.saved_bytes == same.table_bytes == 2048 * 256 * 4
    assert "values equal" in same.why and "2.0 MiB saved" in same.line()
    drift = table_share(2048, 256, 2048, 256, True, False, 0.115)
    assert not drift.shareable and drift.saved_bytes == 0 and drift.values == "differ"
    assert "0.115" in drift.why and "model.draft_embedding" in drift.why
    declared = table_share(2048, 256, 2048, 256, True, False, 0.115, mode="target")
    assert declared.shareable and declared.values == "declared"
    assert not table_share(2048, 256, 2048, 256, True, True, mode="own").shareable
    vocab = table_share(32000, 256, 2048, 256, True, None)
    assert not vocab.shareable and "vocabularies differ" in vocab.why
    with pytest.raises(ValueError, match="draft_embedding"):
        table_share(1, 1, 1, 1, True, True, mode="shared")


def test_qwen25_3b_and_qwen2_05b_do_not_share_their_table():
    """Their vocabularies match (151936), their widths do not (2048 against 896): the draft's
    blocks read vectors of its own width, so it keeps its table: 0 bytes saved."""
    share = config_share(load_config("qwen2.5-3b")[0], load_config("qwen2-0.5b")[0])
    assert not share.shareable and share.saved_bytes == 0 and share.source == "estimated"
    assert (share.target_vocab, share.target_width) == (151936, 2048)
    assert (share.draft_vocab, share.draft_width) == (151936, 896)
    assert "widths differ" in share.why and "2048" in share.why and "896" in share.why
    assert share.table_bytes == 151936 * 896 * 4  # what the draft keeps on the host
    print(f"\n{share.line()}")
    with pytest.raises(StudioError, match="hidden_size"):
        config_share({"vocab_size": 10}, {"vocab_size": 10, "hidden_size": 8})


def test_the_sample_pair_shares_one_table(sample_model_dir):
    """The shipped draft was distilled with the target's table frozen: equal, byte for
    byte."""
    from studio.engine.shared_table import checkpoint_share, compare_tables

    draft = sample_model_dir.parent / "tiny-coder-draft"
    assert compare_tables(sample_model_dir, draft) == (True, None)
    share = checkpoint_share(sample_model_dir, draft)
    assert share.shareable and share.values == "equal" and share.draft_tied
    assert share.saved_bytes == 2048 * 256 * 4
    assert not checkpoint_share(sample_model_dir, draft, "own").shareable


def test_a_drifted_table_is_not_shared(sample_model_dir, tmp_path):
    """A copy of the draft whose table moved (as the first shipped draft's did): not shared,
    with the largest difference named."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from studio.engine.shared_table import checkpoint_share

    draft = tmp_path / "drifted"
    shutil.copytree(sample_model_dir.parent / "tiny-coder-draft", draft)
    weights = load_file(str(draft / "model.safetensors"))
    weights["model.embed_tokens.weight"][7, 3] += 0.125
    save_file(weights, str(draft / "model.safetensors"))
    share = checkpoint_share(sample_model_dir, draft)
    assert not share.shareable and share.values == "differ"
    assert share.max_abs_diff == pytest.approx(0.125, abs=1e-6)
    assert checkpoint_share(sample_model_dir, draft, "target").shareable  # declared


# ---- the runtime -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shared(tiny_coder_graphs, tiny_coder_draft_graphs, tmp_path_factory):
    """The draft's graphs rewritten to read the token table as an input, and the target's
    table (one array)."""
    from studio.engine.shared_table import shared_draft_graphs, target_table

    out = tmp_path_factory.mktemp("draft-shared") / "graphs"
    done = shared_draft_graphs(tiny_coder_draft_graphs[0], out)
    return out, done, target_table(tiny_coder_graphs[0])


@pytest.mark.slow
def test_the_draft_holds_no_table_and_reads_the_targets(shared, tiny_coder_draft_graphs):
    import onnx

    from studio.engine.llm_runtime import cpu_generator, load_graph_spec
    from studio.engine.shared_table import TABLE, shared_draft_graphs, target_table

    out, done, table = shared
    assert done["head"] == "the table (tied)"
    assert set(done["graphs"]) == {"prefill", "decode"}
    # per graph: the table and the tied head's transposed copy, 2 MiB each
    assert done["graph_bytes_dropped"] == 2 * 2 * 2048 * 256 * 4
    for g in ("prefill", "decode"):
        m = onnx.load(str(out / f"{g}.onnx"))
        big = [i.name for i in m.graph.initializer if 2048 in i.dims]
        assert big == [], big  # no [V, H] table, no [H, V] head
        assert TABLE in [i.name for i in m.graph.input]
    assert shared_draft_graphs(tiny_coder_draft_graphs[0], out) == done  # made once
    assert target_table(tiny_coder_draft_graphs[0]) is not table  # one array per file
    # ONNX Runtime reads the array it is fed, not a copy: a row changed in place changes
    # the draft's logits for that token
    own = np.array(table)  # a writable array with the same values
    gen = cpu_generator(out, load_graph_spec(out), fixed_feeds={TABLE: own})
    before = gen.prefill([5, 9, 33])[-1]
    own[33] *= -1.0
    after = gen.prefill([5, 9, 33])[-1]
    assert np.abs(after - before).max() > 1e-2
    own[33] *= -1.0
    assert np.abs(gen.prefill([5, 9, 33])[-1] - before).max() == 0.0


@pytest.mark.slow
def test_greedy_speculative_with_the_shared_table_is_plain_greedy(
        shared, tiny_coder_graphs, tiny_coder_draft_graphs, sample_model_dir, sample_data_dir):
    """The draft reading the target's table drafts what it drafted with its own (equal
    values): the same acceptance, and greedy output stays plain greedy's."""
    from transformers import AutoTokenizer

    from studio.engine.llm_runtime import StaticKVGenerator, cpu_generator, load_graph_spec
    from studio.engine.shared_table import TABLE
    from studio.engine.speculative import DraftModelProposer, speculative_generate

    out, _done, table = shared
    target = cpu_generator(*tiny_coder_graphs)
    own = cpu_generator(*tiny_coder_draft_graphs)
    reads = cpu_generator(out, load_graph_spec(out), fixed_feeds={TABLE: table})
    assert isinstance(reads, StaticKVGenerator) and reads.fixed_feeds[TABLE] is table
    tok = AutoTokenizer.from_pretrained(str(sample_model_dir))
    ids = tok((sample_data_dir / "heldout.py.txt").read_text()).input_ids
    rates = []
    for s in (200, 1500, 4000):
        prompt = ids[s:s + 24]
        plain = target.generate(prompt, 64)["tokens"]
        got = {}
        for name, draft in (("own", own), ("shared", reads)):
            res = speculative_generate(target, DraftModelProposer(draft), prompt, 64, k=4)
            assert res["tokens"] == plain, name
            got[name] = res["speculative"]
        assert got["shared"]["accepted_tokens"] == got["own"]["accepted_tokens"]
        rates.append(got["shared"]["tokens_per_target_pass"])
    assert min(rates) > 1.0
    print(f"\ntokens per target pass with the shared table: {[round(r, 2) for r in rates]}")
