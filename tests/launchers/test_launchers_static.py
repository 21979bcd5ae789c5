"""Launchers, layer 1: static checks of train_gpu.sh, train_gpu.bat and .ci/run (line endings,
quoting, entry points, every failure in train_gpu.bat waiting for a key).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from launchers_common import (
    BASH,
    BAT,
    CI_RUN,
    ROOT,
    SH,
    bat_text,
    bat_var,
    git,
    needs_bash,
    sh_var,
)

# ---------------------------------------------------------------------------
# Both scripts
# ---------------------------------------------------------------------------


def test_torch_version_is_one_variable_and_matches_pyproject():
    sh_version, bat_version = sh_var("TORCH_VERSION"), bat_var("TORCH_VERSION")
    assert sh_version == bat_version
    assert sh_var("TORCH_CUDA_BUILDS") == bat_var("TORCH_CUDA_BUILDS")
    assert sh_var("TORCH_INDEX_BASE") == bat_var("TORCH_INDEX_BASE")
    assert sh_var("TORCH_INDEX_BASE") == "https://download.pytorch.org/whl"
    # The pinned version must satisfy pyproject's torch range, or pip install -e .
    # would replace the CUDA build with whatever the default index has.
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    m = re.search(r'"torch>=([\d.]+),<([\d.]+)"', pyproject)
    assert m, "torch>=X,<Y not found in pyproject.toml"

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("."))

    assert key(m.group(1)) <= key(sh_version) < key(m.group(2))
    for build in sh_var("TORCH_CUDA_BUILDS").split():
        assert re.fullmatch(r"cu\d{3}", build), build


# The Triton minor each torch minor is built with (pytorch's .ci/docker/triton_version.txt at
# its release; triton-windows follows Triton's numbers). A torch bump fails here until the
# launcher's triton-windows pin follows it.
TRITON_FOR_TORCH = {"2.13": "3.7"}


def test_triton_windows_is_pinned_to_the_torch_minor_the_bat_installs():
    torch_minor = ".".join(bat_var("TORCH_VERSION").split(".")[:2])
    assert torch_minor in TRITON_FOR_TORCH, f"which Triton does torch {torch_minor} use?"
    assert bat_var("TRITON_WINDOWS") == TRITON_FOR_TORCH[torch_minor] + ".*"


def test_both_launchers_have_the_same_entry_points():
    sh, bat = SH.read_text(encoding="utf-8"), bat_text()
    for needle in (
        "-m gui",
        "-m core.train",
        "--test",
        "-m pytest -q",
        "-m venv",
        "pip install -e",
        "--index-url",
        ".venv",
        "traindeck-install.stamp",
        "Dependencies up to date",
        "TRAINDECK_PYTHON",
        "TRAINDECK_TORCH_VARIANT",
        "nvidia-smi",
        "CUDA Version",
        "cuda.is_available()",
        "Torch not compiled with CUDA enabled",
        "pyproject.toml",
        "hashlib.sha256",
    ):
        assert needle in sh, f"{needle!r} missing from train_gpu.sh"
        assert needle in bat, f"{needle!r} missing from train_gpu.bat"


# ---------------------------------------------------------------------------
# train_gpu.sh and .ci/run: static checks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", [SH, CI_RUN], ids=["train_gpu.sh", ".ci/run"])
def test_shell_scripts_are_lf_executable_bash(path: Path):
    data = path.read_bytes()
    assert b"\r" not in data, f"{path.name} must have LF line endings"
    assert data.startswith(b"#!/usr/bin/env bash\n")
    assert os.access(path, os.X_OK), f"{path} is not executable"
    rel = path.relative_to(ROOT).as_posix()
    staged = git("ls-files", "-s", "--", rel)
    if staged:  # committed with the executable bit, so clones get it too
        assert staged.startswith("100755"), staged
    if BASH:
        proc = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_ci_run_runs_the_readme_test_command():
    text = CI_RUN.read_text(encoding="utf-8")
    assert "set -euo pipefail" in text
    assert re.search(r"^\./train_gpu\.sh --test \"\$@\" </dev/null \|\| failed=1$", text, re.M)
    # then the same command under other kernels for every test that compares floats, chosen
    # by its source, not a marker; the exit says whether either failed
    assert 'OTHER_KERNELS="ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE' in text
    command = r"^if ! env \$OTHER_KERNELS \./train_gpu\.sh --test --float-comparisons "
    command += r'"\$@" </dev/null; then$'
    assert re.search(command, text, re.M)
    assert "-m " not in text  # no marker picks a subset
    assert text.rstrip().endswith('exit "$failed"')


@needs_bash
def test_sh_help_needs_no_installation(tmp_path: Path):
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy2(SH, repo)
    shutil.copy2(ROOT / "pyproject.toml", repo)
    proc = subprocess.run(
        [str(repo / "train_gpu.sh"), "--help"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    for needle in ("python -m gui", "python -m core.train", "--test", "--resume latest"):
        assert needle in proc.stdout
    assert not (repo / ".venv").exists()


# ---------------------------------------------------------------------------
# train_gpu.bat: static checks
# ---------------------------------------------------------------------------


def _bat_lines() -> list[str]:
    return BAT.read_bytes().decode("ascii").split("\r\n")


def test_bat_has_crlf_line_endings_and_is_ascii():
    data = BAT.read_bytes()
    data.decode("ascii")  # cmd.exe reads .bat files in the OEM code page
    assert data.endswith(b"\r\n")
    assert data.count(b"\n") == data.count(b"\r\n"), "bare LF in train_gpu.bat"
    assert data.count(b"\r") == data.count(b"\r\n"), "bare CR in train_gpu.bat"


def test_bat_is_stored_with_crlf_and_never_converted():
    attrs = git("check-attr", "text", "--", "train_gpu.bat")
    if attrs is None:
        pytest.skip("not a git checkout")
    assert "train_gpu.bat: text: unset" in attrs  # -text: git keeps the CRLF bytes as they are
    eol = git("ls-files", "--eol", "--", "train_gpu.bat")
    assert eol is not None and eol.startswith("i/crlf")  # CRLF in the repository itself


def test_bat_works_in_its_own_folder():
    text = bat_text()
    assert 'cd /d "%~dp0"' in text
    assert 'pushd "%SCRIPT_DIR%"' in text  # \\server\share folders
    # Delayed expansion would eat "!" in folder names.
    assert "EnableDelayedExpansion" not in text
    assert "setlocal EnableExtensions DisableDelayedExpansion" in text


# Variables that hold paths, and the forms of %~ that expand to paths.
BAT_PATH_VARS = (
    "VENV",
    "VENV_PY",
    "STAMP",
    "ROOT",
    "SCRIPT_DIR",
    "SMI",
    "SMI_OUT",
    "PY_EXE",
    "PY_ON_PATH",
    "TRAINDECK_PYTHON",
    "TEMP",
    "ProgramFiles",
    "SystemRoot",
)
BAT_PATH_RE = re.compile(
    r"%~(?:dp0|f0|1)|%(?:" + "|".join(BAT_PATH_VARS) + r")(?::[^%]*)?%|%%~\$PATH:\w",
    re.I,
)


def unquoted_path_uses(line: str) -> list[str]:
    """Path expansions in one batch line that are not inside "double quotes"."""
    if re.match(r"\s*(rem\b|::)", line, re.I):
        return []
    return [m.group(0) for m in BAT_PATH_RE.finditer(line) if line[: m.start()].count('"') % 2 == 0]


def test_quoting_check_catches_unquoted_paths():
    assert unquoted_path_uses(r"%VENV%\Scripts\python.exe -m pip install x") == ["%VENV%"]
    assert unquoted_path_uses(r'if exist %VENV_PY% echo "%VENV%"') == ["%VENV_PY%"]
    assert unquoted_path_uses(r"cd /d %~dp0") == ["%~dp0"]
    assert unquoted_path_uses(r'"%VENV_PY%" -m pip install -e "%PROJECT_SPEC%"') == []
    assert unquoted_path_uses(r'set "SMI=%%~$PATH:I"') == []
    assert unquoted_path_uses(r"rem %VENV% in a comment") == []


def test_bat_quotes_every_path():
    bad = [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(_bat_lines(), 1)
        if unquoted_path_uses(line)
    ]
    assert not bad, "unquoted path expansions:\n" + "\n".join(bad)


LABEL_RE = re.compile(r"^:([A-Za-z_][\w.-]*)\s*$")


def _bat_flow():
    """(lines, labels, successors) of train_gpu.bat; `call` returns to the next line."""
    lines = [line.strip() for line in _bat_lines()]
    labels = {}
    for i, line in enumerate(lines):
        m = LABEL_RE.match(line)
        if m:
            labels[m.group(1).lower()] = i

    def successors(i: int) -> list[int]:
        line = lines[i]
        low = line.lower()
        if not line or low.startswith(("rem ", "::")) or low == "rem":
            return [i + 1]
        out = [
            labels[g.lower()]
            for g in re.findall(r"\bgoto\s+:?([\w.-]+)", line, re.I)
            if g.lower() != "eof"
        ]
        if not low.startswith(("goto ", "exit ")):
            out.append(i + 1)
        return [j for j in out if j < len(lines)]

    return lines, labels, successors


def _reachable(starts, successors) -> set[int]:
    seen, todo = set(), list(starts)
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            todo.extend(successors(i))
    return seen


def test_bat_jumps_and_calls_have_targets():
    lines, labels, _ = _bat_flow()
    text = "\n".join(lines)
    for target in re.findall(r"\b(?:goto|call)\s+:?([\w.-]+)", text, re.I):
        if target.lower() != "eof" and not target.startswith(("%", '"')):
            assert target.lower() in labels, f"no label :{target}"
    # `exit` without /b would close the terminal the user typed the command in.
    for n, line in enumerate(lines, 1):
        # Not in the Python code of -c "...", nor in what echo prints.
        unquoted = re.sub(r"\becho\b.*", "", re.sub(r'"[^"]*"', '""', line), flags=re.I)
        if re.search(r"\bexit\b(?!\s+/b)", unquoted, re.I) and not line.lower().startswith("rem"):
            raise AssertionError(f"line {n}: exit without /b: {line}")


def test_bat_every_failure_waits_for_a_key():
    lines, labels, successors = _bat_flow()
    main = _reachable([0], successors)  # what runs outside the subroutines
    pause_lines = [i for i, line in enumerate(lines) if re.search(r"\bpause\b", line, re.I)]
    assert len(pause_lines) == 1, "expected exactly one pause, in :finish"
    pause = pause_lines[0]
    assert lines[pause].lower() == "if not defined traindeck_no_pause pause"
    assert pause in main

    # Leaving with a non-zero code is only allowed right after that pause.
    for i in sorted(main):
        m = re.search(r"\bexit /b\s+(\S+)", lines[i], re.I)
        if m and m.group(1) != "0":
            assert i == pause + 1, f"line {i + 1} exits with {m.group(1)} without the pause"
    # Every error message of the main flow leads to the pause ...
    for i in sorted(main):
        if "ERROR" in lines[i] or re.search(r"goto fail", lines[i], re.I):
            assert pause in _reachable([i], successors), f"line {i + 1} never pauses"
    # ... and so does every fail_* branch, all of which end in :fail.
    fail_labels = [name for name in labels if name.startswith("fail")]
    assert "fail" in fail_labels and len(fail_labels) >= 6
    for name in fail_labels:
        assert pause in _reachable([labels[name]], successors), f":{name} never pauses"
    # :fail turns a success code into a failure one before :finish.
    fail_block = lines[labels["fail"] : labels["finish"]]
    assert 'if "%RC%"=="0" set "RC=1"' in fail_block


def test_bat_checks_every_failure_it_can_see():
    lines, labels, successors = _bat_flow()
    main = _reachable([0], successors)
    # Subroutines that can fail must be checked by their callers.
    subs = {}
    for name, start in labels.items():
        body = _reachable([start], successors)
        subs[name] = any(re.search(r"\bexit /b\s+[1-9]", lines[i], re.I) for i in body)
    for i in sorted(main):
        m = re.match(r"call :([\w.-]+)", lines[i], re.I)
        if m and subs[m.group(1).lower()]:
            nxt = lines[i + 1]
            assert "ERRORLEVEL" in nxt or "defined" in nxt, f"line {i + 1}: unchecked {lines[i]}"
    # Every program the main flow starts is followed by an errorlevel check.
    for i in sorted(main):
        if re.match(r'"%(VENV_PY|PY_EXE|SMI)%"', lines[i]) and "--help" not in lines[i]:
            assert "ERRORLEVEL" in lines[i + 1], f"line {i + 1}: unchecked {lines[i]}"


def test_bat_runs_the_same_commands_as_the_shell_twin():
    text = bat_text()
    assert '"%VENV_PY%" -m gui\r\n' in text
    assert '"%VENV_PY%" -m core.train %*\r\n' in text
    assert '"%VENV_PY%" -m pytest -q %TEST_ARGS%\r\n' in text
    assert 'if /i "%~1"=="--test" goto parse_test_args' in text
    assert 'if /i "%~1"=="--help" goto usage' in text
    assert 'py" "-%%V"' in text and "(3.13 3.12 3.11 3.10)" in text
    assert "\\WindowsApps\\" in text  # the Microsoft Store stub is recognised


def test_ci_run_first_runs_the_readme_headless_command_from_the_base_install():
    """The newcomer's path: .ci/run reads the README's headless command and runs it before
    the test command, so the base install (no extras) must train."""
    text = CI_RUN.read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.findall(r"`(\./train_gpu\.sh --[^`]*)`", readme)
    assert found and "--test" not in found[0] and "--preset" in found[0]
    assert "README.md" in text and "$headless" in text
    assert text.index("$headless </dev/null") < text.index('./train_gpu.sh --test "$@"')
