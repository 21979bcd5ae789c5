"""Pathological files are refused, or read only as far as needed, in bounded memory.

Makes sparse 2 GiB files with no line break (they take no disk space) and, each in a fresh
process, asks what a run asks of them first: the first record of a .jsonl / .csv / .json
table, and the --eval-data windows of a plain text. Prints the time, the peak memory (RSS)
and the outcome of each:

    python benchmarks/hostile_reads.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZE = 2 << 30

CHILD = """
import resource, sys, time
sys.path.insert(0, {root!r})
from core.data import tables
from core.data.tokenizer import bytes_tokenizer
from core.data.windows import text_windows
from core.errors import UserError
path = sys.argv[1]
t0 = time.perf_counter()
try:
    if path.endswith(".txt"):
        w = text_windows(path, bytes_tokenizer(), 256, 64)
        outcome = f"read {{len(w.x)}} windows"
    else:
        outcome = f"read {{len(tables.first_records(path))}} records"
except UserError as e:
    outcome = "refused: " + str(e).split(": ", 1)[1][:70]
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{{seconds:6.2f}} s  {{peak:7.0f}} MB peak  {{outcome}}")
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, head in (
            ("big.jsonl", b'{"text": "'),
            ("big.csv", b'text\n"'),
            ("big.json", b'[{"text": "'),
            ("big.txt", b""),
        ):
            path = Path(tmp) / name
            with open(path, "wb") as f:
                f.write(head + b"a" * 1000)
                f.truncate(SIZE)  # the rest: NUL bytes, never a line break
            child = CHILD.format(root=str(ROOT))
            out = subprocess.run(
                [sys.executable, "-c", child, str(path)], capture_output=True, text=True
            )
            print(f"{name:<10} {SIZE >> 30} GiB: {(out.stdout or out.stderr).strip()}")


if __name__ == "__main__":
    main()
