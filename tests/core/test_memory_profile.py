"""The memory profile of a step (core.training.memory_profile): the components add up to what
the profiler counted, the static parts are the tensors' sizes, and the large temporaries land
where they are made."""

from __future__ import annotations

import torch

from core.models import model as model_module
from core.models.lora import apply_lora
from core.models.model import GPT, GPTConfig
from core.training import memory_profile as mp


def tiny(**kw):
    c = GPTConfig(
        hidden_dim=32, n_layers=2, n_heads=4, seq_len=256, vocab_size=300, positions="rope", **kw
    )
    torch.manual_seed(0)
    model = GPT(c)
    apply_lora(model, 4, 8.0, 0.0, "all")
    model.train()
    return model


def run(model, t=256):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    idx = torch.randint(0, 300, (1, t))

    def step(phase):
        opt.zero_grad(set_to_none=True)
        with phase("forward"):
            _, loss = model(idx, idx)
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            opt.step()

    step(lambda name: torch.autograd.profiler.record_function(name))  # optimizer states
    opt.zero_grad(set_to_none=True)
    static = mp.static_bytes(model, opt)
    parts, counted = mp.profile_step(model, step)
    return static, parts, counted


def test_the_components_add_up_to_the_profilers_peak(monkeypatch):
    monkeypatch.setattr(model_module, "ATTN_CHUNK_QUERIES", 10_000)
    model = tiny(attn_softcap=30.0)
    static, parts, counted = run(model)
    frozen = sum(p.numel() * 4 for p in model.parameters() if not p.requires_grad)
    assert static[mp.WEIGHTS] == frozen
    assert abs(sum(parts.values()) - counted) <= 0.01 * counted
    # Without chunks the soft-capped scores are the largest temporaries: 4 heads x 256 x 256
    assert parts[mp.ATTENTION] >= 4 * 256 * 256 * 4
    assert parts[mp.ATTENTION] == max(parts.values())


def test_chunked_attention_shrinks_its_component(monkeypatch):
    monkeypatch.setattr(model_module, "ATTN_CHUNK_QUERIES", 10_000)
    whole = run(tiny(attn_softcap=30.0))[1][mp.ATTENTION]
    monkeypatch.setattr(model_module, "ATTN_CHUNK_QUERIES", 32)
    chunked = run(tiny(attn_softcap=30.0))[1][mp.ATTENTION]
    assert chunked < whole / 3


def test_a_cuda_snapshot_is_attributed_by_its_frames():
    def block(size, *frames, state="active_allocated"):
        return {
            "size": size,
            "state": state,
            "frames": [{"name": n, "filename": f, "line": 1} for n, f in frames],
        }

    model_py, ckpt = "core/models/model.py", "torch/utils/checkpoint.py"
    snapshot = {
        "segments": [
            {
                "total_size": 10_000,
                "blocks": [
                    block(1000, ("load", "core/weights/loader.py")),
                    block(200, ("_single_tensor_adamw", "adamw.py"), ("step", "core/optim.py")),
                    block(3000, ("_scores", model_py), ("_attend", model_py)),
                    block(500, ("inner", model_py), ("forward", model_py)),
                    block(700, ("lm_loss", "core/models/loss.py")),
                    block(400, ("forward", model_py), ("recompute_fn", ckpt)),
                    block(2000, ("x", "y"), state="inactive"),
                ],
            }
        ]
    }
    parts = mp.attribute_snapshot(snapshot)
    assert parts[mp.WEIGHTS] == 1000
    assert parts[mp.TRAINABLE] == 200
    assert parts[mp.ATTENTION] == 3000
    assert parts[mp.MLP] == 500
    assert parts[mp.LOSS] == 700
    assert parts[mp.RECOMPUTE] == 400
    assert parts[mp.SLACK] == 10_000 - 5800
    assert sum(parts.values()) == 10_000


def test_a_cuda_step_is_profiled_from_its_allocator_history(monkeypatch):
    """The CUDA path on the CPU: torch.cuda.memory's history and snapshot stood in for; the
    trace is replayed to its peak and the blocks live there are split by their frames."""
    calls = []
    model_py = "core/models/model.py"

    def alloc(addr, size, *frames):
        f = [{"name": n, "filename": p, "line": 1} for n, p in frames]
        return {"action": "alloc", "addr": addr, "size": size, "frames": f}

    def free(addr, size):
        return {"action": "free_completed", "addr": addr, "size": size, "frames": []}

    trace = [
        alloc(1, 300, ("_scores", model_py)),
        alloc(2, 200, ("inner", model_py)),
        free(2, 200),
        alloc(3, 400, ("lm_loss", "core/models/loss.py")),  # the peak: 1 and 3 live, 700
        free(1, 300),
        free(3, 400),
        alloc(4, 100, ("step", "core/training/optim.py")),
    ]
    snapshot = {"device_traces": [trace], "segments": [{"device": 0, "total_size": 2000}]}
    memory = torch.cuda.memory
    monkeypatch.setattr(memory, "_record_memory_history", lambda **kw: calls.append(kw))
    monkeypatch.setattr(memory, "_snapshot", lambda: calls.append("snapshot") or snapshot)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 1000)

    def step(phase):
        with phase("forward"):
            calls.append("step")

    parts = mp.profile_cuda_step(step, torch.device("cuda", 0))
    assert calls == [
        {"max_entries": mp.HISTORY_ENTRIES, "stacks": "python"},
        "step",
        "snapshot",
        {"enabled": None},  # history off again
    ]
    assert parts[mp.ATTENTION] == 300 and parts[mp.LOSS] == 400
    assert parts[mp.MLP] == 0 and parts[mp.TRAINABLE] == 0  # freed before, made after the peak
    assert parts[mp.WEIGHTS] == 1000  # allocated before the step
    assert parts[mp.SLACK] == 2000 - 1000 - 700
