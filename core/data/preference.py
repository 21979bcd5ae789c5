"""Preference pairs for DPO: a prompt, a chosen and a rejected answer, in the layout TRL's DPO
trainer reads (one object a line):

    {"prompt": "...", "chosen": "...", "rejected": "..."}                       plain
    {"prompt": [{"role": "user", "content": "..."}],                             conversational
     "chosen": [{"role": "assistant", "content": "..."}], "rejected": [...]}

Each side is rendered with the model's chat template as prompt + answer; only the answer's
tokens (its end-of-turn mark included) carry a weight. Each pair becomes two rows of seq_len + 1
tokens, chosen then rejected, padded with weight 0: they go through the model in one batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from core.data.chat import answer_spans
from core.data.chatdata import BadLine, _messages, _offsets, _sharegpt_images, refuse_media

FIELDS = ("prompt", "chosen", "rejected")


def is_pair(obj) -> bool:
    """A record with chosen and rejected answers (checked whole by parse_pair)."""
    return isinstance(obj, dict) and ("chosen" in obj or "rejected" in obj)


def _side(obj: dict, key: str) -> list[dict]:
    value = obj.get(key)
    if value is None:
        raise BadLine(f"{key!r} is missing; a preference pair needs prompt, chosen and rejected")
    if isinstance(value, str):
        return [{"role": "assistant", "content": value}]
    answer = _messages(value, repr(key))
    if any(m["role"] != "assistant" for m in answer):
        raise BadLine(f"{key!r} must hold assistant messages only (the answer)")
    return answer


def parse_pair(obj) -> tuple[list[dict], list[dict], list[dict]]:
    """(prompt messages, chosen answer, rejected answer) of one record; BadLine says what
    is wrong with it."""
    if not isinstance(obj, dict):
        raise BadLine("expected a JSON object")
    refuse_media(obj, images_ok=True)  # the prompt may show images; the answers are text
    prompt = obj.get("prompt")
    if prompt is None:
        raise BadLine("'prompt' is missing; a preference pair needs prompt, chosen and rejected")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    else:
        prompt = _messages(prompt, "'prompt'", images_ok=True)
    prompt = _sharegpt_images(obj, prompt)  # an "images" list for the prompt's <image> marks
    chosen, rejected = _side(obj, "chosen"), _side(obj, "rejected")
    if chosen == rejected:
        raise BadLine("'chosen' and 'rejected' are the same answer: nothing to prefer")
    return prompt, chosen, rejected


def encode_side(
    tokenizer, template: str, prompt: list[dict], answer: list[dict], tokens: dict, expand=None
) -> tuple[np.ndarray, int]:
    """(ids, where the answer starts) of prompt + answer as the template renders it; the
    answer runs from the start of its first turn to the end of the text. expand(text, spans)
    -> (text, spans): the prompt's image marks made into the model's image tokens."""
    messages = prompt + answer
    text, spans = answer_spans(template, messages, **tokens)
    if expand is not None:
        text, spans = expand(text, spans)
    first = spans[len(spans) - len(answer)][0]
    ids, starts = _offsets(tokenizer, text)
    return ids, int(np.searchsorted(starts, first))


def fit(ids: np.ndarray, answer_at: int, row: int) -> tuple[np.ndarray, int, bool]:
    """Cut a side to row tokens: the prompt keeps its end (at least half the row when it is
    that long), the answer its beginning. Returns (ids, answer start, whether it was cut)."""
    prompt, answer = ids[:answer_at], ids[answer_at:]
    if len(ids) <= row:
        return ids, answer_at, False
    keep_prompt = max(row - len(answer), min(len(prompt), row // 2))
    prompt = prompt[len(prompt) - keep_prompt :] if keep_prompt else prompt[:0]
    answer = answer[: row - len(prompt)]
    return np.concatenate([prompt, answer]), len(prompt), True


@dataclass
class PairRows:
    """Pairs as rows of `row` tokens and their weights: chosen, rejected, chosen, ..."""

    row: int
    pad: int
    ids: list = field(default_factory=list)
    weights: list = field(default_factory=list)
    pairs: int = 0
    truncated: int = 0  # pairs with a side cut to the row
    cut_tokens: int = 0  # tokens the cuts lost, both sides
    longest: int = 0  # the longest side, in tokens, before a cut
    image_id: int = -1  # the image token (pairs whose prompt shows images)
    row_images: list = field(default_factory=list)  # each row's image numbers

    def add(
        self, chosen: tuple[np.ndarray, int], rejected: tuple[np.ndarray, int], numbers=()
    ) -> str:
        """Add one pair (numbers: its prompt's images, in the store); what is wrong with it
        instead (nothing added) when the context leaves nothing to compare."""
        sides = [fit(ids, at, self.row) for ids, at in (chosen, rejected)]
        if any(len(ids) <= max(at, 1) for ids, at, _ in sides):
            return "an answer keeps no token within the context"
        whole = [int((ids == self.image_id).sum()) for ids, _ in (chosen, rejected)]
        cut = zip(sides, whole, strict=True)
        if any(int((ids == self.image_id).sum()) != n for (ids, _, _), n in cut):
            return "its prompt's image would be cut by the context (its start is cut)"
        if np.array_equal(sides[0][0], sides[1][0]):
            return "its answers differ only past the context: cut to it they are the same"
        for ids, at, _ in sides:
            weights = np.zeros(self.row, dtype=np.uint8)
            weights[max(at, 1) : len(ids)] = 1  # position 0 is never a target
            padded = np.full(self.row, self.pad, dtype=np.int64)
            padded[: len(ids)] = ids
            self.ids.append(padded)
            self.weights.append(weights)
            self.row_images.append(list(numbers))
        self.pairs += 1
        self.truncated += any(cut for _, _, cut in sides)
        lengths = [len(ids) for ids, _ in (chosen, rejected)]
        self.cut_tokens += sum(max(0, n - self.row) for n in lengths)
        self.longest = max(self.longest, *lengths)
        return ""


def long_line(long: int, total: int, seq_len: int, longest: int, cut: int) -> str:
    """What happened to the pairs with a side longer than the context, in one sentence for
    the log and the window (as chatdata.long_line says it of chat examples); empty for none.
    A side keeps its prompt's end and its answer's beginning (fit)."""
    if not long:
        return ""
    return (
        f"{long:,} of {total:,} pairs had a side longer than seq_len {seq_len:,} and were cut "
        f"(longest {longest:,} tokens; {cut:,} tokens lost): the prompt keeps its end, the "
        "answer its beginning"
    )


def holds_pairs(files, columns: dict | None = None) -> bool:
    """Whether the first file's records are preference pairs (auto detection), in any
    table format core.data.tables reads, after the column mapping."""
    from core.data import tables
    from core.errors import UserError

    for path in files[:1]:
        try:
            records = tables.first_records(path, columns, 1)
            return bool(records) and is_pair(records[0])
        except (UserError, OSError, ValueError):
            return False  # reading it properly names the problem
    return False


def summary(files, columns: dict | None = None, seq_len: int = 0, render=None) -> str:
    """One line for the window: how many pairs, how many have a side longer than seq_len
    (render(prompt, answer) -> its tokens; a sample of a large set), and which bad lines
    there are."""
    from core.data import images
    from core.data.chatdata import SUMMARY_SAMPLE, _text_of, read_examples

    found = read_examples(files, True, parse_pair, columns)
    pairs: list = found.conversations  # (prompt, chosen, rejected) each
    n = len(pairs)
    line = f"preference data: {n:,} pairs (prompt, chosen, rejected)"
    line += "; trained with DPO, the answers of each pair compared"
    shown = sum(len(images.conversation_images(p)) for p, _, _ in pairs)
    if shown:
        line += f"; {shown:,} images in the prompts (their tokens counted when prepared)"
    if render is not None and n:
        step = max(1, n // SUMMARY_SAMPLE)
        sample = pairs[::step]
        # any template renders the prompts with their image parts left out
        lengths = [[render(_text_of(p), a) for a in (c, r)] for p, c, r in sample]
        long = [sides for sides in lengths if max(sides) > seq_len + 1]
        if long and step == 1:
            cut = sum(max(0, k - seq_len - 1) for sides in long for k in sides)
            line += "; " + long_line(len(long), n, seq_len, max(map(max, long)), cut)
        elif long:
            line += (
                f"; {len(long) / len(sample):.0%} of a sample of {len(sample):,} pairs have a "
                f"side longer than seq_len {seq_len:,}, to be cut"
            )
        else:
            line += f"; none longer than seq_len {seq_len:,}"
    if found.bad_lines:
        line += f"; {found.bad_lines:,} bad line(s), e.g. {found.first_bad.removeprefix('data: ')}"
    return line
