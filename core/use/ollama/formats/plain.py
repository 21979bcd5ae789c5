"""No chat template (a base model): Ollama feeds it the raw prompt."""

from __future__ import annotations

from core.use.ollama.formats.base import ChatFormat
from core.use.ollama.layout import Layout


class Plain(ChatFormat):
    def found_in(self, jinja_template: str) -> bool:
        return not jinja_template.strip()

    def prompt(self, lay: Layout, messages: list[dict]) -> str:
        # Ollama runs {{ .Prompt }}{{ .Response }} turn by turn.
        return "".join(m["content"] for m in messages if m["role"] in ("user", "assistant"))

    def go_template(self, lay: Layout) -> str:
        return "{{ .Prompt }}"

    def takes_system(self, lay: Layout) -> bool:
        return False


FORMAT = Plain(name="plain", display="none", markers=(), canonical=Layout("plain"))
