"""Before and after: the first held-out examples of a chat fine-tune, each answered greedily by
the model it started from and by the fine-tuned one, side by side in RUN/eval/report.md.

The examples are read again from the run's data files (with its config: the same files, order
and held-out rule as core.data.prepare), not decoded from the packed token cache, so the
prompt, the reference answer and the conversation's roles come back as the data wrote them.
"""

from __future__ import annotations

import json
from pathlib import Path

from core.config import methods
from core.config.spec import TrainConfig, from_dict, validate
from core.data import chatdata, tables
from core.data.chat import chat_ids
from core.data.prepare import data_spec, held_out_split
from core.data.sources import Sources, data_changes
from core.errors import DataError
from core.models.lora import adapters_disabled
from core.platform.atomic import write_text
from core.runs import checkpoint as ckpt
from core.use.generate import generate_ids, stream_text
from core.weights.loader import checkpoint_path, is_model_folder, load

DEFAULT_EXAMPLES = 5
DEFAULT_NEW_TOKENS = 128


def run_config(target, which: str = "best") -> tuple[Path, TrainConfig]:
    """(checkpoint file, its config) of a run folder or checkpoint, without building the model."""
    path = Path(target)
    if not path.exists() or is_model_folder(path):
        raise DataError(
            f"report: {target} is not a run folder; the report compares a fine-tune run with "
            "the model it started from"
        )
    file = checkpoint_path(path, which)
    state = ckpt.load(file, mmap=True)  # mapped: only the config is read
    return file, validate(from_dict(state["config"], source=str(file)))


def _cached_listing(run: Path) -> list[dict] | None:
    """The data files the run was prepared from (its cache entry's manifest), if still there."""
    try:
        cache = Path(json.loads((run / "data.json").read_text(encoding="utf-8"))["cache"])
        return json.loads((cache / "manifest.json").read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def chat_sources(cfg: TrainConfig, target, run: Path) -> Sources:
    """The chat data files the run trained on; one line for a run the report cannot be made
    for."""
    if not cfg.init_from:
        raise DataError(
            f"report: {target} is not a fine-tune of a pretrained model (it has no start model "
            "to compare with); train with --init-from"
        )
    if cfg.method != methods.DEFAULT:
        raise DataError(
            f"report: {target} was trained with method {cfg.method}; the report "
            "needs a chat fine-tune (method sft)"
        )
    if cfg.data is None or cfg.data_format not in ("auto", "chat"):
        data = cfg.data or "the embedded corpus"
        raise DataError(
            f"report: {target} was not trained on chat data (data: {data}, "
            f"format {cfg.data_format})"
        )
    if Path(cfg.data).expanduser().exists():
        if not chatdata.is_chat(
            cfg.data, cfg.data_format, cfg.data_extensions, tables.columns_of(cfg)
        ):
            raise DataError(
                f"report: {target} was not trained on chat data ({cfg.data} is "
                "text, not .jsonl examples)"
            )
        return data_spec(cfg).sources
    # Not found from here (a relative path, or moved): the files the run was prepared from.
    old = _cached_listing(run) or []
    files = [Path(f["path"]) for f in old]
    if files and all(f.is_file() and f.suffix == chatdata.CHAT_SUFFIX for f in files):
        return Sources(str(cfg.data), files, None)
    raise DataError(
        f"report: the run's data {cfg.data} is gone; put it back to read the "
        "held-out examples from it"
    )


def held_out(cfg: TrainConfig, sources: Sources, run: Path, n: int) -> tuple[list, str]:
    """The first n held-out conversations (each ends with its last assistant turn), and a
    note when the data files changed since the run prepared them."""
    old = _cached_listing(run)
    note = ""
    if old is not None:
        gone = [f["path"] for f in old if not Path(f["path"]).is_file()]
        if gone:
            raise DataError(
                f"report: the run's data file {gone[0]} is gone; put it back to "
                "read the held-out examples from it"
            )
        changes = data_changes(old, sources.listing())
        if changes:
            note = (
                f"The data changed since the run prepared it ({', '.join(changes[:3])}): "
                "these examples may not be the ones it held out."
            )
    examples = chatdata.read_examples(
        sources.files, cfg.skip_bad_lines, columns=tables.columns_of(cfg)
    )
    conversations = examples.conversations
    held = held_out_split(len(conversations), cfg.val_fraction, sources.description)
    picked = [c for c, h in zip(conversations, held, strict=True) if h][:n]
    return [_upto_last_answer(c) for c in picked], note


def _upto_last_answer(messages: list[dict]) -> list[dict]:
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[: last + 1]


def answer(model, tok, prompt: list[int], max_new_tokens: int) -> str:
    """A greedy answer, ended where chatting ends it (end-of-turn token or mark, not shown)."""
    stops = tok.stop_ids
    ids = generate_ids(model, prompt, max_new_tokens, temperature=0, stop_ids=stops)
    return "".join(stream_text(tok, ids, hide=stops, until=tok.stop_strings))


def _answers(model, tok, prompts, max_new_tokens, progress) -> list[str]:
    out = []
    for prompt in prompts:
        out.append(answer(model, tok, prompt, max_new_tokens))
        if progress:
            progress(1)
    return out


def make_report(
    target,
    n: int = DEFAULT_EXAMPLES,
    max_new_tokens: int = DEFAULT_NEW_TOKENS,
    which: str = "best",
    progress=None,
) -> dict:
    """Write RUN/eval/report.md; returns {"path", "markdown", "examples"}, each example
    {"prompt": messages, "reference", "start", "fine_tuned"}."""
    if n < 1:
        raise DataError(f"report: the number of examples must be at least 1, got {n}")
    file, cfg = run_config(target, which)
    run = file.parent.parent
    conversations, note = held_out(cfg, chat_sources(cfg, target, run), run, n)
    loaded = load(file)
    tok = loaded.tokenizer  # the run's: it carries the chat template the data was rendered with
    prompts = [chat_ids(tok, c[:-1]) for c in conversations]
    tuned = _answers(loaded.model, tok, prompts, max_new_tokens, progress)
    if cfg.lora_rank:  # the same model, adapters off: no second copy in memory
        with adapters_disabled(loaded.model) as base:
            start = _answers(base, tok, prompts, max_new_tokens, progress)
    else:
        del loaded  # one model in memory at a time
        start = _answers(load(cfg.init_from).model, tok, prompts, max_new_tokens, progress)
    examples = [
        {"prompt": c[:-1], "reference": c[-1]["content"], "start": s, "fine_tuned": t}
        for c, s, t in zip(conversations, start, tuned, strict=True)
    ]
    header = {
        "run": run.name,
        "base": cfg.init_from,
        "checkpoint": file.name,
        "lora": cfg.lora_rank,
        "data": cfg.data,
        "max_new_tokens": max_new_tokens,
        "note": note,
        "measures": measures(run),
    }
    markdown = to_markdown(header, examples)
    folder = run / "eval"
    folder.mkdir(exist_ok=True)
    path = folder / "report.md"
    write_text(path, markdown, durable=False)
    return {"path": str(path), "markdown": markdown, "examples": examples}


# -- Markdown ---------------------------------------------------------------------------------


MARKS = set("\\`*_[]<>|~&#")  # what Markdown could read as formatting inside a line


def inline(text: str) -> str:
    """Text as one line of Markdown that shows it as it is: marks escaped, line breaks as
    <br/> (inside a table cell too), control characters (a barely trained model makes them)
    as U+FFFD, as a terminal shows them."""
    text = "".join(c if c.isprintable() or c in "\n\t" else "\ufffd" for c in text)
    if not text.strip():
        return "*(empty)*"
    escaped = "".join("\\" + c if c in MARKS else c for c in text.strip())
    return escaped.replace("\n", "<br/>")


def measures(run: Path) -> list[tuple[str, str, float, float]]:
    """(data or task, measure, start, fine-tuned) of the run's saved evaluations that were
    taken with --compare (core.eval), the newest of each."""
    from core.runs.compare import HEADLINE, eval_records

    rows, seen = [], set()
    for record in eval_records(run):
        before, after = record.get("start"), record["result"]
        if not isinstance(before, dict):
            continue
        kind, data = record.get("kind"), str(record.get("data"))
        if kind in HEADLINE:
            pairs = [(data, k, before.get(k), after.get(k)) for k in HEADLINE[kind]]
        else:
            pairs = [
                (task, k, (before.get("tasks") or {}).get(task, {}).get(k), v)
                for task, ms in (after.get("tasks") or {}).items()
                for k, v in ms.items()
                if not k.endswith("_stderr")
            ]
        for row in pairs:
            numbers = all(isinstance(v, int | float) for v in row[2:])
            if numbers and row[:2] not in seen:
                seen.add(row[:2])
                rows.append(row)
    return rows


def to_markdown(header: dict, examples: list[dict]) -> str:
    kind = f"LoRA rank {header['lora']}, adapters off" if header["lora"] else "loaded as is"
    lines = [
        f"# Before and after: {inline(header['run'])}",
        "",
        f"The first {len(examples)} held-out examples of `{header['data']}`, answered greedily "
        f"(at most {header['max_new_tokens']} new tokens) by the start model "
        f"`{header['base']}` ({kind}) and by the fine-tuned one ({header['checkpoint']}).",
    ]
    if header["note"]:
        lines += ["", f"**Note:** {header['note']}"]
    if header.get("measures"):  # the run's saved evaluations with --compare, in one table
        lines += [
            "",
            "## Measures",
            "",
            "| Data or task | Measure | Start model | Fine-tuned |",
            "|---|---|---|---|",
        ]
        lines += [f"| {inline(d)} | {m} | {a:.4f} | {b:.4f} |" for d, m, a, b in header["measures"]]
    for i, ex in enumerate(examples, 1):
        lines += ["", f"## Example {i}", ""]
        for m in ex["prompt"]:
            lines += [f"**{m['role']}:** {inline(m['content'])}", ""]
        cells = (inline(ex[k]) for k in ("reference", "start", "fine_tuned"))
        lines += [
            "| Reference | Start model | Fine-tuned |",
            "|---|---|---|",
            "| " + " | ".join(cells) + " |",
        ]
    return "\n".join(lines) + "\n"
