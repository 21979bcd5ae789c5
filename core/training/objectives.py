"""The training objectives behind one interface. Each is one module: sft (the language-model
loss), dpo (preference pairs), grpo (rewards on sampled completions). It says what differs:

- micro_batches(run, cfg, starts, step): what a step trains on, in micro-batches;
- micro_loss(run, cfg, chunk): (the loss of one micro-batch, signal sums or None);
- records(signals, cfg, world): the extra metric records of each step, or None;
- evaluate(run, cfg): (the value a better model lowers, the record's fields, the log line);
- rows(cfg) and extra_bytes(cfg, shape, precision): what it adds to the memory estimate.

make(cfg) picks one, once, at setup; the step loop never asks which.
"""

from __future__ import annotations

from core.config.spec import TrainConfig


def make(cfg: TrainConfig):
    if cfg.method == "dpo":
        from core.training.dpo import DPO

        return DPO()
    if cfg.method == "grpo":
        from core.training.grpo import GRPO

        return GRPO(cfg)
    from core.training.sft import SFT

    return SFT()


def rows_per_example(cfg: TrainConfig) -> int:
    """Sequences through the model per batch element: 1, a pair's 2, or GRPO's G."""
    if cfg.method == "dpo":
        return 2
    if cfg.method == "grpo":
        return cfg.num_generations
    return 1
