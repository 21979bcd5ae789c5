"""Shared helpers for the core tests: a model small enough to train in a second on 2 cores."""

from __future__ import annotations

from core.config.spec import TrainConfig, validate
from core.runs.events import TrainControl, TrainEvents


def tiny_config(**overrides) -> TrainConfig:
    values = dict(
        hidden_dim=32,
        n_layers=2,
        n_heads=2,
        seq_len=32,
        batch_size=4,
        grad_accum=1,
        dropout=0.1,  # exercises the RNG, which exact resume must restore
        lr=3e-3,
        warmup_steps=3,
        max_steps=20,
        precision="fp32",
        device="cpu",
        log_every=3,
        eval_every=10,
        eval_batches=2,
        ckpt_every=10,
        sample_tokens=16,
        corpus_max_bytes=60_000,
    )
    values.update(overrides)
    return validate(TrainConfig(**values))


class StopAfter(TrainControl):
    """Requests a stop once `steps` optimizer steps have run (the trainer asks once a step)."""

    def __init__(self, steps: int):
        super().__init__()
        self.remaining = steps

    @property
    def stop_requested(self) -> bool:
        self.remaining -= 1
        return self.remaining < 0


class Recorder(TrainEvents):
    def __init__(self):
        self.calls = []

    def __getattribute__(self, name):
        if name.startswith("on_"):
            calls = object.__getattribute__(self, "calls")
            return lambda *args: calls.append((name, args))
        return object.__getattribute__(self, name)

    def named(self, name):
        return [args for n, args in self.calls if n == name]


def cached_forward(model, idx, first: int):
    """Logits for idx from forward_cached: the first tokens at once, then one at a time."""
    import torch

    logits, cache = model.forward_cached(idx[:, :first], None)
    steps = [logits]
    for pos in range(first, idx.shape[1]):
        logits, cache = model.forward_cached(idx[:, pos : pos + 1], cache)
        steps.append(logits)
    return torch.cat(steps, dim=1)


class FakeTime:
    """Stands in for the `time` module of core.training.clock: each reading advances `tick`
    seconds, so a run's timings are the same on any machine and under any load."""

    def __init__(self, tick: float = 0.001):
        self.now = 0.0
        self.tick = tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


def llama_greedy(llm, ids: list[int], n: int) -> list[int]:
    """llama.cpp's (llama_cpp.Llama's) first n greedy tokens after ids."""
    got = []
    for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        got.append(token)
        if len(got) == n:
            break
    return got


# An lm_eval multiple-choice task's YAML tail (choices and answer columns, its three
# accuracies), as the harness tests and benchmarks/eval_vs_lm_eval.py write their tasks.
LM_EVAL_MC = """output_type: multiple_choice
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
  - metric: acc_bytes
"""


def plain_token_logps(logits, targets, temperature: float):
    """Each target's log-probability and each position's entropy from the whole logits
    divided by the sampling temperature, as TRL scores them: the plain computation GRPO's
    chunked pass (core.models.loss.token_logps) must equal."""
    import torch.nn.functional as F

    logp_all = F.log_softmax(logits.float() / temperature, dim=-1)
    logps = logp_all.gather(-1, targets[..., None])[..., 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logps, entropy


def float32_rounding(fp32, fp64) -> float:
    """How far float32 arithmetic took a computation from the same one in float64: its
    largest difference. Two float32 computations of one function (another library's, other
    kernels, another summation order) differ by a small multiple of it on any CPU."""
    return (fp32.double() - fp64.double()).abs().max().item()


def card(index: int, name: str, total_gib: int, free_gib: float) -> dict:
    """A CUDA card as core.platform.hardware.gpus describes it (detection mocked)."""
    return {
        "index": index,
        "name": name,
        "total_bytes": total_gib * 1024**3,
        "free_bytes": int(free_gib * 1024**3),
        "capability": "8.6",
        "bf16": True,
        "tf32": True,
        "driver": "550.54",
    }


TWO = [card(0, "NVIDIA GeForce RTX 4090", 24, 22.0), card(1, "NVIDIA GeForce RTX 3090", 24, 11.0)]
