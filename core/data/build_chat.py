"""The builders of chat and preference-pair cache entries: examples read and rendered with
the model's chat template, answers masked, packed into rows of seq_len + 1 tokens (pairs: two
rows a pair), written with their masks."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np

from core.data import chatdata, preference
from core.data.cache import DataSpec, Progress, commit, discard, manifest_of, temp_entry
from core.data.chat import (
    DEFAULT_STOP,
    DEFAULT_TEMPLATE,
    TemplateError,
    render,
    render_vars,
    template_of,
)
from core.data.tokenizer import Tokenizer, bytes_tokenizer, train_bpe
from core.errors import DataError


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


def refused_by_template(error: TemplateError, origin: str) -> DataError:
    """The template's own refusal (its raise_exception), with the example's file and line
    and what to do about it."""
    reason = str(error).removeprefix("chat template: ")
    hint = "fix the example, or use a model whose template takes it"
    if "system" in reason.lower():  # Gemma 2, Mistral v0.1: no system turn at all
        hint = (
            "this model's template takes no system message: remove it from the examples, or "
            "put its text at the start of the first user message"
        )
    elif "alternate" in reason.lower():
        hint = "this model's template needs turns that alternate user, assistant, user, ..."
    return DataError(f"data: {origin}: the model's chat template refused it ({reason}); {hint}")


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
    template, tokens = template_of(tokenizer), render_vars(tokenizer)
    held = held_out_split(len(pairs), spec.val_fraction, spec.sources.description)
    pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
    out = {s: preference.PairRows(chat.seq_len + 1, pad) for s in ("train", "val")}
    progress = Progress(progress_cb, cancelled, sum(examples.sizes), "rendering pairs")
    t0 = time.perf_counter()
    for number, ((prompt, chosen, rejected), is_val, size) in enumerate(
        zip(pairs, held, examples.sizes, strict=True), 1
    ):
        try:
            sides = [
                preference.encode_side(tokenizer, template, prompt, a, tokens)
                for a in (chosen, rejected)
            ]
        except TemplateError as e:
            raise refused_by_template(e, examples.origins[number - 1]) from None
        wrong = out["val" if is_val else "train"].add(*sides)
        if wrong:
            raise DataError(
                f"data: pair {number} of {spec.sources.description}: {wrong} (seq_len "
                f"{chat.seq_len}); raise seq_len, or shorten its prompt"
            )
        progress.advance(size)
    rows = {split: list(zip(r.ids, r.weights, strict=True)) for split, r in out.items()}
    examples_info = {
        "unit": "pairs",
        "train": out["train"].pairs,
        "val": out["val"].pairs,
        **{
            k: getattr(out["train"], k) + getattr(out["val"], k)
            for k in ("truncated", "cut_tokens")
        },
        "longest": max(out["train"].longest, out["val"].longest),
        "bad_lines": examples.bad_lines,
        "seq_len": chat.seq_len,
    }
    extra = {"data_format": "preference", "row": chat.seq_len + 1, "examples": examples_info}
    return _write_row_entry(spec, listing, target, tokenizer, rows, t0, extra)


def _write_row_entry(spec, listing, target: Path, tokenizer, rows: dict, t0: float, extra: dict):
    """A cache entry of rows (chat examples, preference pairs): tokens, masks, tokenizer and
    the manifest with extra in it, committed whole or not at all."""
    tmp = temp_entry(target)
    try:
        counts = _write_rows(tmp, tokenizer, rows)
        tokenizer.save(tmp / "tokenizer.json")
        content = counts.pop("hash")
        manifest = manifest_of(spec, listing, tokenizer, content, time.perf_counter() - t0)
        manifest.update(**counts, **extra)
        commit(tmp, target, manifest)
    except BaseException as e:
        discard(tmp, target, e)
        raise
    return manifest


def build_chat(spec: DataSpec, listing, target: Path, tokenizer, progress_cb, cancelled, log):
    chat = spec.chat
    if chat.pairs:
        return _build_pairs(spec, listing, target, tokenizer, progress_cb, cancelled, log)
    examples = chatdata.read_examples(spec.sources.files, chat.skip_bad_lines, columns=spec.columns)
    if examples.bad_lines:
        log(f"data: skipped {examples.bad_lines} bad line(s); the first: {examples.first_bad}")
    conversations = examples.conversations
    tokenizer = _chat_tokenizer(spec, tokenizer, conversations, log)
    template, tokens = template_of(tokenizer), render_vars(tokenizer)
    held = held_out_split(len(conversations), spec.val_fraction, spec.sources.description)
    row = chat.seq_len + 1
    pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
    packers = {
        split: chatdata.Packer(row, pad, tokenizer.eos_id, chat.drop_long)
        for split in ("train", "val")
    }
    progress = Progress(progress_cb, cancelled, sum(examples.sizes), "rendering chat")
    t0 = time.perf_counter()
    notes: set = set()  # what the template does to the data (chat.REASONING_NOTE)
    for messages, is_val, size, origin in zip(
        conversations, held, examples.sizes, examples.origins, strict=True
    ):
        try:
            ids, weights = chatdata.encode_example(
                tokenizer, template, messages, tokens, chat.train_on_prompts, notes
            )
        except TemplateError as e:
            raise refused_by_template(e, origin) from None
        packers["val" if is_val else "train"].add(ids, weights)
        progress.advance(size)
    for note in sorted(notes):
        log(note)
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
            for k in ("truncated", "dropped", "no_answer", "cut_tokens")
        },
        "longest": max(p.longest for p in packers.values()),
        "bad_lines": examples.bad_lines,
        "seq_len": chat.seq_len,
    }
    extra = {
        "data_format": "chat",
        "row": row,
        "examples": examples_info,
        "train_on_prompts": chat.train_on_prompts,
    }
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
