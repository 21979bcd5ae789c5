"""The data line the window shows under Data and the CLI prints before a run ("Chat data: 1,200
examples ..."), and a table's preview: computed here, from a TrainConfig, without preparing
anything (a chat file's examples are read to count them, as the window always did)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.config import methods
from core.config.methods.base import PROMPTS
from core.config.spec import TrainConfig
from core.data import hub, preference, prompts, tables
from core.data.chatdata import is_chat
from core.errors import UserError


def describe_chat(cfg: TrainConfig, tokenizer=None) -> str:
    """Chat data's shapes, examples and those longer than the context, in the tokenizer the
    run will use (bytes until a BPE is learned: an upper bound)."""
    from core.data.chat import render_vars, template_of, thinking_vars
    from core.data.chatdata import summary
    from core.data.sources import find_sources
    from core.data.tokenizer import bytes_tokenizer

    tokenizer = tokenizer or bytes_tokenizer()
    files = find_sources(cfg.data, cfg.data_extensions, 0, chat=True).files
    columns = tables.columns_of(cfg)
    template = template_of(tokenizer)
    tokens = {**render_vars(tokenizer), **thinking_vars(template, cfg.thinking)}
    if preference.holds_pairs(files, columns):

        def render(prompt, answer):
            return len(preference.encode_side(tokenizer, template, prompt, answer, tokens)[0])

        line = preference.summary(files, columns, cfg.seq_len, render)
        return line[0].upper() + line[1:]
    columns = tables.columns_of(cfg)
    line = summary(files, cfg.seq_len, tokenizer, template, tokens, cfg.drop_long, columns)
    note = "" if cfg.train_on_prompts else "; loss on answers only"
    return line[0].upper() + line[1:] + note


def describe_data(cfg: TrainConfig, tokenizer=None) -> str:
    if cfg.data is None:
        return f"Embedded corpus: the first {cfg.corpus_max_bytes / 1e6:.1f} MB of Python's stdlib"
    path = Path(cfg.data).expanduser()
    try:
        if is_chat(cfg.data, cfg.data_format, cfg.data_extensions, tables.columns_of(cfg)):
            return describe_chat(cfg, tokenizer)
        if path.is_file() and tables.is_table(path):
            return f"{path.stat().st_size / 1e6:,.1f} MB table: its text column, a document a row"
        if path.is_file():
            return f"{path.stat().st_size / 1e6:,.1f} MB, used whole"
        if path.is_dir():
            exts = {e.lower() for e in cfg.data_extensions}
            files = [p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in exts]
            size = sum(p.stat().st_size for p in files)
            return f"{len(files):,} files, {size / 1e6:,.1f} MB, used whole"
    except OSError as e:
        return f"cannot read {path} ({e.strerror})"
    except UserError as e:
        return str(e)
    if hub.is_hub_id(cfg.data):
        return (
            f"Hugging Face dataset {cfg.data}, split {cfg.data_split}: downloaded into the "
            "Hugging Face cache when the run starts"
        )
    return "not found"


def data_line(cfg: TrainConfig, tokenizer=None) -> str:
    """describe_data (GRPO: its prompt file), and what a mix adds: the window's line under
    Data."""
    if methods.of(cfg).data == PROMPTS and cfg.data:
        text = prompts.describe(cfg.data)
    else:
        text = describe_data(cfg, tokenizer)
    return text + ("; " + describe_mix(cfg) if cfg.extra_data else "")


def cli_data_line(cfg: TrainConfig, tokenizer=None) -> str:
    """The data line as the command line prints it: named, for the lines that do not say
    what they describe (a size)."""
    text = data_line(cfg, tokenizer)
    return text if text[:1].isupper() else f"Data: {cfg.data}: {text}"


def describe_mix(cfg: TrainConfig) -> str:
    """What a mix of sources adds to the data line."""
    n = len(cfg.extra_data)
    how = f"weights {cfg.data_weights}" if cfg.data_weights else "shares by training tokens"
    return f"mixed with {n} more source{'s' if n > 1 else ''} ({how})"


def previewed_file(cfg: TrainConfig) -> Path | None:
    """The table a preview shows: the data file, or a folder's first table."""
    if cfg.data is None:
        return None
    path = Path(cfg.data).expanduser()
    if path.is_dir():
        path = next((f for f in sorted(path.rglob("*")) if tables.is_table(f)), path)
    return path if path.is_file() and tables.is_table(path) else None


def preview_data(cfg: TrainConfig) -> str:
    """A table's layout, column mapping and first rows (the first table of a folder); empty
    for text files and the embedded corpus."""
    path = Path(cfg.data).expanduser() if cfg.data is not None else None
    try:
        path = previewed_file(cfg)
        if path is None:
            return ""
        return tables.preview(path, tables.columns_of(cfg), width=70)
    except OSError as e:
        return f"cannot read {path} ({e.strerror})"
    except UserError as e:
        return str(e)


@dataclass(frozen=True)
class PreviewImage:
    """An image a previewed row names: as written, its file (None where it names none that
    can be read), and what is wrong with the name ("" when nothing)."""

    name: str
    path: Path | None
    problem: str = ""


def preview_images(cfg: TrainConfig, n: int = 3) -> list[list[PreviewImage]]:
    """The images of each row preview_data shows (paths relative to the data file), in order;
    empty rows for a file without images, an empty list for no preview."""
    from core.data import images

    try:
        path = previewed_file(cfg)
        records = tables.first_records(path, tables.columns_of(cfg), n) if path else []
    except (OSError, UserError):
        return []
    rows = []
    for record in records:
        row = []
        for name in tables.record_images(record):
            try:
                row.append(PreviewImage(name, images.image_path(name, path.parent)))
            except images.ImageProblem as e:
                row.append(PreviewImage(name, None, f"{name} {e}"))
        rows.append(row)
    return rows
