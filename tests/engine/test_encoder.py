"""The MiniLM encoder workflow on the real shipped model: embed, cosine, ONNX export."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.errors import StudioError
from studio.core.progress import RecordingProgress
from studio.engine import encoder as enc

GUITAR = "A man is playing a guitar."
GUITAR_2 = "Someone is strumming an acoustic guitar on stage."
STOCKS = "Stock markets fell sharply after the interest rate decision."
PASTA = "Boil the pasta in salted water for nine minutes."


@pytest.fixture(scope="module")
def encoder():
    return enc.load_encoder()


def test_pooling_as_sentence_transformers_declares(encoder):
    assert encoder.pooling == enc.PoolingConfig(mode="mean", normalize=True, max_seq_length=256)
    assert encoder.dim == 384


def test_embeddings_are_unit_vectors(encoder):
    e = encoder.embed([GUITAR, STOCKS, PASTA])
    assert e.shape == (3, 384) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert encoder.embed([]).shape == (0, 384)
    np.testing.assert_allclose(encoder.embed(GUITAR)[0], e[0], atol=1e-5)  # batch-independent


def test_similar_sentences_are_closer_than_unrelated_ones(encoder):
    a, b, c, d = encoder.embed([GUITAR, GUITAR_2, STOCKS, PASTA])
    similar = enc.embedding_cosine(a, b)
    assert similar > 0.5
    assert similar > enc.embedding_cosine(a, c) + 0.3
    assert similar > enc.embedding_cosine(a, d) + 0.3


def test_matches_sentence_transformers(encoder):
    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(str(encoder.path), device="cpu", local_files_only=True)
    texts = [GUITAR, STOCKS, "def f(x):\n    return x * 2"]
    cos = enc.embedding_cosine(ref.encode(texts), encoder.embed(texts))
    assert cos.shape == (3,)
    assert cos.min() > 0.9999


def test_embedding_cosine():
    assert enc.embedding_cosine(np.array([1.0, 0.0]), np.array([0.0, 2.0])) == 0.0
    assert enc.embedding_cosine(np.array([3.0, 4.0]), np.array([6.0, 8.0])) == pytest.approx(1.0)
    rows = enc.embedding_cosine(np.eye(3), np.array([[1.0, 0, 0], [0, -1.0, 0], [0, 1.0, 1.0]]))
    np.testing.assert_allclose(rows, [1.0, -1.0, np.sqrt(0.5)])
    with pytest.raises(StudioError, match="shapes"):
        enc.embedding_cosine(np.ones(3), np.ones(4))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("minilm") / "minilm.onnx"
    progress = RecordingProgress()
    texts = [GUITAR, STOCKS, "word " * 100]  # the last one is longer than the fixed shape
    result = enc.run({"out": str(out), "seq_len": 32, "texts": texts}, progress)
    return out, result, progress


def test_onnx_export_matches_torch(exported):
    import onnx

    out, result, progress = exported
    assert result["passed"] is True
    assert result["min_cosine"] >= enc.ONNX_COSINE_MIN == 0.999
    assert len(result["cosines"]) == 3
    model = onnx.load(str(out), load_external_data=False)
    assert model.opset_import[0].version == 17
    shapes = {
        i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input
    }
    assert shapes == {"input_ids": [1, 32], "attention_mask": [1, 32]}
    assert [o.name for o in model.graph.output] == ["sentence_embedding"]
    assert progress.updates[-1][0] == 1.0
    assert any("legacy TorchScript" in line for line in progress.lines)  # logged, not raised


def test_onnx_keeps_the_padding_mask_and_the_metric(encoder, exported):
    out, _, _ = exported
    texts = [GUITAR, GUITAR_2, STOCKS, "hi"]  # different amounts of padding at [1, 32]
    got = enc.onnx_embed(out, encoder, texts)
    assert got.shape == (4, 384)
    assert enc.embedding_cosine(encoder.embed(texts), got).min() > 0.999
    assert enc.embedding_cosine(got[0], got[1]) > enc.embedding_cosine(got[0], got[2]) + 0.3


def test_bad_inputs(encoder, tmp_path):
    with pytest.raises(StudioError, match="sequence length must be between 2 and 256"):
        enc.export_onnx(encoder, tmp_path / "x.onnx", seq_len=1024)
    with pytest.raises(StudioError, match="not a sentence-encoder folder"):
        enc.load_encoder(tmp_path)


def test_the_ranking_check_on_the_shipped_set(encoder):
    s = enc.load_similarity_set()
    queries = [q["text"] for q in s["queries"]]
    docs, qs = encoder.embed(s["documents"]), encoder.embed(queries)
    rel = [q["relevant"] for q in s["queries"]]
    same = enc.ranking_check(docs, qs, docs, qs, rel)
    assert same["top1_agreement"] == 1.0 and same["mean_kendall_tau"] == 1.0
    assert same["recall_at_1_reference"] == 1.0  # MiniLM finds every relevant document
    rng = np.random.RandomState(0)
    noisy = enc.ranking_check(docs, qs, docs, qs + rng.randn(*qs.shape) * 0.3, rel)
    assert noisy["mean_kendall_tau"] < 0.9 and noisy["queries"] == len(rel)


# MiniLM W8A16 on the HTP simulator with the retrieval check: the encoder project's pipeline
# (tests/cli/test_graph_projects.py) takes it from the PyTorch weights to the ranking.
