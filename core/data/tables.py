"""Records from table files: JSON Lines (.jsonl), JSON (.json: an array of objects, or an object
holding one such list), CSV (.csv, UTF-8 with or without Excel's byte-order mark) and Parquet
(.parquet, through pyarrow), one reader for training data and question files alike.

Each record comes with the row number a user finds it by (the line for .jsonl and .csv, the
1-based row for .json and .parquet) and with canonical keys: the file's columns renamed by a
column mapping (canonical key -> the file's column), ShareGPT `conversations` (`from`/`value`,
human/gpt) turned into `messages` (`role`/`content`). Large files stream: Parquet a record
batch at a time, CSV and JSON Lines a row at a time (a .json array is read whole).
"""

from __future__ import annotations

import contextlib
import csv
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from core.errors import DataError

TABLE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
# canonical key -> the TrainConfig field naming the file's column for it
COLUMN_FIELDS = {
    "text": "text_column",
    "messages": "messages_column",
    "prompt": "prompt_column",
    "completion": "completion_column",
    "chosen": "chosen_column",
    "rejected": "rejected_column",
}
LAYOUTS = ("preference", "messages", "prompt/completion", "alpaca", "text")
CHAT_LAYOUTS = ("messages", "prompt/completion", "alpaca")
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "chatgpt": "assistant",
    "bing": "assistant",
}
PARQUET_BATCH = 1024  # rows a Parquet batch holds: memory stays flat whatever the file size
# The longest line (a .jsonl record, a CSV row or field) read: a longer one is refused without
# reading it whole (a 2 GB file with no line break would otherwise be held in memory).
MAX_RECORD_CHARS = 64 << 20
# A .json array is parsed whole: past this size, JSON Lines (.jsonl) is asked for instead.
MAX_JSON_BYTES = 256 << 20

OnBad = Callable[[int, str], None]  # (row number, what is wrong) of a row to skip


def is_table(path: Path) -> bool:
    return path.suffix.lower() in TABLE_SUFFIXES


def unit(path: Path) -> str:
    """What a row number counts in this file: "line" (.jsonl, .csv) or "row"."""
    return "line" if Path(path).suffix.lower() in (".jsonl", ".csv") else "row"


def columns_of(cfg) -> dict[str, str]:
    """The column mapping a TrainConfig sets: canonical key -> the file's column name."""
    out = {}
    for key, name in COLUMN_FIELDS.items():
        value = getattr(cfg, name, None)
        if value:
            out[key] = value
    return out


def check_columns(columns: dict) -> None:
    """One layout a mapping: a text column beside a chat or preference one would be ignored."""
    others = [COLUMN_FIELDS[k] for k in columns if k != "text"]
    if "text" in columns and others:
        raise DataError(
            f"text_column: reads a table as plain text and cannot go with {others[0]} (a chat "
            "or preference layout); give one or the other"
        )


def detect_layout(keys) -> str:
    """Which layout records with these (canonical) keys have: preference (prompt, chosen,
    rejected), messages, prompt/completion, alpaca (instruction, input, output) or text; ""
    when none fits."""
    keys = set(keys)
    if {"chosen", "rejected"} <= keys:
        return "preference"
    if "messages" in keys or "conversations" in keys:
        return "messages"
    if "prompt" in keys or "completion" in keys:
        return "prompt/completion"
    if "instruction" in keys or "output" in keys:
        return "alpaca"
    if "text" in keys:
        return "text"
    return ""


def layout_of(keys, columns: dict | None = None) -> str:
    """The layout, the mapped columns deciding first: --text-column on a file that also has
    a messages column means text."""
    mapped = detect_layout(k for k in (columns or {}) if k in COLUMN_FIELDS)
    return mapped or detect_layout(keys)


def describe_columns(columns: dict | None) -> str:
    """ "prompt <- question, completion <- answer", or "as named in the file"."""
    if not columns:
        return "as named in the file"
    return ", ".join(f"{key} \u2190 {col}" for key, col in columns.items())


# -- canonical records ---------------------------------------------------------------------------


def _sharegpt(turns):
    """ShareGPT turns ({"from": "human", "value": ...}) as role/content messages; other
    shapes pass unchanged (core.data.chatdata names what is wrong with them)."""
    if not isinstance(turns, list):
        return turns
    out = []
    for t in turns:
        if isinstance(t, dict) and "from" in t and "value" in t and "content" not in t:
            role = SHAREGPT_ROLES.get(str(t["from"]).lower(), t["from"])
            t = {"role": role, "content": t["value"]}
        out.append(t)
    return out


def _missing(path: Path, key: str, column: str, found) -> str:
    found = ", ".join(map(str, found)) or "none"
    return (
        f"{path}: no column {column!r} (the {key} column, {COLUMN_FIELDS[key]}); "
        f"columns found: {found}"
    )


def canonical(record: dict, columns: dict | None) -> dict:
    """The record with mapped columns under their canonical keys and ShareGPT turns as
    messages (mapped columns must be present: check with missing_column first)."""
    out = dict(record)
    for key, column in (columns or {}).items():
        value = record[column]
        out.pop(column, None)
        out[key] = value
    if "messages" not in out and "conversations" in out:
        out["messages"] = out.pop("conversations")
    if "messages" in out:
        messages = out["messages"]
        if isinstance(messages, str) and messages.lstrip().startswith("["):  # a CSV cell
            with contextlib.suppress(ValueError):  # chatdata says it is not a list
                messages = json.loads(messages)
        out["messages"] = _sharegpt(messages)
    return out


def missing_column(columns: dict | None, found) -> tuple[str, str] | None:
    """The first (key, column) of the mapping that is not among the found columns."""
    found = set(found)
    for key, column in (columns or {}).items():
        if column not in found:
            return key, column
    return None


# -- readers: (row number, the file's own record) --------------------------------------------------


def _open_text(path: Path):
    try:
        return open(path, encoding="utf-8-sig", newline="")  # noqa: SIM115 (the caller closes)
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror or e})") from None


def _lines(path: Path, f) -> Iterator[str]:
    """The file's lines, each read with a bound: a line over MAX_RECORD_CHARS is refused
    naming the file, the line and the limit."""
    number = 0
    while True:
        line = f.readline(MAX_RECORD_CHARS + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_RECORD_CHARS:
            raise DataError(
                f"{path}: line {number} is longer than {MAX_RECORD_CHARS:,} characters (the "
                "longest record read); is it one record a line?"
            )
        yield line


def _jsonl(path: Path, bad) -> Iterator[tuple[int, object]]:
    with _open_text(path) as f:
        # newline="" keeps "\r\n" whole; lines split at "\n" as the file's own numbering does
        for number, line in enumerate(_lines(path, f), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                bad(number, f"not valid JSON ({e})", f"line {number} is not JSON ({e})")
                continue
            yield number, obj


def _csv(path: Path, bad) -> Iterator[tuple[int, dict]]:
    """Each data row with the file line it ends on. A row with more or fewer fields than the
    header is bad: an unquoted comma would shift a value into another column."""
    csv.field_size_limit(MAX_RECORD_CHARS)  # a document in a cell is over the 128 KB default
    with _open_text(path) as f:
        reader = csv.DictReader(_lines(path, f))
        _check_header(path, reader.fieldnames)
        for n, row in enumerate(reader, 1):
            line, header = reader.line_num, len(reader.fieldnames)
            if None in row:  # DictReader keeps the extra fields under the key None
                fields = header + len(row[None])
            else:  # and fills missing ones with None
                fields = sum(v is not None for v in row.values())
            if fields != header:
                reason = f"has {fields} fields, the header {header}"
                bad(line, reason, f"row {n} (line {line}) {reason}")
                continue
            yield line, row


def csv_header(path: Path) -> list[str]:
    csv.field_size_limit(MAX_RECORD_CHARS)
    try:
        with _open_text(path) as f:
            header = next(csv.reader(_lines(path, f)), [])
    except csv.Error as e:
        raise DataError(f"{path}: not a readable CSV header ({e})") from None
    _check_header(path, header)
    return header


def _check_header(path: Path, header) -> None:
    """Two columns of one name: csv would keep the last and count the row short."""
    seen = set()
    for name in header or []:
        if name in seen:
            raise DataError(f"{path}: the header names the column {name!r} twice; rename one")
        seen.add(name)


def _json_rows(path: Path) -> list:
    """The list of records of a .json file: the file itself, or the one list of objects an
    object holds ({"data": [...]}). A file of JSON lines named .json is read as such."""
    with _open_text(path) as f:
        first, second = f.readline(MAX_RECORD_CHARS + 1), f.readline(MAX_RECORD_CHARS + 1)
        if _is_json_line(first) and second.strip():  # JSON Lines saved as .json (datasets'
            return None  # to_json does)
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise DataError(
                f"{path}: a .json file is read whole and this one holds {size:,} bytes (at "
                f"most {MAX_JSON_BYTES:,}); save it as JSON Lines (.jsonl), one record a line"
            )
        text = first + second + f.read()
    try:
        value = json.loads(text)
    except ValueError as e:
        if "Extra data" in str(e):  # JSON Lines saved as .json (datasets' to_json does)
            return None
        raise DataError(f"{path}: not valid JSON ({e})") from None
    if isinstance(value, dict):
        lists = [v for v in value.values() if isinstance(v, list)]
        if len(lists) == 1:
            value = lists[0]
    if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
        got = type(value).__name__ if not isinstance(value, list) else "a list of non-objects"
        raise DataError(
            f"{path}: expected a JSON array of objects, or an object holding one such list; "
            f"got {got}"
        )
    return value


def _is_json_line(line: str) -> bool:
    """A first line that is one whole JSON object on its own (the file is JSON Lines)."""
    line = line.strip()
    if not (line.startswith("{") and line.endswith("}")):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _parquet_file(path: Path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow: pip install pyarrow") from None
    try:
        # pre_buffer (pyarrow's default) reads ahead without bound: 324 MB held for a 337 MB
        # file; without it a 1 MB read buffer keeps memory flat (measured: 4 MB)
        return pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
    except Exception as e:  # pyarrow's ArrowInvalid, OSError, ...: one line naming the file
        raise DataError(f"{path}: not a readable Parquet file ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _parquet(path: Path) -> Iterator[tuple[int, dict]]:
    pf = _parquet_file(path)
    number = 0
    batches = pf.iter_batches(batch_size=PARQUET_BATCH)
    while True:
        try:
            batch = next(batches, None)
        except Exception as e:
            raise DataError(f"{path}: not a readable Parquet file ({_first_line(e)})") from None
        if batch is None:
            return
        for record in batch.to_pylist():
            number += 1
            yield number, record


def column_names(path: Path) -> list[str] | None:
    """The columns a CSV or Parquet file declares (None for JSON: each record has its own)."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return csv_header(path)
    if suffix == ".parquet":
        return list(_parquet_file(path).schema_arrow.names)
    return None


def iter_records(
    path: str | Path, columns: dict | None = None, on_bad: OnBad | None = None
) -> Iterator[tuple[int, dict]]:
    """(row number, record with canonical keys) for each record of a .jsonl, .json, .csv or
    .parquet file. A bad row (not JSON, not an object, a CSV row with the wrong number of
    fields, a .jsonl record without a mapped column) raises a one-line DataError, or with
    on_bad is passed to it and skipped. A mapped column a CSV or Parquet file lacks, an
    unreadable file or a .json that is not an array of objects always raises."""
    path = Path(path)

    def bad(number: int, reason: str, message: str) -> None:
        if on_bad is None:
            raise DataError(f"{path}: {message}")
        on_bad(number, reason)

    try:
        declared = column_names(path)
        if declared is not None:
            gone = missing_column(columns, declared)
            if gone:
                raise DataError(_missing(path, *gone, declared))
        for number, record in _raw(path, bad):
            if not isinstance(record, dict):
                kind = f"a {type(record).__name__}"
                bad(
                    number,
                    f"expected a JSON object, got {kind}",
                    f"line {number}: expected an object, got {kind}",
                )
                continue
            if declared is None:
                gone = missing_column(columns, record)
                if gone:
                    message = _missing(path, *gone, record).split(": ", 1)[1]
                    bad(number, message, f"{unit(path)} {number}: {message}")
                    continue
            yield number, canonical(record, columns)
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text ({e.reason}); save it as UTF-8") from None
    except csv.Error as e:  # a field over the limit, a NUL byte, a stray line break
        raise DataError(f"{path}: not a readable CSV file ({e})") from None


def _raw(path: Path, bad) -> Iterator[tuple[int, object]]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        yield from _csv(path, bad)
    elif suffix == ".parquet":
        yield from _parquet(path)
    elif suffix == ".json":
        rows = _json_rows(path)
        if rows is None:
            yield from _jsonl(path, bad)
        else:
            yield from enumerate(rows, 1)
    else:
        yield from _jsonl(path, bad)


def first_records(path: str | Path, columns: dict | None = None, n: int = 3) -> list[dict]:
    """Up to n leading records (bad rows skipped): what layout detection and the window's
    preview read."""
    out = []
    for _, record in iter_records(path, columns, on_bad=lambda *_: None):
        out.append(record)
        if len(out) >= n:
            break
    return out


def file_layout(path: str | Path, columns: dict | None = None) -> str:
    """The layout of a file's first record ("" for an empty file or an unknown layout)."""
    records = first_records(path, columns, 1)
    return layout_of(records[0], columns) if records else ""


def require_layout(path: str | Path, columns: dict | None = None) -> str:
    """file_layout, or a DataError naming the columns found when no layout fits them (for
    files whose rows share their columns: a table whose first row fits none, none does)."""
    records = first_records(path, columns, 1)
    if not records:
        return ""
    layout = layout_of(records[0], columns)
    if not layout:
        found = ", ".join(map(str, records[0])) or "none"
        raise DataError(
            f"{path}: no known layout in its columns ({found}); name the columns to use with "
            "--text-column, --messages-column, --prompt-column and --completion-column (or "
            "--chosen-column and --rejected-column)"
        )
    return layout


# -- plain text from a text column -----------------------------------------------------------------


def iter_texts(path: str | Path, columns: dict | None = None) -> Iterator[str]:
    """Each row's text (the text column, or the column mapped to it): one document a row;
    empty and null cells are skipped."""
    path = Path(path)
    for number, record in iter_records(path, columns):
        if "text" not in record:
            found = ", ".join(map(str, record)) or "none"
            raise DataError(
                f"{path}: {unit(path)} {number} has no text column; columns found: {found} "
                "(name the column to train on with text_column)"
            )
        value = record["text"]
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise DataError(
                f"{path}: {unit(path)} {number}: the text column holds a "
                f"{type(value).__name__}, not text"
            )
        yield value


# -- a preview for the window ----------------------------------------------------------------------

KINDS = {".parquet": "Parquet", ".csv": "CSV", ".json": "JSON", ".jsonl": "JSON Lines"}
SHOWN = {  # the columns a preview shows of each layout
    "text": ("text",),
    "prompt/completion": ("prompt", "completion"),
    "alpaca": ("instruction", "input", "output"),
    "preference": ("prompt", "chosen", "rejected"),
}


def _cut(value, width: int) -> str:
    text = " ".join(str(value).split())  # newlines and runs of spaces as one space
    return text if len(text) <= width else text[: max(1, width - 1)] + "\u2026"


IMAGE_PARTS = ("image", "image_url", "input_image")  # the part types naming an image file


def _part_file(part: dict):
    """The file an image part names ("image", "path" or "url"; OpenAI's image_url.url)."""
    inner = part.get("image_url")
    if inner is not None:
        return inner.get("url") if isinstance(inner, dict) else inner
    return next((part[k] for k in ("image", "path", "url") if part.get(k)), None)


def _content_text(content) -> str:
    """A message's content as text: a list of parts with each image as [image NAME]."""
    if not isinstance(content, list):
        return str(content)
    words = []
    for part in content:
        if not isinstance(part, dict):
            words.append(str(part))
        elif part.get("type") == "text":
            words.append(str(part.get("text", "")))
        elif part.get("type") in IMAGE_PARTS:
            words.append(f"[image {Path(str(_part_file(part) or '?')).name}]")
        else:
            words.append(f"[{part.get('type')}]")
    return " ".join(words)


def _row_text(record: dict, layout: str, width: int) -> str:
    if layout == "messages" and isinstance(record.get("messages"), list):
        turns = [m for m in record["messages"] if isinstance(m, dict)]
        each = max(12, width // max(1, len(turns)))
        return " | ".join(
            _cut(f"{m.get('role')}: {_content_text(m.get('content'))}", each) for m in turns
        )
    keys = [k for k in SHOWN.get(layout, record) if k in record]
    each = max(12, width // max(1, len(keys)))
    return " | ".join(_cut(f"{k}: {record[k]}", each) for k in keys)


def record_images(record) -> list[str]:
    """The image files a record names, in order, as written: its image parts' (in any of its
    messages, prompt, chosen or rejected turns) and a ShareGPT "images" list."""
    found: list[str] = []

    def walk(value) -> None:
        if isinstance(value, dict):
            if value.get("type") in IMAGE_PARTS:
                name = _part_file(value)
                if isinstance(name, str):
                    found.append(name)
                return
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    if isinstance(record, dict):
        walk({k: v for k, v in record.items() if k != "images"})
        listed = record.get("images")
        if isinstance(listed, list):
            found += [f for f in listed if isinstance(f, str)]
    return found


def preview(path: str | Path, columns: dict | None = None, n: int = 3, width: int = 110) -> str:
    """A few lines for the window: the kind of file, the layout detected, the column mapping
    in use and the first n rows, each cut to about width characters."""
    path = Path(path)
    records = first_records(path, columns, n)
    layout = layout_of(records[0], columns) if records else ""
    found = ", ".join(map(str, records[0])) if records else "none"
    kind = KINDS.get(path.suffix.lower(), "table")
    if layout:
        what = f"layout {layout}"
    else:
        what = f"layout not recognised (columns {found}): name the columns to use"
    lines = [f"{kind} file {path.name}: {what}; columns {describe_columns(columns)}"]
    lines += [f"{i}. {_row_text(r, layout, width)}" for i, r in enumerate(records, 1)]
    return "\n".join(lines)
