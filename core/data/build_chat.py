"""The builders of chat and preference-pair cache entries: examples read and rendered with
the model's chat template, answers masked, packed into rows of seq_len + 1 tokens (pairs: two
rows a pair), written with their masks."""

from __future__ import annotations

import functools
import hashlib
import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from core.data import chatdata, images, preference
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
    pairs: list = examples.conversations  # (prompt, chosen, rejected) each
    prompts = SimpleNamespace(conversations=[p for p, _, _ in pairs], origins=examples.origins)
    _text_only(spec, prompts)  # an image for a model without a vision tower: one line
    if examples.outside:
        log(f"data: image {examples.outside[0]} lies outside the data folder (through ..)")
    has_images = any(images.conversation_images(p) for p in prompts.conversations)
    tmp = temp_entry(target) if has_images else None
    try:
        return _pair_rows(
            spec, listing, target, tokenizer, examples, has_images, tmp, progress_cb, cancelled, log
        )
    except BaseException as e:
        if tmp is not None:
            discard(tmp, target, e)
        raise


def _pair_rows(
    spec, listing, target, tokenizer, examples, has_images, tmp, progress_cb, cancelled, log
):
    chat, pairs = spec.chat, list(examples.conversations)
    tokenizer = _chat_tokenizer(spec, tokenizer, [p + c for p, c, _ in pairs], log)
    template, tokens = template_of(tokenizer), render_vars(tokenizer)
    held = held_out_split(len(pairs), spec.val_fraction, spec.sources.description)
    pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
    image_id = spec.images.token_id if has_images else -1
    out = {
        s: preference.PairRows(chat.seq_len + 1, pad, image_id=image_id) for s in ("train", "val")
    }
    pictures = Pictures(spec.images, tmp, False) if has_images else None
    progress = Progress(progress_cb, cancelled, sum(examples.sizes), "rendering pairs")
    t0 = time.perf_counter()
    for number, ((prompt, chosen, rejected), is_val, size) in enumerate(
        zip(pairs, held, examples.sizes, strict=True), 1
    ):
        origin = examples.origins[number - 1]
        files = images.conversation_images(prompt) if has_images else []
        expand, numbers, counts = None, [], []
        if files and pictures is not None:
            found = pictures.example(files, origin)
            assert found is not None  # a bad image stopped the build (skip_bad is off)
            numbers, counts = found
            expand = functools.partial(expand_marks, spec.images, counts, origin)
        try:
            sides = [
                preference.encode_side(tokenizer, template, prompt, a, tokens, expand)
                for a in (chosen, rejected)
            ]
        except TemplateError as e:
            raise refused_by_template(e, origin) from None
        for ids, _ in sides if files else ():
            _image_tokens_whole(ids, np.zeros(len(ids)), spec.images, sum(counts), origin)
        wrong = out["val" if is_val else "train"].add(sides[0], sides[1], numbers)
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
    if pictures is not None:  # each row's images: a pair's two rows show its prompt's
        extra.update(pictures.writer.finish(out["train"].row_images + out["val"].row_images))
    return _write_row_entry(spec, listing, target, tokenizer, rows, t0, extra, tmp)


def _write_row_entry(
    spec, listing, target: Path, tokenizer, rows: dict, t0: float, extra: dict, tmp=None
):
    """A cache entry of rows (chat examples, preference pairs): tokens, masks, tokenizer and
    the manifest with extra in it, committed whole or not at all. tmp: the entry's temporary
    folder where something is in it already (the images); extra's image_hash joins the
    content's."""
    tmp = tmp or temp_entry(target)
    try:
        counts = _write_rows(tmp, tokenizer, rows)
        tokenizer.save(tmp / "tokenizer.json")
        content = counts.pop("hash")
        if extra.get("image_hash"):  # the pixels are part of what the rows are
            content = hashlib.blake2b(
                f"{content}:{extra['image_hash']}".encode(), digest_size=16
            ).hexdigest()
        manifest = manifest_of(spec, listing, tokenizer, content, time.perf_counter() - t0)
        manifest.update(**counts, **extra)
        commit(tmp, target, manifest)
    except BaseException as e:
        discard(tmp, target, e)
        raise
    return manifest


class Pictures:
    """The images of a build: each file decoded, checked and processed once (core.data.images),
    written to the entry's store; bad ones named with their example's file and line."""

    def __init__(self, spec: images.ImageSpec, tmp: Path, skip_bad: bool):
        self.spec, self.skip_bad = spec, skip_bad
        self.writer = images.ImageWriter(tmp, spec)
        self.done: dict[str, tuple[int, int]] = {}  # path -> (image number, tokens)
        self.bad = 0
        self.first_bad = ""

    def example(self, files: list[str], origin: str):
        """(image numbers, token counts) of an example's images; None: skipped as bad."""
        numbers, counts = [], []
        for f in files:
            if f not in self.done:
                try:
                    pixels = images.resized(images.open_rgb(Path(f)), self.spec)
                except images.ImageProblem as e:
                    message = f"data: {origin}: image {f} {e}"
                    if not self.skip_bad:
                        raise DataError(
                            message + " (fix it, or pass --skip-bad-lines to skip such lines)"
                        ) from None
                    self.bad += 1
                    self.first_bad = self.first_bad or message
                    return None
                number = self.writer.add(Path(f), pixels, images.file_facts(Path(f)))
                self.done[f] = (number, images.image_tokens(self.spec, pixels))
            numbers.append(self.done[f][0])
            counts.append(self.done[f][1])
        return numbers, counts


def expand_marks(spec: images.ImageSpec, counts: list[int], origin: str, text: str, spans):
    """The rendered text with each image mark the template wrote made into the model's image
    tokens (as its processor does), and the answer spans moved with it."""
    try:
        expanded, shifts = images.marks_expanded(text, spec, counts)
    except images.ImageProblem as e:
        raise DataError(f"data: {origin}: {e}") from None

    def moved(p: int) -> int:
        return p + sum(d for start, d in shifts if start < p)

    return expanded, [(moved(a), moved(b)) for a, b in spans]


def _text_only(spec: DataSpec, examples) -> None:
    """The first image of data given to a model without a vision tower, in one line."""
    if spec.images is not None:
        return
    for messages, origin in zip(examples.conversations, examples.origins, strict=True):
        if (found := images.conversation_images(messages)) and spec.images_problem:
            raise DataError(f"data: {origin}: image {found[0]}: {spec.images_problem}")
        if found:
            raise DataError(
                f"data: {origin}: image {found[0]}: this model reads text only here (no "
                "vision tower TrainDeck runs); train on images with a vision model (Gemma 3 "
                "4B and up, Gemma 4, Qwen3-VL, Qwen3.5), or remove the image parts"
            )


def build_chat(spec: DataSpec, listing, target: Path, tokenizer, progress_cb, cancelled, log):
    chat = spec.chat
    if chat.pairs:
        return _build_pairs(spec, listing, target, tokenizer, progress_cb, cancelled, log)
    examples = chatdata.read_examples(spec.sources.files, chat.skip_bad_lines, columns=spec.columns)
    if examples.bad_lines:
        log(f"data: skipped {examples.bad_lines} bad line(s); the first: {examples.first_bad}")
    _text_only(spec, examples)
    if examples.outside:
        more = f" and {len(examples.outside) - 1} more" if len(examples.outside) > 1 else ""
        log(f"data: image {examples.outside[0]}{more} lies outside the data folder (through ..)")
    has_images = any(images.conversation_images(m) for m in examples.conversations)
    tmp = temp_entry(target) if has_images else None
    try:
        return _build_examples(
            spec, listing, target, tokenizer, examples, has_images, tmp, progress_cb, cancelled, log
        )
    except BaseException as e:
        if tmp is not None:
            discard(tmp, target, e)
        raise


def _build_examples(
    spec, listing, target, tokenizer, examples, has_images, tmp, progress_cb, cancelled, log
):
    chat = spec.chat
    conversations = examples.conversations
    tokenizer = _chat_tokenizer(spec, tokenizer, conversations, log)
    template, tokens = template_of(tokenizer), render_vars(tokenizer)
    held = held_out_split(len(conversations), spec.val_fraction, spec.sources.description)
    row = chat.seq_len + 1
    pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
    pictures = Pictures(spec.images, tmp, chat.skip_bad_lines) if has_images else None
    packers = {
        split: (
            chatdata.ImagePacker(
                row, pad, tokenizer.eos_id, chat.drop_long, image_id=spec.images.token_id
            )
            if has_images
            else chatdata.Packer(row, pad, tokenizer.eos_id, chat.drop_long)
        )
        for split in ("train", "val")
    }
    progress = Progress(progress_cb, cancelled, sum(examples.sizes), "rendering chat")
    t0 = time.perf_counter()
    notes: set = set()  # what the template does to the data (chat.REASONING_NOTE)
    for messages, is_val, size, origin in zip(
        conversations, held, examples.sizes, examples.origins, strict=True
    ):
        files = images.conversation_images(messages) if has_images else []
        expand, numbers = None, []
        if files:
            found = pictures.example(files, origin)
            if found is None:  # a bad image, skipped as its line
                progress.advance(size)
                continue
            numbers, counts = found
            expand = functools.partial(expand_marks, spec.images, counts, origin)
        try:
            ids, weights = chatdata.encode_example(
                tokenizer, template, messages, tokens, chat.train_on_prompts, notes, expand
            )
        except TemplateError as e:
            raise refused_by_template(e, origin) from None
        if files:
            _image_tokens_whole(ids, weights, spec.images, sum(counts), origin)
            packers["val" if is_val else "train"].add(ids, weights, numbers)
        else:
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
    if pictures is not None:
        if pictures.bad:
            log(
                f"data: skipped {pictures.bad} example(s) with a bad image; the first: "
                f"{pictures.first_bad}"
            )
        cut = sum(p.cut_images for p in packers.values())
        examples_info.update(cut_images=cut, bad_images=pictures.bad)
        if cut:
            log(
                f"data: {cut} example(s) longer than seq_len {chat.seq_len} were dropped: the "
                "cut would split an image's tokens; raise seq_len to keep them"
            )
        order = packers["train"].row_images + packers["val"].row_images
        extra.update(pictures.writer.finish(order))
    return _write_row_entry(spec, listing, target, tokenizer, rows, t0, extra, tmp)


def _image_tokens_whole(ids, weights, spec: images.ImageSpec, want: int, origin: str) -> None:
    """The image tokens as many as the images' embeddings (the tokenizer keeps the image
    token whole), and never scored."""
    got = int((ids == spec.token_id).sum())
    if got != want:
        raise DataError(
            f"data: {origin}: {got} image tokens ({spec.token!r}) after tokenizing, for "
            f"{want} image embeddings; the tokenizer does not keep the image token whole"
        )
    weights[ids == spec.token_id] = 0


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
