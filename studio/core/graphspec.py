"""The graph spec (``graph.json``) beside every exported, quantized or compiled LLM: one name
per quantity, read and written through this module.

- ``prompt_length`` (P): the prefill graph's fixed prompt length;
- ``context_length`` (C): the decode graph's static KV cache length;
- ``num_layers``, ``num_heads``, ``num_kv_heads``, ``head_dim``, ``hidden_size``,
  ``vocab_size``, ``eos_token_id(s)``, ``pad_token_id``, ``mask_value``, ``opset``;
- ``family``, ``rope_type``, ``checkpoint_dtype``, the soft-cap values, and per layer
  ``layer_types`` (``full_attention`` / ``sliding_attention``) with ``sliding_window``: where
  only some layers slide, both graphs take a second mask input ``sliding_attention_mask``;
- ``export_check``: the graphs against transformers over the whole context (``positions``,
  ``max_abs_logit_diff``, ``top1_agreement``, ``tolerance``, ``first_bad_position``).

Specs written before this vocabulary (``format`` 1 with ``prompt_len`` / ``context_len``,
sometimes beside the new names, and absolute paths) are migrated when read.
"""

from __future__ import annotations

from typing import Any

# old name -> the one name
_RENAMED = {"prompt_len": "prompt_length", "context_len": "context_length"}
# fields that held machine-specific paths: not part of a spec any more
_DROPPED = ("checkpoint", "tokenizer_dir")


def migrate(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec in the current vocabulary (a copy; the input is left alone)."""
    out = dict(spec)
    for old, new in _RENAMED.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    for key in _DROPPED:
        out.pop(key, None)
    return out
