"""Supervised fine-tuning and pretraining: the mean next-token loss over the scored tokens
(all of plain text, the answers of chat data), evaluated as validation loss and bits per byte."""

from __future__ import annotations

from core.config.methods import sft as declared
from core.config.spec import TrainConfig
from core.training import evaluation
from core.training.objectives import Objective
from core.training.state import RunState
from core.training.steps import autocast, to_device


class SFT(Objective):
    name = declared.METHOD.name  # fields, checks, plots: core/config/methods/sft.py

    def micro_loss(self, run: RunState, cfg: TrainConfig, starts):
        batch = run.data.train_batch(starts)
        x, y, mask, seg = (to_device(t, run.device) for t in batch)
        with autocast(run.device, run.precision):
            _, loss = run.train_model(x, y, mask, seg)
        return loss, None

    def evaluate(self, run: RunState, cfg: TrainConfig) -> tuple[float, dict, str]:
        # As many windows as eval_batches optimizer steps hold, so neither an out-of-memory
        # split of the micro-batch nor the number of processes changes what is measured.
        windows = cfg.eval_batches * cfg.batch_size * cfg.grad_accum * run.world.size
        val = evaluation.validation_loss(
            run.model, run.train_model, run.data, windows, cfg.batch_size, run.device, run.precision
        )
        bpb = evaluation.bits_per_byte(val, run.data)
        return val, {"val_loss": val, "val_bpb": bpb}, f"val_loss {val:.4f}, {bpb:.4f} bits/byte"
