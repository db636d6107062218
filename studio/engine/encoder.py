"""Sentence-encoder workflow (the MiniLM sample): embed, compare, export to ONNX, check.

The encoder is a Hugging Face model folder laid out by sentence-transformers
(``modules.json``, ``1_Pooling/config.json``, ``sentence_bert_config.json``). The pooling
and normalisation it declares are applied here with plain torch, so the same module runs
in :meth:`Encoder.embed` and in the exported ONNX graph. Accuracy metric: cosine
similarity of embeddings.

Heavy libraries (torch, transformers, onnxruntime) are imported inside functions.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.core.progress import NullProgress, Progress
from studio.core.samples import read_data, sample_path
from studio.core.units import format_bytes

ort = lazy_module("onnxruntime")
if TYPE_CHECKING:  # a checker reads the module itself
    import torch
else:
    torch = lazy_module("torch")
transformers = lazy_module("transformers")

#: Minimum cosine between ONNX Runtime and torch embeddings for an export to pass.
ONNX_COSINE_MIN = 0.999
OPSET = 17
DEFAULT_SEQ_LEN = 128

#: Sentences used to check an export when the caller gives none.
CHECK_TEXTS = (
    "A man is playing a guitar on the stage.",
    "The quarterly report shows revenue grew by twelve percent.",
    "def read_file(path): return open(path).read()",
    "Snapdragon NPUs run quantized transformer models efficiently.",
    "hi",
)

_POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len")


@dataclass
class PoolingConfig:
    mode: str = "mean"
    normalize: bool = True
    max_seq_length: int = 256


def read_pooling_config(path: Path) -> PoolingConfig:
    """Pooling, normalisation and length limit as the sentence-transformers files declare."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():  # a plain HF encoder: mean pooling, no normalisation
        return PoolingConfig(mode="mean", normalize=False, max_seq_length=_max_len(path, 512))
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
    except ValueError:
        raise StudioError(f"{modules_file} is not valid JSON") from None
    mode, normalize = "mean", False
    for mod in modules:
        kind = str(mod.get("type", ""))
        if kind.endswith(".Pooling"):
            cfg_file = path / mod.get("path", "") / "config.json"
            cfg = json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
            chosen = [
                m
                for m in _POOLING_MODES
                if cfg.get(f"pooling_mode_{m}_token")
                or cfg.get(f"pooling_mode_{m}_tokens")
                or cfg.get("pooling_mode") == m
            ]
            if len(chosen) > 1:
                raise StudioError(f"{cfg_file}: combined pooling modes {chosen} are not supported")
            mode = chosen[0] if chosen else "mean"
        elif kind.endswith(".Normalize"):
            normalize = True
    return PoolingConfig(mode=mode, normalize=normalize, max_seq_length=_max_len(path, 256))


def _max_len(path: Path, default: int) -> int:
    f = path / "sentence_bert_config.json"
    if f.is_file():
        try:
            return int(json.loads(f.read_text(encoding="utf-8")).get("max_seq_length", default))
        except (ValueError, TypeError):
            pass
    return default


def _pooled_module(model: Any, pooling: PoolingConfig) -> Any:
    """A torch module (input_ids, attention_mask) -> sentence embedding [batch, dim]."""
    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
            if getattr(self.model.config, "type_vocab_size", 0):
                kwargs["token_type_ids"] = torch.zeros_like(input_ids)
            hidden = self.model(**kwargs).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            if pooling.mode == "cls":
                emb = hidden[:, 0]
            elif pooling.mode == "max":
                emb = hidden.masked_fill(mask == 0, -1e9).max(dim=1).values
            else:
                total = (hidden * mask).sum(dim=1)
                count = mask.sum(dim=1).clamp(min=1e-9)
                emb = total / (count if pooling.mode == "mean" else count.sqrt())
            if pooling.normalize:
                emb = torch.nn.functional.normalize(emb, p=2, dim=-1)
            return emb

    return Pooled().eval()


@dataclass
class Encoder:
    """A loaded sentence encoder (tokenizer, torch model, pooling)."""

    path: Path
    tokenizer: Any
    model: Any
    pooling: PoolingConfig
    module: Any = field(repr=False)

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def tokenize(self, texts: list[str] | tuple[str, ...], seq_len: int | None = None):
        """Token ids and mask as int64 numpy arrays; padded to ``seq_len`` when given."""
        max_length = seq_len or self.pooling.max_seq_length
        enc = self.tokenizer(
            list(texts),
            padding="max_length" if seq_len else True,
            truncation=True,
            max_length=max_length,
            return_tensors="np",
        )
        return {
            "input_ids": enc["input_ids"].astype(np.int64),
            "attention_mask": enc["attention_mask"].astype(np.int64),
        }

    def embed(
        self,
        texts: list[str] | tuple[str, ...] | str,
        batch_size: int = 32,
        max_length: int | None = None,
    ) -> np.ndarray:
        """Sentence embeddings, float32 ``[len(texts), dim]`` (unit length when normalised)."""
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        limit = min(max_length or self.pooling.max_seq_length, self.pooling.max_seq_length)
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                enc = self.tokenizer(
                    texts[i : i + batch_size],
                    padding=True,
                    truncation=True,
                    max_length=limit,
                    return_tensors="pt",
                )
                emb = self.module(enc["input_ids"], enc["attention_mask"])
                out.append(emb.float().numpy())
        return np.concatenate(out, axis=0)


def load_encoder(path: str | Path | None = None) -> Encoder:
    """Load a sentence encoder folder offline (default: the ``minilm`` sample)."""
    if path is None:
        path = sample_path("minilm")
    path = Path(path)
    if not (path / "config.json").is_file():
        raise StudioError(
            f"{path} is not a sentence-encoder folder: expected config.json, tokenizer files "
            "and model weights (and modules.json / 1_Pooling from sentence-transformers)"
        )

    pooling = read_pooling_config(path)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        # Eager attention: a plain MatMul/Softmax graph on export, no data-dependent
        # SDPA branches frozen by the tracer.
        model = transformers.AutoModel.from_pretrained(
            path, local_files_only=True, attn_implementation="eager"
        ).eval()
    except (OSError, ValueError) as exc:
        raise StudioError(f"cannot load the encoder in {path}: {exc}") from None
    return Encoder(path, tokenizer, model, pooling, _pooled_module(model, pooling))


def embedding_cosine(a: np.ndarray, b: np.ndarray) -> float | np.ndarray:
    """Cosine similarity: a float for two vectors, one value per row for two matrices."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise StudioError(f"cannot compare embeddings of shapes {a.shape} and {b.shape}")
    num = (a * b).sum(axis=-1)
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    cos = num / np.maximum(den, 1e-12)
    return float(cos) if cos.ndim == 0 else cos


# -- ONNX ----------------------------------------------------------------------------------


def export_onnx(
    encoder: Encoder,
    out_path: str | Path,
    seq_len: int = DEFAULT_SEQ_LEN,
    opset: int = OPSET,
    progress: Progress | None = None,
) -> Path:
    """Export ``encoder`` to ONNX with the fixed input shape ``[1, seq_len]``.

    Inputs ``input_ids`` and ``attention_mask`` (int64), output ``sentence_embedding``
    ``[1, dim]`` (pooled and normalised as the encoder declares).
    """
    progress = progress or NullProgress()
    if not 2 <= seq_len <= encoder.pooling.max_seq_length:
        raise StudioError(
            f"sequence length must be between 2 and {encoder.pooling.max_seq_length} "
            f"(got {seq_len})"
        )
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The example input carries padding so the tracer keeps the attention-mask path.
    example = encoder.tokenize(["example"], seq_len=seq_len)
    ids = torch.from_numpy(example["input_ids"])
    mask = torch.from_numpy(example["attention_mask"])
    progress.update(0.1, f"exporting to ONNX (opset {opset}, shape [1, {seq_len}])")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.onnx.export(
            encoder.module,
            (ids, mask),
            str(out),
            input_names=["input_ids", "attention_mask"],
            output_names=["sentence_embedding"],
            opset_version=opset,
            dynamo=False,
            do_constant_folding=True,
        )
    # The legacy exporter's deprecation note and tracer warnings go to the job log.
    for msg in dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught):
        progress.log(msg.splitlines()[0][:300])
    progress.log(f"wrote {out} ({format_bytes(out.stat().st_size)})")
    return out


def onnx_embed(
    onnx_path: str | Path, encoder: Encoder, texts: list[str] | tuple[str, ...], session=None
) -> np.ndarray:
    """Embeddings from ONNX Runtime (CPU) at the model's fixed sequence length."""
    sess = session or ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    seq_len = int(sess.get_inputs()[0].shape[1])
    rows = []
    for text in texts:
        feed = encoder.tokenize([text], seq_len=seq_len)
        rows.append(sess.run(["sentence_embedding"], feed)[0][0])
    return np.stack(rows).astype(np.float32)


@dataclass
class OnnxCheck:
    cosines: list[float]
    min_cosine: float
    threshold: float
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "cosines": self.cosines,
            "min_cosine": self.min_cosine,
            "threshold": self.threshold,
            "passed": self.passed,
        }


def check_onnx(
    encoder: Encoder,
    onnx_path: str | Path,
    texts: list[str] | tuple[str, ...] = CHECK_TEXTS,
    threshold: float = ONNX_COSINE_MIN,
) -> OnnxCheck:
    """Cosine of ORT vs torch embeddings, per text (same truncation on both sides)."""
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    seq_len = int(sess.get_inputs()[0].shape[1])
    ref = encoder.embed(list(texts), max_length=seq_len)
    got = onnx_embed(onnx_path, encoder, texts, session=sess)
    cos = [float(c) for c in np.atleast_1d(embedding_cosine(ref, got))]
    low = min(cos)
    return OnnxCheck(cos, low, threshold, low >= threshold)


def load_similarity_set() -> dict[str, Any]:
    """The shipped retrieval set: ``documents`` and ``queries`` (``text``, ``relevant``:
    the index of its document)."""
    data = json.loads(read_data("similarity"))
    return {"documents": list(data["documents"]), "queries": list(data["queries"])}


def ranking_check(ref_docs: np.ndarray, ref_queries: np.ndarray, got_docs: np.ndarray,
                  got_queries: np.ndarray, relevant: list[int]) -> dict[str, Any]:
    """How a deployed encoder's rankings agree with the reference's: each query ranks the
    documents by cosine similarity; per query the top-1 agreement, Kendall's tau between the
    two rankings and whether each puts the relevant document first."""

    def scores(d: np.ndarray, q: np.ndarray) -> np.ndarray:
        d = d / np.linalg.norm(d, axis=1, keepdims=True)
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        return q @ d.T

    ref, got = scores(ref_docs, ref_queries), scores(got_docs, got_queries)
    rows = []
    for i, rel in enumerate(relevant):
        a, b = ref[i], got[i]
        n = len(a)
        agree = sum(np.sign(a[j] - a[k]) == np.sign(b[j] - b[k])
                    for j in range(n) for k in range(j + 1, n))
        pairs = n * (n - 1) // 2
        rows.append({"top1_same": int(a.argmax()) == int(b.argmax()),
                     "kendall_tau": (2 * agree - pairs) / pairs,
                     "relevant_first_reference": int(a.argmax()) == rel,
                     "relevant_first_deployed": int(b.argmax()) == rel})
    return {"queries": len(rows),
            "top1_agreement": sum(r["top1_same"] for r in rows) / len(rows),
            "mean_kendall_tau": float(np.mean([r["kendall_tau"] for r in rows])),
            "recall_at_1_reference": sum(r["relevant_first_reference"] for r in rows) / len(rows),
            "recall_at_1_deployed": sum(r["relevant_first_deployed"] for r in rows) / len(rows),
            "per_query": rows}


def run(inputs: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Background work: export the encoder to ONNX and check it against torch.

    ``inputs``: ``out`` (ONNX path), optional ``path`` (encoder folder; default the
    ``minilm`` sample), ``seq_len``, ``texts``.
    """
    progress.update(0.0, "loading the encoder")
    encoder = load_encoder(inputs.get("path"))
    progress.check()
    seq_len = int(inputs.get("seq_len", DEFAULT_SEQ_LEN))
    out = export_onnx(encoder, inputs["out"], seq_len=seq_len, progress=progress)
    progress.check()
    progress.update(0.8, "comparing ONNX Runtime with torch")
    check = check_onnx(encoder, out, tuple(inputs.get("texts") or CHECK_TEXTS))
    progress.update(1.0, f"min cosine {check.min_cosine:.6f}")
    return {"onnx": str(out), "seq_len": seq_len, "opset": OPSET, **check.to_dict()}
