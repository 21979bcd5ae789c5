"""Preparing training data once: the sources (core.data.sources) are read, tokenized (bytes,
BPE, a pretrained model's tokenizer; chat examples rendered and masked) and written to a cache
folder as one flat token file plus a manifest, which training then reads in windows
(core.data.windows). A changed source file invalidates the entry; a half-written one is never
trusted. What to prepare (DataSpec, data_spec) and the cache lookup live here; one builder a
data kind writes the entry (core.data.build_text, core.data.build_chat) through the cache's one
transaction (core.data.cache).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from core.config import methods
from core.config.methods.base import PAIRS
from core.data import chatdata, images, preference, tables
from core.data.build_chat import build_chat, held_out_split  # noqa: F401 (held_out_split: report)
from core.data.build_text import build_text
from core.data.cache import (  # noqa: F401 (Progress, PrepareCancelled: the trainer, tests)
    CACHE_FORMAT,
    ChatSpec,
    DataSpec,
    PrepareCancelled,
    Progress,
    clean_stale,
    default_cache_dir,
    read_manifest,
)
from core.data.chat import DEFAULT_TEMPLATE, template_of
from core.data.sources import Sources, find_sources
from core.data.tokenizer import Tokenizer
from core.errors import DataError, DiskFullError
from core.platform.atomic import free_bytes, is_disk_full, writable_problem


def data_spec(cfg) -> DataSpec:
    """What a TrainConfig says to prepare: its sources, tokenizer and (for chat) packing."""
    chat = None
    fmt = "chat" if cfg.data_format == "preference" else cfg.data_format
    columns = tables.columns_of(cfg)
    tables.check_columns(columns)
    if chatdata.is_chat(cfg.data, fmt, cfg.data_extensions, columns):
        if cfg.data is None:
            raise DataError(f"data_format: {fmt} needs data, a .jsonl file or a folder of them")
        chat = ChatSpec(cfg.seq_len, cfg.train_on_prompts, cfg.drop_long, cfg.skip_bad_lines)
    table = chat is None and _text_table(cfg.data, cfg.data_format, cfg.data_extensions)
    sources = find_sources(
        cfg.data,
        cfg.data_extensions,
        cfg.corpus_max_bytes,
        cfg.max_data_bytes,
        bool(chat) or table,
    )
    if chat is not None:
        chat.pairs = cfg.data_format == "preference" or preference.holds_pairs(
            sources.files, columns
        )
    _check_method(cfg, chat, sources)
    return DataSpec(sources, cfg.tokenizer, cfg.vocab_size, cfg.val_fraction, chat, columns, table)


def _text_table(data: str | None, data_format: str, text_extensions: list[str]) -> bool:
    """Plain text read from a table's text column: a .parquet, .csv or .json file (a .jsonl
    one too, except with data_format text, which reads it as it is), or a folder of them with
    none of the text endings."""
    if data is None:
        return False
    p = Path(data).expanduser()
    if p.is_dir():
        found = {f.suffix.lower() for f in p.rglob("*") if f.is_file()}
        return bool(found & set(tables.TABLE_SUFFIXES)) and not (
            found & {e.lower() for e in text_extensions}
        )
    raw_jsonl = p.suffix.lower() == ".jsonl" and data_format == "text"
    return p.is_file() and tables.is_table(p) and not raw_jsonl


def _check_method(cfg, chat: ChatSpec | None, sources: Sources) -> None:
    """Preference pairs go with the method that takes pairs (DPO), and it with them: one
    line before anything is read."""
    pairs = chat is not None and chat.pairs
    takes_pairs = methods.of(cfg).data == PAIRS
    if takes_pairs and not pairs:
        kind = "chat examples" if chat is not None else "plain text"
        raise DataError(
            f"method: {cfg.method} learns from preference pairs (.jsonl lines with prompt, "
            f"chosen and rejected); {sources.description} holds {kind}"
        )
    if pairs and not takes_pairs:
        name = methods.taking(PAIRS).name
        raise DataError(
            f"data: {sources.description} holds preference pairs (prompt, chosen, rejected); "
            f"train on them with method {name} (--method {name})"
        )


def examples_line(manifest: dict) -> str:
    """What chat data came to, in one line without a label (empty for text)."""
    ex = manifest.get("examples")
    if not ex:
        return ""
    unit = ex.get("unit", "examples")
    line = f"{ex['train']:,} training and {ex['val']:,} held-out {unit}"
    long = "longest" in ex  # a chat entry of this version: cut and dropped in a sentence
    notes = [
        f"{ex[k]:,} {word}"
        for k, word in (
            *([] if long else [("truncated", "truncated"), ("dropped", "dropped")]),
            ("no_answer", "left without an answer by truncation (dropped)"),
            ("bad_lines", "bad lines skipped"),
        )
        if ex.get(k)
    ]
    scope = "every token" if manifest.get("train_on_prompts") else "answers only"
    if unit == "pairs":
        scope = "the answers of each pair"
    if long and (cut := long_examples(ex)):
        notes.insert(0, cut)
    return f"{line}; loss on {scope}" + (f"; {', '.join(notes)}" if notes else "")


def long_examples(ex: dict) -> str:
    """The manifest's examples longer than the context, in chatdata.long_line's sentence."""
    if ex.get("unit") == "pairs":
        total = ex["train"] + ex["val"]
        return preference.long_line(
            ex["truncated"], total, ex["seq_len"], ex["longest"], ex["cut_tokens"]
        )
    drop = bool(ex.get("dropped"))
    total = ex["train"] + ex["val"] + ex.get("dropped", 0) + ex.get("no_answer", 0)
    long = ex.get("dropped", 0) if drop else ex.get("truncated", 0)
    cut = ex.get("cut_tokens", 0)
    return chatdata.long_line(long, total, ex["seq_len"], ex["longest"], cut, drop)


def prepare(
    spec: DataSpec,
    cache_dir: Path | None = None,
    tokenizer: Tokenizer | None = None,
    progress=None,
    cancelled=None,
    log=print,
) -> tuple[Path, dict]:
    """Return (cache entry folder, manifest), preparing the entry unless a whole one exists.

    tokenizer: encode with this one (a resumed run's) instead of building one.
    progress(phase, done_bytes, total_bytes) is called as it goes; cancelled() -> True stops.
    """
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    problem = writable_problem(cache)  # made only when an entry is written
    if problem:
        raise DataError(f"data cache: {problem}")
    listing = spec.sources.listing()
    if not any(f["size"] for f in listing):
        raise DataError(f"data: {spec.sources.description} holds no text (every file is empty)")
    template = None
    if spec.chat is not None:  # the template is part of what the rows are
        template = template_of(tokenizer) if tokenizer is not None else DEFAULT_TEMPLATE
    thinking = tokenizer.meta.get("enable_thinking") if tokenizer is not None else None
    key = spec.key(listing, template, thinking)
    if tokenizer is not None and tokenizer.kind != "bytes":
        key = (
            f"{key}-{tokenizer.fingerprint()}"  # the run's own BPE or the model's, not a fresh one
        )
    target = cache / key
    clean_stale(cache)
    if target.exists():
        manifest = read_manifest(target)
        changed = images.changed_images(manifest.get("image_files", ())) if manifest else []
        if manifest is not None and not changed:
            return target, manifest
        if changed:  # the rows stay, but the pixels (and the fingerprint) would not be theirs
            more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
            log(
                f"data cache: images changed since it was prepared ({changed[0]}{more}); "
                "preparing again"
            )
        else:
            log(f"data cache: {target} is damaged; rebuilding it")
        shutil.rmtree(target, ignore_errors=True)
    try:
        build = build_text if spec.chat is None else build_chat  # one builder a data kind
        return target, build(spec, listing, target, tokenizer, progress, cancelled, log)
    except OSError as e:
        if not is_disk_full(e):
            raise
        free = free_bytes(cache) or 0
        raise DiskFullError(
            f"disk full: no space left on the device holding the data cache {cache} while "
            f"preparing the data (nothing was cached; {free / 1e6:,.1f} MB free now); free some "
            "space, or prepare the data on another disk with --data-cache DIR (or TRAINDECK_CACHE)"
        ) from None
