"""Did the fine-tune help? The measures of lm-evaluation-harness (0.4.13), computed with its
definitions (core.use.scoring) so they can be quoted beside published numbers:

- a text: the rolling log-likelihood of each document and, summed over documents,
  word_perplexity = exp(-Σll / Σwords) (words from re.split(r"\\s+", doc)), byte_perplexity =
  exp(-Σll / ΣUTF-8 bytes), bits_per_byte = -Σll / Σbytes / ln 2; token_perplexity (per token
  of this model's tokenizer) beside them, not comparable across tokenizers;
- questions: each choice's log-likelihood after the context, acc from the sums, acc_norm from
  the sums per character of the choice, acc_bytes per UTF-8 byte of it (the delimiter not
  counted), with few-shot examples drawn as the harness draws them.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from core.data import tables
from core.errors import DataError
from core.use import scoring
from core.weights.loader import Loaded

LETTERS = "ABCDEFGHIJ"
FRAME = "Question: {question}\nAnswer:"  # the frame of a file with a question column
FEWSHOT_SEED = 1234  # lm_eval's fewshot_random_seed


@dataclass
class QuestionFormat:
    """How a question becomes a prompt, in the words of an lm_eval task YAML."""

    template: str | None = None  # doc_to_text: a Jinja template over the columns, or a column
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    description: str = ""
    fewshot: int = 0  # num_fewshot
    seed: int = FEWSHOT_SEED  # fewshot_random_seed
    chat: bool = False  # apply_chat_template: the model's own chat template
    multiturn: bool = True  # fewshot_as_multiturn (lm_eval's default with a chat template)


def unescape(text: str | None) -> str | None:
    """\\n and \\t typed on a command line or in a one-line field: a line break and a tab, as a
    task YAML's double-quoted string has them."""
    return None if text is None else text.replace("\\n", "\n").replace("\\t", "\t")


# -- text -------------------------------------------------------------------------------------


WANTED = {
    "--text": "one text file, or a table (.jsonl, .csv, .parquet) with a text column",
    "--choices": "one question file (.jsonl, .json, .csv, .parquet)",
}


def input_file(path: str | Path, flag: str) -> Path:
    """The file a flag names; a folder or a missing path is one line naming the flag."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{flag}: {path} is a folder; give {WANTED[flag]}")
    if not path.is_file():
        raise DataError(f"{flag}: {path} not found")
    return path


def read_documents(path: str | Path, column: str = "text") -> list[str]:
    """A plain text file is one document; a table (.jsonl, .json, .csv, .parquet) gives one
    document a row, from its text column."""
    path = input_file(path, "--text")
    if not tables.is_table(path):
        return [path.read_text(encoding="utf-8", errors="replace")]
    docs = []
    try:
        for number, row in tables.iter_records(path, {"text": column}):
            value = row["text"]
            if not isinstance(value, str):
                raise DataError(
                    f"{path}: {tables.unit(path)} {number}: the {column} column "
                    f"holds {type(value).__name__}, not text"
                )
            docs.append(value)
    except DataError as e:
        raise DataError(f"--text: {e}") from None
    if not docs:
        raise DataError(f"--text: {path} holds no rows")
    return docs


def text_metrics(loaded: Loaded, docs: str | list[str], progress=None) -> dict:
    """lm_eval's perplexity measures over the documents (its loglikelihood_rolling windows)."""
    docs = [docs] if isinstance(docs, str) else list(docs)
    rolled = scoring.loglikelihood_rolling(loaded, docs, progress)
    ll = sum(r["ll"] for r in rolled)
    tokens = sum(r["tokens"] for r in rolled)
    if tokens == 0:
        raise DataError("text: nothing to score (it tokenizes to no tokens)")
    words = sum(len(re.split(r"\s+", d)) for d in docs)
    size = sum(len(d.encode("utf-8")) for d in docs)
    return {
        "word_perplexity": math.exp(-ll / words),
        "byte_perplexity": math.exp(-ll / size),
        "bits_per_byte": -ll / size / math.log(2),
        "token_perplexity": math.exp(-ll / tokens),
        "loglikelihood": ll,
        "documents": len(docs),
        "words": words,
        "bytes": size,
        "tokens": tokens,
    }


# -- questions --------------------------------------------------------------------------------


def _answer(value, choices: list[str], where: str) -> int:
    if isinstance(value, float) and value.is_integer():  # 1.0 from a Parquet or JSON float
        value = int(value)
    text = str(value).strip()
    if text.upper() in LETTERS[: len(choices)] and len(text) == 1:
        return LETTERS.index(text.upper())
    if text.lstrip("-").isdigit() and 0 <= int(text) < len(choices):
        return int(text)
    last = len(choices) - 1
    raise DataError(
        f"{where}: answer {text!r} is not one of the {len(choices)} choices "
        f"(an index 0-{last} or a letter A-{LETTERS[min(last, 9)]})"
    )


def _choices(row: dict, where: str) -> list[str]:
    if "choices" in row:
        choices = row["choices"]
        if isinstance(choices, str):
            try:
                choices = json.loads(choices)
            except ValueError:
                raise DataError(f"{where}: choices is not a JSON list: {choices[:40]!r}") from None
        if hasattr(choices, "tolist"):  # a NumPy array from a table reader
            choices = choices.tolist()
    else:
        choices = [row[k] for k in LETTERS if row.get(k) not in (None, "")]
    if not isinstance(choices, list) or len(choices) < 2:
        raise DataError(f"{where}: needs at least two choices")
    for n, c in enumerate(choices):
        if not isinstance(c, str):  # 1 and "1" would score alike and read back differently
            raise DataError(
                f"{where}: choice {n} is {type(c).__name__} {c!r}, not text; "
                "write the choices as strings"
            )
        if not c.strip():  # acc_norm divides by its length; an empty choice cannot be scored
            raise DataError(f"{where}: choice {n} is empty")
    seen = {}
    for n, c in enumerate(choices):
        if c in seen:  # a tie would always pick the first: accuracy that means nothing
            raise DataError(f"{where}: choices {seen[c]} and {n} are the same ({c!r})")
        seen[c] = n
    return choices


def _item(row, where: str, template: str | None = None) -> dict:
    """{"doc": the row, "choices", "answer"} of one question; the context is made later
    (doc_to_text: a template, the context column as is, or the question in a frame)."""
    if not isinstance(row, dict):
        raise DataError(
            f"{where}: expected an object with question, choices and answer, got "
            f"{type(row).__name__}"
        )
    prompt = template is not None or {"question", "context"} & set(row)
    if not prompt or "answer" not in row:
        found = ", ".join(sorted(str(k) for k in row)) or "none"
        raise DataError(
            f"{where}: needs the columns question (or context), answer and choices "
            f"(or A, B, C, ...); found {found}"
        )
    choices = _choices(row, where)
    return {"doc": row, "choices": choices, "answer": _answer(row["answer"], choices, where)}


def read_choices(path: str | Path, template: str | None = None) -> list[dict]:
    """Multiple-choice items from .jsonl, .json, .csv or .parquet (core.data.tables): the
    columns question or context, choices (a list) and answer (an index or a letter), or
    A, B, C, ... in place of choices; with a template, any columns it names in place of
    question or context."""
    path = input_file(path, "--choices")
    rows = []
    for n, (number, row) in enumerate(tables.iter_records(path), 1):
        if path.suffix.lower() == ".csv":  # the row among the data rows, and its file line
            where = f"row {n} (line {number})"
        else:
            where = f"{tables.unit(path)} {number}"
        rows.append((where, row))
    if not rows:
        raise DataError(f"choices: {path} holds no questions")
    items = [_item(row, f"{path}: {where}", template) for where, row in rows]
    for item, (where, _) in zip(items, rows, strict=True):
        _picture(item, path.parent, f"{path}: {where}")
    return items


def _picture(item: dict, folder: Path, where: str) -> None:
    """An item's "image": PATH (relative to the questions' file), decoded and checked now,
    before any model loads: item["image"] the path, item["picture"] its RGB image."""
    from core.data import images

    value = item["doc"].get("image")
    if value in (None, ""):
        return
    if not isinstance(value, str):
        raise DataError(f"{where}: image must be a file path, got {type(value).__name__}")
    path = Path(value) if Path(value).is_absolute() else folder / value
    try:
        item["picture"] = images.open_rgb(path)
    except images.ImageProblem as e:
        raise DataError(f"{where}: image {value} {e}") from None
    item["image"] = path


def _jinja(template: str):
    import jinja2

    # lm_eval's template environment, its regex_replace filter included
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["regex_replace"] = lambda s, pattern, repl, count=0: re.sub(
        pattern, repl, s, count=count
    )
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise DataError(f"--template: {e}") from None


def doc_to_text(item: dict, template: str | None) -> str:
    """lm_eval's doc_to_text: a column's value, or the Jinja template rendered over the row;
    without a template the context column as is, else the question in the frame."""
    import jinja2

    doc = item["doc"]
    if template is None:
        return str(doc["context"]) if "context" in doc else FRAME.format(question=doc["question"])
    if template in doc:
        return str(doc[template])
    try:
        return _jinja(template).render(**doc)
    except jinja2.TemplateError as e:
        found = ", ".join(sorted(map(str, doc)))
        raise DataError(f"--template: {e} (the columns are {found})") from None


def sample_shots(rnd: random.Random, pool: list[dict], n: int, doc: dict) -> list[dict]:
    """lm_eval's ContextSampler.sample with the eval doc: n + 1 drawn, the doc itself dropped
    (where duplicates of it leave fewer than n, drawn again from the rest)."""
    if n == 0:
        return []
    if n + 1 > len(pool):
        raise DataError(f"--fewshot: {n} examples need at least {n + 1} questions in the file")
    picked = [x for x in rnd.sample(pool, n + 1) if x["doc"] != doc][:n]
    if len(picked) < n:
        rest = [x for x in pool if x["doc"] != doc]
        picked = rnd.sample(rest, n)
    return picked


def build_context(loaded: Loaded | None, item: dict, shots: list[dict], fmt: QuestionFormat):
    """(context, the delimiter before each choice) as lm_eval's fewshot_context builds it."""
    messages = []  # (role, content, delimiter in plain text)
    if fmt.description:
        messages.append(["system", fmt.description, ""])
    for shot in shots:
        messages.append(["user", doc_to_text(shot, fmt.template), fmt.target_delimiter])
        answer = shot["choices"][shot["answer"]]
        messages.append(["assistant", answer, fmt.fewshot_delimiter])
    messages.append(["user", item.get("mark", "") + doc_to_text(item, fmt.template), ""])
    if not fmt.chat:
        return "".join(content + delim for _, content, delim in messages), fmt.target_delimiter
    system = [m for m in messages if m[0] == "system"]
    turns = [m for m in messages if m[0] != "system"]
    if fmt.multiturn:
        chat = [{"role": r, "content": c} for r, c, _ in system + turns]
    else:  # multiturn_to_singleturn: everything in one user message
        turns[-1][2] = ""
        chat = [{"role": r, "content": c} for r, c, _ in system]
        chat.append({"role": "user", "content": "".join(c + d for _, c, d in turns)})
    return scoring.render_chat(loaded, chat), ""


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)  # the first of equals, as NumPy


def _stderr(hits: list[float]) -> float | None:
    """lm_eval's mean_stderr: the sample standard deviation over sqrt(n) (None for one item:
    JSON has no NaN)."""
    n = len(hits)
    if n < 2:
        return None
    mu = sum(hits) / n
    return math.sqrt(sum((x - mu) ** 2 for x in hits) / (n - 1) / n)


def question_requests(loaded, items: list[dict], fmt: QuestionFormat, limit=None):
    """The scored items and their (context, continuation) requests, few-shot examples drawn
    from all items with one Random(seed) consumed in order, as lm_eval draws them."""
    rnd = random.Random(fmt.seed)
    scored = items if limit is None else items[:limit]
    requests = []
    for item in scored:
        shots = sample_shots(rnd, items, fmt.fewshot, item["doc"])
        context, delim = build_context(loaded, item, shots, fmt)
        requests.append([(context, delim + c) for c in item["choices"]])
    return scored, requests


def _shown(loaded: Loaded, items: list[dict], fmt: QuestionFormat) -> dict:
    """The items' images as the model sees them ({id(item): pixel values (1, 3, H, W)}), its
    tower attached (core.use.generate.seeing); each such item's context gets the image's
    tokens where its mark goes, before the question (item["mark"])."""
    from core.data import images
    from core.use.generate import seeing

    pictured = [item for item in items if "picture" in item]
    if not pictured:
        return {}
    if fmt.fewshot:
        raise DataError(
            "--fewshot: questions with images are scored zero-shot (a few-shot example's "
            "image would not be shown); leave --fewshot out"
        )
    paths = [item["image"] for item in pictured]
    seen = seeing(loaded, paths, [item["picture"] for item in pictured], "--choices")
    spec = seen.spec
    assert isinstance(spec, images.ImageSpec)  # seeing refused a model that sees none
    out = {}
    for n, item in enumerate(pictured):
        count = images.image_tokens(spec, images.resized(item["picture"], spec))
        item["mark"] = spec.text(count)
        out[id(item)] = seen.pixels[n : n + 1]
    return out


def choice_metrics(
    loaded: Loaded,
    items: list[dict],
    fmt: QuestionFormat | None = None,
    limit: int | None = None,
    progress=None,
) -> dict:
    """acc, acc_norm (per character of the choice) and acc_bytes (per UTF-8 byte), with their
    standard errors, and each item's picks [acc, acc_norm, acc_bytes]."""
    fmt = fmt or QuestionFormat()
    scored = items if limit is None else items[:limit]
    shown = _shown(loaded, scored, fmt)
    scored, requests = question_requests(loaded, items, fmt, limit)
    if not scored:
        raise DataError("choices: no questions to score")
    flat = [r for rs in requests for r in rs]
    pixels = [shown.get(id(item)) for item in scored for _ in item["choices"]]
    lls = [ll for ll, _ in scoring.loglikelihood(loaded, flat, progress, pixels)]
    hits = {"acc": [], "acc_norm": [], "acc_bytes": []}
    picks, at = [], 0
    for item in scored:
        k = len(item["choices"])
        mine, at = lls[at : at + k], at + k
        chars = [len(c) for c in item["choices"]]
        size = [len(c.encode("utf-8")) for c in item["choices"]]
        pick = [
            _argmax(mine),
            _argmax([a / b for a, b in zip(mine, chars, strict=True)]),
            _argmax([a / b for a, b in zip(mine, size, strict=True)]),
        ]
        picks.append(pick)
        for name, p in zip(hits, pick, strict=True):
            hits[name].append(1.0 if p == item["answer"] else 0.0)
    out = {}
    for name, h in hits.items():
        out[name] = sum(h) / len(h)
        out[f"{name}_stderr"] = _stderr(h)
    out["n"] = len(scored)
    out["picks"] = picks
    return out


# -- results in the run -----------------------------------------------------------------------


def fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def run_folder(loaded: Loaded) -> Path | None:
    """The run a loaded checkpoint belongs to (None for a plain model folder, even one kept
    inside a run folder)."""
    run = loaded.checkpoint.parent.parent
    if loaded.config is None or not (run / "config.yaml").is_file():
        return None
    return run


def result_name(kind: str, label: str, settings: dict) -> str:
    """One file per data file (its full name and place) and settings: q.csv and q.parquet, or
    two q.jsonl in two folders, never overwrite each other; the same evaluation again does."""
    key = json.dumps(settings, sort_keys=True, default=str)
    tag = hashlib.sha256(key.encode()).hexdigest()[:8]
    safe = re.sub(r"[^\w.,+-]+", "_", label)[:80]
    return f"{kind}-{safe}-{tag}.json"


def write_record(
    loaded: Loaded,
    kind: str,
    label: str,
    settings: dict,
    result: dict,
    start: dict | None = None,
    data: Path | None = None,
) -> Path | None:
    """RUN/eval/<kind>-<name>-<settings>.json for a run (None for a plain model folder)."""
    from core.platform.atomic import write_text

    run = run_folder(loaded)
    if run is None:
        return None
    folder = run / "eval"
    folder.mkdir(exist_ok=True)
    record = {
        "model": str(loaded.checkpoint),
        "step": loaded.step,
        "kind": kind,
        "data": label,
        "settings": settings,
        "result": result,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if data is not None:
        record["data_fingerprint"] = fingerprint(data)
    if start is not None:
        record["start"] = start
        record["start_model"] = str((loaded.base or {}).get("init_from"))
    path = folder / result_name(kind, label, settings)
    write_text(path, json.dumps(record, indent=1))
    return path


def write_result(
    loaded: Loaded, data: Path, kind: str, settings: dict, result: dict, start: dict | None = None
):
    """The record of a data file's evaluation (its resolved path names it)."""
    data = Path(data)
    settings = {**settings, "file": str(data.resolve())}
    return write_record(loaded, kind, data.name, settings, result, start, data)


def list_results(run: str | Path) -> list[dict]:
    """The evaluation records of a run, newest first (each with its "path")."""
    from core.runs.compare import eval_records

    return eval_records(run)


# -- the command ------------------------------------------------------------------------------


def load_model(target, which: str = "best", device: str = "cpu") -> Loaded:
    """The model to evaluate, in fp32 on device ("auto": the GPU where there is one); a LoRA
    run with a 4- or 8-bit base gets its base quantized as training made it (bitsandbytes NF4
    or int8 from the same weights), the adapters on and unmerged."""
    import torch

    from core.platform.device import cuda_device_count, resolve_device
    from core.weights.loader import load

    if device == "auto":
        device = "cuda" if cuda_device_count() else "cpu"
    where = resolve_device(device)
    loaded = load(target, which, str(where))
    cfg = loaded.config
    if cfg is not None and cfg.init_from and cfg.lora_rank and cfg.base_bits in ("4", "8"):
        from core.models import quant

        quant.quantize_base(loaded.model, int(cfg.base_bits), torch.float32, where)
        loaded.model.eval()
    return loaded


def load_with_start(target, which: str, device: str, compare: bool) -> tuple[Loaded, Loaded | None]:
    """The model to evaluate and, with compare, the pretrained model its fine-tune began
    from (None without compare)."""
    loaded = load_model(target, which, device)
    if not compare:
        return loaded, None
    if not loaded.base:
        raise DataError("compare: the target is not a fine-tune of a pretrained model")
    return loaded, load_model(loaded.base["init_from"], device=device)


def _measure(loaded: Loaded, docs, items, fmt: QuestionFormat, limit, progress) -> dict:
    out = {}
    if docs is not None:
        out["text"] = text_metrics(loaded, docs, progress)
    if items is not None:
        out["choices"] = choice_metrics(loaded, items, fmt, limit, progress)
    return out


def evaluate_files(
    target,
    text=None,
    choices=None,
    fewshot: int = 0,
    limit=None,
    compare: bool = False,
    which: str = "best",
    progress=None,
    fmt: QuestionFormat | None = None,
    text_column: str = "text",
    device: str = "cpu",
) -> dict:
    """What `python -m core.eval` and the window's Evaluate tab compute: {"text": ...,
    "choices": ..., and with compare "start": the same for the model a fine-tune began from}.
    Results of a run are written to RUN/eval/."""
    if not text and not choices:
        raise DataError("evaluate: give a text file, a choices file or both")
    fmt = replace(fmt or QuestionFormat(), fewshot=fewshot or (fmt.fewshot if fmt else 0))
    docs = read_documents(text, text_column) if text else None
    items = read_choices(choices, fmt.template) if choices else None
    if items is not None:
        if fmt.fewshot + 1 > len(items) and fmt.fewshot:
            raise DataError(
                f"--fewshot: {fmt.fewshot} examples need at least "
                f"{fmt.fewshot + 1} questions in {choices}"
            )
        if fmt.template is not None:
            doc_to_text(items[0], fmt.template)  # a bad template is refused before loading
    loaded, start = load_with_start(target, which, device, compare)
    out = _measure(loaded, docs, items, fmt, limit, progress)
    if start is not None:
        out["start"] = _measure(start, docs, items, fmt, limit, progress)
    before = out.get("start", {})
    if text:
        settings = {"text_column": text_column} if tables.is_table(Path(text)) else {}
        write_result(loaded, Path(text), "text", settings, out["text"], before.get("text"))
    if choices:
        settings = {**asdict(fmt), "limit": limit}
        write_result(
            loaded, Path(choices), "choices", settings, out["choices"], before.get("choices")
        )
    return out


def evaluate_tasks(
    target,
    tasks: str,
    fewshot: int | None = None,
    limit=None,
    chat: bool = False,
    multiturn: bool = True,
    compare: bool = False,
    which: str = "best",
    progress=None,
    device: str = "cpu",
) -> dict:
    """lm-evaluation-harness tasks on a run or model (core.use.harness), and with compare on
    the model a fine-tune started from; a run's results go to RUN/eval/."""
    from core.use import harness

    harness.check_tasks(tasks)  # unknown tasks and unreadable data: before the model loads
    loaded, start = load_with_start(target, which, device, compare)
    out = harness.run_tasks(loaded, tasks, fewshot, limit, chat, multiturn, progress)
    if start is not None:
        out["start"] = harness.run_tasks(start, tasks, fewshot, limit, chat, multiturn, progress)
    settings = {
        "tasks": tasks,
        "fewshot": fewshot,
        "limit": limit,
        "chat": chat,
        "multiturn": multiturn,
    }
    label = ",".join(Path(t.strip()).stem for t in tasks.split(",") if t.strip())
    result = {"tasks": out["tasks"], "n": out["n"]}
    before = {"tasks": out["start"]["tasks"]} if start is not None else None
    path = write_record(loaded, "tasks", label, settings, result, before)
    out["path"] = str(path) if path else None
    return out


ROWS = {
    "text": ("word_perplexity", "byte_perplexity", "bits_per_byte", "token_perplexity"),
    "choices": ("acc", "acc_norm", "acc_bytes", "n"),
}


def _cell(v) -> str:
    return f"{v:>10.4f}" if isinstance(v, float) else f"{v:>10}"


def format_table(out: dict) -> str:
    """measure, value (and with compare: the start model's value beside it); lm_eval tasks
    (out["tasks"]) as task, measure, value."""
    start = out.get("start")
    head = [f"{'':<8} {'':<17} {'start':>10} {'fine-tuned':>10}"] if start else []
    rows = []
    for part, keys in ROWS.items():
        for key in keys if part in out else ():
            values = ([start[part][key]] if start else []) + [out[part][key]]
            rows.append(f"{part:<8} {key:<17} {' '.join(_cell(v) for v in values)}")
    tasks = out.get("tasks")
    if tasks:
        before = (start or {}).get("tasks") or {}
        if before and not head:
            head = [f"{'':<8} {'':<17} {'start':>10} {'fine-tuned':>10}"]
        for task, measures in tasks.items():
            for key, value in measures.items():
                if not isinstance(value, float | int) or key.endswith("_stderr"):
                    continue
                values = ([before.get(task, {}).get(key, "")] if before else []) + [value]
                rows.append(f"{task:<8} {key:<17} {' '.join(_cell(v) for v in values)}")
    return "\n".join(head + rows)
