"""Instruction and chat data: examples rendered with a chat template, each token weighted 1
(an answer: it carries the loss) or 0 (system and user turns, template marks).

One example a record of a .jsonl, .json, .csv or .parquet file (core.data.tables; columns
renamed by --prompt-column etc., ShareGPT conversations as messages), in any of three shapes
(a file may mix them):
    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
    {"prompt": "...", "completion": "..."}
    {"instruction": "...", "input": "...", "output": "..."}   (Alpaca; input is optional)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.data import tables
from core.data.chat import answer_spans, conversation_text
from core.errors import DataError

ROLES = ("system", "user", "assistant")
# Image, audio and video in a record: OpenAI-style content parts (a list of {"type": ...}),
# and the image/audio columns of LLaMA-Factory's and TRL's vision datasets. Training is on
# text only, so these lines are refused (TrainDeck trains a multimodal model's text part).
MEDIA_PARTS = ("image", "image_url", "input_image", "audio", "input_audio", "video", "video_url")
MEDIA_KEYS = ("images", "image", "audios", "audio", "videos", "video")
NO_MEDIA = "training on image, audio or video is not supported yet; text only"
CHAT_SUFFIX = ".jsonl"
CHAT_SUFFIXES = tables.TABLE_SUFFIXES  # a folder of chat data: its files with these endings


class BadLine(ValueError):
    """What is wrong with one line (the caller adds the file and line number)."""


def _text(obj: dict, key: str, where: str = "") -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        got = "missing" if value is None else f"a {type(value).__name__}"
        raise BadLine(f"{where}{key!r} must be a string, got {got}")
    return value


def refuse_media(obj: dict) -> None:
    """BadLine for a record that carries images, audio or video (a column of them)."""
    for key in MEDIA_KEYS:
        if obj.get(key):
            raise BadLine(f"{key!r} holds media: {NO_MEDIA}")


def refuse_media_parts(m: dict, at: str) -> None:
    """BadLine for a message whose content parts hold an image, audio or video, by name."""
    parts = m.get("content")
    for n, part in enumerate(parts if isinstance(parts, list) else ()):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MEDIA_PARTS:
            raise BadLine(f"{at}.content[{n}] is of type {kind!r}: {NO_MEDIA}")


def _content(m: dict, at: str) -> str:
    refuse_media_parts(m, at)
    return _text(m, "content", f"{at}.")


def _messages(value, where: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise BadLine(f"{where} must be a non-empty list of {{role, content}} objects")
    out = []
    for n, m in enumerate(value):
        at = f"{where}[{n}]"
        if not isinstance(m, dict):
            raise BadLine(f"{at} must be an object with role and content")
        role = m.get("role")
        if role not in ROLES:
            raise BadLine(f"{at}.role is {role!r}; allowed: {', '.join(ROLES)}")
        out.append({"role": role, "content": _content(m, at)})
    return out


def shape_of(obj: dict) -> str:
    """Which of the three shapes a line has (parse_example checks it whole)."""
    if "messages" in obj:
        return "messages"
    if "chosen" in obj or "rejected" in obj:
        return "preference"
    if "prompt" in obj or "completion" in obj:
        return "prompt/completion"
    return "Alpaca"


def parse_example(obj) -> list[dict]:
    """One line's conversation as messages; BadLine says what is wrong."""
    if not isinstance(obj, dict):
        raise BadLine("expected a JSON object")
    refuse_media(obj)
    if "messages" in obj:
        messages = _messages(obj["messages"], "'messages'")
    elif "prompt" in obj or "completion" in obj:
        prompt, completion = obj.get("prompt"), obj.get("completion")
        if isinstance(prompt, list) or isinstance(completion, list):  # conversational form
            messages = _messages(prompt, "'prompt'") + _messages(completion, "'completion'")
        else:
            messages = [
                {"role": "user", "content": _text(obj, "prompt")},
                {"role": "assistant", "content": _text(obj, "completion")},
            ]
    elif "instruction" in obj or "output" in obj:
        extra = obj.get("input") or ""
        if not isinstance(extra, str):
            raise BadLine("'input' must be a string")
        instruction = _text(obj, "instruction")
        user = f"{instruction}\n\n{extra}" if extra.strip() else instruction
        messages = [{"role": "user", "content": user}]
        if isinstance(obj.get("system"), str) and obj["system"]:
            messages.insert(0, {"role": "system", "content": obj["system"]})
        messages.append({"role": "assistant", "content": _text(obj, "output")})
    else:
        raise BadLine(
            "no 'messages', 'prompt'/'completion' or 'instruction'/'output' field "
            f"(keys: {', '.join(map(str, obj)) or 'none'})"
        )
    if not any(m["role"] == "assistant" for m in messages):
        raise BadLine("no assistant message: nothing to learn from")
    return messages


@dataclass
class Examples:
    conversations: list[list[dict]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # each example's line length (progress)
    origins: list[str] = field(default_factory=list)  # each example's file and line (errors)
    shapes: dict = field(default_factory=dict)  # shape -> examples of it
    bad_lines: int = 0
    first_bad: str = ""


def read_examples(
    files: list[Path], skip_bad_lines: bool, parse=parse_example, columns: dict | None = None
) -> Examples:
    """Every example of the files (.jsonl, .json, .csv, .parquet: core.data.tables, with the
    column mapping), as parse makes it of a record (a conversation; a preference pair); a
    bad line or row stops with its file and number, or is counted and skipped."""
    out = Examples()

    def bad(path: Path, number: int, reason: str) -> None:
        message = f"data: {path} {tables.unit(path)} {number}: {reason}"
        if not skip_bad_lines:
            raise DataError(message + " (fix it, or pass --skip-bad-lines to skip such lines)")
        out.bad_lines += 1
        out.first_bad = out.first_bad or message

    for path in files:
        if path.suffix.lower() != CHAT_SUFFIX:  # a table's rows share columns: check once
            try:
                tables.require_layout(path, columns)
            except DataError as e:
                raise _labelled(e) from None
        for number, obj in _records(path, columns, lambda n, r, p=path: bad(p, n, r)):
            try:
                out.conversations.append(parse(obj))
            except BadLine as e:
                bad(path, number, str(e))
                continue
            out.sizes.append(_size(obj))
            out.origins.append(f"{path} {tables.unit(path)} {number}")
            shape = shape_of(obj)
            out.shapes[shape] = out.shapes.get(shape, 0) + 1
    if not out.conversations:
        raise DataError(
            f"data: no usable examples in {', '.join(map(str, files))} "
            f"({out.bad_lines} bad line(s) skipped)"
        )
    return out


def _records(path: Path, columns: dict | None, on_bad):
    """tables.iter_records, its errors labelled as the data's."""
    try:
        yield from tables.iter_records(path, columns, on_bad)
    except DataError as e:
        raise _labelled(e) from None


def _labelled(e: DataError) -> DataError:
    """A table's error as the data's, labelled once (a bad line is labelled already)."""
    text = str(e)
    return DataError(text if text.startswith("data: ") else f"data: {text}")


def _size(value) -> int:
    """About the characters of a record (progress while rendering)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_size(v) for v in value.values()) + 1
    if isinstance(value, list):
        return sum(_size(v) for v in value) + 1
    return 1


def is_chat(
    path: str | None, data_format: str, text_extensions: list[str], columns: dict | None = None
) -> bool:
    """auto: a table file (.jsonl, .json, .csv, .parquet) whose records are not plain text
    (a text column; core.data.tables' layouts), or a folder of such files and none of the
    text endings."""
    if data_format != "auto":
        return data_format == "chat"
    if path is None:
        return False
    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file())
        if {f.suffix.lower() for f in files} & {e.lower() for e in text_extensions}:
            return False
        p = next((f for f in files if tables.is_table(f)), p)
    if not (p.is_file() and tables.is_table(p)):
        return False
    try:
        return tables.file_layout(p, columns) != "text"
    except DataError as e:
        raise DataError(f"data: {e}") from None


def _offsets(tokenizer, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of text (no special tokens added) and each token's start character."""
    ids, starts, _ = _token_chars(tokenizer, text)
    return ids, starts


def _token_chars(tokenizer, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids of text (no special tokens added) and each token's start and end character."""
    if tokenizer.kind == "bytes":
        raw = text.encode("utf-8")
        lengths = [len(c.encode("utf-8")) for c in text]
        starts = np.repeat(np.arange(len(text)), lengths)
        return np.frombuffer(raw, dtype=np.uint8).astype(np.int64), starts, starts + 1
    enc = tokenizer.hf.encode(text, add_special_tokens=False)
    offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
    return np.asarray(enc.ids, dtype=np.int64), offsets[:, 0], offsets[:, 1]


def encode_example(
    tokenizer,
    template: str,
    messages: list[dict],
    tokens: dict,
    train_on_prompts: bool,
    notes: set | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, weights): the conversation as the template renders it, and 1 on the tokens
    of assistant turns (their end-of-turn marks too), 0 elsewhere (1 everywhere with
    train_on_prompts). notes collects lines for the log (core.data.chat.REASONING_NOTE)."""
    # Exactly the template's text (BOS only where the template writes it), as transformers'
    # apply_chat_template gives it: what the model sees here is what it sees in other tools.
    if train_on_prompts:  # one render; no answer spans to find
        ids, _, _ = _token_chars(tokenizer, conversation_text(template, messages, notes, **tokens))
        return ids, np.ones(len(ids), dtype=np.uint8)
    text, spans = answer_spans(template, messages, notes, **tokens)
    ids, starts, ends = _token_chars(tokenizer, text)
    weights = np.zeros(len(ids), dtype=np.uint8)
    for start, end in spans:  # every token with a character in the span, as transformers
        weights[(starts < end) & (np.maximum(ends, starts + 1) > start)] = 1
    return ids, weights


START = 2  # a mask byte's second bit: the first token of an example (its first bit: loss)


@dataclass
class Packer:
    """Packs examples into rows of `row` tokens (context + 1), each example followed by EOS
    (weight 0); a row that cannot take the next example is padded (weight 0). Each example's
    first token carries the START bit, so training keeps packed examples apart."""

    row: int
    pad: int
    sep: int | None
    drop_long: bool
    ids: list = field(default_factory=list)
    weights: list = field(default_factory=list)
    rows: list = field(default_factory=list)  # finished (ids, weights) rows
    truncated: int = 0  # cut to the row's length
    dropped: int = 0  # longer than a row, with drop_long
    no_answer: int = 0  # truncation cut every answer token off: nothing to learn
    examples: int = 0
    longest: int = 0  # tokens of the longest example longer than a row (cut or dropped)
    cut_tokens: int = 0  # tokens truncation cut off

    def add(self, ids: np.ndarray, weights: np.ndarray) -> None:
        weights = weights.astype(np.uint8)  # a copy: the first token gets the START bit below
        if self.sep is not None and (not len(ids) or ids[-1] != self.sep):
            ids = np.append(ids, self.sep)
            weights = np.append(weights, 0).astype(np.uint8)
        if len(ids) > self.row:
            self.longest = max(self.longest, len(ids))
            if self.drop_long:
                self.dropped += 1
                return
            self.truncated += 1
            self.cut_tokens += len(ids) - self.row
            ids, weights = ids[: self.row], weights[: self.row]
        if not weights[1:].any():
            self.no_answer += 1
            return
        weights[0] |= START  # where this example begins: attention does not reach before it
        if sum(map(len, self.ids)) + len(ids) > self.row:
            self._close()
        self.ids.append(ids)
        self.weights.append(weights)
        self.examples += 1

    def _close(self) -> None:
        if not self.ids:
            return
        ids, weights = np.concatenate(self.ids), np.concatenate(self.weights)
        fill = self.row - len(ids)
        ids = np.concatenate([ids, np.full(fill, self.pad, dtype=np.int64)])
        weights = np.concatenate([weights, np.zeros(fill, dtype=np.uint8)])
        self.rows.append((ids, weights))
        self.ids, self.weights = [], []

    def finish(self) -> list[tuple[np.ndarray, np.ndarray]]:
        self._close()
        return self.rows


def _row_length(tokenizer, template: str, messages: list[dict], tokens: dict) -> int:
    """An example's tokens in a packed row: its rendering, and the EOS the Packer adds."""
    ids = encode_example(tokenizer, template, messages, tokens, True)[0]
    eos = tokenizer.eos_id
    return len(ids) + (eos is not None and (not len(ids) or ids[-1] != eos))


def long_line(long: int, total: int, seq_len: int, longest: int, cut: int, drop: bool) -> str:
    """What happened to the examples longer than the context, in one sentence for the log and
    the window (long: how many of total; cut: the tokens truncation lost); empty for none.
    A row holds seq_len + 1 tokens (inputs and shifted targets), the EOS after an example
    included."""
    if not long:
        return ""
    head = f"{long:,} of {total:,} examples were longer than seq_len {seq_len:,} and were"
    if drop:
        return f"{head} dropped (longest {longest:,} tokens); without --drop-long they are cut"
    return (
        f"{head} cut (longest {longest:,} tokens; {cut:,} tokens lost); --drop-long drops "
        "them instead"
    )


def is_val(index: int, val_fraction: float) -> bool:
    """Held-out examples are spread evenly through the file: every 1/fraction-th one."""
    return int((index + 1) * val_fraction) > int(index * val_fraction)


SUMMARY_MAX_BYTES = 20 << 20  # the window reads at most this much to describe chat data
SUMMARY_SAMPLE = 2000  # examples rendered to count those longer than the context


def summary(
    files: list[Path],
    seq_len: int,
    tokenizer,
    template: str,
    tokens: dict,
    drop_long: bool,
    columns: dict | None = None,
) -> str:
    """One line for the window: the shapes, the number of examples and how many are longer
    than the context, to be truncated or dropped (from a sample of a large set)."""
    size = sum(p.stat().st_size for p in files)
    if size > SUMMARY_MAX_BYTES:
        return f"chat data, {size / 1e6:,.1f} MB: examples are counted when the run prepares it"
    found = read_examples(files, skip_bad_lines=True, columns=columns)
    n = len(found.conversations)
    shapes = ", ".join(f"{k} {v:,}" for k, v in found.shapes.items())
    step = max(1, n // SUMMARY_SAMPLE)
    sample = found.conversations[::step]
    row = seq_len + 1  # as the Packer: a row of seq_len + 1 tokens, EOS after each example
    lengths = [_row_length(tokenizer, template, m, tokens) for m in sample]
    long = [k for k in lengths if k > row]
    line = f"chat data: {n:,} examples ({shapes}); "
    if not long:
        line += f"none longer than seq_len {seq_len:,}"
    elif step > 1:
        what = "dropped" if drop_long else "cut"
        line += (
            f"{len(long) / len(sample):.0%} of a sample of {len(sample):,} longer than seq_len "
            f"{seq_len:,} (longest {max(long):,} tokens), to be {what}"
        )
    else:
        line += long_line(len(long), n, seq_len, max(long), sum(long) - row * len(long), drop_long)
    if found.bad_lines:
        line += f"; {found.bad_lines:,} bad line(s), e.g. {found.first_bad.removeprefix('data: ')}"
    return line
