"""Chat templates as checkpoints ship them, written here (no downloads): Qwen2.5-Instruct's
and Qwen2-VL-Instruct's, a Llama-3-style one (``bos_token``, ``strftime_now``,
``raise_exception``), and a small random Qwen2 checkpoint whose tokenizer has the chat
special tokens, with its template in ``tokenizer_config.json`` or ``chat_template.jinja``."""

from __future__ import annotations

import json
from pathlib import Path

#: Qwen2.5-Instruct's template (tokenizer_config.json's chat_template)
QWEN25 = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) "
    "or (message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

#: Qwen2-VL-Instruct's template: an image block becomes <|vision_start|><|image_pad|>...
QWEN2_VL = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: a Llama-3-style template: the bos_token variable, strftime_now, raise_exception
LLAMA3 = (
    "{{- bos_token }}\n"
    "{%- if not date_string is defined %}\n"
    "    {%- set date_string = strftime_now(\"%d %b %Y\") %}\n"
    "{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n<|eot_id|>\" }}\n"
    "{%- for message in messages %}\n"
    "    {%- if message['role'] not in ['user', 'assistant', 'system'] %}\n"
    "        {{- raise_exception('roles are user, assistant and system') }}\n"
    "    {%- endif %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)

CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                 "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def save_chat_tokenizer(folder: Path, text: str, template: str | None, where: str = "config",
                        vocab_size: int = 256, bos: str | None = None) -> Path:
    """A byte-level BPE tokenizer trained on ``text`` with the chat special tokens, saved as
    transformers saves one; ``template`` in ``tokenizer_config.json`` (``where="config"``), in
    ``chat_template.jinja`` (``"jinja"``) or as named templates (``"named"``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=CHAT_SPECIALS, show_progress=False))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                            eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=bos,
                            clean_up_tokenization_spaces=False).save_pretrained(str(folder))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    if template is not None:
        if where == "jinja":
            (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
        else:
            cfg = json.loads((folder / "tokenizer_config.json").read_text())
            cfg["chat_template"] = (template if where == "config" else
                                    [{"name": "default", "template": template},
                                     {"name": "other", "template": "{{ 'unused' }}"}])
            (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return folder


def make_chat_checkpoint(folder: Path, text: str, template: str | None = QWEN25,
                         where: str = "config") -> Path:
    """A random Qwen2 (2 layers, hidden 64, vocab 256) whose tokenizer has the chat tokens
    and ``template``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         initializer_range=0.2, eos_token_id=2, pad_token_id=0,
                         bos_token_id=None)
    Qwen2ForCausalLM(config).save_pretrained(str(folder))
    save_chat_tokenizer(folder, text, template, where)
    return folder
