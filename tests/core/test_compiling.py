"""torch.compile never ends a run: missing tools, a failed test compile or a failed model
compile leave the run going uncompiled, with one line saying why and what to install."""

from __future__ import annotations

import os
import re

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

    def fake_compile(model, **options):
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
    def fake_compile(model, **options):
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

    def fake_compile(model, **options):
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


# -- compiled by default on a GPU, regionally, with a warm cache ------------------------------


def test_a_run_compiles_by_default_on_a_cuda_gpu_only():
    assert compiling.wanted(None, "cuda") and not compiling.wanted(None, "cpu")
    assert not compiling.wanted(False, "cuda")  # --no-compile
    assert compiling.wanted(True, "cpu")  # --compile: the CPU compiles when asked
    # a context the model runs in tiles stays eager unless asked: the tiles make it fit
    assert not compiling.wanted(None, "cuda", tiles=True) and compiling.wanted(True, "cuda", True)


def test_a_long_context_run_on_a_gpu_stays_eager_and_says_why(monkeypatch):
    from core.training.estimate import estimate
    from core.training.setup import compiled_model

    long, lines = tiny_config(seq_len=4096), []
    assert compiled_model(long, torch.nn.Linear(2, 2), torch.device("cuda"), lines.append)
    assert len(lines) == 1 and "off at seq_len 4,096" in lines[0] and "--compile" in lines[0]
    # the estimate counts the tiles the eager model runs in, and not where it compiles
    compiled = tiny_config(seq_len=4096, compile=True)
    assert estimate(long).device_total < estimate(compiled).device_total


def test_without_triton_a_gpu_run_goes_on_eager_with_one_line_naming_the_package(monkeypatch):
    from core.training.setup import compiled_model

    monkeypatch.setattr(compiling, "_has_triton", lambda: False)
    model, cfg = torch.nn.Linear(2, 2), tiny_config(compile=None)
    for system, package in (("linux", "pip install triton)"), ("win32", "triton-windows")):
        monkeypatch.setattr(compiling.sys, "platform", system)
        lines = []
        assert compiled_model(cfg, model, torch.device("cuda"), lines.append) is model
        assert len(lines) == 1 and package in lines[0] and "goes on uncompiled" in lines[0]
    lines = []  # the CPU: eager by default, as before, and nothing to say
    assert compiled_model(cfg, model, torch.device("cpu"), lines.append) is model
    assert lines == []
    cfg = tiny_config(compile=False)  # --no-compile on a GPU: said, never tried
    assert compiled_model(cfg, model, torch.device("cuda"), lines.append) is model
    assert lines == ["torch.compile: off (--no-compile); the model trains eager"]


def tiny_gpt(layers: int = 3):
    from core.models.model import GPT, LLAMA_OPTIONS, GPTConfig

    torch.manual_seed(0)
    shape = GPTConfig(hidden_dim=32, n_layers=layers, n_heads=2, seq_len=16, vocab_size=64)
    return GPT(GPTConfig(**{**shape.__dict__, **LLAMA_OPTIONS}))


def loss_and_grads(model, train_model):
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, 64, (2, 16), generator=g) for _ in range(2))
    model.zero_grad()
    _, loss = train_model(x, y)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_regional_compile_compiles_one_block_for_every_layer(tmp_path, monkeypatch):
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TRAINDECK_CACHE", str(tmp_path / "data"))
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # restored after
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    torch._dynamo.reset()
    counters.clear()
    eager, model, lines = tiny_gpt(), tiny_gpt(), []
    wrapped = compiling.compile_or_eager(
        model, torch.device("cpu"), lines.append, smoke=lambda d: None, backend="aot_eager"
    )
    loss, grads = loss_and_grads(model, wrapped)
    want_loss, want_grads = loss_and_grads(eager, eager)
    # the same operations, traced: equal within fp32 rounding of a reordered sum
    assert torch.allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    for g, want in zip(grads, want_grads, strict=True):
        assert torch.allclose(g, want, rtol=1e-4, atol=1e-6)
    assert model.blocks_compiled and wrapped.is_compiled
    assert counters["stats"]["unique_graphs"] == 1  # three blocks, one compiled graph
    assert len(lines) == 1 and "the 3 transformer blocks" in lines[0]
    assert str(tmp_path / "data" / "compile" / "inductor") in lines[0]
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "data" / "compile" / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "data" / "compile" / "triton")


def test_a_cache_folder_the_user_set_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compiling.use_cache_folder(tmp_path / "ours") == tmp_path / "mine"


def test_blocks_whose_compile_fails_run_eager_from_then_on(monkeypatch):
    calls = []

    def fake_compile(fn, **options):
        def broken(*args, **kwargs):
            calls.append(1)
            raise inductor_failure()

        return broken

    monkeypatch.setattr(torch, "compile", fake_compile)
    model, eager, lines = tiny_gpt(2), tiny_gpt(2), []
    wrapped = compiling.CompiledOrEager(model, lines.append)
    assert model.blocks_compiled
    for _ in range(2):
        assert torch.equal(loss_and_grads(model, wrapped)[0], loss_and_grads(eager, eager)[0])
    assert len(calls) == 1 and len(lines) == 1 and "cannot find user/Train" in lines[0]
    assert not model.blocks_compiled and not compiling.is_compiled(wrapped)


def test_a_compiled_run_says_compiling_then_its_first_step_time(tmp_path, monkeypatch):
    from core.training.trainer import Trainer
    from tests.helpers import Recorder

    monkeypatch.setenv("TRAINDECK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(compiling, "_smoke", lambda device: None)
    monkeypatch.setattr(compiling, "compile_problem", lambda device: None)
    monkeypatch.setattr(compiling, "_options", lambda mode, backend: {"backend": "aot_eager"})
    torch._dynamo.reset()
    events = Recorder()
    cfg = tiny_config(compile=True, max_steps=3, eval_every=3, ckpt_every=3, dropout=0.0)
    result = Trainer(cfg, run_dir=tmp_path / "run").run(events)
    assert result["status"] == "finished"
    start = events.named("on_train_start")[0][0]
    assert "transformer blocks" in start["compiling"]
    (done,) = events.named("on_compiled")
    assert done[0]["step"] == 1 and done[0]["compiled"] and done[0]["seconds"] > 0
    log = (tmp_path / "run" / "train.log").read_text()
    said = re.search(r"compiled in [\d.]+ s \(the first step\)", log)
    assert said and log.index("compiling (first step)…") < said.start()
