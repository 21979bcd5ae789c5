"""Gemma 4: <|turn>role ... <turn|>, the answer's turn named model, the system prompt a turn of
its own. Thinking is off unless asked for (enable_thinking): then a <|think|> line opens a
system turn, and reasoning is written on the thought channel (<|channel>thought\\n ...
<channel|>). With thinking off the 26B/31B templates end the generation prompt with an empty
thought channel, the E2B/E4B ones do not. Ollama renders Gemma 4 with its own gemma4
renderer and parser (set on `ollama create` for a gemma4 GGUF, size-dependent), which the
Modelfile names so the right one of the two is used."""

from __future__ import annotations

from dataclasses import replace

from core.use.ollama.formats.base import ChatFormat
from core.use.ollama.layout import A1, U1, Layout, turns
from core.use.ollama.layout import THINKING as _T
from core.use.ollama.probe import msg

_EMPTY_THOUGHT = "<|channel>thought\n<channel|>"


class Gemma4(ChatFormat):
    def probe(self, jinja, jinja_template: str, bos: str) -> Layout:
        """The generic probe, and the thought channel around a last answer's reasoning."""
        lay = super().probe(jinja, jinja_template, bos)
        reasoned = jinja([msg("user", U1), {**msg("assistant", A1), "reasoning_content": _T}])
        seg = reasoned[reasoned.rindex(lay.last_open) + len(lay.last_open) : reasoned.index(A1)]
        if _T not in seg:
            return lay
        return replace(lay, think=(seg[: seg.index(_T)], seg[seg.index(_T) + len(_T) :]))

    def renderer(self, lay: Layout) -> str:
        off = lay.think_off or lay
        return "gemma4-large" if off.gen.endswith(_EMPTY_THOUGHT) else "gemma4-small"

    def parser(self, lay: Layout) -> str:
        return "gemma4"


FORMAT = Gemma4(
    name="gemma4",
    display="Gemma 4",
    markers=("<|turn>", "<turn|>"),
    role_marks=("<|turn>user", "<|turn>model"),
    stops=("<turn|>", "<|turn>"),
    canonical=turns(
        "gemma4",
        "<|turn>user\n",
        "<|turn>model\n",
        "<turn|>\n",
        system_open="<|turn>system\n",
        system_close="<turn|>\n",
    ),
    tools_unwritten=True,
    notes=(
        "with think unset the TEMPLATE thinks (the <|think|> system line), as Ollama asks a "
        "model that can think to; the model's template thinks only with enable_thinking",
        "tool definitions, calls and results are not written (Gemma 4 writes them in its own "
        "declaration:/call: syntax); Ollama's gemma4 renderer, which the Modelfile names and "
        "Ollama uses instead of the TEMPLATE, writes them",
    ),
)
