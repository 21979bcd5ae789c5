"""Instruction and chat data: examples rendered with a chat template, each token weighted 1
(an answer: it carries the loss) or 0 (system and user turns, template marks).

One example a record of a .jsonl, .json, .csv or .parquet file (core.data.tables; columns
renamed by --prompt-column etc., ShareGPT conversations as messages), in any of three shapes
(a file may mix them):
    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
    {"prompt": "...", "completion": "..."}
    {"instruction": "...", "input": "...", "output": "..."}   (Alpaca; input is optional)
A message's content may be a list of parts ({"type": "text", "text": ...}, {"type": "image",
"image": PATH}); ShareGPT records name their images in an "images" list, one for each <image>
mark (core.data.images).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.data import images, tables
from core.data.chat import answer_spans, conversation_text
from core.errors import DataError

ROLES = ("system", "user", "assistant")
# Image, audio and video in a record: OpenAI-style content parts (a list of {"type": ...}),
# and the image/audio columns of LLaMA-Factory's and TRL's vision datasets. Chat examples may
# carry images (core.data.images); audio, video, and images elsewhere are refused by name.
MEDIA_PARTS = ("image", "image_url", "input_image", "audio", "input_audio", "video", "video_url")
MEDIA_KEYS = ("images", "image", "audios", "audio", "videos", "video")
NO_MEDIA = "training on image, audio or video is not supported yet; text only"
NO_SOUND = "audio and video are not trained on; text and images are"
IMAGE_ROLES = ("system", "user")  # where an image may be: the answers are text
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


def refuse_media(obj: dict, images_ok: bool = False) -> None:
    """BadLine for a record that carries images, audio or video (a column of them);
    images_ok: a ShareGPT "images" list of files is taken (chat examples)."""
    for key in MEDIA_KEYS:
        if images_ok and key == "images" and ("messages" in obj or "prompt" in obj):
            continue
        if obj.get(key):
            why = NO_SOUND if images_ok else NO_MEDIA
            if images_ok and key == "image":
                why = 'an image column is not read: name the files in an "images" list'
            if images_ok and key == "images":
                why = "an images list goes with 'messages' (or 'prompt') and its <image> marks"
            raise BadLine(f"{key!r} holds media: {why}")


def refuse_media_parts(m: dict, at: str) -> None:
    """BadLine for a message whose content parts hold an image, audio or video, by name."""
    parts = m.get("content")
    for n, part in enumerate(parts if isinstance(parts, list) else ()):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MEDIA_PARTS:
            raise BadLine(f"{at}.content[{n}] is of type {kind!r}: {NO_MEDIA}")


def _content(m: dict, at: str, images_ok: bool = False):
    """A message's text, or (images_ok, a list holding an image) its parts."""
    if isinstance(m.get("content"), list):
        return _parts(m["content"], at, images_ok)
    return _text(m, "content", f"{at}.")


def _parts(parts: list, at: str, images_ok: bool):
    """Content parts as [{"type": "text", "text"}, {"type": "image", "image": PATH}]; a list
    of text parts alone is its text."""
    out = []
    for n, part in enumerate(parts):
        where = f"{at}.content[{n}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            out.append({"type": "text", "text": _text(part, "text", f"{where}.")})
        elif images.is_image_part(part):
            if not images_ok:
                raise BadLine(f"{where} is of type {kind!r}: {NO_MEDIA}")
            path = images.part_path(part)
            if not isinstance(path, str) or not path.strip():
                raise BadLine(f"{where}: the image part names no file ('image', 'path' or 'url')")
            out.append({"type": "image", "image": path})
        elif kind in MEDIA_PARTS:
            raise BadLine(f"{where} is of type {kind!r}: {NO_SOUND if images_ok else NO_MEDIA}")
        else:
            raise BadLine(f"{where} must be a part with type 'text' or 'image', got {kind!r}")
    if any(p["type"] == "image" for p in out):
        return out
    return "".join(p["text"] for p in out)


def _messages(value, where: str, images_ok: bool = False) -> list[dict]:
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
        content = _content(m, at, images_ok)
        if isinstance(content, list) and role not in IMAGE_ROLES:
            raise BadLine(f"{at} holds an image in a {role} turn; images go in user turns")
        out.append({"role": role, "content": content})
    return out


def _sharegpt_images(obj: dict, messages: list[dict]) -> list[dict]:
    """ShareGPT's "images" list put where its <image> marks are, one for each."""
    files = obj.get("images")
    if files is None:
        return messages
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise BadLine("'images' must be a list of image file paths")
    marks = sum(
        m["content"].count(images.PLACEHOLDER) for m in messages if isinstance(m["content"], str)
    )
    if marks != len(files):
        raise BadLine(
            f"{marks} {images.PLACEHOLDER} placeholder(s) in the messages but {len(files)} "
            "image(s) in 'images': each image needs one placeholder where it goes"
        )
    left, out = list(files), []
    for n, m in enumerate(messages):
        text = m["content"]
        if isinstance(text, str) and images.PLACEHOLDER in text:
            if m["role"] not in IMAGE_ROLES:
                raise BadLine(
                    f"'messages'[{n}] holds {images.PLACEHOLDER} in a {m['role']} turn; images "
                    "go in user turns"
                )
            m = {**m, "content": images.split_placeholders(text, left)}
        out.append(m)
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
    refuse_media(obj, images_ok=True)
    if "messages" in obj:
        messages = _sharegpt_images(obj, _messages(obj["messages"], "'messages'", True))
    elif "prompt" in obj or "completion" in obj:
        prompt, completion = obj.get("prompt"), obj.get("completion")
        if isinstance(prompt, list) or isinstance(completion, list):  # conversational form
            messages = _messages(prompt, "'prompt'", True) + _messages(completion, "'completion'")
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
    outside: list = field(default_factory=list)  # images named through .. out of the folder


def resolve_images(messages: list[dict], base: Path, outside: list) -> list[dict]:
    """The conversation with each image part's file resolved against the data file's folder
    (base); an image out of that folder (through ..) is allowed and noted in outside."""
    out = []
    for m in messages:
        if isinstance(m["content"], list):
            parts = []
            for p in m["content"]:
                if p["type"] == "image":
                    try:
                        path = images.image_path(p["image"], base)
                    except images.ImageProblem as e:
                        raise BadLine(f"image {p['image']!r} {e}") from None
                    if images.outside(path, base):
                        outside.append(p["image"])
                    p = {"type": "image", "image": str(path)}
                parts.append(p)
            m = {**m, "content": parts}
        out.append(m)
    return out


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
                parsed = parse(obj)
                if isinstance(parsed, list):  # a conversation: its images' files
                    parsed = resolve_images(parsed, path.parent, out.outside)
                elif isinstance(parsed, tuple):  # a pair: its prompt's images' files
                    prompt = resolve_images(parsed[0], path.parent, out.outside)
                    parsed = (prompt, *parsed[1:])
                out.conversations.append(parsed)
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
    expand=None,
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, weights): the conversation as the template renders it, and 1 on the tokens
    of assistant turns (their end-of-turn marks too), 0 elsewhere (1 everywhere with
    train_on_prompts). notes collects lines for the log (core.data.chat.REASONING_NOTE).
    expand(text, spans) -> (text, spans): the rendered text's image marks made into the
    model's image tokens (core.data.build_chat), before tokenizing."""
    # Exactly the template's text (BOS only where the template writes it), as transformers'
    # apply_chat_template gives it: what the model sees here is what it sees in other tools.
    if train_on_prompts:  # one render; no answer spans to find
        text = conversation_text(template, messages, notes, **tokens)
        if expand is not None:
            text, _ = expand(text, [])
        ids, _, _ = _token_chars(tokenizer, text)
        return ids, np.ones(len(ids), dtype=np.uint8)
    text, spans = answer_spans(template, messages, notes, **tokens)
    if expand is not None:
        text, spans = expand(text, spans)
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


@dataclass
class ImagePacker(Packer):
    """A Packer whose examples carry images: each row keeps the numbers of the images its
    image-token runs stand for (row_images). An example whose cut would split an image's
    tokens is dropped (counted in cut_images)."""

    image_id: int = -1
    pending: list = field(default_factory=list)  # image numbers of the open row
    row_images: list = field(default_factory=list)  # each finished row's image numbers
    cut_images: int = 0

    def add(self, ids: np.ndarray, weights: np.ndarray, numbers=()) -> None:
        keep = len(ids) + (self.sep is not None and (not len(ids) or ids[-1] != self.sep))
        if keep > self.row and not self.drop_long:  # truncated: whole images only
            cut = ids[: self.row]
            if self.row < len(ids) and ids[self.row - 1] == self.image_id == ids[self.row]:
                self.cut_images += 1
                self.longest = max(self.longest, keep)
                return
            numbers = list(numbers)[: runs(cut, self.image_id)]
        before = self.examples
        super().add(ids, weights)
        if self.examples > before:
            self.pending.extend(numbers)

    def _close(self) -> None:
        if self.ids:
            self.row_images.append(self.pending)
            self.pending = []
        super()._close()


def runs(ids: np.ndarray, token: int) -> int:
    """How many separate runs of token ids holds (an image's tokens are one run)."""
    hits = np.asarray(ids) == token
    return int((hits & ~np.concatenate(([False], hits[:-1]))).sum())


def _row_length(tokenizer, template: str, messages: list[dict], tokens: dict) -> int:
    """An example's tokens in a packed row: its rendering, and the EOS the Packer adds (its
    images' tokens not counted: the model's count is known when the data is prepared)."""
    ids = encode_example(tokenizer, template, _text_of(messages), tokens, True)[0]
    eos = tokenizer.eos_id
    return len(ids) + (eos is not None and (not len(ids) or ids[-1] != eos))


def _text_of(messages: list[dict]) -> list[dict]:
    """The conversation with its image parts left out (any template renders it)."""
    return [
        {**m, "content": "".join(p.get("text", "") for p in m["content"])}
        if isinstance(m["content"], list)
        else m
        for m in messages
    ]


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
    shown = sum(len(images.conversation_images(m)) for m in found.conversations)
    line = f"chat data: {n:,} examples ({shapes}); "
    if shown:
        line += f"{shown:,} images (their tokens counted when prepared); "
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
