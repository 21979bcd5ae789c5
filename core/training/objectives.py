"""The training objectives behind one interface. Each is one module: sft (the language-model
loss), dpo (preference pairs), grpo (rewards on sampled completions). It says what differs:

- micro_batches(run, cfg, starts, step): what a step trains on, in micro-batches;
- micro_loss(run, cfg, chunk): (the loss of one micro-batch, signal sums or None);
- records(signals, cfg, world): the extra metric records of each step, or None;
- evaluate(run, cfg): (the value a better model lowers, the record's fields, the log line);
- step_tokens(signals, cfg): the tokens a step trained on (tokens/s);
- best_meta(best): how a checkpoint records the best evaluation (val_loss, GRPO's reward);
- rows_per_example and extra_memory below: what it adds to the memory estimate.

make(cfg) picks one, once, at setup; the step loop never asks which.
"""

from __future__ import annotations

from core.config.spec import TrainConfig
from core.models.loss import chunk_positions


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


def extra_memory(cfg: TrainConfig, c, act_bytes: int, weight_bytes: int) -> tuple[int, int, int]:
    """(generation, logits, reference) bytes an objective adds to the estimate (besides its
    rows): GRPO's sampling holds the KV cache of all G x B completions and their last
    logits; its loss makes the completion positions' logits one chunk at a time
    (core.models.loss.token_logps: in fp32 LinearTokenLogps's two blocks; else a
    checkpointed chunk's logits, their fp32 copy, log-softmax, its exp for the entropy, and
    in the backward the remade chunk and its gradient); beta > 0 in a full fine-tune keeps a
    frozen copy of the starting weights."""
    if cfg.method != "grpo":
        return 0, 0, 0
    rows = cfg.batch_size * cfg.grad_accum * cfg.num_generations
    kv = 2 * c.n_layers * rows * cfg.seq_len * c.n_kv_heads * c.head_dim * act_bytes
    generation = kv + rows * c.vocab_size * 4 * 3 + rows * cfg.seq_len**2  # + prefill mask
    positions = cfg.batch_size * cfg.num_generations * cfg.max_completion_tokens
    if act_bytes == 4 and not c.logit_softcap:  # LinearTokenLogps: two fp32 blocks
        logits = min(positions, chunk_positions(c.vocab_size, fused=True)) * c.vocab_size * 8
    else:  # checkpointed chunks: logits, fp32, log-softmax, exp, grad
        chunk = min(positions, chunk_positions(c.vocab_size))
        logits = chunk * c.vocab_size * (act_bytes + 4 * 4)
    reference = weight_bytes if cfg.grpo_beta and not cfg.lora_rank else 0
    return generation, logits, reference
