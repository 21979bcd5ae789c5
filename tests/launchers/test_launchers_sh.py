"""Launchers, layer 2: train_gpu.sh against stub programs (python, nvidia-smi, uname) that
record their calls: CUDA index choice, argument pass-through, exit codes, the install stamp.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from launchers_common import (
    BASH,
    ROOT,
    SH,
    SMI_HEADER,
)

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
