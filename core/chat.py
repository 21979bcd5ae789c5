"""Chat templates: a model's Jinja template rendered the way transformers renders it
(sandboxed, trim_blocks and lstrip_blocks, raise_exception, tojson), so TrainDeck, transformers
and llama.cpp give a model the same prompt."""

from __future__ import annotations

import json
from datetime import datetime

from .errors import UserError


class TemplateError(UserError):
    pass


def _raise(message):
    raise TemplateError(f"chat template: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def render(
    template: str, messages: list[dict], add_generation_prompt: bool = True, **tokens
) -> str:
    """The text of a conversation; tokens: bos_token, eos_token and the like."""
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
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **tokens
        )
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template: {e}") from None


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a conversation in the tokenizer's template (as transformers'
    apply_chat_template: the rendered text, encoded with no special tokens added)."""
    if not tokenizer.chat_template:
        raise TemplateError(
            "chat: this model has no chat template; generate from a plain prompt instead"
        )
    text = render(
        tokenizer.chat_template,
        messages,
        add_generation_prompt,
        bos_token=tokenizer.meta.get("bos_token") or "",
        eos_token=tokenizer.meta.get("eos_token") or "",
    )
    return tokenizer.hf.encode(text, add_special_tokens=False).ids
