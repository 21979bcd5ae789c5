"""torch.compile never ends a run: missing tools, a failed test compile or a failed model
compile leave the run going uncompiled, with one line saying why and what to install."""

from __future__ import annotations

import os

import pytest
import torch

from core.platform import compiling
from tests.helpers import tiny_config


def inductor_failure() -> Exception:
    from torch._inductor.exc import CppCompileError, InductorError

    return InductorError(CppCompileError(["g++"], "/usr/bin/ld: cannot find user/Train"), None)


def test_a_missing_compiler_or_triton_is_named_before_step_0(monkeypatch):
    monkeypatch.setattr(compiling, "_compiler", lambda: None)
    assert "C++ compiler" in compiling.compile_problem(torch.device("cpu"))
    monkeypatch.setattr(compiling, "_has_triton", lambda: False)
    assert "Triton" in compiling.compile_problem(torch.device("cuda"))
    monkeypatch.setattr(compiling, "_has_triton", lambda: True)
    assert compiling.compile_problem(torch.device("cuda")) is None


def test_the_tooltip_text_names_what_each_os_needs():
    assert "MSVC" in compiling.needs_text("win32") and "triton-windows" in compiling.needs_text(
        "win32"
    )
    assert "g++" in compiling.needs_text("linux")
    assert "clang++" in compiling.needs_text("darwin")


def test_a_failed_test_compile_trains_the_model_itself_with_one_line():
    lines = []
    model = torch.nn.Linear(2, 2)

    def smoke(device):
        raise inductor_failure()

    assert compiling.compile_or_eager(model, torch.device("cpu"), lines.append, smoke) is model
    assert len(lines) == 1
    assert "cannot find user/Train" in lines[0] and "Training goes on uncompiled" in lines[0]


def test_a_model_whose_compile_fails_runs_eager_from_then_on(monkeypatch):
    calls = []

    def fake_compile(model):
        def broken(*args, **kwargs):
            calls.append(1)
            raise inductor_failure()

        return broken

    monkeypatch.setattr(torch, "compile", fake_compile)
    lines = []
    model = torch.nn.Linear(3, 1)
    wrapped = compiling.CompiledOrEager(model, lines.append)
    x = torch.ones(2, 3)
    assert torch.equal(wrapped(x), model(x))
    assert torch.equal(wrapped(x), model(x))
    assert len(calls) == 1 and len(lines) == 1 and not wrapped.is_compiled
    assert list(wrapped.state_dict()) == ["model.weight", "model.bias"]  # no second copy


def test_an_out_of_memory_error_is_not_taken_for_a_compile_failure(monkeypatch):
    def fake_compile(model):
        def oom(*args, **kwargs):
            raise torch.OutOfMemoryError("CUDA out of memory")

        return oom

    monkeypatch.setattr(torch, "compile", fake_compile)
    wrapped = compiling.CompiledOrEager(torch.nn.Linear(3, 1), print)
    with pytest.raises(torch.OutOfMemoryError):  # OOM recovery must still see it
        wrapped(torch.ones(1, 3))


@pytest.mark.skipif(os.name == "nt", reason="Windows quotes the path itself")
def test_a_torch_lib_folder_with_spaces_is_linked_from_a_path_without(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    lib = tmp_path / "new user" / "Train Deck" / "lib"
    lib.mkdir(parents=True)
    monkeypatch.setattr(cpp_extension, "TORCH_LIB_PATH", str(lib))
    compiling.link_torch_without_spaces()
    linked = cpp_extension.TORCH_LIB_PATH
    assert " " not in linked and os.path.samefile(linked, lib)


def test_a_run_whose_compile_fails_finishes_and_says_why(tmp_path, monkeypatch):
    from core.training.trainer import Trainer

    def fake_compile(model):
        def broken(*args, **kwargs):
            raise inductor_failure()

        return broken

    monkeypatch.setattr(compiling, "_smoke", lambda device: None)
    monkeypatch.setattr(compiling, "compile_problem", lambda device: None)
    monkeypatch.setattr(torch, "compile", fake_compile)
    cfg = tiny_config(compile=True, max_steps=4, eval_every=4, ckpt_every=4)
    result = Trainer(cfg, run_dir=tmp_path / "run").run()
    assert result["status"] == "finished" and result["step"] == 4
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count("torch.compile is off for this run") == 1
