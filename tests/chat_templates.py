"""The real chat templates of the model families TrainDeck takes, as their models ship them
(tests/fixtures/chat_templates/, see its README), with each tokenizer's special-token texts,
and conversations of every shape, for the template and Ollama tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

FOLDER = Path(__file__).parent / "fixtures" / "chat_templates"


@dataclass(frozen=True)
class Model:
    file: str
    bos: str = ""
    eos: str = ""
    add_bos: bool = False  # the tokenizer (so the GGUF, so Ollama) puts BOS first itself
    system: bool = True  # takes a system message
    kind: str = "chatml"
    extra: dict = field(default_factory=dict)  # other template variables

    @property
    def template(self) -> str:
        return (FOLDER / self.file).read_text(encoding="utf-8")


DS_EOS = "<｜end▁of▁sentence｜>"
REAL = {
    "qwen2.5": Model("Qwen-Qwen2.5-7B-Instruct.jinja", eos="<|im_end|>"),
    "qwen3": Model("Qwen-Qwen3-0.6B.jinja", eos="<|im_end|>", kind="qwen3"),
    "llama3.1": Model(
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "<|begin_of_text|>",
        "<|eot_id|>",
        True,
        kind="llama3",
    ),
    "llama3.2": Model(
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "<|begin_of_text|>",
        "<|eot_id|>",
        True,
        kind="llama3",
    ),
    "mistral-v0.3": Model(
        "mistralai-Mistral-7B-Instruct-v0.3.jinja", "<s>", "</s>", True, kind="mistral"
    ),
    "gemma2": Model("google-gemma-2-2b-it.jinja", "<bos>", "<eos>", True, False, "gemma"),
    "gemma3": Model("google-gemma-3-4b-it.jinja", "<bos>", "<eos>", True, kind="gemma"),
    "phi3.5": Model(
        "microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>", True, kind="phi"
    ),
    "phi4-mini": Model(
        "microsoft-Phi-4-mini-instruct.jinja", "<|endoftext|>", "<|endoftext|>", kind="phi"
    ),
    "deepseek-r1-distill": Model(
        "deepseek-ai-DeepSeek-R1-Distill.jinja",
        "<｜begin▁of▁sentence｜>",
        DS_EOS,
        True,
        kind="deepseek",
    ),
    "smollm3": Model("HuggingFaceTB-SmolLM3-3B.jinja", eos="<|im_end|>", kind="smollm3"),
    # Chat formats no family here ships, each added to core/use/ollama/formats as one module.
    "llama4": Model(
        "meta-llama-Llama-4-Scout-17B-16E-Instruct.jinja",
        "<|begin_of_text|>",
        "<|eot|>",
        True,
        kind="llama4",
    ),
    "mistral-small-3.1": Model(
        "mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja",
        "<s>",
        "</s>",
        True,
        kind="mistral_small",
    ),
    "granite4": Model("ibm-granite-granite-4.0-micro.jinja", eos="<|end_of_text|>", kind="granite"),
    "gpt-oss": Model("openai-gpt-oss-120b.jinja", eos="<|return|>", kind="harmony"),
    "qwen3.5": Model("Qwen-Qwen3.5-35B-A3B.jinja", eos="<|im_end|>", kind="qwen3_5"),
    "gemma4-31b": Model("google-gemma-4-31B-it.jinja", "<bos>", "<eos>", True, kind="gemma4"),
    "gemma4-e2b": Model("google-gemma-4-E2B-it.jinja", "<bos>", "<eos>", True, kind="gemma4"),
}


def m(role, content):
    return {"role": role, "content": content}


SYS = 'You are terse. Quote "exactly" and keep {{ .braces }} as text.'
# The four shapes the issue names, and two more.
SHAPES = {
    "single-turn": [m("user", "Hello, how are you?")],
    "system": [m("system", SYS), m("user", "Hello, how are you?")],
    "multi-turn": [
        m("system", SYS),
        m("user", "Name a colour."),
        m("assistant", "Blue."),
        m("user", "Another?"),
        m("assistant", "Red."),
        m("user", 'One more, in JSON: {"c": ...}'),
    ],
    "assistant-last": [
        m("system", SYS),
        m("user", "Name a colour."),
        m("assistant", "Blue."),
        m("user", "Another?"),
        m("assistant", "Gre"),
    ],
    "no-system-turns": [
        m("user", "Hello, how are you?"),
        m("assistant", "Fine, thanks.\nAnd you?"),
        m("user", "Show me {{ .Prompt }} and </s> as text."),
    ],
    "prefill": [m("user", "Count to three."), m("assistant", "One, two")],
}


def shapes_for(model: Model) -> dict:
    return {
        name: msgs
        for name, msgs in SHAPES.items()
        if model.system or not any(x["role"] == "system" for x in msgs)
    }


def transformers_prompt(template: str, messages: list[dict], bos="", eos="", **extra) -> str:
    """The text transformers' apply_chat_template gives: the generation prompt after a user
    turn, a last assistant message continued (continue_final_message)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    cont = messages[-1]["role"] == "assistant"
    rendered, _ = render_jinja_template(
        [messages],
        chat_template=template,
        add_generation_prompt=not cont,
        continue_final_message=cont,
        bos_token=bos,
        eos_token=eos,
        **extra,
    )
    return rendered[0]
