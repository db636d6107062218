"""The model families the studio supports, each declared once.

A :class:`Family` holds the pure facts of one decoder-only family of Hugging Face
``transformers``: its ``model_type``, the architecture class names its checkpoints name,
the label the studio shows, the transformers defaults a ``config.json`` may leave out
(tied embeddings, attention biases), the config keys the studio needs, the names of the
modules of one transformer block, which layers use the config's ``sliding_window``, and
what the static-KV export must add around the checkpoint's own modules (final logit
soft-capping, the embedding scale).

:data:`FAMILIES` is the one table: checkpoint import and its checks
(:mod:`studio.engine.hf_import`, what ``studio new --checkpoint`` accepts), the static-KV
export (:mod:`studio.engine.llm_export`, which finds the torch code of a family through
:attr:`Family.wrapper`) and the performance model (:mod:`studio.core.perfmodel`) all read
it. Adding a family is one declaration here (plus a wrapper in the export where the
architecture's modules are new).

Pure Python: no torch, no transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FULL, SLIDING = "full_attention", "sliding_attention"

#: which layers slide when the config has a window but no per-layer list: none of them
#: (Llama ignores ``sliding_window``), all of them (Mistral, Phi-3), every other one starting
#: with the first (Gemma 2), or those from ``max_window_layers`` on (Qwen2 / Qwen3)
SLIDING_PATTERNS = ("none", "all", "alternate", "from_max_window_layers")

#: the modules of a Llama-style block as data flows through it: (leaf name, kind)
LLAMA_BLOCK: tuple[tuple[str, str], ...] = (
    ("input_layernorm", "norm"),
    ("q_proj", "attention"),
    ("k_proj", "attention"),
    ("v_proj", "attention"),
    ("o_proj", "attention"),
    ("post_attention_layernorm", "norm"),
    ("gate_proj", "mlp"),
    ("up_proj", "mlp"),
    ("down_proj", "mlp"),
)

#: integer config keys every family's checkpoint must give (the model's sizes)
REQUIRED_CONFIG_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")

# What a config.json may give, checked before anything is sized from it (checkpoint import,
# studio estimate --config): a size past these is a damaged config or not a model's.
#: the largest size (a width, a head count, the vocabulary...)
MAX_CONFIG_INT = 1 << 24
#: the most transformer blocks (published decoders have at most about 130)
MAX_LAYERS = 1024
#: the keys that count blocks (:data:`MAX_LAYERS` holds for them)
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "depth")
#: the most parameters a config may describe (published models have at most a few trillion)
MAX_PARAMS = 10**13


def config_limit(key: str) -> int:
    """The largest value config key ``key`` may hold."""
    return MAX_LAYERS if key in LAYER_KEYS else MAX_CONFIG_INT


@dataclass(frozen=True)
class Family:
    """The facts of one model family.

    ``architectures``: the ``config.json`` ``architectures`` names of its checkpoints (the
    first is assumed when a config names none). ``config_keys``: the integer keys its
    ``config.json`` must give (at least :data:`REQUIRED_CONFIG_KEYS`). ``tied_embeddings`` / ``attention_bias``:
    what transformers assumes when the config does not say. ``block``: the leaf modules of
    one transformer block in data-flow order, with their kind (``norm``, ``attention``,
    ``mlp``). ``sliding``: one of :data:`SLIDING_PATTERNS`; ``reads_layer_types``: whether a
    ``layer_types`` list in the config overrides the pattern; ``window_switch``: a config key
    that must be true for the window to apply at all (Qwen's ``use_sliding_window``).
    ``final_softcap`` / ``attn_softcap``: config keys of the logit soft-capping; the final
    one is applied by the export's wrapper (transformers does it in ``ForCausalLM.forward``,
    which the graphs do not run), the attention one by the checkpoint's own attention
    (recorded only). ``embed_scale``: the embeddings are multiplied by sqrt(hidden_size)
    (transformers 5 does it inside the embedding module; the wrapper does it when the module
    does not). ``wrapper``: the name of the export's static-KV wrapper for these modules
    (:data:`studio.engine.llm_export.WRAPPERS`). ``vision``: a vision-language model (a vision
    tower beside the language model, whose sizes a transformers 5 ``config.json`` keeps under
    ``text_config``; see :func:`text_config`); its export adds the vision encoder's graph
    (:mod:`studio.engine.vision`).
    """

    model_type: str
    label: str
    architectures: tuple[str, ...]
    tied_embeddings: bool = False
    attention_bias: bool = False
    config_keys: tuple[str, ...] = REQUIRED_CONFIG_KEYS
    block: tuple[tuple[str, str], ...] = LLAMA_BLOCK
    sliding: str = "all"
    reads_layer_types: bool = False
    window_switch: str | None = None
    final_softcap: str | None = None
    attn_softcap: str | None = None
    embed_scale: bool = False
    wrapper: str = "decoder"
    vision: bool = False

    def __post_init__(self) -> None:
        if self.sliding not in SLIDING_PATTERNS:
            raise ValueError(f"{self.model_type}: sliding must be one of {SLIDING_PATTERNS}")
        missing = set(REQUIRED_CONFIG_KEYS) - set(self.config_keys)
        if missing:
            raise ValueError(f"{self.model_type}: config_keys lacks {sorted(missing)}")


#: Qwen's window rule (Qwen2, Qwen3, Qwen2-VL, Qwen2.5-VL): a per-layer list when the config
#: has one, else the layers from max_window_layers on, and only with use_sliding_window
QWEN_WINDOW: dict[str, Any] = dict(sliding="from_max_window_layers", reads_layer_types=True,
                                   window_switch="use_sliding_window")

FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family(
            "qwen2",
            "Qwen2 / Qwen2.5",
            ("Qwen2ForCausalLM",),
            attention_bias=True,
            **QWEN_WINDOW,
        ),
        Family(
            "qwen3",
            "Qwen3",
            ("Qwen3ForCausalLM",),
            block=(*LLAMA_BLOCK[:4], ("q_norm", "norm"), ("k_norm", "norm"), *LLAMA_BLOCK[4:]),
            **QWEN_WINDOW,
        ),
        # the vision-language models: Qwen2's decoder with the multimodal rotary embedding
        # (3 rows of positions: temporal, height, width) and a ViT beside it
        Family(
            "qwen2_vl",
            "Qwen2-VL",
            ("Qwen2VLForConditionalGeneration",),
            attention_bias=True,
            **QWEN_WINDOW,
            vision=True,
        ),
        Family(
            "qwen2_5_vl",
            "Qwen2.5-VL",
            ("Qwen2_5_VLForConditionalGeneration",),
            attention_bias=True,
            **QWEN_WINDOW,
            vision=True,
        ),
        Family("llama", "Llama 2 / 3.x", ("LlamaForCausalLM",), sliding="none"),
        Family("mistral", "Mistral", ("MistralForCausalLM",)),
        # Ministral: Mistral's modules, with a per-layer list of sliding / full layers
        Family("ministral", "Ministral", ("MinistralForCausalLM",), reads_layer_types=True),
        Family(
            "phi3",
            "Phi-3 / Phi-3.5",
            ("Phi3ForCausalLM",),
            block=(
                ("input_layernorm", "norm"),
                ("qkv_proj", "attention"),
                ("o_proj", "attention"),
                ("post_attention_layernorm", "norm"),
                ("gate_up_proj", "mlp"),
                ("down_proj", "mlp"),
            ),
        ),
        Family(
            "gemma2",
            "Gemma 2",
            ("Gemma2ForCausalLM",),
            tied_embeddings=True,
            block=(
                *LLAMA_BLOCK[:6],
                ("pre_feedforward_layernorm", "norm"),
                *LLAMA_BLOCK[6:],
                ("post_feedforward_layernorm", "norm"),
            ),
            sliding="alternate",
            reads_layer_types=True,
            final_softcap="final_logit_softcapping",
            attn_softcap="attn_logit_softcapping",
            embed_scale=True,
        ),
    )
}

#: how the performance model treats a decoder outside :data:`FAMILIES`: untied, no
#: attention biases, every layer slides when the config sets a window
UNLISTED = Family("", "an unlisted decoder-only transformer", ())


def text_config(config: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """The language model's keys of a ``config.json`` dict: a vision-language config written
    by transformers 5 keeps them under ``text_config`` (published Qwen2-VL configs keep them
    at the top); the top level's ``model_type`` stays."""
    nested = config.get("text_config") if family.vision else None
    if not isinstance(nested, Mapping):
        return dict(config)
    return {**config, **nested, "model_type": config.get("model_type")}


def family_of(model_type: object) -> Family | None:
    """The family of a ``config.json`` ``model_type``, or None when the studio has none."""
    return FAMILIES.get(str(model_type))


def family_of_architecture(architecture: str) -> Family | None:
    """The family whose checkpoints name ``architecture`` (``Qwen2ForCausalLM``)."""
    return next((f for f in FAMILIES.values() if architecture in f.architectures), None)


def architectures() -> list[str]:
    """Every architecture class name of every family, in table order."""
    return [a for f in FAMILIES.values() for a in f.architectures]


def labels() -> str:
    """The families as the studio names them, for messages: ``Qwen2 / Qwen2.5, Qwen3, ...``."""
    return ", ".join(f.label for f in FAMILIES.values())


def layer_types(config: Mapping[str, Any], family: Family, num_layers: int) -> list[str]:
    """The attention type of each layer (:data:`FULL` / :data:`SLIDING`), read from a
    ``config.json`` dict the way the family's transformers model reads it, from either
    generation of config keys: no window (or the family's ``window_switch`` off) means full
    attention everywhere; a family that reads ``layer_types`` takes that list when it has one
    entry per layer; otherwise the family's :data:`SLIDING_PATTERNS` entry decides."""
    window = config.get("sliding_window")
    if family.sliding == "none" or not window:
        return [FULL] * num_layers
    if family.window_switch and not config.get(family.window_switch):
        return [FULL] * num_layers
    given = config.get("layer_types")
    if family.reads_layer_types and isinstance(given, list) and len(given) == num_layers:
        return [str(t) for t in given]
    if family.sliding == "all":
        return [SLIDING] * num_layers
    if family.sliding == "alternate":
        return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
    first = int(config.get("max_window_layers") or 0)
    return [SLIDING if i >= first else FULL for i in range(num_layers)]
