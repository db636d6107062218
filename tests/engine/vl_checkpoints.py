"""Small random Qwen2-VL and Qwen2.5-VL checkpoints, built here (no downloads): the config,
random weights, a BPE tokenizer trained on standard-library text with the vision tokens, and
transformers' own image processor config."""

from __future__ import annotations

from pathlib import Path

#: the tokenizer's special tokens, in id order: config.json names the vision ones' ids
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 2, 3, 4, 5
#: a test image side: 8 x 8 patches of 14 pixels, 16 image tokens, four 2 x 2-token windows
IMAGE = 112

TEXT = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            initializer_range=0.2, eos_token_id=0, pad_token_id=1, bos_token_id=None,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                             "mrope_section": [2, 3, 3]})
VISION = {
    "qwen2_5_vl": dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                       out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                       temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
                       initializer_range=0.2),
    "qwen2_vl": dict(depth=2, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2,
                     patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                     initializer_range=0.2),
}


def save_tokenizer(folder: Path, text: str, vocab_size: int = 2048) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  show_progress=False)
    tok.train_from_iterator([text], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                            eos_token="<|endoftext|>", pad_token="<|pad|>",
                            clean_up_tokenization_spaces=False).save_pretrained(str(folder))


def make_vl_checkpoint(folder: Path, model_type: str, text: str, seed: int = 0,
                       min_pixels: int = IMAGE * IMAGE, max_pixels: int = 4 * IMAGE * IMAGE,
                       max_positions: int = 512, vision: dict | None = None) -> Path:
    """A random ``qwen2_vl`` / ``qwen2_5_vl`` checkpoint in ``folder``: its image processor
    gives ``min_pixels`` to ``max_pixels`` images, its language model ``max_positions``;
    ``vision``: keys of the vision config set over :data:`VISION`'s (e.g. Qwen2.5-VL's
    ``fullatt_block_indexes``)."""
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
    )

    torch.manual_seed(seed)
    config_cls, model_cls = {
        "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration),
        "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
    }[model_type]
    config = config_cls(text_config={**TEXT, "max_position_embeddings": max_positions},
                        vision_config={**VISION[model_type], **(vision or {})},
                        image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD,
                        vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
                        eos_token_id=0, pad_token_id=1, bos_token_id=None,
                        tie_word_embeddings=False)
    model_cls(config).save_pretrained(str(folder))
    save_tokenizer(folder, text)
    Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(
        str(folder))
    return folder
