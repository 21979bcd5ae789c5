"""--format ollama: a folder Ollama imports as it is: the GGUF and a Modelfile whose TEMPLATE
renders conversations exactly as the model's chat template does, with a stop parameter per
end-of-turn token (without them the model runs past its answer)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from core.use import ollama
from core.use.common import ExportError
from core.use.gguf_export import export_gguf
from core.weights.loader import Loaded


def export_ollama(
    loaded: Loaded, folder: Path, quant: str, system, log, progress=None, projector=None
) -> dict:
    """projector: the projector file's name (a composite's towers), a second FROM line."""
    tok = loaded.tokenizer
    # First, so a template Ollama cannot be given exactly is refused before the GGUF is written.
    text = ollama.modelfile_of(tok, "model.gguf", system, projector)
    report = export_gguf(loaded, folder, quant, log, progress, chat=True)
    (folder / "Modelfile").write_text(text, encoding="utf-8")
    lay = ollama.layout_of(tok)
    stops = ollama.stop_tokens(lay.kind, tok)
    name = ollama.formats.get(lay.kind).display
    log(f"ollama: Modelfile with the {name} template, stop at {', '.join(stops)}")
    caps = ollama.capabilities(lay)
    fmt = ollama.formats.get(lay.kind)
    renderer, parser = fmt.renderer(lay), fmt.parser(lay)
    if renderer:  # Ollama renders with its own code and never reads the TEMPLATE
        log(
            f"ollama: Ollama renders prompts with its built-in {renderer} renderer (RENDERER) "
            f"and reads thinking and tool calls with its {parser} parser (PARSER); the "
            "TEMPLATE is kept for reference only"
        )
    elif parser:
        log(
            f"ollama: Ollama reads thinking and tool calls out of the replies with its "
            f"built-in {parser} parser (PARSER); the TEMPLATE renders the prompts"
        )
    if caps and not renderer:  # recent Ollama prefers the GGUF's template if it has more
        log(
            f"ollama: the TEMPLATE takes {' and '.join(caps)} as the model's template does, "
            "so Ollama uses it rather than the GGUF's template"
        )
    differences = ollama.differences(lay, tok.chat_template or "")
    for line in differences:
        log(f"ollama: differs from the model's template: {line}")
    return {
        **report,
        "template": lay.kind,
        "stops": stops,
        "renderer": renderer,
        "parser": parser,
        "differences": differences,
    }


def ollama_create(name: str, folder: Path) -> str:
    """Run `ollama create NAME -f Modelfile`; its output, or one line saying what failed."""
    command = ollama.create_command(name, Path(folder))
    if shutil.which("ollama") is None:
        raise ExportError(
            "ollama-create: ollama is not on PATH; install it or run: " + " ".join(command)
        )
    done = subprocess.run(command, capture_output=True, text=True, cwd=folder)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ExportError(f"ollama-create: ollama create {name} failed: {tail[0]}")
    return done.stdout.strip()
