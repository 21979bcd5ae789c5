"""Preparing training data once: the sources (core.data.sources) are read, tokenized (bytes,
BPE, a pretrained model's tokenizer; chat examples rendered and masked) and written to a cache
folder as one flat token file plus a manifest, which training then reads in windows
(core.data.windows). A changed source file invalidates the entry; a half-written one is never
trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.data import chatdata, preference, tables
from core.data.chat import DEFAULT_STOP, DEFAULT_TEMPLATE, render, special_tokens, template_of
from core.data.sources import Sources, find_sources
from core.data.tokenizer import Tokenizer, bytes_tokenizer, train_bpe
from core.errors import DataError, DiskFullError, UserError
from core.platform.atomic import (
    TEMP_MARK,
    as_disk_full,
    free_bytes,
    fsync_dir,
    is_disk_full,
    temp_owner_alive,
    temp_sibling,
    writable_problem,
    write_text,
)

CACHE_FORMAT = 2  # 2: chat masks mark where each packed example starts
BLOCK = 4 << 20  # bytes read per chunk: memory stays flat whatever the corpus size
BPE_SAMPLE_BYTES = 100 << 20  # BPE learns its merges from at most this much training text
MB = 1 << 20


class PrepareCancelled(UserError):
    """The user stopped data preparation; nothing was left in the cache."""


def default_cache_dir() -> Path:
    env = os.environ.get("TRAINDECK_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("traindeck", appauthor=False)) / "data"


# -- preparation ---------------------------------------------------------------------------


@dataclass
class ChatSpec:
    """How chat examples become training rows (see core.data.chatdata)."""

    seq_len: int  # rows hold seq_len + 1 tokens: a window and its shifted targets
    train_on_prompts: bool = False
    drop_long: bool = False
    skip_bad_lines: bool = False
    pairs: bool = False  # preference pairs (method dpo): two rows a pair, not packed


@dataclass
class DataSpec:
    sources: Sources
    tokenizer: str  # "bytes" | "bpe"
    vocab_size: int
    val_fraction: float
    chat: ChatSpec | None = None  # None: plain text
    columns: dict = field(default_factory=dict)  # a table's column mapping (core.data.tables)
    table: bool = False  # plain text from the text column of table files, a document a row

    def key(self, listing: list[dict], template: str | None = None) -> str:
        body = {
            "format": CACHE_FORMAT,
            "files": listing,
            "cap": self.sources.cap,
            "tokenizer": self.tokenizer,
            "vocab_size": self.vocab_size if self.tokenizer == "bpe" else 256,
            "val_fraction": self.val_fraction,
        }
        if self.chat is not None:
            body["chat"] = {**vars(self.chat), "template": template}
        if self.table:
            body["table"] = True
        if self.columns:  # which column is the text or the answer decides the tokens
            body["columns"] = self.columns
        return hashlib.blake2b(json.dumps(body).encode(), digest_size=12).hexdigest()


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
        cfg.data, cfg.data_extensions, cfg.corpus_max_bytes, cfg.max_data_bytes,
        bool(chat) or table,
    )  # fmt: skip
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
    """Preference pairs go with DPO, and DPO with them: one line before anything is read."""
    pairs = chat is not None and chat.pairs
    if cfg.method == "dpo" and not pairs:
        kind = "chat examples" if chat is not None else "plain text"
        raise DataError(
            f"method: dpo learns from preference pairs (.jsonl lines with prompt, chosen and "
            f"rejected); {sources.description} holds {kind}"
        )
    if pairs and cfg.method != "dpo":
        raise DataError(
            f"data: {sources.description} holds preference pairs (prompt, chosen, rejected); "
            "train on them with method dpo (--method dpo)"
        )


def examples_line(manifest: dict) -> str:
    """What chat data came to, in one line without a label (empty for text)."""
    ex = manifest.get("examples")
    if not ex:
        return ""
    unit = ex.get("unit", "examples")
    line = f"{ex['train']:,} training and {ex['val']:,} held-out {unit}"
    notes = [
        f"{ex[k]:,} {word}"
        for k, word in (
            ("truncated", "truncated"),
            ("dropped", "dropped"),
            ("no_answer", "left without an answer by truncation (dropped)"),
            ("bad_lines", "bad lines skipped"),
        )
        if ex.get(k)
    ]
    scope = "every token" if manifest.get("train_on_prompts") else "answers only"
    if unit == "pairs":
        scope = "the answers of each pair"
    return f"{line}; loss on {scope}" + (f"; {', '.join(notes)}" if notes else "")


DOC_END = object()  # a marker between documents (files), where a pretrained model's EOS goes


def _read_blocks(files: list[Path], limit: int, doc_ends: bool = False):
    """Yield blocks of up to BLOCK bytes, limit bytes in all, empty files skipped; with
    doc_ends, DOC_END after each file that was read."""
    left = limit
    for path in files:
        if left <= 0:
            return
        read = 0
        try:
            with open(path, "rb") as f:
                while left > 0:
                    block = f.read(min(BLOCK, left))
                    if not block:
                        break
                    left -= len(block)
                    read += len(block)
                    yield block
        except OSError as e:
            raise DataError(f"data: cannot read {path} ({e.strerror or e})") from None
        if doc_ends and read:
            yield DOC_END


def _split_stream(blocks, train_bytes: int):
    """Re-cut a byte stream into ('train'|'val', block) pieces at the train/val boundary."""
    pos = 0
    for block in blocks:
        if block is DOC_END:  # belongs with the byte before it
            yield ("train" if pos <= train_bytes else "val"), block
            continue
        end = pos + len(block)
        if end <= train_bytes:
            yield "train", block
        elif pos >= train_bytes:
            yield "val", block
        else:
            cut = train_bytes - pos
            yield "train", block[:cut]
            yield "val", block[cut:]
        pos = end


def _line_chunks(blocks, size: int = 1 << 18):
    """Regroup blocks into chunks of about size bytes that end at a newline where one exists,
    so BPE never sees a word cut in two (a chunk with no newline is cut where it is)."""
    carry = b""
    for block in blocks:
        if block is DOC_END:
            if carry:
                yield carry
            carry = b""
            yield DOC_END
            continue
        buf = carry + block
        start = 0
        while len(buf) - start >= size:
            cut = buf.rfind(b"\n", start, start + size)
            cut = start + size if cut < 0 else cut + 1
            yield buf[start:cut]
            start = cut
        carry = buf[start:]
    if carry:
        yield carry


class _Progress:
    def __init__(self, callback, cancelled, total: int, phase: str):
        self.callback, self.cancelled = callback, cancelled
        self.total, self.phase, self.done = total, phase, 0

    def advance(self, n: int) -> None:
        self.done += n
        if self.cancelled is not None and self.cancelled():
            raise PrepareCancelled("data: preparation stopped; nothing was cached")
        if self.callback is not None:
            self.callback(self.phase, self.done, self.total)


def _bpe_sample(spec: DataSpec, train_bytes: int):
    limit = min(train_bytes, BPE_SAMPLE_BYTES)
    return _line_chunks(_blocks(spec, limit))


def _table_blocks(spec: DataSpec, limit: int, doc_ends: bool = False):
    """_read_blocks for tables: each row's text (a document: DOC_END after it with doc_ends,
    else a newline keeps rows apart), limit bytes in all."""
    left = limit
    for path in spec.sources.files:
        for text in _table_texts(path, spec.columns):
            if left <= 0:
                return
            data = text.encode("utf-8") + (b"" if doc_ends else b"\n")
            data = data[:left]
            left -= len(data)
            yield data
            if doc_ends:
                yield DOC_END


def _table_texts(path: Path, columns: dict):
    try:
        yield from tables.iter_texts(path, columns)
    except DataError as e:
        raise DataError(f"data: {e}") from None


def _table_bytes(spec: DataSpec, doc_ends: bool) -> int:
    """The bytes of text the rows hold (a first pass: the split needs the total)."""
    return sum(len(b) for b in _table_blocks(spec, 1 << 62, doc_ends) if b is not DOC_END)


def _blocks(spec: DataSpec, limit: int, doc_ends: bool = False):
    if spec.table:
        return _table_blocks(spec, limit, doc_ends)
    return _read_blocks(spec.sources.files, limit, doc_ends)


def _regroup(split_pieces):
    """BPE: each split's blocks regrouped at line ends (bytes pass blocks as they come)."""
    current, buf = None, []
    for split, block in split_pieces:
        if block is DOC_END:
            yield from ((current, c) for c in _line_chunks(buf))
            buf = []
            yield split, DOC_END
            continue
        if split != current and buf:
            yield from ((current, c) for c in _line_chunks(buf))
            buf = []
        current = split
        buf.append(block)
    if buf:
        yield from ((current, c) for c in _line_chunks(buf))


def _write_tokens(f, tok: Tokenizer, pieces, progress: _Progress, hasher) -> dict:
    """Tokenize the split stream into f; returns token and byte counts per split."""
    counts = {"train_tokens": 0, "val_tokens": 0, "train_bytes": 0, "val_bytes": 0}
    batch, batch_split = [], None

    def flush():
        nonlocal batch
        if not batch:
            return
        if tok.kind == "bytes":  # id == byte value: the text is its own token file
            for chunk in batch:
                f.write(chunk)
                counts[f"{batch_split}_tokens"] += len(chunk)
            batch = []
            return
        for ids in tok.encode_many(batch):
            f.write(ids.astype(tok.dtype).tobytes())
            counts[f"{batch_split}_tokens"] += len(ids)
        batch = []

    def special(split, token_id):
        flush()
        f.write(np.array([token_id], dtype=tok.dtype).tobytes())
        counts[f"{split}_tokens"] += 1

    # A pretrained model sees documents as it was trained to: BOS (if its tokenizer adds
    # one) before each, EOS after each.
    bos = tok.bos_id if tok.add_bos else None
    doc_start = True
    source = _regroup(pieces) if tok.kind != "bytes" else pieces
    for split, chunk in source:
        if chunk is DOC_END:
            if tok.eos_id is not None:
                special(split, tok.eos_id)
            doc_start = True
            continue
        if doc_start and bos is not None:
            special(split, bos)
        doc_start = False
        hasher.update(chunk)
        counts[f"{split}_bytes"] += len(chunk)
        if split != batch_split:
            flush()
            batch_split = split
        batch.append(chunk)
        if tok.kind == "bytes" or sum(map(len, batch)) >= 16 * (1 << 18):
            flush()
        progress.advance(len(chunk))
    flush()
    return counts


def _build(spec: DataSpec, listing, target: Path, tokenizer, progress_cb, cancelled, log):
    if spec.chat is not None:
        return _build_chat(spec, listing, target, tokenizer, progress_cb, cancelled, log)
    sizes = [f["size"] for f in listing]
    total = sum(sizes)
    doc_ends = tokenizer is not None and tokenizer.kind == "model"
    if spec.table:
        total = _table_bytes(spec, doc_ends)
        if not total:
            raise DataError(f"data: {spec.sources.description} holds no text in its text column")
    used = total if spec.sources.cap is None else min(total, spec.sources.cap)
    val_bytes = int(used * spec.val_fraction)
    train_bytes = used - val_bytes
    if tokenizer is None and spec.tokenizer == "bpe":
        sample = min(train_bytes, BPE_SAMPLE_BYTES)
        note = "" if sample == train_bytes else f" (a sample: the first {sample:,} bytes)"
        log(f"data: learning a {spec.vocab_size}-token BPE from {sample:,} bytes{note}")
        progress = _Progress(progress_cb, cancelled, sample, "learning BPE")

        def counted(chunks):
            for c in chunks:
                progress.advance(len(c))
                yield c

        tokenizer = train_bpe(counted(_bpe_sample(spec, train_bytes)), spec.vocab_size)
    tokenizer = tokenizer or bytes_tokenizer()
    tmp = _temp_entry(target)
    try:
        progress = _Progress(progress_cb, cancelled, used, "tokenizing")
        hasher = hashlib.blake2b(digest_size=16)
        t0 = time.perf_counter()
        with open(tmp / "tokens.bin", "wb") as f:
            blocks = _blocks(spec, used, doc_ends=tokenizer.kind == "model")
            pieces = _split_stream(blocks, train_bytes)
            counts = _write_tokens(f, tokenizer, pieces, progress, hasher)
            f.flush()
            os.fsync(f.fileno())
        seconds = time.perf_counter() - t0
        tokenizer.save(tmp / "tokenizer.json")
        content = hasher.hexdigest()
        manifest = _manifest(spec, listing, tokenizer, content, seconds)
        manifest.update(source_bytes=used, **counts)
        _commit(tmp, target, manifest)
    except BaseException as e:
        _discard(tmp, target, e)
        raise
    return manifest


def _manifest(spec: DataSpec, listing, tokenizer: Tokenizer, content: str, seconds: float):
    """What every cache entry's manifest says: its sources, tokenizer and fingerprints."""
    total = sum(f["size"] for f in listing)
    return {
        "format": CACHE_FORMAT,
        "source": spec.sources.description,
        "files": listing,
        "empty_files": sum(1 for f in listing if f["size"] == 0),
        "total_bytes": total,
        "source_bytes": total,
        "tokenizer": tokenizer.kind,
        "tokenizer_meta": tokenizer.meta or None,
        "vocab_size": tokenizer.vocab_size,
        "dtype": np.dtype(tokenizer.dtype).name,
        "val_fraction": spec.val_fraction,
        "content_fingerprint": content,
        "tokenizer_fingerprint": tokenizer.fingerprint(),
        "fingerprint": hashlib.blake2b(
            f"{content}:{tokenizer.fingerprint()}".encode(), digest_size=12
        ).hexdigest(),
        "prepare_seconds": round(seconds, 3),
        "created": time.time(),
    }


def _temp_entry(target: Path) -> Path:
    return temp_sibling(target)  # named after its owner: a later run knows when it is stale


def _commit(tmp: Path, target: Path, manifest: dict) -> None:
    write_text(tmp / "manifest.json", json.dumps(manifest, indent=1))
    fsync_dir(tmp)
    try:
        os.replace(tmp, target)  # the one step that makes the cache entry trusted
    except OSError:
        if not (target / "manifest.json").is_file():  # not a concurrent twin: a real error
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(target.parent)


def _discard(tmp: Path, target: Path, error: BaseException) -> None:
    """Remove a failed entry; a full disk is reported as such (raises DiskFullError)."""
    err = as_disk_full(error, target.parent)  # before the half-written files give space back
    shutil.rmtree(tmp, ignore_errors=True)
    if err is not error:
        raise err from error


def _chat_tokenizer(spec: DataSpec, tokenizer, conversations, log) -> Tokenizer:
    """The tokenizer, carrying the chat template the data is rendered with (the model's own,
    else the default, which then travels with the run and its exports)."""
    if tokenizer is None and spec.tokenizer == "bpe":
        tokens = {"bos_token": "", "eos_token": ""}
        texts = (render(DEFAULT_TEMPLATE, c, False, **tokens) for c in conversations)
        log(f"data: learning a {spec.vocab_size}-token BPE from {len(conversations):,} examples")
        tokenizer = train_bpe(texts, spec.vocab_size)
    tokenizer = tokenizer or bytes_tokenizer()
    meta = dict(tokenizer.meta)
    if not meta.get("chat_template"):
        meta["chat_template"] = DEFAULT_TEMPLATE
        if tokenizer.eos_id is None:  # no EOS closes an answer: its end mark does
            meta["stop_strings"] = [DEFAULT_STOP]
        log("data: the model has no chat template; using the default (ChatML) template")
    return Tokenizer(tokenizer.hf, tokenizer.kind, meta)


def held_out_split(n: int, val_fraction: float, source: str) -> list[bool]:
    """Which examples are held out for validation (at least one, never all)."""
    if n < 2:
        raise DataError(f"data: {source} holds {n} example; at least 2 are needed")
    held = [chatdata.is_val(i, val_fraction) for i in range(n)]
    if not any(held):
        held[-1] = True
    return held


def _build_pairs(spec: DataSpec, listing, target: Path, tokenizer, progress_cb, cancelled, log):
    """Preference pairs: each pair two rows (chosen, rejected) of seq_len + 1 tokens, the
    answers' tokens weighted; held-out pairs as for chat examples."""
    chat = spec.chat
    examples = chatdata.read_examples(
        spec.sources.files, chat.skip_bad_lines, preference.parse_pair, spec.columns
    )
    if examples.bad_lines:
        log(f"data: skipped {examples.bad_lines} bad line(s); the first: {examples.first_bad}")
    pairs = examples.conversations
    tokenizer = _chat_tokenizer(spec, tokenizer, [p + c for p, c, _ in pairs], log)
    template, tokens = template_of(tokenizer), special_tokens(tokenizer)
    held = held_out_split(len(pairs), spec.val_fraction, spec.sources.description)
    pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
    out = {s: preference.PairRows(chat.seq_len + 1, pad) for s in ("train", "val")}
    progress = _Progress(progress_cb, cancelled, sum(examples.sizes), "rendering pairs")
    t0 = time.perf_counter()
    for number, ((prompt, chosen, rejected), is_val, size) in enumerate(
        zip(pairs, held, examples.sizes, strict=True), 1
    ):
        sides = [preference.encode_side(tokenizer, template, prompt, a, tokens)
                 for a in (chosen, rejected)]  # fmt: skip
        wrong = out["val" if is_val else "train"].add(*sides)
        if wrong:
            raise DataError(
                f"data: pair {number} of {spec.sources.description}: {wrong} (seq_len "
                f"{chat.seq_len}); raise seq_len, or shorten its prompt"
            )
        progress.advance(size)
    rows = {split: list(zip(r.ids, r.weights, strict=True)) for split, r in out.items()}
    examples_info = {
        "unit": "pairs", "train": out["train"].pairs, "val": out["val"].pairs,
        "truncated": out["train"].truncated + out["val"].truncated,
        "bad_lines": examples.bad_lines, "seq_len": chat.seq_len,
    }  # fmt: skip
    extra = {"data_format": "preference", "row": chat.seq_len + 1, "examples": examples_info}
    return _write_row_entry(spec, listing, target, tokenizer, rows, t0, extra)


def _write_row_entry(spec, listing, target: Path, tokenizer, rows: dict, t0: float, extra: dict):
    """A cache entry of rows (chat examples, preference pairs): tokens, masks, tokenizer and
    the manifest with extra in it, committed whole or not at all."""
    tmp = _temp_entry(target)
    try:
        counts = _write_rows(tmp, tokenizer, rows)
        tokenizer.save(tmp / "tokenizer.json")
        content = counts.pop("hash")
        manifest = _manifest(spec, listing, tokenizer, content, time.perf_counter() - t0)
        manifest.update(**counts, **extra)
        _commit(tmp, target, manifest)
    except BaseException as e:
        _discard(tmp, target, e)
        raise
    return manifest


def _build_chat(spec: DataSpec, listing, target: Path, tokenizer, progress_cb, cancelled, log):
    chat = spec.chat
    if chat.pairs:
        return _build_pairs(spec, listing, target, tokenizer, progress_cb, cancelled, log)
    examples = chatdata.read_examples(spec.sources.files, chat.skip_bad_lines, columns=spec.columns)
    if examples.bad_lines:
        log(f"data: skipped {examples.bad_lines} bad line(s); the first: {examples.first_bad}")
    conversations = examples.conversations
    tokenizer = _chat_tokenizer(spec, tokenizer, conversations, log)
    template, tokens = template_of(tokenizer), special_tokens(tokenizer)
    held = held_out_split(len(conversations), spec.val_fraction, spec.sources.description)
    row = chat.seq_len + 1
    pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
    packers = {
        split: chatdata.Packer(row, pad, tokenizer.eos_id, chat.drop_long)
        for split in ("train", "val")
    }
    progress = _Progress(progress_cb, cancelled, sum(examples.sizes), "rendering chat")
    t0 = time.perf_counter()
    for messages, is_val, size in zip(conversations, held, examples.sizes, strict=True):
        ids, weights = chatdata.encode_example(
            tokenizer, template, messages, tokens, chat.train_on_prompts
        )
        packers["val" if is_val else "train"].add(ids, weights)
        progress.advance(size)
    rows = {split: p.finish() for split, p in packers.items()}
    for split in ("train", "val"):
        p = packers[split]
        if not rows[split]:
            raise DataError(
                f"data: no {split} example of {spec.sources.description} keeps an answer "
                f"within seq_len {chat.seq_len} ({p.dropped} too long, {p.no_answer} cut "
                "before their answer); raise seq_len"
            )
    examples_info = {
        "train": packers["train"].examples,
        "val": packers["val"].examples,
        **{
            k: sum(getattr(p, k) for p in packers.values())
            for k in ("truncated", "dropped", "no_answer")
        },
        "bad_lines": examples.bad_lines,
        "seq_len": chat.seq_len,
    }
    extra = {"data_format": "chat", "row": row, "examples": examples_info,
             "train_on_prompts": chat.train_on_prompts}  # fmt: skip
    return _write_row_entry(spec, listing, target, tokenizer, rows, t0, extra)


def _write_rows(folder: Path, tokenizer: Tokenizer, rows: dict) -> dict:
    """tokens.bin and mask.bin (one weight byte a token), train rows then validation rows;
    counts, with the bytes the weighted tokens stand for (bits per byte are of answers)."""
    hasher = hashlib.blake2b(digest_size=16)
    counts = {}
    lengths = np.array([len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size)])
    with open(folder / "tokens.bin", "wb") as f, open(folder / "mask.bin", "wb") as m:
        for split in ("train", "val"):
            n_tokens = n_weighted = n_bytes = 0
            for ids, weights in rows[split]:
                data = ids.astype(tokenizer.dtype).tobytes()
                f.write(data)
                m.write(weights.tobytes())
                hasher.update(data)
                hasher.update(weights.tobytes())
                n_tokens += len(ids)
                loss = weights[1:] & 1  # the START bit is not a weight
                n_weighted += int(loss.sum())
                n_bytes += int(lengths[ids[1:][loss > 0]].sum())
            counts[f"{split}_tokens"] = n_tokens
            counts[f"{split}_target_tokens"] = n_weighted
            counts[f"{split}_bytes"] = n_bytes
        for handle in (f, m):
            handle.flush()
            os.fsync(handle.fileno())
    counts["hash"] = hasher.hexdigest()
    return counts


def _read_manifest(folder: Path) -> dict | None:
    """The manifest if the entry is whole and consistent, else None."""
    try:
        m = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        expected = (m["train_tokens"] + m["val_tokens"]) * np.dtype(m["dtype"]).itemsize
        if m["format"] != CACHE_FORMAT or (folder / "tokens.bin").stat().st_size != expected:
            return None
        if not (folder / "tokenizer.json").is_file():
            return None
        if (
            "row" in m
            and (folder / "mask.bin").stat().st_size * np.dtype(m["dtype"]).itemsize != expected
        ):
            return None
        return m
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _clean_stale(cache: Path) -> None:
    """Remove temp folders of preparations whose process is gone (a crash or kill)."""
    import psutil

    for tmp in cache.glob(f".*{TEMP_MARK}*"):
        if not temp_owner_alive(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    for tmp in cache.glob(".tmp-*"):  # named before temp_sibling: by the process id alone
        try:
            pid = int(tmp.name.split("-")[-2])
        except (ValueError, IndexError):
            continue
        if not psutil.pid_exists(pid) or pid == os.getpid():
            shutil.rmtree(tmp, ignore_errors=True)


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
    key = spec.key(listing, template)
    if tokenizer is not None and tokenizer.kind != "bytes":
        key = (
            f"{key}-{tokenizer.fingerprint()}"  # the run's own BPE or the model's, not a fresh one
        )
    target = cache / key
    _clean_stale(cache)
    if target.exists():
        manifest = _read_manifest(target)
        if manifest is not None:
            return target, manifest
        log(f"data cache: {target} is damaged; rebuilding it")
        shutil.rmtree(target, ignore_errors=True)
    try:
        return target, _build(spec, listing, target, tokenizer, progress, cancelled, log)
    except OSError as e:
        if not is_disk_full(e):
            raise
        free = free_bytes(cache) or 0
        raise DiskFullError(
            f"disk full: no space left on the device holding the data cache {cache} while "
            f"preparing the data (nothing was cached; {free / 1e6:,.1f} MB free now); free some "
            "space, or prepare the data on another disk with --data-cache DIR (or TRAINDECK_CACHE)"
        ) from None
