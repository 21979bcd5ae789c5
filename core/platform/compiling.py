"""torch.compile that never ends a run. What it needs is checked before step 0 (a C++ compiler
for the CPU, Triton for an NVIDIA GPU) and a tiny function is compiled for real; a failure then
or at the model's first compiled step leaves the run going uncompiled, with one line that says
why and what to install."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

WINDOWS = sys.platform == "win32"


def needs_text(system: str = sys.platform) -> str:
    """What torch.compile needs on this OS: the window's tooltip and the docs say the same."""
    if system == "win32":
        return (
            "torch.compile needs, on Windows: MSVC (Visual Studio Build Tools, 'Desktop "
            "development with C++', cl.exe on PATH: start from a Developer prompt) for the "
            "CPU, and the triton-windows package for an NVIDIA GPU"
        )
    if system == "darwin":
        return "torch.compile needs, on macOS: Xcode's command line tools (clang++) for the CPU"
    return (
        "torch.compile needs, on Linux: a C++ compiler (g++ or clang++: apt install g++) "
        "for the CPU, and Triton for an NVIDIA GPU (it comes with torch's CUDA builds)"
    )


def _compiler() -> str | None:
    names = ["cl"] if WINDOWS else [os.environ.get("CXX") or "g++", "clang++", "c++"]
    return next((shutil.which(n) for n in names if n and shutil.which(n)), None)


def _has_triton() -> bool:
    try:
        from torch.utils._triton import has_triton

        return bool(has_triton())
    except Exception:  # an old torch, or a Triton that imports but is broken
        return False


def compile_problem(device: torch.device) -> str | None:
    """Why torch.compile cannot work here, in one line; None when the tools are there."""
    if device.type == "cuda" and not _has_triton():
        install = "pip install triton-windows" if WINDOWS else "pip install triton"
        return f"Triton is not importable, and compiling for an NVIDIA GPU needs it ({install})"
    if device.type == "cpu" and _compiler() is None:
        wanted = "cl.exe (MSVC)" if WINDOWS else "a C++ compiler (g++, clang++)"
        return f"no {wanted} on PATH, and compiling for the CPU needs one"
    return None


def link_torch_without_spaces() -> None:
    """Inductor links with torch's lib folder unquoted (-L/a b/torch/lib, pytorch PR 191010),
    so a venv in a folder with spaces cannot link. Point it at a link to that folder from a
    path without spaces. Windows quotes the path (/LIBPATH:"..."): nothing to do there."""
    from torch.utils import cpp_extension

    lib = cpp_extension.TORCH_LIB_PATH
    if WINDOWS or " " not in lib:
        return
    tag = hashlib.sha256(lib.encode()).hexdigest()[:12]
    link = Path(tempfile.gettempdir()) / f"traindeck-torch-lib-{tag}"
    if " " in str(link):
        return
    try:
        if not link.is_symlink():
            link.symlink_to(lib, target_is_directory=True)
    except FileExistsError:  # another process made it first
        pass
    except OSError:
        return
    if os.path.realpath(link) == os.path.realpath(lib):
        cpp_extension.TORCH_LIB_PATH = str(link)


def compile_errors() -> tuple[type[BaseException], ...]:
    """What a failed compilation raises (never an out-of-memory error of the model itself)."""
    errors: list[type[BaseException]] = []
    try:
        from torch._dynamo.exc import BackendCompilerFailed

        errors.append(BackendCompilerFailed)
    except ImportError:
        pass
    try:
        from torch._inductor.exc import InductorError

        errors.append(InductorError)
    except ImportError:
        pass
    return tuple(errors)


def _reason(e: BaseException) -> str:
    """The line of a compiler's output that says what went wrong, else the first line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines[1:]:  # the first is the exception's title ("C++ compile error")
        if "cannot find" in ln or "error:" in ln.lower() or "not found" in ln:
            return ln[:200]
    return (lines[0] if lines else type(e).__name__)[:200]


def fallback_line(why: str) -> str:
    return (
        f"torch.compile is off for this run: {why}. Training goes on uncompiled "
        f"(slower steps, same results). {needs_text()}."
    )


def _smoke(device: torch.device) -> None:
    """Compile and run a tiny function and its backward: the real compiler, linker and
    Triton, in seconds (its kernels are cached for the model's compile)."""
    f = torch.compile(lambda x: (x * 2.0).sin().sum())
    x = torch.ones(16, device=device, requires_grad=True)
    f(x).backward()


class CompiledOrEager(nn.Module):
    """The model compiled, or itself again once compiling it fails."""

    def __init__(self, model: nn.Module, log: Callable[[str], None]):
        super().__init__()
        self.model = model
        # Not a submodule: its parameters are the model's, registered once above.
        self.__dict__["compiled"] = torch.compile(model)
        self.__dict__["_log"] = log

    def forward(self, *args, **kwargs):
        compiled = self.__dict__["compiled"]
        if compiled is not None:
            try:
                return compiled(*args, **kwargs)
            except compile_errors() as e:
                self.__dict__["compiled"] = None
                self.__dict__["_log"](fallback_line(f"compiling the model failed ({_reason(e)})"))
        return self.model(*args, **kwargs)

    @property
    def is_compiled(self) -> bool:
        return self.__dict__["compiled"] is not None


def compile_or_eager(
    model: nn.Module,
    device: torch.device,
    log: Callable[[str], None],
    smoke: Callable[[torch.device], None] | None = None,
) -> nn.Module:
    """The model to train: compiled where the tools work, else the model itself and one line."""
    problem = compile_problem(device)
    if problem is None:
        link_torch_without_spaces()
        try:
            (smoke or _smoke)(device)
        except Exception as e:  # anything a tiny function raises says compiling cannot work
            problem = f"a test compile failed ({_reason(e)})"
    if problem is not None:
        log(fallback_line(problem))
        return model
    return CompiledOrEager(model, log)
