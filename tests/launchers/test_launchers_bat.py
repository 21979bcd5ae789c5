"""Launchers, layer 3: train_gpu.bat for real under wine's cmd.exe, against stub python.exe /
py.exe / nvidia-smi.exe (skipped when wine is not installed).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from launchers_common import (
    BAT,
    ROOT,
    SMI_HEADER,
    WINE,
)

# Under load wine now and then fails to start a process (seen in CI: cmd.exe not
# started at all; a stub python.exe reporting failure after it ran). train_gpu.bat
# has no timing of its own, so a real fault fails every attempt.
pytestmark = pytest.mark.flaky(reruns=2, reruns_delay=2)

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
set "ARG4=%~5"
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
set "ARG4=%~6"

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
if defined STUB_TRITON_RC if not "%ARG4:triton=%"=="%ARG4%" exit /b %STUB_TRITON_RC%
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
        rc, out = self._wine_cmd(full_env)
        calls = []
        if self.log.exists():
            calls = self.log.read_bytes().decode("utf-8", "replace").splitlines()
        return BatRun(rc, out, [c.strip() for c in calls])

    def _wine_cmd(self, env: dict) -> tuple[int, str]:
        # Output into a file, not a pipe: with pipes wine takes 5x as long.
        with open(self.base / "output.txt", "w+b") as output:
            proc = subprocess.run(
                [WINE, "cmd", "/c", winpath(self.driver)],
                cwd=self.elsewhere,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=180,
            )
            output.seek(0)
            return proc.returncode, output.read().decode("utf-8", "replace").replace("\r\n", "\n")

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
    assert "Dependencies up to date" not in r.out, r.out
    assert r.venv_calls('-m pip install -e "."'), r.out
    r = wine.run(repo, "--resume latest", gpu="12.8")
    assert r.venv_calls('"torch==2.13.0+cu128"'), r.out


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


def test_bat_installs_triton_windows_for_the_gpu_only(wine: Wine, tmp_path: Path):
    pin = '-m pip install "triton-windows==3.7.*"'  # torch 2.13's Triton minor
    repo = wine.repo(tmp_path)
    r = wine.run(repo, "--max-epochs 1", gpu="12.8")
    assert r.rc == 0, r.out
    pip = r.venv_calls(" -m pip install ")
    assert [c for c in pip if c.endswith(pin)] == [pip[-1]], pip  # after TrainDeck
    assert r.venv_calls("t.cuda.is_available()")
    stamp = (repo / ".venv" / "traindeck-install.stamp").read_text()
    assert "torch=2.13.0+cu128 triton-windows=3.7.* extras=" in stamp
    assert "Dependencies up to date" in wine.run(repo, "--max-epochs 1", gpu="12.8").out
    r = wine.run(wine.repo(tmp_path / "cpu"), "--max-epochs 1")
    assert r.rc == 0 and not r.venv_calls("triton-windows=="), r.calls
    # A failed Triton install is a warning: the run goes on (uncompiled) and says how.
    r = wine.run(
        wine.repo(tmp_path / "no"), "--max-epochs 1", gpu="12.8", env={"STUB_TRITON_RC": "1"}
    )
    assert r.rc == 0, r.out
    assert "WARNING: installing triton-windows failed" in r.out
    assert 'pip install "triton-windows==3.7.*"' in r.out
    assert r.venv_calls(" -m core.train ")


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
