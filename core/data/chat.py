"""Chat templates: a model's Jinja template rendered the way transformers renders it
(sandboxed, trim_blocks and lstrip_blocks, raise_exception, tojson), so TrainDeck, transformers
and llama.cpp give a model the same prompt."""

from __future__ import annotations

import functools
import json
from datetime import datetime

from core.errors import UserError


class TemplateError(UserError):
    pass


def _raise(message):
    raise TemplateError(f"chat template: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


# The template a model without one trains and chats with: ChatML (as SmolLM2 and Qwen use),
# with the model's EOS (where it has one) closing each answer, so every tool stops there.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
DEFAULT_STOP = "<|im_end|>"  # where an answer ends for a tokenizer with no EOS token


@functools.lru_cache(maxsize=16)
def _compiled(template: str):
    """Compiling costs milliseconds; a data set renders one template thousands of times."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template: {e}") from None


def render(
    template: str, messages: list[dict], add_generation_prompt: bool = True, **tokens
) -> str:
    """The text of a conversation; tokens: bos_token, eos_token and the like."""
    import jinja2

    compiled = _compiled(template)
    try:
        return compiled.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **tokens
        )
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template: {e}") from None


def special_tokens(tokenizer) -> dict:
    """The token texts a template may use, as transformers passes them."""
    meta = tokenizer.meta
    return {"bos_token": meta.get("bos_token") or "", "eos_token": meta.get("eos_token") or ""}


def template_of(tokenizer) -> str:
    """The template a tokenizer's model chats with: its own, else the default."""
    return tokenizer.chat_template or DEFAULT_TEMPLATE


def answer_spans(template: str, messages: list[dict], **tokens) -> tuple[str, list[tuple]]:
    """The whole conversation's text and the (start, end) characters of each assistant
    turn in it, end-of-turn marks included. A turn is what rendering it adds after the
    generation prompt; where a template rewrites earlier turns (some drop old reasoning),
    the answer's own text is found instead."""
    text = render(template, messages, False, **tokens)
    spans, cursor = [], 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        span = None
        try:
            before = render(template, messages[:i], True, **tokens) if i else ""
            upto = render(template, messages[: i + 1], False, **tokens)
            if before and upto.startswith(before) and text.startswith(upto):
                span = (len(before), len(upto))
        except TemplateError:  # e.g. a template that needs a user turn first
            pass
        if span is None or span[0] < cursor:
            start = text.find(message["content"], cursor)
            if start < 0:
                raise TemplateError(
                    "chat template: an assistant answer does not appear in the rendered text"
                )
            span = (start, start + len(message["content"]))
        spans.append(span)
        cursor = span[1]
    return text, spans


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a conversation in the tokenizer's template (as transformers'
    apply_chat_template: the rendered text, encoded with no special tokens added)."""
    if not tokenizer.chat_template:
        raise TemplateError(
            "chat: this model has no chat template; generate from a plain prompt instead, or "
            "fine-tune it on chat data (which gives it one)"
        )
    text = render(
        tokenizer.chat_template, messages, add_generation_prompt, **special_tokens(tokenizer)
    )
    return tokenizer.encode(text)
