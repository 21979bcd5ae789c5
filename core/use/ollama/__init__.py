"""Ollama: a Modelfile for an exported GGUF, so Ollama prompts the model as it was trained.

Ollama takes a GGUF's chat template only when it is nearly identical to one it knows; any other
model runs with the bare `{{ .Prompt }}` and no stop strings, so it never stops and prints the
next turn's markers. The Modelfile written here carries a TEMPLATE in Ollama's Go template
syntax that renders a conversation exactly as the model's Jinja chat template does
(add_generation_prompt=True; an assistant message last is continued, as transformers'
continue_final_message does), one PARAMETER stop per end-of-turn mark, and an optional SYSTEM.

Templates are told apart by their markers (template_kind): each chat format is one module in
formats/ (ChatML, Llama 3, Mistral [INST], Gemma, Phi, DeepSeek-R1, ..., or none: "plain", a
base model). Within a format, the pieces that vary between models (the text around each turn,
a default system prompt, Llama 3.1's date header, TrainDeck's EOS after each answer,
Mistral's spacing and where it puts the system prompt, the <think> block, the tools block)
are read off the Jinja template by
rendering probe conversations, and the Go template built from them is checked against the
Jinja renders of several conversations: a template that does not fit is refused with a one-line
error rather than exported with a prompt format the model never saw. The stages are modules:
probe.py (rendering probe conversations, reading the pieces off), layout.py (the pieces, and
the prompt they give), gotemplate.py (writing the Go template); template.py runs them,
modelfile.py writes the Modelfile.

Recent Ollama compares capabilities (server/images.go shouldPreferChatTemplate): where the GGUF's
own template has tools or thinking and the TEMPLATE has fewer, it renders with the GGUF's
template instead. So where the model's template takes tools or <think> blocks the TEMPLATE has
them too: .Tools, tool calls and tool results (.ToolCalls, role "tool") where the model's
template writes them, and .Thinking inside range .Messages between <think> tags, plus the
template's enable_thinking=False form for a request with think off.

What a Go template cannot do is listed by differences(): message text is written as given,
where Llama 3, Gemma and SmolLM3 strip whitespace from it; a date a template computes is
Ollama's currentDate, always YYYY-MM-DD; Ollama merges consecutive messages of one role and puts
the Modelfile's SYSTEM first when a conversation has no system message; tool JSON is Ollama's
compact JSON.
"""

from __future__ import annotations

from core.use.ollama import formats
from core.use.ollama.layout import Layout, OllamaError
from core.use.ollama.modelfile import create_command, layout_of, modelfile, modelfile_of
from core.use.ollama.probe import has_thinking, has_tools, jinja_prompt
from core.use.ollama.template import (
    capabilities,
    differences,
    expected_prompt,
    go_template,
    layout,
    stop_tokens,
    takes_system,
    template_kind,
)

__all__ = [
    "Layout",
    "OllamaError",
    "capabilities",
    "create_command",
    "differences",
    "expected_prompt",
    "formats",
    "go_template",
    "has_thinking",
    "has_tools",
    "jinja_prompt",
    "layout",
    "layout_of",
    "modelfile",
    "modelfile_of",
    "stop_tokens",
    "takes_system",
    "template_kind",
]
