"""torch.compile that never ends a run. Whether a run compiles is decided here, once, from its
setting and its device (`wanted`: by default on a CUDA GPU, never by default on the CPU, whose
eager path is tuned). A model with blocks is compiled regionally: each transformer block in
place, so blocks alike share one compiled graph and the first step compiles one block, not the
whole model. Inductor's and Triton's caches live in TrainDeck's cache folder, so a second run of
the same shapes starts warm. What compiling needs is checked before step 0 (a C++ compiler for
the CPU, Triton for an NVIDIA GPU) and a tiny function is compiled for real; a failure then or
at the model's first compiled step leaves the run going uncompiled, with one line that says why
and what to install."""

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
# torch.compile's modes a run may pick: reduce-overhead adds CUDA graphs (static shapes only)
MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


def wanted(requested: bool | None, device_type: str, tiles: bool = False) -> bool:
    """Whether a run compiles: what it asked for, else (None, the default) on a CUDA GPU,
    unless the model would run in tiles at this length (tiles: core.models.tiling's long
    sequences, whose memory a compiled block forgoes, and which are what makes such a
    context fit). The one place this is decided: setup and the estimate ask it."""
    if requested is not None:
        return requested
    return device_type == "cuda" and not tiles


def triton_package(system: str | None = None) -> str:
    """The pip package that brings Triton: a separate build on Windows."""
    return "triton-windows" if (system or sys.platform) == "win32" else "triton"


def cache_folder() -> Path:
    """Where compiled kernels are kept between runs: TrainDeck's cache folder (beside the
    data cache; inside the folder TRAINDECK_CACHE names), not the temporary folder a reboot
    empties."""
    env = os.environ.get("TRAINDECK_CACHE")
    if env:
        return Path(env) / "compile"
    import platformdirs

    return Path(platformdirs.user_cache_dir("traindeck", appauthor=False)) / "compile"


def use_cache_folder(folder: Path | None = None) -> Path:
    """Point Inductor and Triton at the cache folder, before anything compiles; a folder the
    user set (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) is kept. Returns Inductor's."""
    folder = folder or cache_folder()
    inductor = os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(folder / "triton"))
    return Path(inductor)


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
        needs = f"compiling for an NVIDIA GPU needs it (pip install {triton_package()})"
        return f"Triton does not import, and {needs}"
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


def _options(mode: str, backend: str | None) -> dict:
    """torch.compile's arguments (backend: tests use aot_eager, which needs no compiler)."""
    return {"mode": mode} if backend is None else {"mode": mode, "backend": backend}


class CompiledOrEager(nn.Module):
    """The model compiled, or itself again once compiling it fails. A model that compiles its
    own blocks (GPT.compile_blocks) is compiled regionally, in place; any other whole."""

    def __init__(
        self,
        model: nn.Module,
        log: Callable[[str], None],
        mode: str = "default",
        backend: str | None = None,
    ):
        super().__init__()
        self.model = model
        regional = hasattr(model, "compile_blocks")
        if regional:
            blocks = model.compile_blocks(_options(mode, backend))
            compiled = model
            self.__dict__["parts"] = (
                f"the {blocks} transformer blocks, each compiled in place (blocks alike share "
                "one compiled graph); the embedding, the head and the loss run eager"
            )
        else:
            # Not a submodule: its parameters are the model's, registered once above.
            compiled = torch.compile(model, **_options(mode, backend))
            self.__dict__["parts"] = "the whole model"
        self.__dict__["compiled"] = compiled
        self.__dict__["regional"] = regional
        self.__dict__["_log"] = log

    def forward(self, *args, **kwargs):
        compiled = self.__dict__["compiled"]
        if compiled is not None:
            try:
                return compiled(*args, **kwargs)
            except compile_errors() as e:
                self._give_up()
                self.__dict__["_log"](fallback_line(f"compiling the model failed ({_reason(e)})"))
        return self.model(*args, **kwargs)

    def _give_up(self) -> None:
        self.__dict__["compiled"] = None
        if self.__dict__["regional"]:
            self.model.compile_blocks(None)  # its blocks eager again

    @property
    def is_compiled(self) -> bool:
        return self.__dict__["compiled"] is not None

    @property
    def parts(self) -> str:
        """Which parts are compiled, for the log."""
        return self.__dict__["parts"]


def is_compiled(train_model: nn.Module) -> bool:
    """Whether the model as trained (DDP's wrapper taken off) still runs compiled."""
    inner = getattr(train_model, "module", train_model)
    return bool(getattr(inner, "is_compiled", False))


def compile_or_eager(
    model: nn.Module,
    device: torch.device,
    log: Callable[[str], None],
    smoke: Callable[[torch.device], None] | None = None,
    mode: str = "default",
    backend: str | None = None,
) -> nn.Module:
    """The model to train: compiled where the tools work, else the model itself and one line.
    The log says which parts compile and where their kernels are cached."""
    cache = use_cache_folder()
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
    wrapped = CompiledOrEager(model, log, mode, backend)
    log(
        f"torch.compile (mode {mode}): {wrapped.parts}; the first step compiles, its kernels "
        f"are cached in {cache} (a second run of these shapes starts warm)"
    )
    return wrapped
