"""Run folders as the web page sees them, read and never written: the run list with each
run's state, progress and ETA, a run's metrics.jsonl followed as it grows, and the tails of its
samples, log and GRPO completions.

Only the fixed file names below are opened, inside folders found by listing the watched
folder; a name from a request is looked up among those, never joined to a path. Links are not
followed. A folder that vanishes, a file being replaced (a resume rewrites metrics.jsonl) or a
line still being written are ordinary states, not errors.
"""

from __future__ import annotations

import json
import math
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from core.runs import experts, lock

METRICS = "metrics.jsonl"
STATUS = "status.json"
SAMPLES = "samples.txt"
LOG = "train.log"
COMPLETIONS = "completions.jsonl"
CONFIG = "config.yaml"
# What makes a folder a run (core.runs.folder.RUN_MARKS and what every run writes first).
MARKS = (CONFIG, METRICS, STATUS, LOG, lock.LOCK_NAME)

MAX_POINTS = 4000  # step records a page gets at once; later ones arrive one by one
TAIL_BYTES = 64 * 1024  # the end of metrics.jsonl read for the run list's progress and ETA
LOG_LINES = 60
SAMPLE_BYTES = 16 * 1024
COMPLETION_BYTES = 1 << 20  # a GRPO step's rows are a few hundred KB at most
COMPLETION_ROWS = 16
LIST_EVERY_S = 1.0  # the run list is read again at most this often, whoever asks
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_BINARY = getattr(os, "O_BINARY", 0)


def read_bytes(path: Path, start: int = 0, limit: int | None = None) -> bytes | None:
    """Bytes of a plain file from start (negative: from the end), or None: missing, a link,
    a folder, unreadable. Never creates anything."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _BINARY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not _is_file(st.st_mode):
            return None
        size = st.st_size
        offset = max(0, size + start) if start < 0 else min(start, size)
        os.lseek(fd, offset, os.SEEK_SET)
        want = size - offset if limit is None else min(limit, size - offset)
        chunks, left = [], want
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _is_file(mode: int) -> bool:
    return stat.S_ISREG(mode)


def file_stamp(path: Path) -> tuple | None:
    """(device, inode, size, mtime) of a plain file, not through a link; None if absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not _is_file(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def read_json(path: Path) -> dict:
    data = read_bytes(path, limit=1 << 20)
    try:
        value = json.loads(data) if data else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def clean(value):
    """A JSON value the browser can parse: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def parse_lines(data: bytes) -> list[dict]:
    """The records of whole JSON lines; a damaged line (a crash mid-write) is skipped."""
    records = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            records.append(rec)
    return records


def is_eval(record: dict) -> bool:
    return "loss" not in record and any(k.startswith(("val_", "eval_")) for k in record)


def plain(record: dict) -> dict:
    """A record's numbers, for the plots; an expert load (large) goes separately."""
    return {
        k: clean(v)
        for k, v in record.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def thin(records: list[dict], most: int = MAX_POINTS) -> list[dict]:
    """At most `most` records, evenly spaced, the last one kept: a long run's page loads fast
    and the plots look the same at screen width."""
    if len(records) <= most:
        return records
    stride = math.ceil(len(records) / most)
    kept = records[::stride]
    if kept[-1] is not records[-1]:
        kept.append(records[-1])
    return kept


def expert_message(record: dict) -> dict | None:
    load = experts.from_record(record)
    if load is None:
        return None
    return {
        "step": load.step,
        "layers": list(load.layers),
        "shares": [list(row) for row in load.shares],
        "note": load.idle_line(),
    }


class MetricsTail:
    """Follows one metrics.jsonl: each read returns the records added since the last, or all
    of them after the file was replaced or cut (a resume drops records past its checkpoint).
    A last line without its newline is still being written: it waits for the next read."""

    def __init__(self, path: Path):
        self.path = path
        self.ident: tuple | None = None  # (device, inode) of the file being followed
        self.offset = 0
        self.partial = b""

    def read(self) -> tuple[bool, list[dict]]:
        """(whether the records so far were replaced, the new records)."""
        stamp = file_stamp(self.path)
        if stamp is None:
            reset = self.ident is not None
            self.ident, self.offset, self.partial = None, 0, b""
            return reset, []
        ident, size = stamp[:2], stamp[2]
        reset = ident != self.ident or size < self.offset
        if reset:
            self.ident, self.offset, self.partial = ident, 0, b""
        if size == self.offset:
            return reset, []
        data = read_bytes(self.path, self.offset, size - self.offset)
        if data is None:
            return reset, []
        self.offset += len(data)
        data = self.partial + data
        cut = data.rfind(b"\n") + 1
        self.partial = data[cut:]
        return reset, parse_lines(data[:cut])


@dataclass
class RunWatch:
    """What one page follows of one run: (event name, data) messages as the run changes."""

    path: Path
    metrics: MetricsTail = field(init=False)
    stamps: dict = field(default_factory=dict)
    started: bool = False

    def __post_init__(self):
        self.metrics = MetricsTail(self.path / METRICS)

    def poll(self) -> list[tuple[str, dict]]:
        out = []
        reset, records = self.metrics.read()
        if reset or not self.started:
            out.append(("reset", self._records(records, thin_them=True)))
        elif records:
            out.append(("records", self._records(records)))
        load = next((r for r in reversed(records) if experts.LOAD in r), None)
        message = expert_message(load) if load is not None else None
        if message is not None:
            out.append(("experts", message))
        for name, event, reader in (
            (SAMPLES, "samples", latest_sample),
            (LOG, "log", log_tail),
            (COMPLETIONS, "completions", latest_completions),
        ):
            stamp = file_stamp(self.path / name)
            if stamp != self.stamps.get(name) or not self.started:
                self.stamps[name] = stamp
                message = reader(self.path / name)
                if message is not None or self.started:  # a file gone: an empty message
                    out.append((event, message or {}))
        self.started = True
        return out

    @staticmethod
    def _records(records: list[dict], thin_them: bool = False) -> dict:
        train = [plain(r) for r in records if "loss" in r]
        evals = [plain(r) for r in records if is_eval(r)]
        return {"train": thin(train) if thin_them else train, "evals": evals}


def latest_sample(path: Path) -> dict | None:
    """The last '--- step N ---' block of samples.txt."""
    data = read_bytes(path, -SAMPLE_BYTES)
    if not data:
        return None
    text = data.decode("utf-8", errors="replace")
    head = text.rfind("--- step ")
    if head < 0:
        return {"step": None, "text": text.strip()}
    line_end = text.find("\n", head)
    title = text[head : line_end if line_end >= 0 else len(text)]
    body = text[line_end + 1 :] if line_end >= 0 else ""
    step = "".join(ch for ch in title if ch.isdigit())
    return {"step": int(step) if step else None, "text": body.strip()}


def log_tail(path: Path, lines: int = LOG_LINES) -> dict | None:
    data = read_bytes(path, -32 * 1024)
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace").splitlines()
    if len(data) == 32 * 1024 and text:
        text = text[1:]  # the first line was cut by the tail
    return {"lines": text[-lines:]}


def latest_completions(path: Path) -> dict | None:
    """GRPO: the last step's sampled completions with their rewards (the first rows)."""
    data = read_bytes(path, -COMPLETION_BYTES)
    if not data:
        return None
    for line in reversed(data.split(b"\n")):
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # being written, or cut by the tail
        if not isinstance(rec, dict) or not isinstance(rec.get("rows"), list):
            continue
        rows = [
            {
                "prompt": str(row.get("prompt", "")),
                "completion": str(row.get("completion", "")),
                "reward": clean(row.get("reward")),
                "advantage": clean(row.get("advantage")),
            }
            for row in rec["rows"][:COMPLETION_ROWS]
            if isinstance(row, dict)
        ]
        return {"step": rec.get("step"), "rows": rows, "total": len(rec["rows"])}
    return None


def eta_seconds(records: list[dict], max_steps: int | None) -> float | None:
    """Seconds to max_steps at the speed of the last records (their elapsed_s)."""
    timed = [r for r in records if isinstance(r.get("elapsed_s"), (int, float))]
    if len(timed) < 2 or not max_steps:
        return None
    first, last = timed[max(0, len(timed) - 50)], timed[-1]
    steps = last["step"] - first["step"]
    if steps <= 0 or last["elapsed_s"] <= first["elapsed_s"]:
        return None
    return max(0.0, (max_steps - last["step"]) * (last["elapsed_s"] - first["elapsed_s"]) / steps)


def run_state(status: dict, folder: Path) -> str:
    """running | finished | stopped | failed | interrupted (it said running; its process is
    gone) | starting (locked, no status yet) | missing (the folder is gone)."""
    if not folder.is_dir():
        return "missing"
    state = status.get("state")
    if state and state != "running":
        return str(state)
    alive = lock.held(folder)  # read only where it decides: a finished run has no lock
    if state == "running":
        return "running" if alive else "interrupted"
    return "starting" if alive else "interrupted"


def summary(folder: Path) -> dict:
    """A run as the run list shows it."""
    status = read_json(folder / STATUS)
    tail = read_bytes(folder / METRICS, -TAIL_BYTES) or b""
    cut = tail.find(b"\n") + 1 if len(tail) == TAIL_BYTES else 0  # a line the tail cut
    train = [r for r in parse_lines(tail[cut:]) if "loss" in r]
    last = train[-1] if train else {}
    step = max(int(status.get("step") or 0), int(last.get("step") or 0))
    max_steps = last.get("max_steps") or status.get("max_steps")
    state = run_state(status, folder)
    eta = eta_seconds(train, max_steps) if state == "running" else None
    stamps = [file_stamp(folder / n) for n in (METRICS, STATUS, LOG)]
    updated = max((s[3] / 1e9 for s in stamps if s), default=None)
    return {
        "name": folder.name,
        "state": state,
        "step": step,
        "max_steps": max_steps,
        "eta_s": None if eta is None else round(eta),
        "loss": clean(last.get("loss")),
        "tokens_per_s": clean(last.get("tokens_per_s")),
        "updated": updated,
        "error": status.get("error"),
    }


def is_run(folder: Path) -> bool:
    return any(file_stamp(folder / name) is not None for name in MARKS)


class RunIndex:
    """The watched runs: every run folder under a root (new ones appear, vanished ones go),
    or one run folder (which may not exist yet, or vanish). Thread-safe; the list is read at
    most once a second however many pages ask."""

    def __init__(self, path: Path, single: bool, clock=time.monotonic):
        self.path = Path(path)
        self.single = single
        self.clock = clock  # tests: a fake one
        self._lock = threading.Lock()
        self._read_at = -math.inf
        self._folders: dict[str, Path] = {}
        self._summaries: list[dict] = []

    def _list(self) -> dict[str, Path]:
        if self.single:
            return {self.path.name: self.path}
        try:
            entries = list(os.scandir(self.path))
        except OSError:  # the runs folder is not there (yet, or any more)
            return {}
        return {
            e.name: Path(e.path)
            for e in entries
            if e.is_dir(follow_symlinks=False) and is_run(Path(e.path))
        }

    def refresh(self) -> None:
        now = self.clock()
        with self._lock:
            if now - self._read_at < LIST_EVERY_S:
                return
            self._read_at = now
            folders = self._list()
            runs = [summary(p) for p in folders.values()]
            runs.sort(key=lambda r: (r["state"] != "running", -(r["updated"] or 0)))
            self._folders, self._summaries = folders, runs

    def runs(self) -> list[dict]:
        self.refresh()
        return self._summaries

    def folder(self, name: str) -> Path | None:
        """The folder of a listed run, by its exact name; None for anything else."""
        self.refresh()
        return self._folders.get(name)

    def state_of(self, name: str) -> str | None:
        return next((r["state"] for r in self.runs() if r["name"] == name), None)

    def describe(self) -> str:
        what = "the run" if self.single else "the runs under"
        return f"{what} {self.path}"
