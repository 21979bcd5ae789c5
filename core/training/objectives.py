"""The training objectives behind one interface. Each is one module: sft (the language-model
loss), dpo (preference pairs), grpo (rewards on sampled completions). Objective below holds
what they share; a module overrides what differs:

- check(cfg): its own settings and files, before any data or model is touched;
- load_data(cfg, pretrained, saved, ...): its data (token windows, or GRPO's prompts);
- check_data(data): what the data must hold for it, before the model loads;
- prepare(run, cfg, log, events, stop): what it makes before the first step (a reference);
- micro_batches(run, cfg, starts, step): what a step trains on, in micro-batches;
- micro_loss(run, cfg, chunk): (the loss of one micro-batch, signal sums or None);
- prefetch(run, cfg, starts): read the next step's first micro-batch ahead (where
  `prefetches`: on a GPU, while this step's kernels run);
- step_signals(sums): a step's StepSignals, kept until records() reads them;
- records(signals, cfg, world): the extra metric records of each step, or None;
- evaluate(run, cfg): (the value a better model lowers, the record's fields, the log line);
- step_tokens(signals, cfg): the tokens a step trained on (tokens/s);
- best_meta(best): how a checkpoint records the best evaluation (val_loss, GRPO's reward);
- extra_memory(...): what it adds to the memory estimate (rows_per_example: its declaration).

What a method is to the rest of TrainDeck (fields, checks, data kind, plots) is declared in
core.config.methods; the declaration names its runtime here. kind(cfg) imports that class and
make(cfg) builds it, once, at setup; the step loop never asks which.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from core.config import methods
from core.config.spec import TrainConfig


def kind(cfg: TrainConfig) -> type[Objective]:
    """The method's objective class, imported when asked for (GRPO's sampling need not load
    for SFT)."""
    module, name = methods.of(cfg).runtime.split(":")
    return getattr(importlib.import_module(module), name)


def make(cfg: TrainConfig) -> Objective:
    return kind(cfg)(cfg)


def rows_per_example(cfg: TrainConfig) -> int:
    """Sequences through the model per batch element: 1, a pair's 2, or GRPO's G."""
    return methods.of(cfg).rows_per_example(cfg)


def extra_memory(cfg: TrainConfig, c, act_bytes: int, weight_bytes: int) -> tuple[int, int, int]:
    """(generation, logits, reference) bytes an objective adds to the estimate."""
    return kind(cfg).extra_memory(cfg, c, act_bytes, weight_bytes)


@dataclass
class StepSignals:
    """What one optimizer step reports beside its loss, kept until the next metrics read
    (the trainer reads every pending step's signals in one host-device sync)."""

    sums: torch.Tensor | None = None  # the micro-batches' signal sums added up (on the device)
    sampled: dict | None = None  # GRPO: its sampling's metrics, already read on the CPU
    tokens: int | None = None  # tokens the step trained on; None: cfg.tokens_per_step
    moe: tuple | None = None  # an MoE model's routing sums (GPT.moe_step), on the device


class Objective:
    """The defaults: a language-model loss over token windows, nothing made before the
    first step, no records beyond the loss."""

    name = ""
    prefetches = False  # reads the next step's batch ahead (prefetch)

    def __init__(self, cfg: TrainConfig):
        pass

    def check(self, cfg: TrainConfig) -> None:
        """Nothing of its own to check before the data."""

    def load_data(
        self,
        cfg: TrainConfig,
        pretrained,
        saved: dict | None,
        *,
        cache,
        allow_change: bool,
        events,
        stop,
        log,
    ):
        """The cached token windows of each data source (core.training.inputs)."""
        from core.training.inputs import prepare_data

        return prepare_data(
            cfg,
            pretrained,
            saved,
            cache=cache,
            allow_change=allow_change,
            events=events,
            stop=stop,
            log=log,
        )

    def check_data(self, data) -> None:
        """Any prepared data will do."""

    def prepare(self, run, cfg: TrainConfig, log, events, stop) -> None:
        """Nothing to make before the first step."""

    def micro_batches(self, run, cfg: TrainConfig, starts, step: int):
        return starts.split(cfg.batch_size)

    def micro_loss(self, run, cfg: TrainConfig, chunk):
        raise NotImplementedError

    def prefetch(self, run, cfg: TrainConfig, starts) -> None:
        """Nothing read ahead."""

    def step_signals(self, sums: torch.Tensor | None) -> StepSignals:
        return StepSignals(sums)

    def records(self, signals: list[StepSignals], cfg: TrainConfig, world) -> list[dict] | None:
        return None

    def step_tokens(self, signals: StepSignals, cfg: TrainConfig) -> int:
        """Tokens through the model in a step (tokens/s): the step's windows unless the
        objective counted them."""
        return cfg.tokens_per_step if signals.tokens is None else signals.tokens

    def best_meta(self, best: float | None) -> dict:
        """How a checkpoint records the best evaluation so far."""
        return {"val_loss": best}

    def evaluate(self, run, cfg: TrainConfig) -> tuple[float, dict, str]:
        raise NotImplementedError

    @staticmethod
    def extra_memory(cfg: TrainConfig, c, act_bytes: int, weight_bytes: int):
        return 0, 0, 0
