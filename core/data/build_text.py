"""The builder of plain-text cache entries: text files, folders, the embedded corpus and a
table's text column, read in blocks (memory stays flat whatever the size), split into
training and held-out bytes, tokenized (bytes, a BPE learned here, a pretrained model's) into
one flat token file."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np

from core.data import tables
from core.data.cache import DataSpec, Progress, commit, discard, manifest_of, temp_entry
from core.data.tokenizer import Tokenizer, bytes_tokenizer, train_bpe
from core.errors import DataError

BLOCK = 4 << 20  # bytes read per chunk: memory stays flat whatever the corpus size


BPE_SAMPLE_BYTES = 100 << 20  # BPE learns its merges from at most this much training text


DOC_END = object()  # a marker between documents (files), where a pretrained model's EOS goes


def read_blocks(files: list[Path], limit: int, doc_ends: bool = False):
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


def _bpe_sample(spec: DataSpec, train_bytes: int):
    limit = min(train_bytes, BPE_SAMPLE_BYTES)
    return _line_chunks(_blocks(spec, limit))


def _table_blocks(spec: DataSpec, limit: int, doc_ends: bool = False):
    """read_blocks for tables: each row's text (a document: DOC_END after it with doc_ends,
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
    return read_blocks(spec.sources.files, limit, doc_ends)


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


def _write_tokens(f, tok: Tokenizer, pieces, progress: Progress, hasher) -> dict:
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


def build_text(spec: DataSpec, listing, target: Path, tokenizer, progress_cb, cancelled, log):
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
        progress = Progress(progress_cb, cancelled, sample, "learning BPE")

        def counted(chunks):
            for c in chunks:
                progress.advance(len(c))
                yield c

        tokenizer = train_bpe(counted(_bpe_sample(spec, train_bytes)), spec.vocab_size)
    tokenizer = tokenizer or bytes_tokenizer()
    tmp = temp_entry(target)
    try:
        progress = Progress(progress_cb, cancelled, used, "tokenizing")
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
        manifest = manifest_of(spec, listing, tokenizer, content, seconds)
        manifest.update(source_bytes=used, **counts)
        commit(tmp, target, manifest)
    except BaseException as e:
        discard(tmp, target, e)
        raise
    return manifest
