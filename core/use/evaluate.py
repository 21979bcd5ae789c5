"""Did the fine-tune help? Perplexity and bits per byte of a text, and multiple-choice accuracy
scored as lm-evaluation-harness scores it: the log-likelihood of each choice after the
question, acc from the sum, acc_norm from the sum per byte of the choice."""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from core.data import tables
from core.errors import DataError
from core.weights.loader import Loaded

LETTERS = "ABCDEFGHIJ"


def _ids(loaded: Loaded, text: str) -> list[int]:
    tok = loaded.tokenizer
    ids = tok.encode(text)
    return [tok.bos_id, *ids] if tok.add_bos and tok.bos_id is not None else ids


@torch.no_grad()
def _log_probs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1, the context cut from the left to the model's."""
    ids = ids[-(model.config.seq_len + 1) :]
    logits, _ = model(torch.tensor([ids[:-1]]))
    return F.log_softmax(logits[0].float(), -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


@torch.no_grad()
def text_metrics(loaded: Loaded, text: str, progress=None) -> dict:
    """Perplexity and bits per byte over the text in non-overlapping windows of the model's
    context (each window scored from its own start, as training sees them)."""
    model, ids = loaded.model.eval(), _ids(loaded, text)
    n = model.config.seq_len
    nll, count = 0.0, 0
    for start in range(0, max(1, len(ids) - 1), n):
        window = ids[start : start + n + 1]
        if len(window) < 2:
            break
        nll -= float(_log_probs(model, window).sum())
        count += len(window) - 1
        if progress:
            progress(len(window) - 1)
    if count == 0:
        raise DataError("text: too short to score (it tokenizes to fewer than 2 tokens)")
    size = len(text.encode("utf-8"))
    return {"ppl": math.exp(nll / count), "bpb": nll / math.log(2) / size, "tokens": count,
            "bytes": size}  # fmt: skip


# -- multiple choice --------------------------------------------------------------------------


def _answer(value, choices: list[str], where: str) -> int:
    if isinstance(value, float) and value.is_integer():  # 1.0 from a Parquet or JSON float
        value = int(value)
    text = str(value).strip()
    if text.upper() in LETTERS[: len(choices)] and len(text) == 1:
        return LETTERS.index(text.upper())
    if text.lstrip("-").isdigit() and 0 <= int(text) < len(choices):
        return int(text)
    last = len(choices) - 1
    raise DataError(f"{where}: answer {text!r} is not one of the {len(choices)} choices "
                    f"(an index 0-{last} or a letter A-{LETTERS[min(last, 9)]})")  # fmt: skip


def _item(row, where: str) -> dict:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with question, choices and answer, got "
                        f"{type(row).__name__}")  # fmt: skip
    if "question" not in row or "answer" not in row:
        found = ", ".join(sorted(str(k) for k in row)) or "none"
        raise DataError(f"{where}: needs the columns question, answer and choices (or A, B, "
                        f"C, ...); found {found}")  # fmt: skip
    if "choices" in row:
        choices = row["choices"]
        if isinstance(choices, str):
            try:
                choices = json.loads(choices)
            except ValueError:
                raise DataError(f"{where}: choices is not a JSON list: {choices[:40]!r}") from None
    else:
        choices = [row[k] for k in LETTERS if row.get(k) not in (None, "")]
    if not isinstance(choices, list) or len(choices) < 2:
        raise DataError(f"{where}: needs at least two choices")
    choices = [str(c) for c in choices]
    return {"question": str(row["question"]), "choices": choices,
            "answer": _answer(row["answer"], choices, where)}  # fmt: skip


def read_choices(path: str | Path) -> list[dict]:
    """Multiple-choice items from .jsonl, .json, .csv or .parquet (core.data.tables): the
    columns question, choices (a list) and answer (an index or a letter), or question, A, B,
    C, ... and answer."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"choices: {path} not found")
    rows = []
    for n, (number, row) in enumerate(tables.iter_records(path), 1):
        if path.suffix.lower() == ".csv":  # the row among the data rows, and its file line
            where = f"row {n} (line {number})"
        else:
            where = f"{tables.unit(path)} {number}"
        rows.append((where, row))
    if not rows:
        raise DataError(f"choices: {path} holds no questions")
    return [_item(row, f"{path}: {where}") for where, row in rows]


def _prompt(item: dict) -> str:
    return f"Question: {item['question']}\nAnswer:"


def choice_scores(loaded: Loaded, item: dict, shots: str = "") -> list[tuple[float, int]]:
    """(sum of the choice's log-probabilities after the prompt, its length in bytes) per
    choice. The continuation's tokens are those of prompt + choice past the prompt's own, as
    the harness takes them (a choice starts with a space, which joins its first word).

    Tokenizer boundary: prompt + " choice" is tokenized whole, and the continuation is its
    tokens past len(prompt tokens). That assumes the prompt's tokens are a prefix of the
    whole's, which holds where the tokenizer splits before a space (byte-level BPE); where a
    merge crosses the boundary the harness takes the same tokens. BOS: added where the
    tokenizer adds one, as transformers' tokenizer(text) does; lm-evaluation-harness's HF
    backend leaves it out unless given add_bos_token=True, so compare a BOS-adding model
    (Llama, Mistral) with the harness run that way."""
    context = shots + _prompt(item)
    base = _ids(loaded, context)
    out = []
    for choice in item["choices"]:
        cont = " " + choice
        whole = _ids(loaded, context + cont)
        n = len(whole) - len(base)
        out.append((float(_log_probs(loaded.model, whole)[-n:].sum()), len(cont.encode())))
    return out


def choice_metrics(loaded: Loaded, items: list[dict], fewshot: int = 0, progress=None) -> dict:
    """acc (argmax of the sums) and acc_norm (argmax of the sums per byte); the first
    `fewshot` items are the examples shown before each question and are not scored."""
    loaded.model.eval()
    shots = "".join(f"{_prompt(it)} {it['choices'][it['answer']]}\n\n" for it in items[:fewshot])
    right = right_norm = 0
    scored = items[fewshot:]
    for item in scored:
        scores = choice_scores(loaded, item, shots)
        right += max(range(len(scores)), key=lambda i: scores[i][0]) == item["answer"]
        per_byte = [s / b for s, b in scores]
        right_norm += max(range(len(scores)), key=per_byte.__getitem__) == item["answer"]
        if progress:
            progress(1)
    if not scored:
        raise DataError("choices: no items left to score after the few-shot examples")
    return {"acc": right / len(scored), "acc_norm": right_norm / len(scored), "n": len(scored)}


def fingerprint(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def write_result(loaded: Loaded, data: Path, kind: str, settings: dict, result: dict):
    """RUN/eval/<data name>.json for a run (None for a plain model folder)."""
    run = loaded.checkpoint.parent.parent
    # a plain model folder (config None) writes nothing, even one kept inside a run folder
    if loaded.config is None or not (run / "config.yaml").is_file():
        return None
    folder = run / "eval"
    folder.mkdir(exist_ok=True)
    record = {"model": str(loaded.checkpoint), "step": loaded.step, "data": str(data),
              "data_fingerprint": fingerprint(data), "kind": kind, "settings": settings,
              "result": result, "time": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
    path = folder / f"{Path(data).stem}.json"
    path.write_text(json.dumps(record, indent=1), encoding="utf-8")
    return path


def _measure(loaded: Loaded, text: str | None, items, fewshot: int, settings: dict,
             write: bool, progress) -> dict:  # fmt: skip
    out = {}
    if text:
        content = Path(text).read_text(encoding="utf-8", errors="replace")
        out["text"] = text_metrics(loaded, content, progress)
        if write:
            write_result(loaded, Path(text), "text", {}, out["text"])
    if items is not None:
        out["choices"] = choice_metrics(loaded, items, fewshot, progress)
        if write:
            write_result(loaded, Path(settings["choices"]), "choices", settings, out["choices"])
    return out


def evaluate_files(target, text=None, choices=None, fewshot: int = 0, limit=None,
                   compare: bool = False, which: str = "best", progress=None) -> dict:  # fmt: skip
    """What `python -m core.eval` and the window's Evaluate tab compute: {"text": ...,
    "choices": ..., and with compare "start": the same for the model a fine-tune began from}.
    Results of a run are written to RUN/eval/."""
    from core.weights.loader import load

    if not text and not choices:
        raise DataError("evaluate: give a text file, a choices file or both")
    for name, path in (("text", text), ("choices", choices)):
        if path and not Path(path).is_file():
            raise DataError(f"{name}: {path} not found")
    items = read_choices(choices) if choices else None
    if items is not None and limit is not None:
        items = items[: fewshot + limit]
    loaded = load(target, which)
    start = None
    if compare:
        if not loaded.base:
            raise DataError("compare: the target is not a fine-tune of a pretrained model")
        start = load(loaded.base["init_from"])
    settings = {"fewshot": fewshot, "limit": limit, "choices": str(choices)}
    out = _measure(loaded, text, items, fewshot, settings, True, progress)
    if start is not None:
        out["start"] = _measure(start, text, items, fewshot, settings, False, progress)
    return out


ROWS = {"text": ("ppl", "bpb"), "choices": ("acc", "acc_norm", "n")}


def format_table(out: dict) -> str:
    """metric, value (and with compare: the start model's value beside it)."""
    start = out.get("start")
    head = [f"{'':<8} {'':<9} {'start':>10} {'fine-tuned':>10}"] if start else []
    rows = []
    for part, keys in ROWS.items():
        for key in keys if part in out else ():
            values = ([start[part][key]] if start else []) + [out[part][key]]
            cells = " ".join(f"{v:>10.4f}" if isinstance(v, float) else f"{v:>10}" for v in values)
            rows.append(f"{part:<8} {key:<9} {cells}")
    return "\n".join(head + rows)
