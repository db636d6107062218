"""A checkpoint's chat template: read where transformers reads it, and rendered as
transformers' ``apply_chat_template`` renders it for one user message with the assistant's
turn opened (``add_generation_prompt=True``).

Where it is read (the order transformers gives them): ``chat_template.jinja`` beside the
tokenizer (what transformers saves, and prefers), a processor's ``chat_template.json``, else
``tokenizer_config.json``'s ``chat_template`` (one string, or named templates of which
``default`` is used). The export carries these files in its ``tokenizer`` folder, so the
runtimes read the template the model was exported with.

How it is rendered: jinja2's immutable sandbox with ``trim_blocks`` and ``lstrip_blocks``,
the ``loopcontrols`` extension, transformers' ``tojson`` (no HTML escaping),
``raise_exception`` and ``strftime_now``, the tokenizer's named special tokens
(``bos_token``, ``eos_token``, ...) as variables, ``tools`` and ``documents`` None. The text
is tokenized without the tokenizer's own special tokens (the template writes them), as the
tokenizer's ``apply_chat_template`` does; a vision-language prompt follows the processor's
rule (special tokens added unless the text starts with ``bos_token``), and its image is a
content block before the text, where the template puts the image's placeholder.

jinja2 is imported inside functions (a dependency of the studio, but not needed to start it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module

jinja2 = lazy_module("jinja2")
if TYPE_CHECKING:  # a checker reads the module itself
    from jinja2 import ext
else:
    ext = lazy_module("jinja2.ext")
nodes = lazy_module("jinja2.nodes")
sandbox = lazy_module("jinja2.sandbox")
tokenizers = lazy_module("tokenizers")

TEMPLATE_FILE = "chat_template.jinja"
PROCESSOR_FILE = "chat_template.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_MAP_FILE = "special_tokens_map.json"
#: the files the export copies beside the tokenizer (tokenizer_config.json goes with the rest)
FILES = (TEMPLATE_FILE, PROCESSOR_FILE)
#: the tokenizer's named special tokens a template sees (transformers' special_tokens_map)
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                  "cls_token", "mask_token")
#: where a vision-language template puts an image (Qwen2-VL's placeholder)
IMAGE_PLACEHOLDER = "<|image_pad|>"
#: how a prompt goes in when no template is applied
AS_WRITTEN = "the prompt goes in as written"


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template and what it renders with."""

    text: str
    source: str  # the file (and key) it was read from
    special: tuple[tuple[str, str], ...] = ()  # the named special tokens, as variables

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def render(self, prompt: str, image: bool = False) -> str:
        """The text for one user message (``image``: an image block before the text), the
        assistant's turn opened."""
        content: Any = ([{"type": "image"}, {"type": "text", "text": prompt}] if image
                        else prompt)
        no_image = (f"the chat template ({self.source}) puts no image ({IMAGE_PLACEHOLDER}) "
                    "in a user message: give the prompt as written (studio generate --raw, "
                    "or model.chat_template = \"none\")")
        try:
            out = _render(self.text, self.source, [{"role": "user", "content": content}],
                          dict(self.special))
        except StudioError:
            if image:  # a text template, handed an image block it cannot take
                raise StudioError(no_image) from None
            raise
        if image and IMAGE_PLACEHOLDER not in out:
            raise StudioError(no_image)
        return out

    def affixes(self) -> tuple[str, str] | None:
        """(prefix, suffix): the text the template puts before and after a user's prompt,
        what an app without a template engine wraps a prompt in; None when the template
        does more to a prompt than put it between two fixed texts."""
        pieces = []
        for sentinel in ("\x00PROMPT-A\x00", "\x00PROMPT-B\x00"):
            out = self.render(sentinel)
            if out.count(sentinel) != 1:
                return None
            pieces.append(tuple(out.split(sentinel)))
        return pieces[0] if pieces[0] == pieces[1] else None  # type: ignore[return-value]

    def describe(self) -> str:
        return f"{self.source} ({len(self.text):,} characters, sha256 {self.sha256[:12]})"


def read(folder: Path) -> ChatTemplate | None:
    """The chat template of the tokenizer in ``folder`` (None when it has none); a file that
    cannot be read, or a template that does not compile, is a one-line error."""
    folder = Path(folder)
    special = _special_tokens(folder)
    jinja = folder / TEMPLATE_FILE
    if jinja.is_file():
        return _checked(ChatTemplate(_read_text(jinja), TEMPLATE_FILE, special))
    proc = folder / PROCESSOR_FILE
    if proc.is_file():
        data = _read_json(proc)
        text = data.get("chat_template") if isinstance(data, dict) else None
        if not isinstance(text, str):
            raise StudioError(f"{proc} holds no chat_template string: save the processor "
                              "again (processor.save_pretrained)")
        return _checked(ChatTemplate(text, f"{PROCESSOR_FILE}'s chat_template", special))
    config = _config(folder)
    value = config.get("chat_template")
    if value is None:
        return None
    where = f"{CONFIG_FILE}'s chat_template"
    if isinstance(value, list):  # named templates: transformers uses "default"
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if "default" not in named:
            raise StudioError(f"{folder / CONFIG_FILE}: chat_template names templates "
                              f"{sorted(str(k) for k in named)} but no \"default\": name one "
                              "\"default\", or set model.chat_template = \"none\"")
        value, where = named["default"], f"{CONFIG_FILE}'s chat_template \"default\""
    if not isinstance(value, str):
        raise StudioError(f"{folder / CONFIG_FILE}: chat_template must be a string, not "
                          f"{type(value).__name__}")
    return _checked(ChatTemplate(value, where, special))


def missing_line() -> str:
    """What a checkpoint without a template is told (one line, not an error)."""
    return (f"no chat template in the checkpoint (no {TEMPLATE_FILE}, no chat_template in "
            f"{CONFIG_FILE}): {AS_WRITTEN}")


@dataclass(frozen=True)
class PromptFormat:
    """How a prompt becomes the model's ids: through the chat template, or as written
    (``why`` says why no template is applied)."""

    template: ChatTemplate | None
    why: str = ""

    @property
    def applied(self) -> bool:
        return self.template is not None

    def text(self, prompt: str, image: bool = False) -> str:
        """What the tokenizer reads for ``prompt``."""
        return self.template.render(prompt, image) if self.template is not None else prompt

    def ids(self, tok, prompt: str, image: bool = False, vision: bool = False) -> list[int]:
        """The ids of ``prompt`` (``tok``: a transformers or a ``tokenizers`` tokenizer);
        ``image``: an image block goes before the text (its placeholder expanded by the
        caller); ``vision``: a vision-language model (the processor's rule for special
        tokens)."""
        if self.template is None:
            return encode(tok, prompt, True)
        text = self.template.render(prompt, image)
        special = False
        if vision:
            bos = dict(self.template.special).get("bos_token")
            special = not (bos and text.startswith(bos))
        return encode(tok, text, special)

    def line(self) -> str:
        """One line: the template applied and where it comes from, or why none is."""
        if self.template is not None:
            return ("chat template: " + self.template.describe() + ", applied (one user "
                    "message, the assistant's turn opened)")
        return self.why

    def to_json(self) -> dict[str, Any]:
        t = self.template
        return {"applied": t is not None, "source": t.source if t else None,
                "sha256": t.sha256 if t else None, "note": self.line()}


def prompt_format(folder: Path, setting: str = "checkpoint", raw: bool = False) -> PromptFormat:
    """The prompt format of the tokenizer in ``folder`` for ``model.chat_template``
    (``checkpoint``: its template where it has one; ``none``: as written); ``raw``: as
    written whatever the setting (``studio generate --raw``)."""
    if raw:
        return PromptFormat(None, f"chat template skipped (--raw): {AS_WRITTEN}")
    if setting == "none":
        return PromptFormat(None, f"chat template off (model.chat_template = \"none\"): "
                                  f"{AS_WRITTEN}")
    template = read(folder)
    return PromptFormat(template, "" if template is not None else missing_line())


def encode(tok, text: str, special: bool) -> list[int]:
    """``text``'s ids from a transformers tokenizer or a ``tokenizers`` one, with or without
    the tokenizer's own special tokens."""
    if isinstance(tok, tokenizers.Tokenizer):
        return list(tok.encode(text, add_special_tokens=special).ids)
    return list(tok(text, add_special_tokens=special).input_ids)


# ---- reading ----------------------------------------------------------------------------------
def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StudioError(f"cannot read {path}: {exc}") from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_read_text(path))
    except ValueError as exc:
        raise StudioError(f"{path} is not valid JSON ({exc}): save the tokenizer again") from None


def _config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        return {}
    data = _read_json(path)
    if not isinstance(data, dict):
        raise StudioError(f"{path} is not a JSON object: save the tokenizer again")
    return data


def _special_tokens(folder: Path) -> tuple[tuple[str, str], ...]:
    """The named special tokens (tokenizer_config.json, else special_tokens_map.json), as
    transformers' ``special_tokens_map`` gives them to a template."""
    config = _config(folder)
    extra_path = folder / SPECIAL_MAP_FILE
    extra = _read_json(extra_path) if extra_path.is_file() else {}
    out = []
    for name in SPECIAL_TOKENS:
        value = config.get(name)
        if value is None and isinstance(extra, dict):
            value = extra.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out.append((name, value))
    return tuple(out)


# ---- rendering --------------------------------------------------------------------------------
def _checked(template: ChatTemplate) -> ChatTemplate:
    _compiled(template.text, template.source)
    return template


@lru_cache(maxsize=16)
def _compiled(text: str, source: str):
    class Generation(ext.Extension):
        """``{% generation %}…{% endgeneration %}`` (assistant-mask markers): the body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        raise StudioError(f"the chat template ({source}) does not compile (line {exc.lineno}: "
                          f"{exc.message}): fix it, or set model.chat_template = \"none\""
                          ) from None


def _render(text: str, source: str, messages: list[dict[str, Any]],
            special: dict[str, str]) -> str:
    template = _compiled(text, source)
    try:
        return template.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=True, **special)
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError,
            IndexError) as exc:  # a template is code: its own errors, and Python's
        raise StudioError(f"the chat template ({source}) refused the prompt: {exc}; give it "
                          "as written (studio generate --raw, or model.chat_template = "
                          "\"none\")") from None
