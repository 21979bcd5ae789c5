"""Chat templates: a model's Jinja template rendered the way transformers renders it
(sandboxed, trim_blocks and lstrip_blocks, raise_exception, strftime_now, tojson, the
{% generation %} tag), so TrainDeck, transformers and llama.cpp give a model the same prompt."""

from __future__ import annotations

import functools
import json
import os
import re
from contextvars import ContextVar
from datetime import datetime

from core.errors import ConfigError, UserError


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


# The text rendered so far and the (start, end) of each {% generation %} block, while
# generation_spans renders; None otherwise.
_TRACKING: ContextVar = ContextVar("chat_generation_spans", default=None)
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation(template: str) -> bool:
    """Whether the template marks its assistant text with {% generation %} (SmolLM3 does)."""
    return bool(_GENERATION.search(template))


def _generation_extension():
    """transformers' {% generation %} ... {% endgeneration %}: renders its body unchanged and,
    while generation_spans renders, records where that text lies in the output."""
    import jinja2
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            call = self.call_method("_block")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _block(self, caller):
            text = caller()
            tracking = _TRACKING.get()
            if tracking is not None:
                blocks, spans = tracking
                start = sum(map(len, blocks))
                spans.append((start, start + len(text)))
            return text

    return Generation


@functools.lru_cache(maxsize=16)
def _compiled(template: str):
    """Compiling costs milliseconds; a data set renders one template thousands of times."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_extension(), loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template: {e}") from None


def _context(messages, add_generation_prompt, tokens) -> dict:
    # transformers passes tools and documents (None without them) to every render.
    return {
        "tools": None,
        "documents": None,
        **tokens,
        "messages": messages,
        "add_generation_prompt": add_generation_prompt,
    }


def render(
    template: str, messages: list[dict], add_generation_prompt: bool = True, **tokens
) -> str:
    """The text of a conversation; tokens: bos_token, eos_token and the like (any other
    template variable too, e.g. enable_thinking, or strftime_now to fix the date)."""
    import jinja2

    compiled = _compiled(template)
    try:
        return compiled.render(_context(messages, add_generation_prompt, tokens))
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template: {e}") from None


def generation_spans(
    template: str, messages: list[dict], add_generation_prompt: bool = False, **tokens
) -> tuple[str, list[tuple[int, int]]]:
    """The text and the (start, end) characters of each {% generation %} block in it: the
    assistant's text as transformers' apply_chat_template(return_assistant_tokens_mask=True)
    marks it."""
    import jinja2

    compiled = _compiled(template)
    blocks, spans = [], []
    token = _TRACKING.set((blocks, spans))
    try:
        for block in compiled.generate(_context(messages, add_generation_prompt, tokens)):
            blocks.append(block)
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template: {e}") from None
    finally:
        _TRACKING.reset(token)
    return "".join(blocks), spans


def special_tokens(tokenizer) -> dict:
    """The token texts a template may use, as transformers passes them."""
    meta = tokenizer.meta
    return {"bos_token": meta.get("bos_token") or "", "eos_token": meta.get("eos_token") or ""}


def render_vars(tokenizer) -> dict:
    """What every render of a run's template gets: the special token texts, and the run's
    enable_thinking where it set one (set_thinking), so chat data, prompts, generation and
    evaluation render alike."""
    if "enable_thinking" not in tokenizer.meta:
        return special_tokens(tokenizer)
    return {**special_tokens(tokenizer), "enable_thinking": bool(tokenizer.meta["enable_thinking"])}


def thinking_vars(template: str | None, thinking: str) -> dict:
    """The template variables of a thinking setting ("default", "on", "off"): {} for default,
    else enable_thinking, which only a template that reads it can take."""
    if thinking == "default":
        return {}
    if "enable_thinking" not in (template or ""):
        raise ConfigError(
            f"thinking: {thinking} needs a chat template with a thinking switch "
            "(enable_thinking, as Qwen3's, Qwen3.5's and Gemma 4's); this model's template has "
            "none: leave thinking at default",
            field="thinking",
        )
    return {"enable_thinking": thinking == "on"}


def set_thinking(tokenizer, thinking: str) -> None:
    """Make the tokenizer carry the thinking setting: it is saved with the run's data and
    checkpoints, so chat data, generation and evaluation all render the template so."""
    tokenizer.meta.pop("enable_thinking", None)
    tokenizer.meta.update(thinking_vars(template_of(tokenizer), thinking))


def template_of(tokenizer) -> str:
    """The template a tokenizer's model chats with: its own, else the default."""
    return tokenizer.chat_template or DEFAULT_TEMPLATE


REASONING_NOTE = (
    "chat: the model's chat template drops the reasoning (<think> or thought channel) from "
    "every answer; TrainDeck keeps it in each conversation's last answer (as Qwen3's template "
    "does), so the model learns to reason; earlier answers lose theirs, as the template "
    "writes them"
)
_KEPT = "TrainDeckKeptReasoning{}"  # stands for a kept answer while the template renders
# How an answer's text holds its reasoning: a <think> block (Qwen, DeepSeek-R1, SmolLM3), or
# Gemma 4's thought channel, which its template strips from every answer's text.
_REASONING_MARKS = (("<think>", "</think>"), ("<|channel>", "<channel|>"))


def _reasoning(content: str) -> str:
    """The text of an answer's reasoning block ("" without one)."""
    for start, end in _REASONING_MARKS:
        if end in content:
            return content.split(end)[0].split(start)[-1].strip()
    return ""


def _after_reasoning(content: str) -> str | None:
    """An answer's text after its reasoning block (None without one)."""
    ends = [end for _, end in _REASONING_MARKS if end in content]
    return content.split(ends[0])[-1] if ends else None


def _keep_last_reasoning(template: str, messages: list[dict], tokens: dict) -> dict:
    """{placeholder: answer} for the answers after the last user turn whose reasoning the
    template drops (DeepSeek-R1's content.split('</think>')[-1]); empty where it keeps it."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    late = [
        i
        for i, m in enumerate(messages)
        if i > last_user and m["role"] == "assistant" and _reasoning(m["content"])
    ]
    if not late:
        return {}
    text = render(template, messages, False, **tokens)
    return {
        _KEPT.format(i): messages[i]["content"]
        for i in late
        if _reasoning(messages[i]["content"]) not in text
    }


def _substituted(messages: list[dict], kept: dict) -> list[dict]:
    """The messages with each kept answer replaced by its placeholder, which no template
    splits or trims."""
    return [
        {**m, "content": _KEPT.format(i)} if _KEPT.format(i) in kept else m
        for i, m in enumerate(messages)
    ]


def _restored(text: str, kept: dict) -> str:
    for key, content in kept.items():
        text = text.replace(key, content)
    return text


def conversation_text(template: str, messages: list[dict], notes: set | None = None, **tokens):
    """The training text of a whole conversation (no generation prompt): the template's own,
    except that reasoning the template would drop from the last answer is kept (notes gets
    REASONING_NOTE then)."""
    kept = _keep_last_reasoning(template, messages, tokens)
    if kept and notes is not None:
        notes.add(REASONING_NOTE)
    return _restored(render(template, _substituted(messages, kept), False, **tokens), kept)


def _common(a: str, b: str) -> int:
    """The length of the longest common prefix of a and b."""
    return len(os.path.commonprefix([a, b]))


def _turn_end(following: str, written: str) -> int:
    """How much of the text following an answer is its end-of-turn text: what the template
    writes after the answer when it is the last message (written), as far as the whole
    conversation's text agrees; where they part inside a mark (Phi's <|endoftext|> against the
    next turn's <|user|>), only the marks before it."""
    n = _common(following, written)
    if n < len(written):
        mark = written.rfind("<", 0, n + 1)
        n = mark if 0 <= mark < n else n
    return n


def _answer_at(text: str, content: str, cursor: int, prompt_end: int) -> tuple[int, int]:
    """Where an answer's text lies in the rendered conversation, after cursor and reaching
    past prompt_end (where the generation prompt stops matching: inside the answer where the
    prompt opens a reasoning block the answer fills, Gemma 4's): the whole content, else
    (reasoning dropped by the template) what follows its reasoning block."""
    variants = [content]
    after = _after_reasoning(content)
    if after is not None:
        variants += [after, after.lstrip("\n"), after.strip()]
    for v in variants:
        at = text.find(v, max(cursor, prompt_end - len(v) + 1)) if v else -1
        if at >= 0:
            return at, at + len(v)
    raise TemplateError("chat template: an assistant answer does not appear in the rendered text")


def answer_spans(
    template: str, messages: list[dict], notes: set | None = None, **tokens
) -> tuple[str, list[tuple]]:
    """The whole conversation's text and the (start, end) characters of each assistant
    turn in it, end-of-turn marks included.

    A template with {% generation %} marks the turns itself (transformers' assistant mask).
    Otherwise a turn starts where the generation prompt before it ends (or, where a template
    rewrites earlier turns, at the answer's own text) and ends after the end-of-turn text the
    template writes after it. Reasoning a template drops from the last answer is kept
    (conversation_text)."""
    if has_generation(template):
        text, spans = generation_spans(template, messages, False, **tokens)
        if spans:
            return text, spans
    kept = _keep_last_reasoning(template, messages, tokens)
    if kept and notes is not None:
        notes.add(REASONING_NOTE)
    shown = _substituted(messages, kept)

    def text_of(upto: int, prompt: bool) -> str:
        return _restored(render(template, shown[:upto], prompt, **tokens), kept)

    text = text_of(len(messages), False)
    spans, cursor = [], 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        try:
            before = text_of(i, True) if i else ""
            upto = text_of(i + 1, False)
        except TemplateError:  # e.g. a template that needs a user turn first
            before, upto = "", None
        # The answer is looked for where the generation prompt stops matching the text.
        a0, a1 = _answer_at(text, message["content"], cursor, _common(before, text))
        start = (
            len(before)
            if before and text.startswith(before) and cursor <= len(before) <= a1
            else a0
        )
        end = a1
        if upto is not None:
            same = upto[a0:a1] == text[a0:a1]
            at = a0 if same else upto.find(text[a0:a1], _common(before, upto))
            if at >= 0:  # the end-of-turn text the template writes after the answer
                end = a1 + _turn_end(text[a1:], upto[at + a1 - a0 :])
        spans.append((start, end))
        cursor = end
    return text, spans


def chat_ids(
    tokenizer, messages: list[dict], add_generation_prompt: bool = True, images=None, counts=None
) -> list[int]:
    """Token ids of a conversation in the tokenizer's template (as transformers'
    apply_chat_template: the rendered text, encoded with no special tokens added). images:
    the model's ImageSpec (core.data.images), for a conversation with image parts: each
    image's mark made into its tokens, as its processor does (counts: each image's tokens,
    where they vary by image (Qwen); else the spec's fixed count)."""
    if not tokenizer.chat_template:
        raise TemplateError(
            "chat: this model has no chat template; generate from a plain prompt instead, or "
            "fine-tune it on chat data (which gives it one)"
        )
    text = render(
        tokenizer.chat_template, messages, add_generation_prompt, **render_vars(tokenizer)
    )
    if images is not None:
        from core.data.images import conversation_images, marks_expanded

        shown = len(conversation_images(messages))
        text, _ = marks_expanded(text, images, counts or [images.tokens] * shown)
    return tokenizer.encode(text)
