"""The commands the docs show still run: every `python -m MODULE ...` line inside a fenced
code block of README.md or docs/*.md names a module that answers --help, and every --flag
it uses is one that module's --help lists. A doc naming a flag that no longer exists fails."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^\s*(```|~~~)")
COMMAND = re.compile(r"^(?:[$>]\s+)?python -m ([\w.]+)(.*)$")
QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")
COMMENT = re.compile(r"\s#.*$")
FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
SKIPPED = {"pytest"}


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def fenced_lines(path: Path):
    """(line number, text) of each line inside a fenced block, continuations joined."""
    inside, pending, start = False, "", 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        if not pending:
            start = number
        text = pending + line.strip()
        if text.endswith("\\"):  # a shell continuation: the command goes on
            pending = text[:-1] + " "
            continue
        pending = ""
        yield start, text


def flags_of(arguments: str) -> list[str]:
    """The --flags of a command line, leaving out quoted text and a trailing # comment."""
    return FLAG.findall(COMMENT.sub("", QUOTED.sub('""', arguments)))


@functools.cache
def documented() -> dict[str, list[tuple[str, str, list[str]]]]:
    """module -> [(where, command, flags)] for every documented `python -m` command."""
    commands: dict[str, list[tuple[str, str, list[str]]]] = {}
    for path in doc_files():
        for number, text in fenced_lines(path):
            match = COMMAND.match(text)
            if match is None or match.group(1) in SKIPPED:
                continue
            where = f"{path.relative_to(ROOT).as_posix()}:{number}"
            entry = (where, text, flags_of(match.group(2)))
            commands.setdefault(match.group(1), []).append(entry)
    return commands


@functools.cache
def help_of(module: str) -> tuple[int, str]:
    """(exit code, stdout + stderr) of `python -m MODULE --help`, run once per module."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


MODULES = sorted(documented())


def test_the_docs_show_the_three_commands():
    assert {"core.train", "core.generate", "core.export"} <= set(MODULES), MODULES


@pytest.mark.parametrize("module", MODULES)
def test_a_documented_module_answers_help(module):
    code, output = help_of(module)
    where = ", ".join(w for w, _, _ in documented()[module])
    assert code == 0, f"python -m {module} --help exited {code} (documented at {where}):\n{output}"


@pytest.mark.parametrize("module", MODULES)
def test_every_documented_flag_is_in_help(module):
    code, output = help_of(module)
    assert code == 0, output
    listed = set(FLAG.findall(output))
    unknown = [
        f"{where}: {flag} in `{text}`"
        for where, text, flags in documented()[module]
        for flag in flags
        if flag not in listed
    ]
    assert not unknown, f"flags not in python -m {module} --help:\n" + "\n".join(unknown)
