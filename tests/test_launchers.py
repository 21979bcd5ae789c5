"""Tests for the launchers: train_gpu.sh, train_gpu.bat and .ci/run.

Four layers, cheapest first:

* static checks of both scripts (line endings, quoting, entry points, that
  every failure in train_gpu.bat waits for a key before the window closes);
* train_gpu.sh against stub programs (python, nvidia-smi, uname) that record
  their calls: CUDA index choice, argument pass-through, exit codes, the
  install stamp - milliseconds each, no network;
* train_gpu.bat for real under wine's cmd.exe, against stub python.exe /
  py.exe / nvidia-smi.exe (skipped when wine is not installed);
* train_gpu.sh for real on a fresh copy of the repository: creates .venv,
  installs torch and the project, trains a few steps, and a second run skips
  the installation (a minute or two, once per session).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SH = ROOT / "train_gpu.sh"
BAT = ROOT / "train_gpu.bat"
CI_RUN = ROOT / ".ci" / "run"
BASH = shutil.which("bash")
WINE = shutil.which("wine") or shutil.which("wine64")

needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")


def _bat_text() -> str:
    return BAT.read_bytes().decode("ascii")  # keeps the \r\n


def _sh_var(name: str) -> str:
    m = re.search(rf'^{name}="([^"]*)"$', SH.read_text(encoding="utf-8"), re.M)
    assert m, f"{name}=... not found in train_gpu.sh"
    return m.group(1)


def _bat_var(name: str) -> str:
    m = re.search(rf'^set "{name}=([^"]*)"\r$', _bat_text(), re.M)
    assert m, f'set "{name}=..." not found in train_gpu.bat'
    return m.group(1)


def _git(*args: str) -> str | None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else None


# ---------------------------------------------------------------------------
# Both scripts
# ---------------------------------------------------------------------------


def test_torch_version_is_one_variable_and_matches_pyproject():
    sh_version, bat_version = _sh_var("TORCH_VERSION"), _bat_var("TORCH_VERSION")
    assert sh_version == bat_version
    assert _sh_var("TORCH_CUDA_BUILDS") == _bat_var("TORCH_CUDA_BUILDS")
    assert _sh_var("TORCH_INDEX_BASE") == _bat_var("TORCH_INDEX_BASE")
    assert _sh_var("TORCH_INDEX_BASE") == "https://download.pytorch.org/whl"
    # The pinned version must satisfy pyproject's torch range, or pip install -e .
    # would replace the CUDA build with whatever the default index has.
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    m = re.search(r'"torch>=([\d.]+),<([\d.]+)"', pyproject)
    assert m, "torch>=X,<Y not found in pyproject.toml"

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("."))

    assert key(m.group(1)) <= key(sh_version) < key(m.group(2))
    for build in _sh_var("TORCH_CUDA_BUILDS").split():
        assert re.fullmatch(r"cu\d{3}", build), build


def test_both_launchers_have_the_same_entry_points():
    sh, bat = SH.read_text(encoding="utf-8"), _bat_text()
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
    staged = _git("ls-files", "-s", "--", rel)
    if staged:  # committed with the executable bit, so clones get it too
        assert staged.startswith("100755"), staged
    if BASH:
        proc = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_ci_run_runs_the_readme_test_command():
    text = CI_RUN.read_text(encoding="utf-8")
    assert "set -euo pipefail" in text
    assert re.search(r"^exec \./train_gpu\.sh --test\b", text, re.M)


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
    attrs = _git("check-attr", "text", "--", "train_gpu.bat")
    if attrs is None:
        pytest.skip("not a git checkout")
    assert "train_gpu.bat: text: unset" in attrs  # -text: git keeps the CRLF bytes as they are
    eol = _git("ls-files", "--eol", "--", "train_gpu.bat")
    assert eol is not None and eol.startswith("i/crlf")  # CRLF in the repository itself


def test_bat_works_in_its_own_folder():
    text = _bat_text()
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
    text = _bat_text()
    assert '"%VENV_PY%" -m gui\r\n' in text
    assert '"%VENV_PY%" -m core.train %*\r\n' in text
    assert '"%VENV_PY%" -m pytest -q %TEST_ARGS%\r\n' in text
    assert 'if /i "%~1"=="--test" goto parse_test_args' in text
    assert 'if /i "%~1"=="--help" goto usage' in text
    assert 'py" "-%%V"' in text and "(3.13 3.12 3.11 3.10)" in text
    assert "\\WindowsApps\\" in text  # the Microsoft Store stub is recognised


# ---------------------------------------------------------------------------
# train_gpu.sh against stub programs
# ---------------------------------------------------------------------------

STUB_PYTHON = r"""#!/usr/bin/env bash
# Stub python: records its arguments, emulates venv/pip, runs nothing real.
{ printf '%s' "$0"; printf '\t%s' "$@"; printf '\n'; } >>"$STUB_LOG"
case "${1-}" in
-c)
    case "$2" in
    *hashlib*) cksum <pyproject.toml | cut -d' ' -f1 ;;
    *platform*) echo 3.12.0 ;;
    *torch*) echo "stub: torch imported"; exit "${STUB_TORCH_RC:-0}" ;;
    *version_info*)
        case " ${STUB_OLD_PYTHONS-} " in *" $(basename "$0") "*) exit 3 ;; esac ;;
    esac
    ;;
-m)
    case "$2" in
    venv) mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && echo "home = stub" >"$3/pyvenv.cfg" ;;
    pip)
        case " $* " in *" --no-index "*) exit "${STUB_NOINDEX_RC:-1}" ;; esac
        exit "${STUB_PIP_RC:-0}"
        ;;
    *)
        printf 'QT_QPA_PLATFORM=%s\n' "${QT_QPA_PLATFORM-}" >>"$STUB_LOG"
        echo "stub: ran python -m $2"
        exit "${STUB_RUN_RC:-0}"
        ;;
    esac
    ;;
esac
exit 0
"""

STUB_NVIDIA_SMI = r"""#!/usr/bin/env bash
printf 'nvidia-smi\t%s\n' "$*" >>"$STUB_LOG"
if [ -n "${STUB_SMI_RC-}" ]; then
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    exit "$STUB_SMI_RC"
fi
case "$*" in --query-gpu*) echo "NVIDIA Stub GPU, 999.99"; exit 0 ;; esac
cat "$STUB_SMI_FILE"
"""

SMI_HEADER = """\
Sat Nov 22 10:00:00 2025
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 999.99                 Driver Version: 999.99         CUDA Version: {cuda}     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|=========================================+========================+======================|
|   0  NVIDIA Stub GPU                Off |   00000000:01:00.0  On |                  Off |
|  0%   38C    P8             21W /  450W |     650MiB /  24564MiB |      2%      Default |
+-----------------------------------------+------------------------+----------------------+
"""

# Everything train_gpu.sh and the stubs call, so PATH can leave out the rest
# (a real nvidia-smi or python3 on the machine running the tests).
TOOLS = ["bash", "env", "dirname", "basename", "uname", "sed", "head", "rm", "cat"]
TOOLS += ["mkdir", "cp", "cksum", "cut"]  # for the stubs


@dataclass
class Run:
    rc: int
    out: str
    err: str
    calls: list[list[str]]

    @property
    def pip(self) -> list[list[str]]:
        return [c[1:] for c in self.calls if c[1:3] == ["-m", "pip"]]

    def ran(self, module: str) -> list[list[str]]:
        return [c[3:] for c in self.calls if c[1:3] == ["-m", module]]


class ShStubs:
    def __init__(self, base: Path):
        self.base = base
        self.repo = base / "Train Deck ü"
        self.repo.mkdir(parents=True)
        shutil.copy2(SH, self.repo)
        shutil.copy2(ROOT / "pyproject.toml", self.repo)
        self.tools = base / "tools"
        self.tools.mkdir()
        for name in TOOLS:
            found = shutil.which(name)
            if found is None:
                pytest.skip(f"{name} not found")
            (self.tools / name).symlink_to(found)
        self.bin = base / "bin"  # python3 & co
        self.smi = base / "smi"  # nvidia-smi
        self.darwin = base / "darwin"  # uname saying Darwin
        for d in (self.bin, self.smi, self.darwin):
            d.mkdir()
        for name in ("python3", "python3.12"):
            self._script(self.bin / name, STUB_PYTHON)
        self._script(self.smi / "nvidia-smi", STUB_NVIDIA_SMI)
        self._script(self.darwin / "uname", "#!/usr/bin/env bash\necho Darwin\n")
        self.log = base / "calls.log"
        self.smi_file = base / "smi.txt"
        self.smi_file.write_text(SMI_HEADER.format(cuda="12.8"))

    @staticmethod
    def _script(path: Path, text: str):
        path.write_text(text)
        path.chmod(0o755)

    def run(self, *args: str, gpu: str | None = None, darwin=False, env=None) -> Run:
        path = [self.bin, self.tools]
        if gpu is not None:
            self.smi_file.write_text(SMI_HEADER.format(cuda=gpu))
            path.insert(0, self.smi)
        if darwin:
            path.insert(0, self.darwin)
        self.log.unlink(missing_ok=True)
        full_env = {
            "PATH": os.pathsep.join(map(str, path)),
            "HOME": str(self.base),
            "STUB_LOG": str(self.log),
            "STUB_SMI_FILE": str(self.smi_file),
            **(env or {}),
        }
        proc = subprocess.run(
            [str(self.repo / "train_gpu.sh"), *args],
            cwd=self.base,  # not the repo: the script has to find its folder
            env=full_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        calls = []
        if self.log.exists():
            calls = [line.split("\t") for line in self.log.read_text().splitlines()]
        return Run(proc.returncode, proc.stdout, proc.stderr, calls)


@pytest.fixture
def sh_stubs(tmp_path: Path) -> ShStubs:
    if BASH is None:
        pytest.skip("bash is not installed")
    return ShStubs(tmp_path)


def test_sh_first_run_installs_cpu_torch_then_trains(sh_stubs: ShStubs):
    r = sh_stubs.run("--preset", "cpu-tiny", "--out", "runs/a b", "--name", "it's")
    assert r.rc == 0, r.out + r.err
    venv_py = str(sh_stubs.repo / ".venv" / "bin" / "python")
    venv = [c for c in r.calls if c[1:3] == ["-m", "venv"]]
    assert venv == [[str(sh_stubs.bin / "python3"), "-m", "venv", str(sh_stubs.repo / ".venv")]]
    # Local wheel first (no network), then PyTorch's CPU index; torch's own
    # dependencies then come from the usual index with pip install -e .
    assert r.pip == [
        ["-m", "pip", "install", "--upgrade", "pip"],
        ["-m", "pip", "install", "--no-deps", "--no-index", "torch==2.13.0+cpu"],
        [
            "-m",
            "pip",
            "install",
            "--no-deps",
            "torch==2.13.0+cpu",
            "--index-url",
            "https://download.pytorch.org/whl/cpu",
        ],
        ["-m", "pip", "install", "-e", "."],
    ]
    assert all(c[0] == venv_py for c in r.calls if c[1:3] == ["-m", "pip"])
    assert r.ran("core.train") == [["--preset", "cpu-tiny", "--out", "runs/a b", "--name", "it's"]]
    assert "No NVIDIA GPU found" in r.out
    stamp = (sh_stubs.repo / ".venv" / "traindeck-install.stamp").read_text()
    assert stamp.endswith(" torch=2.13.0+cpu extras=\n")


def test_sh_uses_a_local_cpu_wheel_when_there_is_one(sh_stubs: ShStubs):
    r = sh_stubs.run("--max-epochs", "1", env={"STUB_NOINDEX_RC": "0"})
    assert r.rc == 0, r.out + r.err
    assert ["-m", "pip", "install", "--no-deps", "--no-index", "torch==2.13.0+cpu"] in r.pip
    assert not any("--index-url" in c for c in r.pip)
    assert "from a local wheel" in r.out


def test_sh_second_run_skips_installation(sh_stubs: ShStubs):
    assert sh_stubs.run("--max-epochs", "1").rc == 0
    r = sh_stubs.run("--resume", "latest")
    assert r.rc == 0
    assert "Dependencies up to date" in r.out
    assert r.pip == []
    assert not any(c[1:3] == ["-m", "venv"] for c in r.calls)
    assert r.ran("core.train") == [["--resume", "latest"]]
    # A changed pyproject.toml means new dependencies: install again.
    with open(sh_stubs.repo / "pyproject.toml", "a") as f:
        f.write("\n# changed\n")
    r = sh_stubs.run("--resume", "latest")
    assert "Dependencies up to date" not in r.out
    assert ["-m", "pip", "install", "-e", "."] in r.pip


def test_sh_test_mode_installs_test_extras_and_runs_pytest(sh_stubs: ShStubs):
    assert sh_stubs.run("--max-epochs", "1").rc == 0
    r = sh_stubs.run("--test", "-k", "a or b", "-x")
    assert r.rc == 0, r.out + r.err
    assert ["-m", "pip", "install", "-e", ".[test]"] in r.pip  # extras changed: reinstall
    assert r.ran("pytest") == [["-q", "-k", "a or b", "-x"]]
    assert "QT_QPA_PLATFORM=offscreen" in [c[0] for c in r.calls]  # no DISPLAY here
    # The test extras include everything a normal run needs.
    r = sh_stubs.run("--max-epochs", "1")
    assert "Dependencies up to date" in r.out and r.pip == []
    r = sh_stubs.run("--test", env={"STUB_RUN_RC": "1"})
    assert r.rc == 1 and r.pip == []


def test_sh_without_arguments_opens_the_gui(sh_stubs: ShStubs):
    r = sh_stubs.run()
    assert r.rc == 0, r.out + r.err
    assert r.ran("gui") == [[]]
    assert "no display found" in r.err  # hint towards the CLI on a headless box


@pytest.mark.parametrize("code", [1, 2, 130])
def test_sh_passes_the_exit_code_on(sh_stubs: ShStubs, code: int):
    r = sh_stubs.run("--preset", "cpu-tiny", env={"STUB_RUN_RC": str(code)})
    assert r.rc == code


@pytest.mark.parametrize(
    ("cuda", "build"),
    [("13.0", "cu130"), ("13.1", "cu130"), ("12.9", "cu128"), ("12.8", "cu128"), ("12.6", "cu126")],
)
def test_sh_picks_the_cuda_build_the_driver_supports(sh_stubs: ShStubs, cuda: str, build: str):
    r = sh_stubs.run("--max-epochs", "1", gpu=cuda)
    assert r.rc == 0, r.out + r.err
    assert f"Found NVIDIA GPU: NVIDIA Stub GPU, 999.99 - driver supports CUDA {cuda}" in r.out
    assert [
        "-m",
        "pip",
        "install",
        f"torch==2.13.0+{build}",
        "--index-url",
        f"https://download.pytorch.org/whl/{build}",
    ] in r.pip
    # The CUDA build is checked with torch.cuda.is_available().
    assert any(
        "torch.cuda.is_available()" in c[2].replace("t.cuda", "torch.cuda")
        for c in r.calls
        if c[1:2] == ["-c"]
    )


def test_sh_old_driver_falls_back_to_the_cpu_build(sh_stubs: ShStubs):
    r = sh_stubs.run("--max-epochs", "1", gpu="12.4")
    assert r.rc == 0
    assert "too old" in r.out and "Update the NVIDIA driver" in r.out
    assert any("torch==2.13.0+cpu" in c for c in r.pip)


def test_sh_broken_driver_falls_back_to_the_cpu_build(sh_stubs: ShStubs):
    r = sh_stubs.run("--max-epochs", "1", gpu="12.8", env={"STUB_SMI_RC": "9"})
    assert r.rc == 0
    assert "reports no working NVIDIA GPU" in r.out
    assert any("torch==2.13.0+cpu" in c for c in r.pip)


def test_sh_gpu_but_torch_without_cuda_explains_the_fix(sh_stubs: ShStubs):
    r = sh_stubs.run("--max-epochs", "1", gpu="12.8", env={"STUB_TORCH_RC": "3"})
    assert r.rc == 1
    assert "Torch not compiled with CUDA enabled" in r.err
    assert "delete the .venv folder" in r.err
    assert not (sh_stubs.repo / ".venv" / "traindeck-install.stamp").exists()
    assert r.ran("core.train") == []
    r = sh_stubs.run("--max-epochs", "1", gpu="12.8", env={"STUB_TORCH_RC": "4"})
    assert r.rc == 1 and "cannot use the GPU" in r.err and "Update the NVIDIA driver" in r.err


def test_sh_forced_variant_and_macos(sh_stubs: ShStubs):
    r = sh_stubs.run("--max-epochs", "1", env={"TRAINDECK_TORCH_VARIANT": "cu126"})
    assert [
        "-m",
        "pip",
        "install",
        "torch==2.13.0+cu126",
        "--index-url",
        "https://download.pytorch.org/whl/cu126",
    ] in r.pip
    r = sh_stubs.run("--max-epochs", "1", env={"TRAINDECK_TORCH_VARIANT": "rocm"})
    assert r.rc == 1 and "TRAINDECK_TORCH_VARIANT must be" in r.err
    r = sh_stubs.run("--max-epochs", "1", darwin=True, gpu="12.8")
    assert r.rc == 0
    assert ["-m", "pip", "install", "torch==2.13.0"] in r.pip  # macOS wheels: CPU + MPS


def test_sh_python_discovery(sh_stubs: ShStubs):
    # python3 too old: python3.12 is used instead.
    r = sh_stubs.run("--max-epochs", "1", env={"STUB_OLD_PYTHONS": "python3"})
    assert r.rc == 0, r.out + r.err
    venv_call = next(c for c in r.calls if c[1:3] == ["-m", "venv"])
    assert venv_call[0] == str(sh_stubs.bin / "python3.12")
    # Nothing new enough: a clear message, non-zero exit.
    shutil.rmtree(sh_stubs.repo / ".venv")
    r = sh_stubs.run("--max-epochs", "1", env={"STUB_OLD_PYTHONS": "python3 python3.12"})
    assert r.rc == 1
    assert "No Python 3.10 or newer found" in r.err
    # TRAINDECK_PYTHON wins.
    other = sh_stubs.base / "other"
    other.mkdir()
    ShStubs._script(other / "mypython", STUB_PYTHON)
    r = sh_stubs.run("--max-epochs", "1", env={"TRAINDECK_PYTHON": str(other / "mypython")})
    assert r.rc == 0
    assert next(c for c in r.calls if c[1:3] == ["-m", "venv"])[0] == str(other / "mypython")


def test_sh_recreates_a_broken_venv(sh_stubs: ShStubs):
    venv = sh_stubs.repo / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /gone\n")
    ShStubs._script(venv / "bin" / "python", "#!/usr/bin/env bash\nexit 127\n")
    r = sh_stubs.run("--max-epochs", "1")
    assert r.rc == 0, r.out + r.err
    assert "does not work any more" in r.out
    assert any(c[1:3] == ["-m", "venv"] for c in r.calls)


def test_sh_failed_install_stops_with_a_message(sh_stubs: ShStubs):
    r = sh_stubs.run("--max-epochs", "1", env={"STUB_PIP_RC": "1"})
    assert r.rc == 1
    assert "ERROR: Installing torch" in r.err and "Setup did not finish" in r.err
    assert r.ran("core.train") == []
    assert not (sh_stubs.repo / ".venv" / "traindeck-install.stamp").exists()


# ---------------------------------------------------------------------------
# train_gpu.bat under wine's cmd.exe
# ---------------------------------------------------------------------------

# Stands in for python.exe, py.exe and nvidia-smi.exe. Each of those is a
# distlib console-script launcher (the t64.exe pip uses on Windows) whose
# shebang runs `cmd.exe /c stub.bat`: a real .exe, so train_gpu.bat calls it
# exactly like the real programs, exit codes included. %1 = the .exe started.
STUB_BAT = r"""@echo off
setlocal EnableExtensions DisableDelayedExpansion
set "SELF=%~1"
set "NAME=%~n1"
>>"%STUB_LOG%" echo %NAME% %*
set "SELF_NOT_STORE=%SELF:\WindowsApps\=%"
if not "%SELF_NOT_STORE%"=="%SELF%" goto store
if /i "%NAME%"=="nvidia-smi" goto smi
set "ARG1=%~2"
set "ARG2=%~3"
set "ARG3=%~4"
if /i "%NAME%"=="py" goto py
goto emulate

:store
echo Python was not found; run without arguments to install from the Microsoft Store.
exit /b 9009

:smi
if "%~2"=="--query-gpu" goto smi_query
type "%STUB_SMI_FILE%"
exit /b 0
:smi_query
echo NVIDIA Stub GPU, 999.99
exit /b 0

:py
set "FOUND="
for %%V in (%STUB_PY_VERSIONS%) do if "%%V"=="%~2" set "FOUND=1"
if defined FOUND goto py_found
echo No suitable Python runtime found
exit /b 103
:py_found
set "ARG1=%~3"
set "ARG2=%~4"
set "ARG3=%~5"

:emulate
if "%ARG1%"=="-c" goto emulate_c
if "%ARG1%"=="-m" goto emulate_m
exit /b 0
:emulate_c
set "HEAD=%ARG2:~0,24%"
if not "%HEAD:hashlib=%"=="%HEAD%" goto c_hash
if not "%HEAD:torch=%"=="%HEAD%" goto c_torch
if not "%HEAD:struct=%"=="%HEAD%" goto c_version
exit /b 0
:c_hash
for %%F in (pyproject.toml) do echo stubhash-%%~zF
exit /b 0
:c_torch
echo stub: torch imported
if defined STUB_TORCH_RC exit /b %STUB_TORCH_RC%
exit /b 0
:c_version
if defined STUB_VERSION_RC exit /b %STUB_VERSION_RC%
exit /b 0
:emulate_m
if "%ARG2%"=="venv" goto m_venv
if "%ARG2%"=="pip" goto m_pip
echo stub: ran python -m %ARG2%
if defined STUB_RUN_RC exit /b %STUB_RUN_RC%
exit /b 0
:m_venv
mkdir "%ARG3%\Scripts"
copy /y "%SELF%" "%ARG3%\Scripts\python.exe" >nul
>"%ARG3%\pyvenv.cfg" echo home = stub
exit /b 0
:m_pip
echo stub: pip
if defined STUB_PIP_RC exit /b %STUB_PIP_RC%
exit /b 0
"""

# How a user starts it from a terminal, and close to what Explorer does on a
# double-click (cmd /c "path\train_gpu.bat"). Paths come in through the
# environment, which wine passes on as Unicode.
DRIVER_BAT = '@echo off\r\ncmd /c ""%TD_SCRIPT%" %TD_ARGS%"\r\nexit /b %ERRORLEVEL%\r\n'


def winpath(path: Path) -> str:
    return "Z:" + str(path).replace("/", "\\")


def _distlib_launcher() -> bytes | None:
    try:
        import pip._vendor.distlib as distlib
    except ImportError:
        return None
    launcher = Path(distlib.__file__).parent / "t64.exe"
    return launcher.read_bytes() if launcher.exists() else None


@dataclass
class BatRun:
    rc: int
    out: str
    calls: list[str]

    def venv_calls(self, needle: str) -> list[str]:
        return [c for c in self.calls if "\\.venv\\Scripts\\python.exe" in c and needle in c]


class Wine:
    def __init__(self, base: Path):
        self.base = base
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TRAINDECK_", "STUB_", "DISPLAY", "WAYLAND"))
        }
        self.env.update(
            WINEPREFIX=str(base / "prefix"), WINEDEBUG="-all", WINEDLLOVERRIDES="mscoree,mshtml="
        )
        stubs = base / "stubs"
        stubs.mkdir()
        (stubs / "stub.bat").write_bytes(STUB_BAT.replace("\n", "\r\n").encode("ascii"))
        launcher = _distlib_launcher()
        zipped = io.BytesIO()
        with zipfile.ZipFile(zipped, "w") as zf:
            zf.writestr("__main__.py", "")
        shebang = f"#!C:\\windows\\system32\\cmd.exe /c {winpath(stubs / 'stub.bat')}\n"
        exe = launcher + shebang.encode("ascii") + zipped.getvalue()
        for rel in (
            "bin/py.exe",
            "bin/python.exe",
            "smi/nvidia-smi.exe",
            "store/WindowsApps/python.exe",
            "other/python.exe",
        ):
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_bytes(exe)
        self.driver = base / "driver.bat"
        self.driver.write_bytes(DRIVER_BAT.encode("ascii"))
        self.smi_file = base / "smi.txt"
        self.log = base / "calls.log"
        self.elsewhere = base / "elsewhere"  # the folder the user starts from
        self.elsewhere.mkdir()
        proc = subprocess.run(
            [WINE, "cmd", "/c", "exit 0"], env=self.env, capture_output=True, timeout=300
        )  # creates the prefix
        if proc.returncode != 0:
            pytest.skip(f"wine does not run: {proc.stderr[-500:]!r}")

    def repo(self, tmp_path: Path) -> Path:
        repo = tmp_path / "Train Deck ü"  # spaces and a non-ASCII letter
        repo.mkdir(parents=True)
        shutil.copy2(BAT, repo)
        shutil.copy2(ROOT / "pyproject.toml", repo)
        return repo

    def run(
        self,
        repo: Path,
        args: str = "",
        path=("bin",),
        gpu: str | None = None,
        pause=False,
        env=None,
    ) -> BatRun:
        self.log.unlink(missing_ok=True)
        dirs = list(path) + (["smi"] if gpu else [])
        if gpu:
            self.smi_file.write_text(SMI_HEADER.format(cuda=gpu).replace("\n", "\r\n"))
        full_env = dict(self.env)
        full_env.update(
            TD_SCRIPT=winpath(repo / "train_gpu.bat"),
            TD_ARGS=args,
            WINEPATH=";".join(winpath(self.base / d) for d in dirs),
            STUB_LOG=winpath(self.log),
            STUB_SMI_FILE=winpath(self.smi_file),
            STUB_PY_VERSIONS="-3.12",
        )
        if not dirs:
            del full_env["WINEPATH"]  # an empty WINEPATH stops wine from running anything
        if not pause:
            full_env["TRAINDECK_NO_PAUSE"] = "1"
        full_env.update(env or {})
        # Output into a file, not a pipe: with pipes wine takes 5x as long.
        with open(self.base / "output.txt", "w+b") as output:
            proc = subprocess.run(
                [WINE, "cmd", "/c", winpath(self.driver)],
                cwd=self.elsewhere,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=180,
            )
            output.seek(0)
            out = output.read().decode("utf-8", "replace").replace("\r\n", "\n")
        calls = []
        if self.log.exists():
            calls = self.log.read_bytes().decode("utf-8", "replace").splitlines()
        return BatRun(proc.returncode, out, [c.strip() for c in calls])

    def close(self):
        server = shutil.which("wineserver")
        if server:  # stops the wineserver of this prefix, nothing else
            subprocess.run([server, "-k"], env=self.env, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def wine(tmp_path_factory):
    if WINE is None:
        pytest.skip(
            "wine is not installed (apt-get install wine64): train_gpu.bat gets "
            "the static checks only"
        )
    if _distlib_launcher() is None:
        pytest.skip("pip's distlib launcher t64.exe is not available")
    base = tmp_path_factory.mktemp("wine")
    if " " in str(base):
        pytest.skip("the stub launchers need a temporary folder without spaces")
    w = Wine(base)
    yield w
    w.close()


def test_bat_first_run_from_a_folder_with_spaces(wine: Wine, tmp_path: Path):
    repo = wine.repo(tmp_path)
    r = wine.run(repo, r'--preset cpu-tiny --out "runs\my run" --max-steps=3')
    assert r.rc == 0, r.out
    assert "No NVIDIA GPU found" in r.out
    # py -3.13 is missing here, py -3.12 makes the venv.
    assert any(c.startswith("py ") and " -3.13 -c " in c for c in r.calls)
    venv = [c for c in r.calls if " -m venv " in c]
    assert len(venv) == 1 and " -3.12 -m venv " in venv[0], r.calls
    assert venv[0].endswith('.venv"') and "Train Deck" in venv[0]
    assert (repo / ".venv" / "pyvenv.cfg").exists()
    pip = r.venv_calls(" -m pip ")
    assert pip[1].endswith(
        '-m pip install "torch==2.13.0+cpu" --index-url "https://download.pytorch.org/whl/cpu"'
    )
    assert pip[2].endswith('-m pip install -e "."')
    assert r.venv_calls("import torch")  # torch import checked after installing
    train = r.venv_calls(" -m core.train ")
    assert len(train) == 1
    assert train[0].endswith(r'-m core.train --preset cpu-tiny --out "runs\my run" --max-steps=3')
    stamp = (repo / ".venv" / "traindeck-install.stamp").read_text()
    assert re.fullmatch(r"stubhash-\d+ torch=2\.13\.0\+cpu extras=\s*", stamp)


def test_bat_second_run_skips_installation(wine: Wine, tmp_path: Path):
    repo = wine.repo(tmp_path)
    assert wine.run(repo, "--max-epochs 50").rc == 0
    r = wine.run(repo, "--resume latest")
    assert r.rc == 0, r.out
    assert "Dependencies up to date (torch 2.13.0+cpu)" in r.out
    assert not r.venv_calls(" -m pip ") and not [c for c in r.calls if " -m venv " in c]
    assert r.venv_calls(" -m core.train ")[0].endswith("-m core.train --resume latest")
    # Changed dependencies, or now a GPU: install again.
    with open(repo / "pyproject.toml", "a") as f:
        f.write("\n# changed\n")
    r = wine.run(repo, "--resume latest")
    assert "Dependencies up to date" not in r.out
    assert r.venv_calls('-m pip install -e "."')
    r = wine.run(repo, "--resume latest", gpu="12.8")
    assert r.venv_calls('"torch==2.13.0+cu128"')


def test_bat_without_arguments_opens_the_gui(wine: Wine, tmp_path: Path):
    r = wine.run(wine.repo(tmp_path), "")
    assert r.rc == 0, r.out
    gui = r.venv_calls(" -m gui")
    assert len(gui) == 1 and gui[0].endswith("-m gui")
    assert not r.venv_calls(" -m core.train")


@pytest.mark.parametrize("code", [1, 2, 130])
def test_bat_passes_the_exit_code_on(wine: Wine, tmp_path: Path, code: int):
    r = wine.run(wine.repo(tmp_path), "--preset cpu-tiny", env={"STUB_RUN_RC": str(code)})
    assert r.rc == code, r.out
    assert f"ends with exit code {code}" in r.out


def test_bat_waits_for_a_key_on_failure(wine: Wine, tmp_path: Path):
    repo = wine.repo(tmp_path)
    r = wine.run(repo, "--preset cpu-tiny", pause=True, env={"STUB_PIP_RC": "1"})
    assert r.rc == 1
    assert "ERROR: installing torch 2.13.0+cpu failed" in r.out
    assert "Press any key" in r.out
    assert not (repo / ".venv" / "traindeck-install.stamp").exists()
    # Training that fails pauses too; TRAINDECK_NO_PAUSE=1 turns it off.
    r = wine.run(repo, "--preset cpu-tiny", pause=True, env={"STUB_RUN_RC": "2"})
    assert r.rc == 2 and "Press any key" in r.out
    r = wine.run(repo, "--preset cpu-tiny", env={"STUB_RUN_RC": "2"})
    assert r.rc == 2 and "Press any key" not in r.out
    r = wine.run(repo, "--preset cpu-tiny", pause=True)
    assert r.rc == 0 and "Press any key" not in r.out


@pytest.mark.parametrize(
    ("cuda", "build"),
    [("13.0", "cu130"), ("12.9", "cu128"), ("12.8", "cu128"), ("12.6", "cu126"), ("12.4", "cpu")],
)
def test_bat_picks_the_cuda_build_the_driver_supports(wine: Wine, tmp_path: Path, cuda, build):
    r = wine.run(wine.repo(tmp_path), "--max-epochs 1", gpu=cuda)
    assert r.rc == 0, r.out
    assert f"driver supports CUDA {cuda}" in r.out
    assert r.venv_calls(
        f'-m pip install "torch==2.13.0+{build}" --index-url '
        f'"https://download.pytorch.org/whl/{build}"'
    ), r.calls
    if build == "cpu":
        assert "too old" in r.out and "Continuing with the CPU build" in r.out
    else:
        assert r.venv_calls("t.cuda.is_available()")


def test_bat_gpu_but_torch_without_cuda_explains_the_fix(wine: Wine, tmp_path: Path):
    repo = wine.repo(tmp_path)
    r = wine.run(repo, "--max-epochs 1", gpu="12.8", env={"STUB_TORCH_RC": "3"})
    assert r.rc == 1
    assert "Torch not compiled with CUDA enabled" in r.out
    assert "delete the .venv folder" in r.out
    assert not r.venv_calls(" -m core.train")
    assert not (repo / ".venv" / "traindeck-install.stamp").exists()
    r = wine.run(repo, "--max-epochs 1", gpu="12.8", env={"STUB_TORCH_RC": "4"})
    assert r.rc == 1 and "cannot use the GPU" in r.out


def test_bat_test_mode(wine: Wine, tmp_path: Path):
    r = wine.run(wine.repo(tmp_path), '--test -k "a or b" --maxfail=1')
    assert r.rc == 0, r.out
    assert r.venv_calls('-m pip install -e ".[test]"')
    assert r.venv_calls(" -m pytest ")[0].endswith('-m pytest -q  -k "a or b" --maxfail=1')


def test_bat_help(wine: Wine, tmp_path: Path):
    repo = wine.repo(tmp_path)
    r = wine.run(repo, "--help")
    assert r.rc == 0
    assert "open the GUI (python -m gui)" in r.out
    assert "python -m core.train" in r.out and "--test" in r.out
    assert not (repo / ".venv").exists() and not r.calls


def test_bat_microsoft_store_stub(wine: Wine, tmp_path: Path):
    r = wine.run(wine.repo(tmp_path), "--max-epochs 1", path=("store/WindowsApps",))
    assert r.rc == 1
    assert "Microsoft Store shortcut" in r.out
    assert "python.org" in r.out and "winget install Python.Python.3.12" in r.out


def test_bat_no_python_at_all(wine: Wine, tmp_path: Path):
    r = wine.run(wine.repo(tmp_path), "--max-epochs 1", path=())
    assert r.rc == 1
    assert "no 64-bit Python 3.10 or newer found" in r.out
    r = wine.run(wine.repo(tmp_path / "old"), "--max-epochs 1", env={"STUB_VERSION_RC": "3"})
    assert r.rc == 1 and "older than Python 3.10" in r.out


def test_bat_traindeck_python(wine: Wine, tmp_path: Path):
    other = winpath(wine.base / "other" / "python.exe")
    r = wine.run(
        wine.repo(tmp_path), "--max-epochs 1", path=(), env={"TRAINDECK_PYTHON": f'"{other}"'}
    )
    assert r.rc == 0, r.out
    venv = [c for c in r.calls if " -m venv " in c]
    assert venv and venv[0].startswith(f'python "{other}" -m venv')


def test_bat_recreates_a_broken_venv(wine: Wine, tmp_path: Path):
    repo = wine.repo(tmp_path)
    (repo / ".venv" / "Scripts").mkdir(parents=True)
    (repo / ".venv" / "pyvenv.cfg").write_text("home = gone\n")
    # An .exe that does not run: what is left when the base Python is gone.
    (repo / ".venv" / "Scripts" / "python.exe").write_bytes(b"")
    r = wine.run(repo, "--max-epochs 1")
    assert r.rc == 0, r.out
    assert "does not work any more" in r.out
    assert [c for c in r.calls if " -m venv " in c]


# ---------------------------------------------------------------------------
# train_gpu.sh for real, on a fresh copy of the repository
# ---------------------------------------------------------------------------


def copy_repo(dest: Path) -> Path:
    """What a fresh clone has: the files git tracks (working-tree contents)."""
    listed = _git("ls-files", "-z", "--cached")
    if listed is None:  # not a git checkout: copy all but local state
        shutil.copytree(
            ROOT,
            dest,
            ignore=shutil.ignore_patterns(
                ".git", ".venv", "runs", "__pycache__", "*.egg-info", ".*_cache"
            ),
        )
        return dest
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@dataclass
class RealRun:
    rc: int
    out: str
    seconds: float
    setup_seconds: float  # until the launcher hands over to python -m core.train


def _run_timed(cmd: list[str], cwd: Path, env: dict, timeout: float) -> RealRun:
    start = time.monotonic()
    setup = None
    chunks = []
    with subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
    ) as proc:
        try:
            for line in proc.stdout:
                chunks.append(line)
                if setup is None and line.startswith("[traindeck] Training without the GUI"):
                    setup = time.monotonic() - start
                if time.monotonic() - start > timeout:
                    proc.kill()
                    break
        finally:
            rc = proc.wait(timeout=60)
    total = time.monotonic() - start
    return RealRun(rc, "".join(chunks), total, setup if setup is not None else total)


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Runs ./train_gpu.sh twice on a fresh copy: install + train, then train again."""
    if BASH is None:
        pytest.skip("bash is not installed")
    base = tmp_path_factory.mktemp("real")
    repo = copy_repo(base / "Train Deck")
    if not (repo / "train_gpu.sh").exists():
        pytest.fail("train_gpu.sh is not tracked by git (git add it)")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TRAINDECK_", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"))
    }
    # The CPU build even on a GPU machine: the CUDA choice is tested with stubs,
    # and this keeps the download small.
    env.update(
        TRAINDECK_TORCH_VARIANT="cpu",
        QT_QPA_PLATFORM="offscreen",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
    )
    runs = []
    for n in (1, 2):
        out = base / f"run {n}"
        cmd = [
            str(repo / "train_gpu.sh"),
            "--preset",
            "cpu-tiny",
            "--max-steps",
            "3",
            "--out",
            str(out),
        ]
        runs.append((_run_timed(cmd, base, env, timeout=900), out))
    return repo, runs


def _show(run: RealRun) -> str:
    return run.out[-6000:]


def test_real_first_run_installs_into_a_fresh_venv(real_runs):
    repo, [(first, _), _] = real_runs
    print(f"first run: {first.seconds:.1f} s, setup {first.setup_seconds:.1f} s")
    assert "[traindeck] Creating the virtual environment" in first.out, _show(first)
    assert "[traindeck] Installation complete." in first.out, _show(first)
    venv_py = repo / ".venv" / "bin" / "python"
    proc = subprocess.run(
        [str(venv_py), "-c", "import torch, sympy, networkx, jinja2; print(torch.__version__)"],
        capture_output=True,
        text=True,
        cwd=repo.parent,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(_sh_var("TORCH_VERSION"))
    stamp = (repo / ".venv" / "traindeck-install.stamp").read_text()
    digest = hashlib.sha256((repo / "pyproject.toml").read_bytes()).hexdigest()
    variant = "macos" if sys.platform == "darwin" else "cpu"
    assert stamp == f"{digest} torch={_sh_var('TORCH_VERSION')}+{variant} extras=\n"


def test_real_second_run_skips_installation(real_runs):
    repo, [(first, _), (second, _)] = real_runs
    print(f"second run: {second.seconds:.1f} s, setup {second.setup_seconds:.1f} s")
    assert "[traindeck] Dependencies up to date" in second.out, _show(second)
    assert "Installing" not in second.out and "Creating the virtual" not in second.out
    assert second.setup_seconds < 15, f"setup took {second.setup_seconds:.1f} s"


@pytest.mark.parametrize("n", [0, 1], ids=["first", "second"])
def test_real_run_trains(real_runs, n):
    _, runs = real_runs
    run, out = runs[n]
    assert run.rc == 0, _show(run)
    for rel in ("config.yaml", "metrics.jsonl", "checkpoints/latest.pt"):
        assert (out / rel).is_file(), f"{rel} missing in {out}:\n{_show(run)}"
